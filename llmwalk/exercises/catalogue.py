"""Every exercise: its cases (plain, edge, adversarial), llmwalk's reference, and the mistakes it recognises.

Cases run in order, simplest first, so the first failure points at one idea. A diagnosis recomputes the usual
wrong answer (no scale, no mask, unbiased variance ...) on the failing input and names it when it matches.
"""
from __future__ import annotations

import math
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import (Norm, apply_temperature, causal_mask, gpt2_config, gpt2_tokenizer, greedy, kv_cache_bytes,
                layer_norm, lm_head, rms_norm, softmax, token_embedding, top_k_filter, top_p_filter)
from .grader import Case, Exercise

INF = float("inf")


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape: int, seed: int = 0, scale: float = 1.0) -> Tensor:
    return torch.randn(*shape, generator=_gen(seed)) * scale


def _close(a, b) -> bool:
    return isinstance(a, Tensor) and isinstance(b, Tensor) and a.shape == b.shape and \
        torch.allclose(a.float(), b.float(), rtol=1e-4, atol=1e-5, equal_nan=False)


def _first_match(got, candidates: dict[str, object]) -> str | None:
    """The hint of the first wrong variant that `got` equals."""
    return next((hint for hint, variant in candidates.items() if _close(got, variant)), None)


# ---------------------------------------------------------------- 02 tokenization

def gpt2_ranks() -> dict[bytes, int]:
    """GPT-2's merge table, token bytes -> rank (lower merges first): a copy of tiktoken's, yours to change."""
    return dict(gpt2_tokenizer().encoding._mergeable_ranks)


def _bpe_reference(piece: bytes, ranks: dict[bytes, int]) -> list[bytes]:
    """tiktoken's own byte-pair merge of one pre-split piece."""
    encoding = gpt2_tokenizer().encoding
    return [encoding.decode_single_token_bytes(i) for i in encoding._encode_single_piece(piece)]


def _bpe_cases() -> list[Case]:
    ranks = gpt2_ranks()
    order = "merge the adjacent pair whose joined bytes have the LOWEST rank first, then look again, until no pair is in ranks"
    words = [("one byte", b"a", "a single byte is already a token: return [piece]"),
             ("a common word", b"hello", order),
             ("a word with its leading space", b" world", order),
             ("a long word", b" tokenization", order),
             ("a repeated letter", b"aaaaaaa", "when the best pair occurs several times, merge the leftmost first"),
             ("北京 (UTF-8 bytes)", "北京".encode(), order),
             (" 北京 with a space", " 北京".encode(), order),
             ("an emoji (4 bytes)", "🙂".encode(), order),
             ("a rare long word", b" antidisestablishmentarianism", order)]
    return [Case(label, (piece, ranks), hint) for label, piece, hint in words]


def _bpe_diagnose(case: Case, expected, got) -> str | None:
    piece = case.args[0]
    if isinstance(got, list) and got == [bytes([b]) for b in piece]:
        return "nothing was merged: join the best pair, then repeat while some adjacent pair is in ranks"
    if got == [piece] and expected != [piece]:
        return "only merge a pair whose joined bytes are a key of ranks"
    if isinstance(got, list) and got and isinstance(got[0], str):
        return "work on bytes, not str: bytes([b]) for each byte of the piece, and join pairs with a + b"
    return None


# ---------------------------------------------------------------- 03 embedding

def _embed_cases() -> list[Case]:
    table = _randn(10, 4, seed=1)
    return [Case("three different ids", (torch.tensor([2, 7, 5]), table), "one row of the table per id: table[ids]"),
            Case("the same id twice", (torch.tensor([3, 3, 1]), table), "a repeated id gives the same row twice"),
            Case("one token (T = 1)", (torch.tensor([4]), table), "T = 1 still returns a [1, d] matrix"),
            Case("the first and the last row", (torch.tensor([0, 9]), table), "ids start at 0: row i is table[i]")]


def _embed_diagnose(case: Case, expected, got) -> str | None:
    ids, table = case.args
    return _first_match(got, {"off by one: row i of the table is table[i], ids count from 0": table[(ids + 1) % 10],
                              "off by one the other way: row i is table[i]": table[ids - 1]})


def _cosine_cases() -> list[Case]:
    a = _randn(8, seed=2)
    return [Case("a vector and itself, scaled by 3", (a, 3 * a), "length must not matter: divide by both norms"),
            Case("opposite vectors", (a, -a), "opposite directions give -1"),
            Case("perpendicular vectors", (torch.tensor([1.0, 0, 0]), torch.tensor([0, 2.0, 0])),
                 "perpendicular vectors give 0"),
            Case("random vectors", (a, _randn(8, seed=3)), "cos = a·b / (|a| |b|)"),
            Case("batched: [3, 8] against one [8] vector", (_randn(3, 8, seed=4), a),
                 "work over the last dim (dim=-1) so a batch of rows compares each row with b")]


def _cosine_reference(a: Tensor, b: Tensor) -> Tensor:
    return F.cosine_similarity(a, b, dim=-1)


def _cosine_diagnose(case: Case, expected, got) -> str | None:
    a, b = case.args
    dot = (a * b).sum(-1)
    return _first_match(got, {"that is the dot product: divide by |a| and |b|": dot,
                              "divide by both lengths, |a| · |b|, not by one of them": dot / a.norm(dim=-1)})


# ---------------------------------------------------------------- 04 layers

def _mask_cases() -> list[Case]:
    hint = "row i is query i, column j is key j: True where j <= i (the token itself and everything before it)"
    return [Case(f"T = {t}", (t,), hint) for t in (1, 2, 3, 5, 8)]


def _mask_diagnose(case: Case, expected, got) -> str | None:
    if not isinstance(got, Tensor) or got.shape != expected.shape:
        return None
    if got.dtype != torch.bool:
        return "make it a bool tensor, e.g. torch.ones(T, T, dtype=torch.bool).tril()"
    t = case.args[0]
    ones = torch.ones(t, t, dtype=torch.bool)
    variants = {"the diagonal is missing: a token may look at itself (j <= i, not j < i)": ones.tril(-1),
                "off by one: the next token is visible too (j <= i, not j <= i + 1)": ones.tril(1),
                "transposed: rows are queries, columns keys, so it is lower-triangular (tril)": ones.triu(),
                "inverted: True means *may look*, so the past is True and the future False": ~ones.tril()}
    return next((hint for hint, v in variants.items() if torch.equal(got, v)), None)


def _attention_reference(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _attention_cases() -> list[Case]:
    def qkv(h, t, d, seed):
        return tuple(_randn(h, t, d, seed=seed + i) for i in range(3))
    return [Case("one token (T = 1)", qkv(1, 1, 4, 10), "one token attends only to itself: the output is v"),
            Case("2 heads, T = 4, d_head = 8", qkv(2, 4, 8, 20),
                 "scores = q @ kᵀ / √d_head, mask the future with -inf, softmax over the keys, then @ v"),
            Case("4 heads, T = 6, d_head = 16", qkv(4, 6, 16, 30), "check the scale: divide by √d_head"),
            Case("1 head, T = 5, d_head = 64", qkv(1, 5, 64, 40), "check the scale: divide by √d_head"),
            Case("large scores (q × 30)", (_randn(2, 5, 8, seed=50) * 30, *qkv(2, 5, 8, 51)[1:]),
                 "softmax must not overflow: use torch.softmax, or subtract the row max first")]


def _attention_diagnose(case: Case, expected, got) -> str | None:
    q, k, v = case.args
    d = q.shape[-1]
    if isinstance(got, Tensor) and got.isnan().any():
        return ("a row of the scores is all -inf: the mask must keep the diagonal (each token sees itself), "
                "or the softmax overflowed")
    sdpa = F.scaled_dot_product_attention
    return _first_match(got, {
        "the 1/√d_head scale is missing: scores = q @ k.transpose(-2, -1) / math.sqrt(d_head)":
            sdpa(q, k, v, is_causal=True, scale=1.0),
        "divide by √d_head, not d_head": sdpa(q, k, v, is_causal=True, scale=1 / d),
        "the causal mask is missing: set scores of future keys (j > i) to -inf before the softmax":
            sdpa(q, k, v, is_causal=False),
        "softmax over the wrong dimension: each query's weights over the keys (dim=-1) sum to 1":
            ((q @ k.transpose(-2, -1) / math.sqrt(d)).masked_fill(~causal_mask(q.shape[1]), -INF)
             .softmax(-2).nan_to_num() @ v),
    })


def _rms_reference(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return rms_norm(x, Norm(weight), eps)


def _rms_cases() -> list[Case]:
    w = 1 + _randn(8, seed=60, scale=0.5)
    zero = torch.cat([torch.zeros(1, 8), _randn(1, 8, seed=61)])
    return [Case("weight of ones, [3, 8]", (_randn(3, 8, seed=62), torch.ones(8), 1e-5),
                 "divide each row by sqrt(mean(x²) + eps); RMSNorm does not subtract the mean"),
            Case("one token (T = 1) with a learned weight", (_randn(1, 8, seed=63), w, 1e-5),
                 "multiply by weight after normalizing"),
            Case("a zero vector", (zero, w, 1e-6),
                 "a zero vector has RMS 0: eps inside the square root keeps it finite, sqrt(mean(x²) + eps)"),
            Case("a large eps (0.5) on small values", (_randn(2, 8, seed=64, scale=0.1), w, 0.5),
                 "eps goes inside the square root, added to mean(x²), not to the root"),
            Case("leading dims [2, 3, 8]", (_randn(2, 3, 8, seed=65), w, 1e-5),
                 "take the mean over the last dim only (dim=-1, keepdim=True)")]


def _rms_diagnose(case: Case, expected, got) -> str | None:
    x, w, eps = case.args
    ms = x.pow(2).mean(-1, keepdim=True)
    if isinstance(got, Tensor) and got.isnan().any():
        return "NaN on a zero vector: add eps inside the square root, sqrt(mean(x²) + eps)"
    return _first_match(got, {
        "the learned weight is missing: multiply by weight": x / torch.sqrt(ms + eps),
        "eps belongs inside the square root: sqrt(mean(x²) + eps)": x / (torch.sqrt(ms) + eps) * w,
        "that is LayerNorm: RMSNorm does not subtract the mean": F.layer_norm(x, (x.shape[-1],), w, None, eps),
        "mean over the wrong dimension: normalize each row over the last dim": x / torch.sqrt(
            x.pow(2).mean(0, keepdim=True) + eps) * w,
    })


def _ln_reference(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    return layer_norm(x, Norm(weight, bias), eps)


def _ln_cases() -> list[Case]:
    w, b = 1 + _randn(8, seed=70, scale=0.5), _randn(8, seed=71, scale=0.5)
    flat = torch.cat([torch.full((1, 8), 3.0), _randn(1, 8, seed=72)])
    return [Case("weight 1, bias 0, [3, 8]", (_randn(3, 8, seed=73), torch.ones(8), torch.zeros(8), 1e-5),
                 "subtract the mean of each row, divide by sqrt(variance + eps)"),
            Case("a learned weight and bias", (_randn(2, 8, seed=74), w, b, 1e-5),
                 "multiply by weight, then add bias"),
            Case("only 4 features", (_randn(3, 4, seed=75), w[:4], b[:4], 1e-5),
                 "use the biased variance (divide by d, not d - 1): x.var(-1, unbiased=False)"),
            Case("a constant row (variance 0)", (flat, w, b, 1e-5),
                 "a constant row has variance 0: eps inside the square root keeps it finite"),
            Case("one token (T = 1)", (_randn(1, 8, seed=76), w, b, 1e-5), "normalize over the last dim"),
            Case("leading dims [2, 3, 8]", (_randn(2, 3, 8, seed=77), w, b, 1e-5),
                 "statistics over the last dim only (dim=-1, keepdim=True)")]


def _ln_diagnose(case: Case, expected, got) -> str | None:
    x, w, b, eps = case.args
    mean, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True, unbiased=False)
    if isinstance(got, Tensor) and got.isnan().any():
        return "NaN on a constant row: add eps inside the square root, sqrt(var + eps)"
    return _first_match(got, {
        "the variance is the unbiased one (÷ (d-1)): LayerNorm divides by d, x.var(-1, unbiased=False)":
            (x - mean) / torch.sqrt(x.var(-1, keepdim=True) + eps) * w + b,
        "the bias is missing: add bias after scaling": (x - mean) / torch.sqrt(var + eps) * w,
        "the weight is missing: multiply by weight, then add bias": (x - mean) / torch.sqrt(var + eps) + b,
        "eps belongs inside the square root: sqrt(var + eps)": (x - mean) / (torch.sqrt(var) + eps) * w + b,
        "subtract the mean first: LayerNorm centres each row": x / torch.sqrt(var + eps) * w + b,
    })


# ---------------------------------------------------------------- 05 LM head

def _lm_head_cases() -> list[Case]:
    return [Case("one token: h [1, 4], W [6, 4]", (_randn(1, 4, seed=80), _randn(6, 4, seed=81)),
                 "one dot product per vocabulary row: h @ W.T"),
            Case("h [3, 8], W [20, 8]", (_randn(3, 8, seed=82), _randn(20, 8, seed=83)),
                 "logits[t, i] = h[t] · W[i]: h @ W.T gives [T, vocab]"),
            Case("vocab much larger than d: W [500, 4]", (_randn(2, 4, seed=84), _randn(500, 4, seed=85)),
                 "h @ W.T gives [T, vocab]")]


def _lm_head_diagnose(case: Case, expected, got) -> str | None:
    if isinstance(got, Tensor) and got.shape == expected.shape[::-1]:
        return "transposed: rows are positions, columns vocabulary entries, so h @ W.T (not W @ h.T)"
    return None


def _softmax_cases() -> list[Case]:
    stable = "exp of a big logit overflows (exp(1000) = inf): subtract each row's max first; softmax is unchanged"
    return [Case("three logits", (torch.tensor([2.0, 1.0, 0.1]),), "exp, then divide by the sum"),
            Case("random logits [10]", (_randn(10, seed=90, scale=3),), "exp, then divide by the sum"),
            Case("ties: all logits equal", (torch.zeros(4),), "equal logits give equal probabilities"),
            Case("a vocabulary of one", (torch.tensor([3.0]),), "one logit gets probability 1"),
            Case("batched [3, 5]", (_randn(3, 5, seed=91, scale=2),),
                 "softmax over the last dim: each row sums to 1 (sum(-1, keepdim=True))"),
            Case("large logits (~1000)", (torch.tensor([1000.0, 999.0, 998.0, 990.0]),), stable),
            Case("very negative logits (~-1000)", (torch.tensor([-1000.0, -1001.0, -1003.0]),),
                 "exp(-1000) underflows to 0 and the sum to 0: subtract each row's max first"),
            Case("-inf logits (removed tokens)", (torch.tensor([1.0, -INF, 0.5, -INF]),),
                 "exp(-inf) = 0: removed tokens get probability 0"),
            Case("3-D [2, 3, 4] with large logits", (_randn(2, 3, 4, seed=92, scale=2) + 500,), stable)]


def _softmax_diagnose(case: Case, expected, got) -> str | None:
    (x,) = case.args
    if isinstance(got, Tensor) and (got.isnan().any() or got.isinf().any()):
        return case.hint if "max" in case.hint else None
    if x.dim() > 1 and _close(got, x.softmax(0)):
        return "softmax over the wrong dimension: use the last one (dim=-1) so each row sums to 1"
    if isinstance(got, Tensor) and got.shape == expected.shape and not _close(got.sum(-1), torch.ones(got.shape[:-1])):
        return "probabilities must sum to 1 along the last dim: divide by exp(...).sum(-1, keepdim=True)"
    return None


# ---------------------------------------------------------------- 06 sampling

def _temperature_cases() -> list[Case]:
    x = _randn(6, seed=100, scale=2)
    return [Case("temperature 1 changes nothing", (x, 1.0), "divide the logits by the temperature"),
            Case("temperature 0.5 sharpens", (x, 0.5), "T < 1 sharpens: logits / T makes them larger"),
            Case("temperature 2 flattens", (x, 2.0), "T > 1 flattens: logits / T"),
            Case("batched [2, 5]", (_randn(2, 5, seed=101), 0.7), "the same division for every row"),
            Case("-inf (removed) logits stay -inf", (torch.tensor([1.0, -INF, 3.0]), 0.5),
                 "-inf / T is still -inf: no special case needed"),
            Case("large logits (~1000)", (torch.tensor([1000.0, 998.0]), 0.25), "logits / T")]


def _temperature_diagnose(case: Case, expected, got) -> str | None:
    x, t = case.args
    return _first_match(got, {"the temperature multiplies here: divide, logits / T": x * t,
                              "return logits, not probabilities: the softmax comes later": (x / t).softmax(-1)})


def _removed_as_zero(expected, got) -> str | None:
    if isinstance(got, Tensor) and got.shape == expected.shape and got.is_floating_point() and \
            expected.isneginf().any() and not got.isneginf().any():
        return "removed entries must be -inf (so softmax gives them 0), not 0 or dropped"
    return None


def _top_k_cases() -> list[Case]:
    x = torch.tensor([1.0, 4.0, 2.0, 3.0, 0.0])
    return [Case("k = 2", (x, 2), "keep the k largest logits, set the rest to -inf"),
            Case("k = 1 keeps only the top token", (x, 1), "k = 1 is the top token only"),
            Case("k = vocabulary size keeps everything", (x, 5), "k = vocab keeps every token"),
            Case("k larger than the vocabulary", (x, 50), "clamp k: min(k, vocab) (torch.topk refuses k > vocab)"),
            Case("a tie at the k-th place", (torch.tensor([3.0, 1.0, 2.0, 2.0, 0.0]), 2),
                 "keep every logit >= the k-th largest value, so a token tied with the k-th is kept too"),
            Case("batched [3, 6]: k per row", (_randn(3, 6, seed=110), 3),
                 "the k-th largest of each row: torch.topk(logits, k, dim=-1).values[..., -1:]"),
            Case("-inf already present", (torch.tensor([0.5, -INF, -INF, 2.0]), 3),
                 "a -inf logit may stay -inf; don't turn it into something else"),
            Case("large logits (~1000)", (torch.tensor([1000.0, 999.0, 1001.0, 998.0]), 2), "keep the 2 largest")]


def _top_k_diagnose(case: Case, expected, got) -> str | None:
    if hint := _removed_as_zero(expected, got):
        return hint
    x, k = case.args
    if isinstance(got, Tensor) and got.shape == x.shape and int(got.isfinite().sum()) < int(expected.isfinite().sum()):
        return "tokens tied with the k-th largest logit must be kept: keep logits >= kth value"
    return None


def _probs_case(probs: list[float], p: float) -> tuple[Tensor, float]:
    return torch.tensor(probs).log(), p


def _top_p_cases() -> list[Case]:
    probs = [0.05, 0.5, 0.15, 0.3]                # sorted: 0.5, 0.3, 0.15, 0.05
    crossing = "keep the token that crosses p: the kept mass must reach p, so the token that pushes it past p stays"
    zipf = torch.tensor([1.0 / (i + 1) for i in range(200)])[torch.randperm(200, generator=_gen(120))]
    return [Case("top_p 0.6: 0.5 + 0.3 reaches it", _probs_case(probs, 0.6), crossing),
            Case("top_p 0.4: the top token alone reaches it", _probs_case(probs, 0.4),
                 "stop as soon as the kept mass reaches p: 0.5 >= 0.4 keeps one token"),
            Case("top_p 0.9: three tokens", _probs_case(probs, 0.9), crossing),
            Case("top_p 1 keeps everything", _probs_case(probs, 1.0), "top_p = 1 keeps every token"),
            Case("tiny top_p keeps the top token", _probs_case(probs, 1e-3),
                 "at least one token must survive: the top one"),
            Case("ties inside the kept set", _probs_case([0.2, 0.3, 0.2, 0.3], 0.5),
                 "both 0.3 tokens: the first reaches 0.3 < 0.5, the second crosses"),
            Case("logits not yet normalized (+1000)", (torch.tensor(probs).log() + 1000, 0.6),
                 "turn logits into probabilities with a (stable) softmax first"),
            Case("-inf already present", (torch.tensor([0.5, 0.0, 0.3, 0.2]).log(), 0.6),
                 "a -inf logit has probability 0 and stays removed"),
            Case("batched [2, 4]: p per row", (torch.tensor([probs, [0.25, 0.15, 0.4, 0.2]]).log(), 0.6),
                 "sort, cumsum and cut each row on its own (dim=-1)"),
            Case("200 tokens, top_p 0.9", (zipf.log(), 0.9), crossing)]


def _top_p_diagnose(case: Case, expected, got) -> str | None:
    if hint := _removed_as_zero(expected, got):
        return hint
    if not (isinstance(got, Tensor) and got.shape == expected.shape):
        return None
    logits, p = case.args
    probs = logits.softmax(-1)
    if torch.equal(got.isneginf(), (probs.cumsum(-1) - probs >= p) | logits.isneginf()):
        return "the cumulative sum runs in vocabulary order: sort by probability, descending, first"
    kept, want = int(got.isfinite().sum()), int(expected.isfinite().sum())
    if kept < want:
        return "the token that crosses p is dropped: keep a token if the mass *before* it is < p"
    if kept > want:
        return "one token too many: stop once the kept mass reaches p (mass before a token < p keeps it)"
    return "the right number of tokens but not the right ones: sort by probability, descending"


# ---------------------------------------------------------------- 07 the loop

def _greedy_reference(next_logits, prompt_ids: list[int], n: int) -> list[int]:
    ids = list(prompt_ids)
    for _ in range(n):
        ids.append(int(greedy(next_logits(ids))))
    return ids[len(prompt_ids):]


def _toy_lm(vocab: int = 11):
    """A made-up model whose next token depends on every id so far (so forgetting one shows)."""
    def next_logits(ids: list[int]) -> Tensor:
        target = (3 * sum(ids) + len(ids)) % vocab
        return -(torch.arange(vocab) - target).float() ** 2
    return next_logits


def _bigram_lm(vocab: int = 9):
    """A made-up model that looks only at the last token, with a random table of logits."""
    table = _randn(vocab, vocab, seed=130, scale=3)
    return lambda ids: table[ids[-1]].clone()


def _greedy_cases() -> list[Case]:
    return [Case("one new token", (_toy_lm(), [1, 2], 1), "call next_logits(ids), take the argmax, return [it]"),
            Case("zero new tokens", (_toy_lm(), [4], 0), "n = 0 returns []"),
            Case("six new tokens", (_toy_lm(), [1, 2, 3], 6),
                 "append each new token to ids before the next call: the model must see it"),
            Case("a model that looks at the last token", (_bigram_lm(), [5], 8),
                 "append each new token, then ask for the next logits"),
            Case("a one-token prompt", (_toy_lm(7), [0], 5), "start from a copy of prompt_ids")]


def _greedy_diagnose(case: Case, expected, got) -> str | None:
    fn, prompt, n = case.args
    if not isinstance(got, (list, tuple)):
        return "return a Python list of ints, e.g. ids[len(prompt_ids):]"
    got = list(got)
    if len(got) == len(prompt) + n and got[len(prompt):] == expected:
        return "return only the n new ids, not the prompt in front of them"
    if len(got) != n:
        return f"return exactly n = {n} new ids"
    if n > 1 and len(set(got)) == 1 and len(set(expected)) > 1:
        return "the same token every time: append each new token to ids before calling next_logits again"
    return None


def _kv_step_reference(q: Tensor, k_new: Tensor, v_new: Tensor, k_cache: Tensor, v_cache: Tensor):
    k, v = torch.cat([k_cache, k_new], dim=1), torch.cat([v_cache, v_new], dim=1)
    return F.scaled_dot_product_attention(q, k, v), k, v   # the newest query may look at every cached key


def _kv_loop(h: int, t: int, d: int, seed: int):
    q, k, v = (_randn(h, t, d, seed=seed + i) for i in range(3))

    def run(fn):
        k_cache, v_cache, outs = torch.empty(h, 0, d), torch.empty(h, 0, d), []
        for i in range(t):
            out, k_cache, v_cache = fn(q[:, i:i + 1].clone(), k[:, i:i + 1].clone(), v[:, i:i + 1].clone(),
                                       k_cache, v_cache)
            outs.append(out)
        return torch.cat(outs, dim=1) if all(isinstance(o, Tensor) for o in outs) else outs
    return run


def _kv_step_cases() -> list[Case]:
    def step(h, s, d, seed):
        q, k, v = (_randn(h, 1, d, seed=seed + i) for i in range(3))
        return q, k, v, _randn(h, s, d, seed=seed + 3), _randn(h, s, d, seed=seed + 4)
    order = "append k_new, v_new to the caches along the positions (dim=1), then attend with q to all of them"
    return [Case("the first token: empty cache", step(1, 0, 4, 140), order),
            Case("2 heads, 4 cached positions", step(2, 4, 8, 150), order),
            Case("4 heads, 9 cached, d_head 16", step(4, 9, 16, 160), "scale the scores by 1/√d_head"),
            Case("6 steps from an empty cache", run=_kv_loop(2, 6, 8, 170),
                 shown="q, k, v of 6 tokens fed one at a time, [2, 1, 8] each, the caches passed back in",
                 hint="return the grown caches so the next step sees this token's k and v")]


def _kv_step_diagnose(case: Case, expected, got) -> str | None:
    if case.run is not None or not isinstance(got, tuple) or len(got) != 3:
        return None
    q, k_new, v_new, k_cache, v_cache = case.args
    out, k, v = got
    if isinstance(k, Tensor) and k.shape == k_cache.shape:
        return "the cache did not grow: return torch.cat([k_cache, k_new], dim=1) (and the same for v)"
    if k_cache.shape[1] and _close(out, F.scaled_dot_product_attention(q, k_cache, v_cache)):
        return "the new token must see itself: append k_new, v_new first, then attend"
    k_all, v_all = torch.cat([k_cache, k_new], dim=1), torch.cat([v_cache, v_new], dim=1)
    return _first_match(out, {"the 1/√d_head scale is missing: scores = q @ kᵀ / √d_head":
                              F.scaled_dot_product_attention(q, k_all, v_all, scale=1.0)})


# ---------------------------------------------------------------- 08 cost

def _kv_bytes_reference(n_layer: int, n_kv_head: int, d_head: int, T: int, bytes_per_number: int) -> int:
    config = replace(gpt2_config(), n_layer=n_layer, n_head=n_kv_head, n_kv_head=n_kv_head, d_head=d_head)
    return kv_cache_bytes(config, T, bytes_per_number)


def _kv_bytes_cases() -> list[Case]:
    formula = "2 (keys and values) × n_layer × n_kv_head × d_head × T × bytes_per_number"
    return [Case("SmolLM2, 4,096 tokens, fp32", (30, 3, 64, 4096, 4), formula),
            Case("GPT-2 small, 1,024 tokens, fp16", (12, 12, 64, 1024, 2), formula),
            Case("one token", (30, 3, 64, 1, 4), formula),
            Case("int8 numbers (1 byte)", (24, 8, 128, 8192, 1), "bytes, not bits: 1 byte per int8 number"),
            Case("an empty cache (T = 0)", (30, 3, 64, 0, 4), "T = 0 holds nothing")]


def _kv_bytes_diagnose(case: Case, expected, got) -> str | None:
    if not isinstance(got, int) or not expected:
        return "return an int" if isinstance(got, float) else None
    if got * 2 == expected:
        return "the factor 2 is missing: the cache holds keys AND values"
    if got == expected * 8:
        return "that is bits: multiply by bytes_per_number, not bits"
    if got * case.args[-1] == expected:
        return "multiply by bytes_per_number"
    return None


EXERCISES: dict[str, Exercise] = {ex.name: ex for ex in [
    Exercise("bpe", "02_tokenization", "bpe(piece: bytes, ranks: dict[bytes, int]) -> list[bytes]",
             ("piece", "ranks"), 20, _bpe_reference, _bpe_cases, _bpe_diagnose),
    Exercise("embed", "03_embedding", "embed(ids: [T] int64, table: [vocab, d]) -> [T, d]",
             ("ids", "table"), 5, token_embedding, _embed_cases, _embed_diagnose),
    Exercise("cosine_similarity", "03_embedding", "cosine_similarity(a: [..., d], b: [..., d]) -> [...]",
             ("a", "b"), 10, _cosine_reference, _cosine_cases, _cosine_diagnose),
    Exercise("causal_mask", "04_layers", "causal_mask(T: int) -> bool [T, T], True where query i may look at key j",
             ("T",), 5, causal_mask, _mask_cases, _mask_diagnose),
    Exercise("attention", "04_layers", "attention(q, k, v: [n_head, T, d_head]) -> [n_head, T, d_head], causal",
             ("q", "k", "v"), 20, _attention_reference, _attention_cases, _attention_diagnose),
    Exercise("rms_norm", "04_layers", "rms_norm(x: [..., d], weight: [d], eps: float) -> [..., d]",
             ("x", "weight", "eps"), 10, _rms_reference, _rms_cases, _rms_diagnose),
    Exercise("layer_norm", "04_layers", "layer_norm(x: [..., d], weight: [d], bias: [d], eps: float) -> [..., d]",
             ("x", "weight", "bias", "eps"), 10, _ln_reference, _ln_cases, _ln_diagnose),
    Exercise("lm_head", "05_lm_head", "lm_head(h: [T, d], W: [vocab, d]) -> logits [T, vocab]",
             ("h", "W"), 5, lm_head, _lm_head_cases, _lm_head_diagnose),
    Exercise("softmax", "05_lm_head", "softmax(logits: [..., vocab]) -> probabilities [..., vocab]",
             ("logits",), 10, softmax, _softmax_cases, _softmax_diagnose, rtol=1e-4, atol=1e-6),
    Exercise("apply_temperature", "06_sampling", "apply_temperature(logits: [..., vocab], temperature: float) -> logits",
             ("logits", "temperature"), 5, apply_temperature, _temperature_cases, _temperature_diagnose),
    Exercise("top_k_filter", "06_sampling", "top_k_filter(logits: [..., vocab], top_k: int) -> logits, -inf where removed",
             ("logits", "top_k"), 10, top_k_filter, _top_k_cases, _top_k_diagnose),
    Exercise("top_p_filter", "06_sampling", "top_p_filter(logits: [..., vocab], top_p: float) -> logits, -inf where removed",
             ("logits", "top_p"), 20, top_p_filter, _top_p_cases, _top_p_diagnose),
    Exercise("greedy_generate", "07_autoregressive",
             "greedy_generate(next_logits: Callable[[list[int]], Tensor [vocab]], prompt_ids: list[int], n: int) -> list[int]",
             ("next_logits", "prompt_ids", "n"), 10, _greedy_reference, _greedy_cases, _greedy_diagnose),
    Exercise("kv_cache_step", "07_autoregressive",
             "kv_cache_step(q, k_new, v_new: [n_head, 1, d_head], k_cache, v_cache: [n_head, S, d_head]) "
             "-> (out [n_head, 1, d_head], k_cache [n_head, S+1, d_head], v_cache)",
             ("q", "k_new", "v_new", "k_cache", "v_cache"), 15, _kv_step_reference, _kv_step_cases, _kv_step_diagnose),
    Exercise("kv_cache_bytes", "08_cost", "kv_cache_bytes(n_layer, n_kv_head, d_head, T, bytes_per_number) -> int",
             ("n_layer", "n_kv_head", "d_head", "T", "bytes_per_number"), 5, _kv_bytes_reference, _kv_bytes_cases,
             _kv_bytes_diagnose),
]}
