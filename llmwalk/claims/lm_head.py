"""Section 五's claims, measured: the LM head of a real model, and what it says after the article's question.

GPT-2's sizes come from its published architecture (`cost.gpt2_config`) and its real tokenizer (50257 entries);
the probabilities are measured on the model passed in (SmolLM2 offline) and on Gemma-3-270M when it is given —
the small model of the three that answers the article's Chinese question in Chinese.
"""
from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Sequence

import torch

from ..cost import gpt2_config
from ..head import lm_head, softmax
from ..kv_cache import KVCache
from ..report import Claim
from ..tokens import gpt2_tokenizer
from ..walk import forward
from .tokenization import DIFFERS, HOLDS, ROUGHLY, UNCHECKABLE

if TYPE_CHECKING:
    from ..models import Model

SECTION = "五"
PROMPT, ANSWER = "The capital of France is", " Paris"
QUESTION = "法国的首都是什么"                       # the article's question, as printed
GEMMA_QUESTION = "法国的首都是什么？\n"              # with its question mark and a line break: Gemma answers on the next line
GEMMA_PREFIX = "法国的首都是"                       # "The capital of France is", in Chinese
GEMMA_ANSWER_START = ("法国", "的", "首都", "是")   # how Gemma-3 greedily begins its answer (tests check it)
PARIS, BEIJING = ("巴黎", "巴"), ("北京", "北")      # the word and its first character
ARTICLE_P = {"巴": 0.042, "北": 0.018}
NEAR_TOP = 5                                       # "roughly": 巴 among the top 5 and above 北


def rank_of(probs: torch.Tensor, token: int) -> int:
    """1 for the most likely token."""
    return int((probs > probs[token]).sum()) + 1


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
            for layer in cache.layers:
                layer.length = len(ids)                                  # back to the end of the prompt
            later = softmax(forward(model, p[:-1], cache=cache, record=False).logits)   # [len(p) - 1, vocab]
            chain += later[torch.arange(len(p) - 1), torch.as_tensor(p[1:])].tolist()
        out[w] = {"ids": p, "pieces": model.tokenizer.pieces(p), "one_token": len(p) == 1, "chain": chain,
                  "p": float(torch.tensor(chain).prod()), "rank": rank_of(probs, p[0])}
    return probs, out


def top(model: "Model", probs: torch.Tensor, k: int = 1) -> list[tuple[str, float]]:
    """The k most likely next tokens as (piece, probability)."""
    v = probs.topk(k)
    return list(zip(model.tokenizer.pieces(v.indices.tolist()), v.values.tolist()))


def gemma_contexts(gemma: "Model") -> dict[str, list[int]]:
    """The three Chinese contexts measured on Gemma-3: the question, the bare sentence start, and the question
    followed by the start of Gemma's own answer (its tokens, as it writes them)."""
    tok = gemma.tokenizer
    answer = [i for w in GEMMA_ANSWER_START for i in tok.text_ids(w)]
    return {GEMMA_QUESTION: tok.encode(GEMMA_QUESTION), GEMMA_PREFIX: tok.encode(GEMMA_PREFIX),
            GEMMA_QUESTION + "".join(GEMMA_ANSWER_START): tok.encode(GEMMA_QUESTION) + answer}


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


def paris_verdict(stats: dict[str, dict]) -> str:
    """✓ when 巴/巴黎 is the most likely next token; ≈ when it is in the top 5 and above 北/北京; else ✗."""
    best = min(stats[w]["rank"] for w in PARIS)
    p_paris = max(stats[w]["p"] for w in PARIS)
    p_beijing = max(stats[w]["p"] for w in BEIJING)
    if best == 1:
        return HOLDS
    return ROUGHLY if best <= NEAR_TOP and p_paris > p_beijing else DIFFERS


def _show(stats: dict[str, dict]) -> str:
    def one(w):
        s = stats[w]
        if s["one_token"]:
            return f"P({w}) = {s['p']:.3g}, rank {s['rank']:,}"
        return f"P({w}) = {s['p']:.3g} ({len(s['ids'])} pieces; the first ranks {s['rank']:,})"
    return "; ".join(one(w) for w in PARIS + BEIJING)


def _top(model, probs) -> str:
    (piece, p), = top(model, probs)
    return f"top: {piece!r} ({p:.4f})"


def claims(model: "Model", gemma: "Model | None" = None) -> list[Claim]:
    """Every claim of section 五, measured on `model` (SmolLM2 offline) and on Gemma-3-270M when given."""
    config, rows = model.config, []
    gpt2 = config if config.family == "gpt2" else gpt2_config()
    gpt2_vocab = len(gpt2_tokenizer())
    vocabs = {m.config.name: m.weights.output.shape[0] for m in (model, gemma) if m is not None}
    rows.append(Claim(SECTION, "the last token's 768-d vector → LM head → 50257 logits, one per word of the vocabulary",
                      f"GPT-2: d_model {gpt2.d_model} (published config), vocabulary {gpt2_vocab} (its tokenizer); "
                      + ", ".join(f"{name}: {n} logits" for name, n in vocabs.items()),
                      HOLDS if (gpt2.d_model, gpt2_vocab) == (768, 50257) else DIFFERS))

    ids = model.tokenizer.encode(PROMPT)
    trace = forward(model, ids, record=False)
    h, w = trace.final[-1], model.weights.output
    logits = lm_head(h[None], w)[0]
    probs = softmax(logits)
    token = model.tokenizer.token_id(ANSWER)
    same = float((logits - trace.logits[-1]).abs().max())
    rows.append(Claim(SECTION, "LM head = one linear layer from the hidden size to the vocabulary; softmax gives probabilities",
                      f"{config.name}: [{h.shape[0]}] · W{list(w.shape)}ᵀ → {logits.shape[0]} logits (= the model's own, "
                      f"max |Δ| {'< 1e-04' if same < 1e-4 else f'{same:.3g}'}); softmax sums to {float(probs.sum()):.4f}; "
                      f"after {PROMPT!r}: P({ANSWER!r}) = {float(probs[token]):.4f}, rank {rank_of(probs, token)}",
                      HOLDS if same < 1e-4 and abs(float(probs.sum()) - 1) < 1e-4 else DIFFERS))

    tied = model.weights.output is model.weights.token_embd
    saved = w.shape[0] * w.shape[1]
    rows.append(Claim(SECTION, "the head multiplies by Wᵀ: GPT-2's token embedding table, transposed (tied)",
                      f"{config.name}: output is token_embd: {tied}; "
                      + (f"one table instead of two saves {saved / 1e6:.1f} M parameters "
                         f"({saved / config.n_params:.0%} of the model)" if tied else "a separate output matrix"),
                      HOLDS if tied else ROUGHLY))

    chat = model.tokenizer.chat_template is not None
    probs, stats = word_probs(model, model.tokenizer.encode(QUESTION, chat=chat), PARIS + BEIJING)
    rows.append(Claim(SECTION, "after 法国的首都是什么: P(巴) = 0.042, P(北) = 0.018, 巴 the most likely",
                      f"{config.name}{' (chat template)' if chat else ''}: {_top(model, probs)}; {_show(stats)}",
                      paris_verdict(stats)))

    if gemma is None:
        rows.append(Claim(SECTION, "…the same on a model that answers in Chinese",
                          "Gemma-3-270M not loaded (pip install -e '.[gemma]', then pass gemma=...)", UNCHECKABLE))
    else:
        for text, ids in gemma_contexts(gemma).items():
            probs, stats = word_probs(gemma, ids, PARIS + BEIJING)
            chars = {c: next_char_prob(gemma.tokenizer, probs, c) for c in ("巴", "北")}
            rows.append(Claim(SECTION, f"…on Gemma-3 after {text!r}",
                              f"{gemma.config.name}: {_top(gemma, probs)}; {_show(stats)}; next character 巴: "
                              f"{chars['巴']:.3g}, 北: {chars['北']:.3g}", paris_verdict(stats)))

    rows.append(Claim(SECTION, "巴 wins because in training text 法国的首都是… is followed by 巴黎 far more often",
                      "no training corpus here: the models' preferences are measured above, not their causes",
                      UNCHECKABLE))
    return rows
