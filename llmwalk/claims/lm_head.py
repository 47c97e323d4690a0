"""Section 五's claims, measured: the LM head of a real model, and what it says after the article's question.

GPT-2's sizes come from its published architecture (`cost.gpt2_config`) and its real tokenizer (50257 entries);
the probabilities are measured on the model passed in (SmolLM2 offline) and on Gemma-3-270M when it is given —
the small model of the three that answers the article's Chinese question in Chinese.
"""
from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Sequence

import torch

from .. import prompts
from ..cost import gpt2_small
from ..head import lm_head, softmax
from ..i18n import quoted, t
from . import below, listed, yes
from ..kv_cache import KVCache
from ..report import Claim, Verdict
from ..sampling import rank_of
from ..tokens import gpt2_tokenizer
from ..walk import forward

if TYPE_CHECKING:
    from ..models import Model

SECTION = "五"
PROMPT, ANSWER = prompts.PROMPT, prompts.ANSWER
QUESTION = prompts.QUESTION                       # the article's question, as printed
GEMMA_QUESTION = prompts.GEMMA_QUESTION          # Gemma answers on the next line
GEMMA_PREFIX = "法国的首都是"                       # "The capital of France is", in Chinese
GEMMA_ANSWER_START = ("法国", "的", "首都", "是")   # how Gemma-3 greedily begins its answer (tests check it)
PARIS, BEIJING = ("巴黎", "巴"), ("北京", "北")      # the word and its first character
ARTICLE_P = {"巴": 0.042, "北": 0.018}
NEAR_TOP = 5                                       # the claim's point: 巴 among the top 5 and above 北
GEMMA_DIGITS = 2            # Gemma's probabilities, as notebook 05's own table: a 3rd digit may change on another CPU


# ---------------------------------------------------------------- measurements

@torch.inference_mode()
def word_probs(model: "Model", ids: Sequence[int], words: Sequence[str]) -> tuple[torch.Tensor, dict[str, dict]]:
    """The next-token distribution after `ids`, and for each word the probability that the model writes exactly
    its pieces next: P(piece 1) · P(piece 2 | piece 1) · … (one factor when the word is one token).

    The prompt runs once into a KV cache; each word's pieces then run from there (the cache is rewound to the
    prompt between words). Returns (probs [vocab], {word: ids, pieces, one_token, chain, p, rank of the first piece}).
    """
    pieces = {w: model.tokenizer.text_ids(w) for w in words}
    cache = KVCache.empty(model.config, len(ids) + max(len(p) for p in pieces.values()))
    probs = softmax(forward(model, ids, cache=cache, record=False, last_only=True).logits[-1])
    out = {}
    for w, p in pieces.items():
        chain = [float(probs[p[0]])]
        if len(p) > 1:
            cache.truncate(len(ids))                                     # back to the end of the prompt
            later = softmax(forward(model, p[:-1], cache=cache, record=False).logits)   # [len(p) - 1, vocab]
            chain += later[torch.arange(len(p) - 1), torch.as_tensor(p[1:])].tolist()
        out[w] = {"ids": p, "pieces": model.tokenizer.pieces(p), "one_token": len(p) == 1, "chain": chain,
                  "p": float(torch.tensor(chain).prod()), "rank": int(rank_of(probs, p[0]))}
    return probs, out


def top_tokens(model: "Model", probs: torch.Tensor, k: int = 1) -> list[tuple[str, float]]:
    """The k most likely next tokens as (piece, probability)."""
    v = probs.topk(k)
    return list(zip(model.tokenizer.pieces(v.indices.tolist()), v.values.tolist()))


@lru_cache(maxsize=16)
def _starting_with(tokenizer, text: str) -> tuple[int, ...]:
    return tuple(i for i, p in enumerate(tokenizer.pieces(range(tokenizer.vocab_size))) if p.startswith(text))


def tokens_starting_with(tokenizer, text: str) -> list[int]:
    """Ids of every vocabulary entry whose text starts with `text` (Gemma-3: 巴 → 巴, 巴黎, 巴西, 巴士, 巴巴).

    A scan of the whole vocabulary, remembered per (tokenizer, text)."""
    return list(_starting_with(tokenizer, text))


def next_char_prob(tokenizer, probs: torch.Tensor, char: str) -> float:
    """P(the next token starts with `char`): the article's P(巴) for a vocabulary that has whole characters
    and words (for byte-level vocabularies, where 巴 is two byte pieces, use word_probs' chain instead)."""
    return float(probs[tokens_starting_with(tokenizer, char)].sum())



# ---------------------------------------------------------------- the claims

def gemma_contexts(gemma: "Model") -> dict[str, list[int]]:
    """The three Chinese contexts measured on Gemma-3: the question, the bare sentence start, and the question
    followed by the start of Gemma's own answer (its tokens, as it writes them)."""
    tok = gemma.tokenizer
    answer = [i for w in GEMMA_ANSWER_START for i in tok.text_ids(w)]
    return {GEMMA_QUESTION: tok.encode(GEMMA_QUESTION), GEMMA_PREFIX: tok.encode(GEMMA_PREFIX),
            GEMMA_QUESTION + "".join(GEMMA_ANSWER_START): tok.encode(GEMMA_QUESTION) + answer}


def paris_verdict(stats: dict[str, dict]) -> Verdict:
    """The point: 巴/巴黎 comes before 北/北京 and among the top 5 next tokens. The detail: it is the most likely.
    The numbers: P(巴) and P(北) against the article's 0.042 and 0.018, by the rule for numbers (off by more than
    ×2, the claim does not hold)."""
    best = min(stats[w]["rank"] for w in PARIS)
    p_paris = max(stats[w]["p"] for w in PARIS)
    p_beijing = max(stats[w]["p"] for w in BEIJING)
    return Verdict.of(best <= NEAR_TOP and p_paris > p_beijing, best == 1,
                      numbers=[(p_paris, ARTICLE_P["巴"]), (p_beijing, ARTICLE_P["北"])])


def _show(stats: dict[str, dict], digits: int = 3) -> str:
    def one(w):
        s, p = stats[w], f"{stats[w]['p']:.{digits}g}"
        if s["one_token"]:
            return t("claims.lm_head.word_one", word=w, p=p, rank=f"{s['rank']:,}")
        return t("claims.lm_head.word_pieces", word=w, p=p, n=len(s["ids"]), rank=f"{s['rank']:,}")
    return t("claims.common.sep").join(one(w) for w in PARIS + BEIJING)


def _top(model, probs, digits: int = 3) -> str:
    (piece, p), = top_tokens(model, probs)
    return t("claims.lm_head.top", piece=quoted(piece), p=f"{p:.{digits}g}")


def claims(model: "Model", gemma: "Model | None" = None) -> list[Claim]:
    """Every claim of section 五, measured on `model` (SmolLM2 offline) and on Gemma-3-270M when given."""
    config, rows = model.config, []
    gpt2 = gpt2_small(model)
    gpt2_vocab = len(gpt2_tokenizer())
    vocabs = {m.config.name: m.weights.output.shape[0] for m in (model, gemma) if m is not None}
    rows.append(Claim(SECTION, t("claims.lm_head.logits.article"),
                      t("claims.lm_head.logits.measured", d_model=gpt2.d_model, vocab=gpt2_vocab,
                        models=listed(t("claims.lm_head.logits.model", name=name, n=n) for name, n in vocabs.items())),
                      Verdict.of((gpt2.d_model, gpt2_vocab) == (768, 50257)),
                      numbers={"d_model": gpt2.d_model, "vocab": gpt2_vocab, **vocabs}, key="lm_head.logits"))

    ids = model.tokenizer.encode(PROMPT)
    trace = forward(model, ids, record=False)
    h, w = trace.final[-1], model.weights.output
    logits = lm_head(h[None], w)[0]
    probs = softmax(logits)
    token = model.tokenizer.token_id(ANSWER)
    same = float((logits - trace.logits[-1]).abs().max())
    rows.append(Claim(SECTION, t("claims.lm_head.linear.article"),
                      t("claims.lm_head.linear.measured", model=config.name, d=h.shape[0], shape=list(w.shape),
                        n=logits.shape[0], diff=below(same, "1e-04"),
                        total=f"{float(probs.sum()):.4f}", prompt=quoted(PROMPT), answer=quoted(ANSWER),
                        p=f"{float(probs[token]):.2f}", rank=int(rank_of(probs, token))),
                      Verdict.of(same < 1e-4 and abs(float(probs.sum()) - 1) < 1e-4),
                      numbers={"max_diff": same, "sum": float(probs.sum()), "p_answer": float(probs[token])},
                      key="lm_head.linear"))

    tied = model.weights.output is model.weights.token_embd
    saved = w.shape[0] * w.shape[1]
    how = (t("claims.lm_head.tied.saves", millions=f"{saved / 1e6:.1f}", share=f"{saved / config.n_params:.0%}")
           if tied else t("claims.lm_head.tied.separate"))
    rows.append(Claim(SECTION, t("claims.lm_head.tied.article"),
                      t("claims.lm_head.tied.measured", model=config.name, gpt2_tied=yes(gpt2.tied_embeddings),
                        tied=yes(tied), how=how),
                      # the point: a linear layer (a separate head is one too); the detail, GPT-2's head is its
                      # table: its published architecture says so (the weights are online only)
                      Verdict.of(True, gpt2.tied_embeddings), numbers={"tied": tied, "gpt2_tied": gpt2.tied_embeddings},
                      key="lm_head.tied"))

    chat = model.tokenizer.chat_template is not None
    probs, stats = word_probs(model, model.tokenizer.encode(QUESTION, chat=chat), PARIS + BEIJING)
    rows.append(Claim(SECTION, t("claims.lm_head.paris.article"),
                      t("claims.lm_head.paris.measured", model=config.name,
                        chat=t("claims.lm_head.paris.chat") if chat else "", top=_top(model, probs),
                        words=_show(stats)),
                      paris_verdict(stats), numbers=stats, key="lm_head.paris"))

    if gemma is None:
        rows.append(Claim(SECTION, t("claims.lm_head.no_gemma.article"), t("claims.lm_head.no_gemma.measured"),
                          Verdict.UNCHECKABLE, key="lm_head.no_gemma"))
    else:
        for text, ids in gemma_contexts(gemma).items():
            probs, stats = word_probs(gemma, ids, PARIS + BEIJING)
            chars = {c: next_char_prob(gemma.tokenizer, probs, c) for c in ("巴", "北")}
            rows.append(Claim(SECTION, t("claims.lm_head.gemma.article", text=quoted(text)),
                              t("claims.lm_head.gemma.measured", model=gemma.config.name,
                                top=_top(gemma, probs, GEMMA_DIGITS), words=_show(stats, GEMMA_DIGITS),
                                p_ba=f"{chars['巴']:.{GEMMA_DIGITS}g}", p_bei=f"{chars['北']:.{GEMMA_DIGITS}g}"),
                              paris_verdict(stats),
                              numbers={**stats, "next_char": chars}, key="lm_head.gemma"))

    rows.append(Claim(SECTION, t("claims.lm_head.why.article"), t("claims.lm_head.why.measured"),
                      Verdict.UNCHECKABLE, key="lm_head.why"))
    return rows
