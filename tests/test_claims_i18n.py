"""The claims tables in both languages: every text of llmwalk.claims comes from strings/<lang>/claims.toml, each
call fills exactly its template's placeholders, and the Chinese rows carry the same numbers and verdicts as the
English ones, in Chinese words (the article's own, from article_zh.md, in the "the article says" column)."""

import ast
import re
from pathlib import Path

import pytest

import llmwalk as lw
from llmwalk import i18n
from llmwalk.claims import cost as c8, embedding, layers, lm_head, tokenization
from llmwalk.i18n import placeholders

CLAIMS = Path(lw.__file__).parent / "claims"
CJK = re.compile(r"[\u4e00-\u9fff]")
ENGLISH_WORDS = re.compile(r"\b(the|and|tokens|layers?|measured|rank|after)\b")


def claims_texts(language: str) -> dict[str, str]:
    return {k: v for k, v in i18n.table(language).items() if k.startswith("claims.")}


def t_calls() -> list[tuple[str, set[str] | None, str]]:
    """Every t("claims....", name=...) call in llmwalk/claims: its key, its keyword names (None with **fields)."""
    calls = []
    for path in sorted(CLAIMS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "t"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                names = {k.arg for k in node.keywords}
                calls.append((node.args[0].value, None if None in names else names, f"{path.name}:{node.lineno}"))
    return calls


# ---------------------------------------------------------------- the texts, without running a model

def test_both_languages_hold_the_same_claims_keys_and_placeholders():
    en, zh = claims_texts("en"), claims_texts("zh")
    assert set(en) == set(zh)
    assert {k for k in en if placeholders(en[k]) != placeholders(zh[k])} == set()


def test_every_claims_text_is_used_and_every_key_used_exists():
    used = {key for key, _, _ in t_calls()}
    assert all(key.startswith("claims.") for key in used)
    assert used == set(claims_texts("en"))                    # none missing, none left over
    # a table per claim: its article words beside its measured template (the ids rows: one token / several)
    claims = {k.rsplit(".", 1)[0] for k in used if k.endswith(".measured")}
    assert {c for c in claims if f"{c}.article" not in used} == {"claims.tokenization.ids"}
    assert {"claims.tokenization.ids.article_one", "claims.tokenization.ids.article_many"} <= used


def test_each_call_fills_exactly_its_templates_placeholders():
    en = claims_texts("en")
    wrong = [(where, key, names, placeholders(en[key])) for key, names, where in t_calls()
             if names is not None and names != placeholders(en[key])]
    assert wrong == []


@pytest.mark.parametrize("language", ["en", "zh"])
def test_every_template_formats_in_both_languages(language):
    for key, text in claims_texts(language).items():
        filled = text.format(**{name: "⟨x⟩" for name in placeholders(text)})
        assert "{" not in filled and "}" not in filled, key


def test_the_chinese_article_column_quotes_the_article():
    """Each "the article says" text in Chinese is the article's wording: its key phrases appear in article_zh.md."""
    article = (Path(__file__).parents[2] / "shared" / "article" / "article_zh.md")
    if not article.exists():
        pytest.skip("the article (../shared/article/article_zh.md) is not next to this checkout")
    text = re.sub(r"\s", "", article.read_text(encoding="utf-8"))
    zh = claims_texts("zh")
    for key, phrase in {"claims.tokenization.fewer.article": "Token越少计算越快内存占用越低",
                        "claims.tokenization.finer.article": "英文切得更碎",
                        "claims.layers.norm.article": "LayerNorm把向量拉回标准范围",
                        "claims.sampling.loop.article": "容易陷入重复循环",
                        "claims.cost.kv.article": "不用每次重新算",
                        "claims.lm_head.why.article": "后面接巴黎的频率远高于其他词"}.items():
        assert phrase in re.sub(r"[\s，、：；（）“”]", "", zh[key]) and phrase in text, key
    assert all(CJK.search(v) for k, v in zh.items() if k.endswith(".article"))


# ---------------------------------------------------------------- rows measured in Chinese

@pytest.fixture(scope="module")
def zh_rows(smollm2):
    lw.set_language("zh")
    try:
        yield {"二": tokenization.claims(), "三": embedding.claims(smollm2), "四": layers.claims(smollm2),
               "五": lm_head.claims(smollm2), "八": [c8._architecture_claim(c8.cost.gpt2_small(smollm2), smollm2),
                                                   c8._llama_claim(c8.cost.gpt2_small(smollm2))]}
    finally:
        lw.set_language("en")


@pytest.fixture(scope="module")
def en_rows(smollm2):
    return {"二": tokenization.claims(), "四": layers.claims(smollm2), "五": lm_head.claims(smollm2)}


def test_chinese_rows_are_chinese(zh_rows):
    for section, rows in zh_rows.items():
        for c in rows:
            assert CJK.search(c.article) and CJK.search(c.measured), (section, c.article)
            # prompts, token pieces and model names stay as they are; the sentence around them is Chinese
            prose = re.sub(r"'[^']*'|\"[^\"]*\"|smollm2-135m|GPT-2 small|max_new_tokens", "", c.measured)
            assert not ENGLISH_WORDS.search(prose), c.measured


def test_chinese_rows_carry_the_same_numbers_and_verdicts(zh_rows, en_rows):
    for section, en in en_rows.items():
        zh = zh_rows[section]
        assert [c.verdict for c in zh] == [c.verdict for c in en], section
        assert [c.numbers for c in zh] == [c.numbers for c in en], section
        assert [c.said for c in zh] == [c.said for c in en], section


def test_chinese_tokenization_rows_show_their_numbers(zh_rows):
    rows = zh_rows["二"]
    assert rows[0].article == "“法国的首都是什么”→[1374, 11223, 1585, 3425, 30, 40674]，6 个 Token"
    assert rows[2].article == "“巴黎”→[1585]，一个 Token"
    n = rows[1].numbers
    assert rows[1].article == "“法国的首都是什么？”切成 9 个 Token，标点也占一个"
    assert rows[1].measured.startswith(f"GPT-2：{n['tokens']} 个词块，“？”单独占 {n['question_mark_tokens']} 个")
    for row in (rows[0], rows[2], rows[3], rows[4], rows[5]):
        real = row.numbers["gpt2_ids"]
        assert row.measured.startswith(f"GPT-2：{real}（{len(real)} 个词块")
        assert "; " not in row.measured and ": " not in row.measured     # the separators of the Chinese table
    assert f"GPT-2：{rows[6].numbers['english']} 对 {rows[6].numbers['chinese']}" in rows[6].measured


def test_chinese_layer_rows_count_layers_from_0(zh_rows, smollm2):
    row = zh_rows["四"][4]
    path, L = row.numbers, smollm2.config.n_layer
    assert f"在第 0 层之后排第 {path['rank'][1]:,}" in row.measured
    assert f"在第 {L // 2} 层之后排第 {path['rank'][L // 2 + 1]:,}" in row.measured
    assert f"从第 {path['top10_from'] - 1} 层之后起一直在前 10，" in row.measured      # no space inside 从…起
    assert f"从第 {path['top1_from'] - 1} 层之后起才一直排第一（第 0–{L - 1} 层" in row.measured


def test_chinese_paris_row_shows_its_probabilities(zh_rows):
    row = next(c for c in zh_rows["五"] if c.key == "lm_head.paris")
    for w in ("巴黎", "北京"):
        assert f"P({w}) = {row.numbers[w]['p']:.3g}" in row.measured
    assert row.article == "“法国的首都是什么”之后：P(巴) = 0.042，P(北) = 0.018，“巴”的概率最高"
    assert "; " not in row.measured                                  # the pieces are joined by the Chinese "；"


def test_chinese_cost_rows_show_their_numbers(zh_rows):
    arch, llama = zh_rows["八"]
    assert "GPT-2 small：12 层，d_model 768，12 头；按架构数出 124,439,808 个参数" in arch.measured
    assert arch.numbers == {"params": 124_439_808, "shape": (12, 768, 12)} and arch.said == 120e6
    assert llama.article == "LLaMA 7B 一次前向是 GPT-2 的 56 倍"
    assert f"每个词块的 FLOPs 是它的 {llama.numbers['by_flops']:.4g} 倍" in llama.measured
