"""The Chinese edition reads as one text: the glossary's terms (notebooks/zh/GLOSSARY.md), ratios said right, no
line break inside a Chinese paragraph, Chinese in “” — in the notebooks' prose, llmwalk/strings/zh/*.toml and the
notebooks' stored outputs. Each problem names the file, the cell (0-based, all cells counted) or key, and the text."""
from __future__ import annotations

import json
import re
import unicodedata
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:                                   # pragma: no cover - the test command runs 3.11
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
ZH = REPO / "notebooks" / "zh"
GLOSSARY = ZH / "GLOSSARY.md"
STRINGS = REPO / "llmwalk" / "strings" / "zh"
ARTICLE = REPO.parent / "shared" / "article" / "article_zh.md"

HAN = "\u3400-\u9fff"
CJK = HAN + "\u3000-\u303f\uff00-\uffef“”‘’"
# “快 X 倍”, “多了 X 倍”, “多 X×”, “少 X×”: in Chinese these say X times *more* than the base.
# (最多 / 至少 X 倍, “at most / at least”, are fine.)
RATIO = re.compile(r"(?<![最至差])(快|慢|多了?|少了?)\s*\{?[\w.]*\d[\w.]*\}?\s*(倍|×)"
                   r"|(?<![最至差])(快|慢|多了?|少了?)\s*\{\w+\}\s*(倍|×)|多出的倍数")
HAN_BREAK = re.compile(rf"[{CJK}]\n[{CJK}]")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)
QUOTE = re.compile(r"“[^”]*”")


def glossary() -> list[tuple[list[str], list[str]]]:
    """(the terms to use, the variants not to use) of each glossary row that names variants."""
    rows = []
    for line in GLOSSARY.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[2] and not set(cells[2]) <= set("-") and cells[2] != "不用":
            split = lambda s: [x.strip() for x in re.split("[；;]", s) if x.strip()]
            rows.append((split(cells[1]), split(cells[2])))
    return rows


def _article() -> str:
    """The article's text; in a clone without ../shared, the claims' quotes of it (test_claims_i18n checks those
    against the article where it is)."""
    if ARTICLE.exists():
        return ARTICLE.read_text(encoding="utf-8")
    return "\n".join(text for key, text in _strings().items() if key.endswith(".article"))


def _bare(text: str) -> str:
    """Letters, digits and hanzi only: the scraped article lost much of its punctuation."""
    return re.sub(r"[^\w]", "", text)


def _quoted_from_article(text: str, start: int, end: int, article: str) -> bool:
    """Whether text[start:end] quotes the article: inside “…” whose words are the article's (any “…” when the article
    is not here), or in a quote without marks (a block quote, a claim's "article says") whose words around it are."""
    for m in QUOTE.finditer(text):
        if m.start() <= start and end <= m.end():
            return not article or _bare(m.group(0)) in _bare(article)
    if not article:
        return False
    word = len(_bare(text[start:end]))
    return any(len(_bare(w)) > word + 3 and _bare(w) in _bare(article)
               for w in (text[start:end + 12], text[max(0, start - 12):end]))


def term_problems(text: str, *, article: str = "") -> list[str]:
    """Every variant the glossary rejects, outside code and article quotes; a variant inside one of its row's own
    longer terms (印在 in 打印在) is that term."""
    prose = CODE.sub(lambda m: " " * len(m.group(0)), text)
    found = []
    for use, avoid in glossary():
        spans = [(m.start(), m.end()) for u in use for m in re.finditer(re.escape(u), prose)]
        for variant in avoid:
            for m in re.finditer(re.escape(variant), prose):
                inside_a_term = any(a < m.end() and m.start() < b and (a < m.start() or b > m.end()) for a, b in spans)
                if not inside_a_term and not _quoted_from_article(prose, m.start(), m.end(), article):
                    found.append(f"{variant!r} (use {' / '.join(use)}): …{prose[max(0, m.start() - 15):m.end() + 15]}…")
    return found


def ratio_problems(text: str) -> list[str]:
    return [f"ratio said as {m.group(0)!r} (say 是……的 X 倍 or 只有……的 1/X): …{text[max(0, m.start() - 15):m.end() + 10]}…"
            for m in RATIO.finditer(CODE.sub(" ", text))]


def typography_problems(text: str) -> list[str]:
    """Line breaks between two Chinese characters of one paragraph, Chinese in ASCII quotes, a space between a
    Chinese character and a Chinese quote, and bold that CommonMark does not render."""
    prose = CODE.sub(lambda m: " " * len(m.group(0)), text)
    return ([f"line break inside a Chinese paragraph: {prose[m.start() - 10:m.end() + 10]!r}"
             for m in HAN_BREAK.finditer(prose)] +
            [f"Chinese in ASCII quotes (use “”): {q}" for q in _ascii_quoted(prose) if re.search(f"[{HAN}]", q)] +
            [f"a space beside a Chinese quote: {text[m.start() - 6:m.end() + 6]!r}"
             for m in re.finditer(f"[{HAN}，。：；？！] +“|” +[{HAN}，。：；？！]",
                                  CODE.sub(lambda m: "`" * len(m.group(0)), text))] +
            [f"bold that shows its asterisks: {b!r}" for b in _unrendered_bold(prose)])


def _punctuation(c: str) -> bool:
    return c == "" or unicodedata.category(c)[0] in "PS"


def _unrendered_bold(text: str) -> list[str]:
    """`**` runs CommonMark cannot open or close: "**下面一排：**同样" (a closer after punctuation, before a letter)
    shows its asterisks; write "**下面一排**：同样". Lines with an odd number of runs (bold across lines) are skipped."""
    bad = []
    for line in text.splitlines():
        runs = list(re.finditer(r"(?<!\*)\*\*(?!\*)", line))
        if len(runs) % 2:
            continue
        for k, m in enumerate(runs):
            before = line[m.start() - 1] if m.start() else ""
            after = line[m.end()] if m.end() < len(line) else ""
            if k % 2 == 0:      # an opener: not followed by space; after punctuation only if space/punctuation before
                ok = not (after == "" or after.isspace()) and (not _punctuation(after) or before == ""
                                                                 or before.isspace() or _punctuation(before))
            else:               # a closer, the mirror image
                ok = not (before == "" or before.isspace()) and (not _punctuation(before) or after == ""
                                                                   or after.isspace() or _punctuation(after))
            if not ok:
                bad.append(line[max(0, m.start() - 12):m.end() + 12])
    return bad


def test_a_latin_word_beside_chinese_gets_one_space_in_figures():
    from llmwalk.viz._draw import spaced
    assert spaced("去掉该层的FFN") == "去掉该层的 FFN" and spaced("去掉该层的注意力") == "去掉该层的注意力"
    assert spaced("layer 3 attention removed") == "layer 3 attention removed"


def test_the_typography_checks_catch_what_they_name():
    assert _unrendered_bold("- **下面一排：**同样十个词块") and not _unrendered_bold("- **下面一排**：同样十个词块")
    assert _unrendered_bold("从**残差（归一化后）**中抽取") and not _unrendered_bold("每点一次**下一个词块**，")
    assert typography_problems("下面是 “The capital” 之后") and not typography_problems("下面是“The capital”之后")


def _ascii_quoted(text: str) -> list[str]:
    """The spans of each line between ASCII quotes, paired in order (" Paris" 和 " Berlin": two English spans)."""
    spans = []
    for line in text.splitlines():
        at = [i for i, c in enumerate(line) if c == '"']
        spans += [line[a:b + 1] for a, b in zip(at[::2], at[1::2])]
    return spans


def _notebooks() -> list[Path]:
    return sorted(ZH.rglob("*.ipynb"))


def _outputs(cell: dict) -> str:
    texts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            texts.append("".join(out["text"]))
        for mime in ("text/plain", "text/markdown"):
            if mime in out.get("data", {}):
                texts.append("".join(out["data"][mime]))
    return "\n".join(texts)


def _strings() -> dict[str, str]:
    texts: dict[str, str] = {}

    def walk(node, prefix):
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}.{key}")
            elif isinstance(value, str):
                texts[f"{prefix}.{key}"] = value
    for path in sorted(STRINGS.glob("*.toml")):
        walk(tomllib.loads(path.read_text(encoding="utf-8")), path.stem)
    return texts


def notebook_problems(path: Path, *, article: str = "") -> list[str]:
    problems = []
    for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
        where = f"{path.relative_to(ZH)} cell {i}"
        if cell["cell_type"] == "markdown":
            text = "".join(cell["source"])
            found = term_problems(text, article=article) + ratio_problems(text) + typography_problems(text)
        else:
            text = _outputs(cell)            # stored outputs: what llmwalk's zh strings and the cell printed
            found = term_problems(text, article=article) + ratio_problems(text)
        problems += [f"{where}: {p}" for p in found]
    return problems


def strings_problems(texts: dict[str, str], *, article: str = "") -> list[str]:
    """A string's line breaks are the figure's own (a two-line label), so only its quotes are typography here."""
    return [f"strings/zh {key}: {p}" for key, text in texts.items()
            for p in term_problems(text, article=article) + ratio_problems(text)
            + [q for q in typography_problems(text) if not q.startswith("line break")]]


@pytest.mark.parametrize("notebook", [str(p.relative_to(ZH)) for p in _notebooks()])
def test_the_chinese_notebook_follows_the_glossary(notebook):
    problems = notebook_problems(ZH / notebook, article=_article())
    assert not problems, "\n".join(problems)


def test_the_chinese_strings_follow_the_glossary():
    problems = strings_problems(_strings(), article=_article())
    assert not problems, "\n".join(problems)


def test_there_are_chinese_notebooks_and_a_glossary():
    assert len(_notebooks()) >= 12
    assert len(glossary()) >= 15


# ---------------------------------------------------------------- the checks catch what the review found

@pytest.mark.parametrize("text", [
    "第 5 层的逻辑值", "勾选聊天模板", "从德国移植残差流", "白送一个词块", "下面每块芯片是一个词块", "这张结论表",
    "熵是 2.1 奈特", "4 位模型", "它的静态孪生", "最终 norm 之后", "单元格印出了两个比值", "滑块需要活的内核",
    "平局：所有 logit 相等", "嵌入表的一行", "有 KV cache 时", "文章的一轮轮", "五十次传播", "取决于 CPU 的计算核"])
def test_each_rejected_variant_is_found(text):
    assert term_problems(text), text


@pytest.mark.parametrize("text", [
    "单元格打印在下面", "logits（未归一化的分数）", "KV 缓存", "Embedding 表", "最终归一化", "计算内核（kernel）",
    "并列", "速度是普通解码的 0.51 倍", "`llm.logits` 与 `KV cache`", "最多 1.5 ×", "至少 2 倍"])
def test_the_glossarys_own_terms_pass(text):
    assert not term_problems(text) and not ratio_problems(text), text


@pytest.mark.parametrize("text", ["快 0.51 倍", "（多了 1.51 倍）", "全部重算 12.83 B（多 47×）", "有缓存时 FLOPs 少 21.1×",
                                  "多了 {too_many}×", "少 {answer_ratio}×", "无缓存多出的倍数"])
def test_wrong_ratio_phrasings_are_found(text):
    assert ratio_problems(text), text


def test_typography_problems_are_found_and_code_is_left_alone():
    assert typography_problems("合并名次最小的\n那一对")
    assert typography_problems('现在换成文章的句子"法国的首都是什么"')
    assert not typography_problems('第一段。\n\n第二段，GPT-2\n的词表；`print("法国")`')
    assert not typography_problems("句子“法国的首都是什么”")


def test_an_article_quote_keeps_the_articles_word():
    article = "每生成一个 token，都要查 KV Cache 里的内容"
    assert not term_problems("文章说“都要查 KV Cache 里的内容”", article=article)
    assert not term_problems("> 都要查 KV Cache，里的内容", article=article)        # a block quote, punctuation restored
    assert term_problems("我们的 KV Cache 里", article=article)
    assert term_problems("文章说“KV Cache 是假的”", article=article)      # not the article's words
