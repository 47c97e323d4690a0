"""Section 二's claims, measured with GPT-2's real tokenizer (OpenAI's tiktoken) and any other tokenizers given.

The article's token ids are GPT-2 ids (all below 50257), so GPT-2 decides each verdict; SmolLM2's and Gemma-3's
cuts are reported beside it when their tokenizers are passed in.
"""
from __future__ import annotations

from .. import prompts
from ..cost import flops_by_stage, gpt2_config
from ..i18n import t
from . import named
from ..kv_cache import kv_cache_bytes
from ..report import Claim, Table, Verdict, table
from ..tokens import Tokenizer, gpt2_tokenizer

SECTION = "二"
QUESTION = prompts.QUESTION               # the article's sentence, as printed
QUESTION_MARKED = QUESTION + "？"          # with the full-width question mark the article's punctuation remark implies
ENGLISH = prompts.ENGLISH_QUESTION
ARTICLE_IDS = {                          # the article's "tokenizer output"
    QUESTION: [1374, 11223, 1585, 3425, 30, 40674],
    "巴黎": [1585],
    "首都": [3425],
    "人工智": [24597, 5765],
    "ChatGPT": [203, 1372, 1273, 164, 58],
}
ARTICLE_QUESTION_TOKENS = 9              # "法国的首都是什么切成 9 个 Token，标点也占一个"


def visible(tokenizer: Tokenizer, ids) -> str:
    """The pieces of some ids on one line: '␣How|␣je|rist' (␣ a space, control characters and fragments as \\xNN)."""
    def show(piece):
        return "".join("␣" if c == " " else c if c.isprintable() else c.encode("unicode_escape").decode() for c in piece)
    return "|".join(show(p) for p in tokenizer.pieces(ids))


def token_cost_table(texts: list[str], tokenizers: dict[str, Tokenizer]) -> Table:
    """Tokens each tokenizer needs for each text (the <bos> left out), and tokens per character."""
    rows = []
    for text in texts:
        counts = [len(tok.text_ids(text)) for tok in tokenizers.values()]
        rows.append([text.replace("\n", "↵"), len(text)]
                    + [t("claims.tokenization.cost_table.count", n=n, per_char=f"{n / len(text):.2f}") for n in counts])
    return table(rows, [t("claims.tokenization.cost_table.text"), t("claims.tokenization.cost_table.characters")]
                 + [t("claims.tokenization.cost_table.tokens", name=name) for name in tokenizers])


def forward_cost(tokens: int, config=None) -> dict[str, int]:
    """What one forward pass over `tokens` positions costs GPT-2 small (or `config`) to predict the next token: FLOPs
    (the LM head on the last position, as notebook 01 and the rest of the series count) and KV-cache bytes (fp32)."""
    config = config or gpt2_config()
    return {"tokens": tokens, "flops": sum(flops_by_stage(config, tokens, last_only=True).values()),
            "kv_cache_bytes": kv_cache_bytes(config, tokens)}


def elsewhere(values: dict[str, object]) -> str:
    """Other tokenizers' results after GPT-2's: '; SmolLM2: 14; Gemma-3: 4' (the separators of the current language)."""
    return "".join(t("claims.common.sep") + named(name, v) for name, v in values.items())


def _ids_claim(article_text: str, gpt2: Tokenizer, others: dict[str, Tokenizer], note: str = "") -> Claim:
    """'text → [article ids]': the real GPT-2 ids, what the article's ids decode to, other tokenizers' counts."""
    said = ARTICLE_IDS[article_text]
    real = gpt2.encode(article_text)
    article = (t("claims.tokenization.ids.article_one", text=article_text, ids=said, note=note) if len(said) == 1 else
               t("claims.tokenization.ids.article_many", text=article_text, ids=said, n=len(said), note=note))
    return Claim(SECTION, article,
                 t("claims.tokenization.ids.measured", real=real, n=len(real), pieces=visible(gpt2, said),
                   elsewhere=elsewhere({name: len(tok.text_ids(article_text)) for name, tok in others.items()})),
                 Verdict.of(len(real) == len(said), real == said),        # the point: the count; the detail: the ids
                 numbers={"gpt2_ids": real, "article_ids": said}, key="tokenization.ids")


def claims(tokenizers: dict[str, Tokenizer] | None = None) -> list[Claim]:
    """Every claim of section 二, measured. `tokenizers`: extra tokenizers by name, reported beside GPT-2's."""
    gpt2, others = gpt2_tokenizer(), dict(tokenizers or {})
    rows = [_ids_claim(QUESTION, gpt2, others)]

    # "切成 9 个 Token，标点也占一个"
    n = len(gpt2.encode(QUESTION_MARKED))
    mark = n - len(gpt2.encode(QUESTION))
    rows.append(Claim(SECTION, t("claims.tokenization.nine.article", text=QUESTION_MARKED, n=ARTICLE_QUESTION_TOKENS),
                      t("claims.tokenization.nine.measured", n=n, mark=mark,
                        elsewhere=elsewhere({name: len(tok.text_ids(QUESTION_MARKED)) for name, tok in others.items()})),
                      Verdict.of(n == ARTICLE_QUESTION_TOKENS, mark == 1),      # a count: equal, or the point fails
                      numbers={"tokens": n, "question_mark_tokens": mark}, said=ARTICLE_QUESTION_TOKENS,
                      key="tokenization.nine"))

    rows += [_ids_claim("巴黎", gpt2, others), _ids_claim("首都", gpt2, others),
             _ids_claim("人工智", gpt2, others, note=t("claims.tokenization.ids.unseen")),
             _ids_claim("ChatGPT", gpt2, others)]

    # "英文切得更碎": the same question in English and in Chinese
    def pair(tok):
        return len(tok.text_ids(ENGLISH)), len(tok.text_ids(QUESTION_MARKED))
    en, zh = pair(gpt2)
    both = lambda tok: t("claims.tokenization.finer.pair", english=pair(tok)[0], chinese=pair(tok)[1])  # noqa: E731
    rows.append(Claim(SECTION, t("claims.tokenization.finer.article"),
                      t("claims.tokenization.finer.measured", pair=both(gpt2),
                        elsewhere=elsewhere({name: both(tok) for name, tok in others.items()})),
                      Verdict.of(en > zh), numbers={"english": en, "chinese": zh}, key="tokenization.finer"))

    # "Token 越少，计算越快，内存占用越低"
    short, long = sorted([forward_cost(en), forward_cost(zh)], key=lambda c: c["tokens"])
    grows = short["flops"] < long["flops"] and short["kv_cache_bytes"] < long["kv_cache_bytes"]
    rows.append(Claim(SECTION, t("claims.tokenization.fewer.article"),
                      t("claims.tokenization.fewer.measured", short_n=short["tokens"],
                        short_gflops=f"{short['flops'] / 1e9:.3g}", short_kb=f"{short['kv_cache_bytes'] / 1e3:.4g}",
                        long_n=long["tokens"], long_gflops=f"{long['flops'] / 1e9:.3g}",
                        long_kb=f"{long['kv_cache_bytes'] / 1e3:.4g}"),
                      # the point, fewer tokens cost less work and memory, is counted; "faster" (wall time) is not timed
                      Verdict.of(grows, False), numbers={"short": short, "long": long}, key="tokenization.fewer"))

    rows.append(Claim(SECTION, t("claims.tokenization.turbo.article"), t("claims.tokenization.turbo.measured"),
                      Verdict.UNCHECKABLE, key="tokenization.turbo"))
    return rows
