"""Every exercise: its cases (plain, edge, adversarial), llmwalk's reference, and the mistakes it recognises.

Cases run in order, simplest first, so the first failure points at one idea. A diagnosis recomputes the usual
wrong answer (no scale, no mask, unbiased variance ...) on the failing input and names it when it matches.
"""
from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import (Block, Config, Linear, Model, Norm, Weights, apply_rope, apply_temperature, block_forward, causal_mask,
                ffn, forward, gpt2_config, gpt2_tokenizer, greedy, kv_cache_bytes, layer_norm, lm_head, load_model,
                norm, rms_norm, rope_angles, softmax, token_embedding, top_k_filter, top_p_filter)
from ..attribution import direct_parts
from ..cost import decode_step_flops, matmul_flops
from ..i18n import t
from ..prompts import PROMPT
from ..quantize import quantize_tensor
from ..speculative import speculative_accept
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
    return dict(gpt2_tokenizer().ranks)


def _bpe_reference(piece: bytes, ranks: dict[bytes, int]) -> list[bytes]:
    """tiktoken's own byte-pair merge of one pre-split piece (GPT-2's ranks: the cases pass gpt2_ranks())."""
    return gpt2_tokenizer().merge(piece)


def _bpe_cases() -> list[Case]:
    ranks = gpt2_ranks()
    order = t("exercises.bpe.hint.order")
    words = [(t("exercises.bpe.case.one_byte"), b"a", t("exercises.bpe.hint.one_byte")),
             (t("exercises.bpe.case.common"), b"hello", order),
             (t("exercises.bpe.case.space"), b" world", order),
             (t("exercises.bpe.case.long"), b" tokenization", order),
             (t("exercises.bpe.case.repeated"), b"aaaaaaa", t("exercises.bpe.hint.leftmost")),
             (t("exercises.bpe.case.beijing"), "北京".encode(), order),
             (t("exercises.bpe.case.beijing_space"), " 北京".encode(), order),
             (t("exercises.bpe.case.emoji"), "🙂".encode(), order),
             (t("exercises.bpe.case.rare"), b" antidisestablishmentarianism", order)]
    return [Case(label, (piece, ranks), hint) for label, piece, hint in words]


def _bpe_diagnose(case: Case, expected, got) -> str | None:
    piece = case.args[0]
    if isinstance(got, list) and got == [bytes([b]) for b in piece]:
        return t("exercises.bpe.hint.no_merge")
    if got == [piece] and expected != [piece]:
        return t("exercises.bpe.hint.only_ranked")
    if isinstance(got, list) and got and isinstance(got[0], str):
        return t("exercises.bpe.hint.bytes")
    return None


# ---------------------------------------------------------------- 03 embedding

def _embed_cases() -> list[Case]:
    table = _randn(10, 4, seed=1)
    return [Case(t("exercises.embed.case.three"), (torch.tensor([2, 7, 5]), table), t("exercises.embed.hint.rows")),
            Case(t("exercises.embed.case.twice"), (torch.tensor([3, 3, 1]), table), t("exercises.embed.hint.twice")),
            Case(t("exercises.embed.case.one"), (torch.tensor([4]), table), t("exercises.embed.hint.one")),
            Case(t("exercises.embed.case.ends"), (torch.tensor([0, 9]), table), t("exercises.embed.hint.ends"))]


def _embed_diagnose(case: Case, expected, got) -> str | None:
    ids, table = case.args
    return _first_match(got, {t("exercises.embed.hint.plus_one"): table[(ids + 1) % 10],
                              t("exercises.embed.hint.minus_one"): table[ids - 1]})


def _cosine_cases() -> list[Case]:
    a = _randn(8, seed=2)
    return [Case(t("exercises.cosine.case.scaled"), (a, 3 * a), t("exercises.cosine.hint.scaled")),
            Case(t("exercises.cosine.case.opposite"), (a, -a), t("exercises.cosine.hint.opposite")),
            Case(t("exercises.cosine.case.perpendicular"), (torch.tensor([1.0, 0, 0]), torch.tensor([0, 2.0, 0])),
                 t("exercises.cosine.hint.perpendicular")),
            Case(t("exercises.cosine.case.random"), (a, _randn(8, seed=3)), t("exercises.cosine.hint.formula")),
            Case(t("exercises.cosine.case.batched"), (_randn(3, 8, seed=4), a), t("exercises.cosine.hint.batched"))]


def _cosine_reference(a: Tensor, b: Tensor) -> Tensor:
    return F.cosine_similarity(a, b, dim=-1)


def _cosine_diagnose(case: Case, expected, got) -> str | None:
    a, b = case.args
    dot = (a * b).sum(-1)
    return _first_match(got, {t("exercises.cosine.hint.dot"): dot,
                              t("exercises.cosine.hint.one_norm"): dot / a.norm(dim=-1)})


def _rope_reference(x: Tensor, positions: Tensor, base: float) -> Tensor:
    return apply_rope(x, *rope_angles(positions, x.shape[-1], base))


def _rope_variant(x: Tensor, positions: Tensor, base: float, *, adjacent: bool = False, sign: float = 1.0,
                  shift: int = 0, step: int = 2, first_half_only: bool = False) -> Tensor:
    """RoPE with one classic mistake switched on (the defaults give the right answer).  # [n_head, T, d] -> same"""
    x, d = x.double(), x.shape[-1]
    angles = (positions.double() + shift)[:, None] * float(base) ** (-step * torch.arange(d // 2).double() / d)
    cos, sin = angles.cos(), sign * angles.sin()                                        # [T, d/2]
    x1, x2 = (x[..., 0::2], x[..., 1::2]) if adjacent else (x[..., :d // 2], x[..., d // 2:])
    y1, y2 = x1 * cos - x2 * sin, x2 if first_half_only else x1 * sin + x2 * cos
    out = torch.stack([y1, y2], -1).flatten(-2) if adjacent else torch.cat([y1, y2], -1)
    return out.float()


def _rope_cases() -> list[Case]:
    rotate, turn = t("exercises.rope.hint.rotate"), t("exercises.rope.hint.turn")
    return [Case(t("exercises.rope.case.position_0"), (_randn(2, 1, 8, seed=5), torch.tensor([0]), 10000.0),
                 t("exercises.rope.hint.position_0")),
            Case(t("exercises.rope.case.one_pair"), (_randn(1, 2, 2, seed=6), torch.arange(2), 10000.0), turn),
            Case(t("exercises.rope.case.pairs"), (_randn(2, 4, 8, seed=7), torch.arange(4), 10000.0), rotate),
            Case(t("exercises.rope.case.base"), (_randn(2, 3, 8, seed=8), torch.arange(3), 100000.0),
                 t("exercises.rope.hint.base")),
            Case(t("exercises.rope.case.offset"), (_randn(1, 3, 8, seed=9), torch.tensor([5, 6, 7]), 10000.0),
                 t("exercises.rope.hint.positions")),
            Case(t("exercises.rope.case.smollm2"), (_randn(9, 5, 64, seed=10), torch.arange(5), 100000.0), rotate)]


def _rope_diagnose(case: Case, expected, got) -> str | None:
    x, positions, base = case.args
    if _close(got, x):
        return t("exercises.rope.hint.unrotated")
    wrong_base = 10000.0 if base != 10000.0 else 100000.0
    return _first_match(got, {
        t("exercises.rope.hint.adjacent"): _rope_variant(x, positions, base, adjacent=True),
        t("exercises.rope.hint.sign"): _rope_variant(x, positions, base, sign=-1.0),
        t("exercises.rope.hint.from_one"): _rope_variant(x, positions, base, shift=1),
        t("exercises.rope.hint.exponent"): _rope_variant(x, positions, base, step=1),
        t("exercises.rope.hint.first_half"): _rope_variant(x, positions, base, first_half_only=True),
        t("exercises.rope.hint.wrong_base"): _rope_variant(x, positions, wrong_base),
        t("exercises.rope.hint.arange"): _rope_variant(x, torch.arange(len(positions)), base),
    })


# ---------------------------------------------------------------- 04 layers

def _mask_cases() -> list[Case]:
    hint = t("exercises.causal_mask.hint.rows")
    return [Case(f"T = {n}", (n,), hint) for n in (1, 2, 3, 5, 8)]


def _mask_diagnose(case: Case, expected, got) -> str | None:
    if not isinstance(got, Tensor) or got.shape != expected.shape:
        return None
    if got.dtype != torch.bool:
        return t("exercises.causal_mask.hint.bool")
    n = case.args[0]
    ones = torch.ones(n, n, dtype=torch.bool)
    variants = {t("exercises.causal_mask.hint.diagonal"): ones.tril(-1),
                t("exercises.causal_mask.hint.next"): ones.tril(1),
                t("exercises.causal_mask.hint.transposed"): ones.triu(),
                t("exercises.causal_mask.hint.inverted"): ~ones.tril()}
    return next((hint for hint, v in variants.items() if torch.equal(got, v)), None)


def _attention_reference(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _attention_cases() -> list[Case]:
    def qkv(h, t, d, seed):
        return tuple(_randn(h, t, d, seed=seed + i) for i in range(3))
    heads = [(2, 4, 8, 20, t("exercises.attention.hint.recipe")), (4, 6, 16, 30, t("exercises.attention.hint.scale")),
             (1, 5, 64, 40, t("exercises.attention.hint.scale"))]
    return [Case(t("exercises.attention.case.one"), qkv(1, 1, 4, 10), t("exercises.attention.hint.one")),
            *(Case(t("exercises.attention.case.heads", n_head=h, T=n, d_head=d), qkv(h, n, d, seed), hint)
              for h, n, d, seed, hint in heads),
            Case(t("exercises.attention.case.large"), (_randn(2, 5, 8, seed=50) * 30, *qkv(2, 5, 8, 51)[1:]),
                 t("exercises.attention.hint.overflow"))]


def _attention_diagnose(case: Case, expected, got) -> str | None:
    q, k, v = case.args
    d = q.shape[-1]
    if isinstance(got, Tensor) and got.isnan().any():
        return t("exercises.attention.hint.nan")
    sdpa = F.scaled_dot_product_attention
    return _first_match(got, {
        t("exercises.attention.hint.no_scale"): sdpa(q, k, v, is_causal=True, scale=1.0),
        t("exercises.attention.hint.scale_d"): sdpa(q, k, v, is_causal=True, scale=1 / d),
        t("exercises.attention.hint.no_mask"): sdpa(q, k, v, is_causal=False),
        t("exercises.attention.hint.softmax_dim"):
            ((q @ k.transpose(-2, -1) / math.sqrt(d)).masked_fill(~causal_mask(q.shape[1]), -INF)
             .softmax(-2).nan_to_num() @ v),
    })


def _rms_reference(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return rms_norm(x, Norm(weight), eps)


def _rms_cases() -> list[Case]:
    w = 1 + _randn(8, seed=60, scale=0.5)
    zero = torch.cat([torch.zeros(1, 8), _randn(1, 8, seed=61)])
    return [Case(t("exercises.rms_norm.case.ones"), (_randn(3, 8, seed=62), torch.ones(8), 1e-5),
                 t("exercises.rms_norm.hint.recipe")),
            Case(t("exercises.rms_norm.case.one"), (_randn(1, 8, seed=63), w, 1e-5),
                 t("exercises.rms_norm.hint.weight")),
            Case(t("exercises.rms_norm.case.zero"), (zero, w, 1e-6), t("exercises.rms_norm.hint.zero")),
            Case(t("exercises.rms_norm.case.large_eps"), (_randn(2, 8, seed=64, scale=0.1), w, 0.5),
                 t("exercises.rms_norm.hint.eps")),
            Case(t("exercises.rms_norm.case.leading"), (_randn(2, 3, 8, seed=65), w, 1e-5),
                 t("exercises.rms_norm.hint.last_dim"))]


def _rms_diagnose(case: Case, expected, got) -> str | None:
    x, w, eps = case.args
    ms = x.pow(2).mean(-1, keepdim=True)
    if isinstance(got, Tensor) and got.isnan().any():
        return t("exercises.rms_norm.hint.nan")
    return _first_match(got, {
        t("exercises.rms_norm.hint.no_weight"): x / torch.sqrt(ms + eps),
        t("exercises.rms_norm.hint.eps_outside"): x / (torch.sqrt(ms) + eps) * w,
        t("exercises.rms_norm.hint.layer_norm"): F.layer_norm(x, (x.shape[-1],), w, None, eps),
        t("exercises.rms_norm.hint.wrong_dim"): x / torch.sqrt(
            x.pow(2).mean(0, keepdim=True) + eps) * w,
    })


def _ln_reference(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    return layer_norm(x, Norm(weight, bias), eps)


def _ln_cases() -> list[Case]:
    w, b = 1 + _randn(8, seed=70, scale=0.5), _randn(8, seed=71, scale=0.5)
    flat = torch.cat([torch.full((1, 8), 3.0), _randn(1, 8, seed=72)])
    return [Case(t("exercises.layer_norm.case.plain"), (_randn(3, 8, seed=73), torch.ones(8), torch.zeros(8), 1e-5),
                 t("exercises.layer_norm.hint.recipe")),
            Case(t("exercises.layer_norm.case.learned"), (_randn(2, 8, seed=74), w, b, 1e-5),
                 t("exercises.layer_norm.hint.affine")),
            Case(t("exercises.layer_norm.case.four"), (_randn(3, 4, seed=75), w[:4], b[:4], 1e-5),
                 t("exercises.layer_norm.hint.biased")),
            Case(t("exercises.layer_norm.case.constant"), (flat, w, b, 1e-5), t("exercises.layer_norm.hint.constant")),
            Case(t("exercises.layer_norm.case.one"), (_randn(1, 8, seed=76), w, b, 1e-5),
                 t("exercises.layer_norm.hint.last_dim")),
            Case(t("exercises.layer_norm.case.leading"), (_randn(2, 3, 8, seed=77), w, b, 1e-5),
                 t("exercises.layer_norm.hint.statistics"))]


def _ln_diagnose(case: Case, expected, got) -> str | None:
    x, w, b, eps = case.args
    mean, var = x.mean(-1, keepdim=True), x.var(-1, keepdim=True, unbiased=False)
    if isinstance(got, Tensor) and got.isnan().any():
        return t("exercises.layer_norm.hint.nan")
    return _first_match(got, {
        t("exercises.layer_norm.hint.unbiased"): (x - mean) / torch.sqrt(x.var(-1, keepdim=True) + eps) * w + b,
        t("exercises.layer_norm.hint.no_bias"): (x - mean) / torch.sqrt(var + eps) * w,
        t("exercises.layer_norm.hint.no_weight"): (x - mean) / torch.sqrt(var + eps) + b,
        t("exercises.layer_norm.hint.eps_outside"): (x - mean) / (torch.sqrt(var) + eps) * w + b,
        t("exercises.layer_norm.hint.no_mean"): x / torch.sqrt(var + eps) * w + b,
    })


SWIGLU = replace(gpt2_config(), ffn="swiglu")     # lw.ffn reads only config.ffn


def _swiglu_reference(x: Tensor, w_gate: Tensor, w_up: Tensor, w_down: Tensor) -> Tensor:
    """lw.ffn on a block that holds only these FFN weights, given in the checkpoint's [out, in] layout."""
    block = Block(*(None,) * 6, ffn_up=Linear(w_up.T), ffn_down=Linear(w_down.T), ffn_gate=Linear(w_gate.T))
    return ffn(x, block, SWIGLU)[0]


@lru_cache(maxsize=1)
def _smollm2_layer3() -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """What SmolLM2's layer-3 FFN reads for "The capital of France is", and its weights as the checkpoint stores
    them ([out, in]; llmwalk keeps them as [in, out]).  # x [5, 576], w_gate/w_up [1536, 576], w_down [576, 1536]

    The weights are transposed views of the model's own, as notebook 04 passes them: a copy kept in this cache
    would cost every learner's kernel 10.6 MB of memory of its own (the model's weights are shared between kernels)."""
    model = load_model(progress=False)
    block = model.weights.blocks[3]
    x = forward(model, model.tokenizer.encode(PROMPT)).layers[3].ffn_in
    return x, *(w.weight.T for w in (block.ffn_gate, block.ffn_up, block.ffn_down))


def _ffn_weights(d: int, d_ff: int, seed: int) -> tuple[Tensor, Tensor, Tensor]:
    return _randn(d_ff, d, seed=seed), _randn(d_ff, d, seed=seed + 1), _randn(d, d_ff, seed=seed + 2)


def _swiglu_cases() -> list[Case]:
    negative = (_randn(2, 8, seed=184).abs(), -_randn(16, 8, seed=185).abs(), *_ffn_weights(8, 16, 186)[1:])
    return [Case(t("exercises.swiglu.case.square"), (_randn(3, 4, seed=180), *_ffn_weights(4, 4, 181)),
                 t("exercises.swiglu.hint.recipe")),
            Case(t("exercises.swiglu.case.wide"), (_randn(1, 8, seed=190), *_ffn_weights(8, 16, 191)),
                 t("exercises.swiglu.hint.shapes")),
            Case(t("exercises.swiglu.case.negative"), negative, t("exercises.swiglu.hint.negative")),
            Case(t("exercises.swiglu.case.leading"), (_randn(2, 3, 8, seed=200), *_ffn_weights(8, 16, 201)),
                 t("exercises.swiglu.hint.last_dim")),
            Case(t("exercises.swiglu.case.smollm2"), _smollm2_layer3(), t("exercises.swiglu.hint.smollm2"))]


def _swiglu_diagnose(case: Case, expected, got) -> str | None:
    """The classic mistakes, recomputed on the failing input; the first that `got` equals names it."""
    x, w_gate, w_up, w_down = case.args
    g, u = x @ w_gate.T, x @ w_up.T                                   # [..., d_ff] each

    def down(h):
        return h @ w_down.T
    gelu = t("exercises.swiglu.hint.gelu")
    variants = [(t("exercises.swiglu.hint.swapped"), down(g * F.silu(u))),
                (t("exercises.swiglu.hint.both"), down(F.silu(g) * F.silu(u))),
                (t("exercises.swiglu.hint.relu"), down(F.relu(g) * u)), (gelu, down(F.gelu(g) * u)),
                (gelu, down(F.gelu(g, approximate="tanh") * u)),
                (t("exercises.swiglu.hint.sigmoid"), down(torch.sigmoid(g) * u)),
                (t("exercises.swiglu.hint.after_product"), down(F.silu(g * u))),
                (t("exercises.swiglu.hint.no_gate"), down(F.silu(u))), (t("exercises.swiglu.hint.no_up"), down(F.silu(g))),
                (t("exercises.swiglu.hint.residual"), x + expected)]
    if w_gate.shape[0] == w_gate.shape[1]:                             # x @ w runs only when w is square
        variants.append((t("exercises.swiglu.hint.not_transposed"), (F.silu(x @ w_gate) * (x @ w_up)) @ w_down))
    return next((hint for hint, v in variants if _close(got, v)), None)

# ---------------------------------------------------------------- 05 LM head

def _lm_head_cases() -> list[Case]:
    return [Case(t("exercises.lm_head.case.one"), (_randn(1, 4, seed=80), _randn(6, 4, seed=81)),
                 t("exercises.lm_head.hint.dot")),
            Case("h [3, 8], W [20, 8]", (_randn(3, 8, seed=82), _randn(20, 8, seed=83)),
                 t("exercises.lm_head.hint.entry")),
            Case(t("exercises.lm_head.case.large_vocab"), (_randn(2, 4, seed=84), _randn(500, 4, seed=85)),
                 t("exercises.lm_head.hint.shape"))]


def _lm_head_diagnose(case: Case, expected, got) -> str | None:
    if isinstance(got, Tensor) and got.shape == expected.shape[::-1]:
        return t("exercises.lm_head.hint.transposed")
    return None


def _softmax_cases() -> list[Case]:
    stable, exp_sum = t("exercises.softmax.hint.overflow"), t("exercises.softmax.hint.exp_sum")
    return [Case(t("exercises.softmax.case.three"), (torch.tensor([2.0, 1.0, 0.1]),), exp_sum),
            Case(t("exercises.softmax.case.random"), (_randn(10, seed=90, scale=3),), exp_sum),
            Case(t("exercises.softmax.case.ties"), (torch.zeros(4),), t("exercises.softmax.hint.ties")),
            Case(t("exercises.softmax.case.one"), (torch.tensor([3.0]),), t("exercises.softmax.hint.one")),
            Case(t("exercises.softmax.case.batched"), (_randn(3, 5, seed=91, scale=2),),
                 t("exercises.softmax.hint.rows")),
            Case(t("exercises.softmax.case.large"), (torch.tensor([1000.0, 999.0, 998.0, 990.0]),), stable),
            Case(t("exercises.softmax.case.negative"), (torch.tensor([-1000.0, -1001.0, -1003.0]),),
                 t("exercises.softmax.hint.underflow")),
            Case(t("exercises.softmax.case.removed"), (torch.tensor([1.0, -INF, 0.5, -INF]),),
                 t("exercises.softmax.hint.removed")),
            Case(t("exercises.softmax.case.three_d"), (_randn(2, 3, 4, seed=92, scale=2) + 500,), stable)]


def _softmax_diagnose(case: Case, expected, got) -> str | None:
    (x,) = case.args
    if isinstance(got, Tensor) and (got.isnan().any() or got.isinf().any()):
        return case.hint if case.hint in (t("exercises.softmax.hint.overflow"), t("exercises.softmax.hint.underflow")) \
            else None
    if x.dim() > 1 and _close(got, x.softmax(0)):
        return t("exercises.softmax.hint.wrong_dim")
    if isinstance(got, Tensor) and got.shape == expected.shape and not _close(got.sum(-1), torch.ones(got.shape[:-1])):
        return t("exercises.softmax.hint.sum_to_one")
    return None



def _lens_reference(resid: Tensor, weight: Tensor, eps: float, W_U: Tensor) -> Tensor:
    return lm_head(rms_norm(resid, Norm(weight), eps), W_U)


def _smollm2_lens_args() -> tuple[Tensor, Tensor, float, Tensor]:
    """The real thing: the last token's residual stream of "The capital of France is", emb + every layer."""
    model = load_model(progress=False)
    trace = forward(model, model.tokenizer.encode(PROMPT))
    return trace.resid[:, -1], model.weights.output_norm.weight, model.config.norm_eps, model.weights.output


def _lens_cases() -> list[Case]:
    # Residuals with a non-zero mean (LayerNorm would centre them) and a weight far from 1 (so forgetting it shows).
    def toy(layers, d, vocab, seed, eps=1e-5, scale=1.0):
        return (_randn(layers, d, seed=seed, scale=scale) + 0.5, 1 + _randn(d, seed=seed + 1, scale=0.5), eps,
                _randn(vocab, d, seed=seed + 2))
    recipe = t("exercises.logit_lens.hint.recipe")
    growing = _randn(5, 16, seed=199) * torch.tensor([1, 4, 16, 64, 256.0])[:, None]   # as a real stream grows
    return [Case(t("exercises.logit_lens.case.square"), toy(4, 8, 8, 190), recipe),
            Case(t("exercises.logit_lens.case.toy", layers=3, d=8, vocab=20), toy(3, 8, 20, 193), recipe),
            Case(t("exercises.logit_lens.case.large_eps"), toy(3, 8, 12, 196, eps=0.5, scale=0.1),
                 t("exercises.logit_lens.hint.eps")),
            Case(t("exercises.logit_lens.case.growing"), (growing, *toy(1, 16, 30, 200)[1:]), recipe),
            Case(t("exercises.logit_lens.case.smollm2"), _smollm2_lens_args(), recipe)]


def _lens_diagnose(case: Case, expected, got) -> str | None:
    resid, w, eps, W_U = case.args
    if isinstance(got, Tensor) and got.shape[-1] == expected.shape[-1] and got.shape[0] == expected.shape[0] - 1 \
            and _close(got, expected[1:]):
        return t("exercises.logit_lens.hint.skipped_emb")
    if isinstance(got, Tensor) and got.shape == expected.shape and _close(got, expected.softmax(-1)):
        return t("exercises.logit_lens.hint.probabilities")
    rms = torch.rsqrt(resid.pow(2).mean(-1, keepdim=True) + eps)
    return _first_match(got, {
        t("exercises.logit_lens.hint.no_norm"): resid @ W_U.T,
        t("exercises.logit_lens.hint.no_weight"): (resid * rms) @ W_U.T,
        t("exercises.logit_lens.hint.layer_norm"): F.layer_norm(resid, (resid.shape[-1],), w, None, eps) @ W_U.T,
        t("exercises.logit_lens.hint.not_transposed"): (resid * rms * w) @ W_U,
        t("exercises.logit_lens.hint.eps_outside"):
            resid / (resid.pow(2).mean(-1, keepdim=True).sqrt() + eps) * w @ W_U.T,
        t("exercises.logit_lens.hint.wrong_dim"):
            resid * torch.rsqrt(resid.pow(2).mean(0, keepdim=True) + eps) * w @ W_U.T,
    })

# ---------------------------------------------------------------- 06 sampling

def _temperature_cases() -> list[Case]:
    x = _randn(6, seed=100, scale=2)
    return [Case(t("exercises.temperature.case.one"), (x, 1.0), t("exercises.temperature.hint.divide")),
            Case(t("exercises.temperature.case.sharpen"), (x, 0.5), t("exercises.temperature.hint.sharpen")),
            Case(t("exercises.temperature.case.flatten"), (x, 2.0), t("exercises.temperature.hint.flatten")),
            Case(t("exercises.temperature.case.batched"), (_randn(2, 5, seed=101), 0.7),
                 t("exercises.temperature.hint.rows")),
            Case(t("exercises.temperature.case.removed"), (torch.tensor([1.0, -INF, 3.0]), 0.5),
                 t("exercises.temperature.hint.removed")),
            Case(t("exercises.temperature.case.large"), (torch.tensor([1000.0, 998.0]), 0.25), "logits / T")]


def _temperature_diagnose(case: Case, expected, got) -> str | None:
    x, temperature = case.args
    return _first_match(got, {t("exercises.temperature.hint.multiplies"): x * temperature,
                              t("exercises.temperature.hint.probabilities"): (x / temperature).softmax(-1)})


def _removed_as_zero(expected, got) -> str | None:
    if isinstance(got, Tensor) and got.shape == expected.shape and got.is_floating_point() and \
            expected.isneginf().any() and not got.isneginf().any():
        return t("exercises.sampling.hint.removed_as_zero")
    return None


def _top_k_cases() -> list[Case]:
    x = torch.tensor([1.0, 4.0, 2.0, 3.0, 0.0])
    return [Case("k = 2", (x, 2), t("exercises.top_k.hint.keep")),
            Case(t("exercises.top_k.case.one"), (x, 1), t("exercises.top_k.hint.one")),
            Case(t("exercises.top_k.case.vocab"), (x, 5), t("exercises.top_k.hint.vocab")),
            Case(t("exercises.top_k.case.larger"), (x, 50), t("exercises.top_k.hint.clamp")),
            Case(t("exercises.top_k.case.tie"), (torch.tensor([3.0, 1.0, 2.0, 2.0, 0.0]), 2),
                 t("exercises.top_k.hint.tie")),
            Case(t("exercises.top_k.case.batched"), (_randn(3, 6, seed=110), 3), t("exercises.top_k.hint.rows")),
            Case(t("exercises.top_k.case.removed"), (torch.tensor([0.5, -INF, -INF, 2.0]), 3),
                 t("exercises.top_k.hint.removed")),
            Case(t("exercises.top_k.case.large"), (torch.tensor([1000.0, 999.0, 1001.0, 998.0]), 2),
                 t("exercises.top_k.hint.two"))]


def _top_k_diagnose(case: Case, expected, got) -> str | None:
    if hint := _removed_as_zero(expected, got):
        return hint
    x, k = case.args
    if isinstance(got, Tensor) and got.shape == x.shape and int(got.isfinite().sum()) < int(expected.isfinite().sum()):
        return t("exercises.top_k.hint.tied")
    return None


def _probs_case(probs: list[float], p: float) -> tuple[Tensor, float]:
    return torch.tensor(probs).log(), p


def _top_p_cases() -> list[Case]:
    probs = [0.05, 0.5, 0.15, 0.3]                # sorted: 0.5, 0.3, 0.15, 0.05
    crossing = t("exercises.top_p.hint.crossing")
    zipf = torch.tensor([1.0 / (i + 1) for i in range(200)])[torch.randperm(200, generator=_gen(120))]
    return [Case(t("exercises.top_p.case.two"), _probs_case(probs, 0.6), crossing),
            Case(t("exercises.top_p.case.top_alone"), _probs_case(probs, 0.4), t("exercises.top_p.hint.stop")),
            Case(t("exercises.top_p.case.three"), _probs_case(probs, 0.9), crossing),
            Case(t("exercises.top_p.case.one"), _probs_case(probs, 1.0), t("exercises.top_p.hint.one")),
            Case(t("exercises.top_p.case.tiny"), _probs_case(probs, 1e-3), t("exercises.top_p.hint.tiny")),
            Case(t("exercises.top_p.case.ties"), _probs_case([0.2, 0.3, 0.2, 0.3], 0.5),
                 t("exercises.top_p.hint.ties")),
            Case(t("exercises.top_p.case.unnormalized"), (torch.tensor(probs).log() + 1000, 0.6),
                 t("exercises.top_p.hint.softmax")),
            Case(t("exercises.top_p.case.removed"), (torch.tensor([0.5, 0.0, 0.3, 0.2]).log(), 0.6),
                 t("exercises.top_p.hint.removed")),
            Case(t("exercises.top_p.case.batched"), (torch.tensor([probs, [0.25, 0.15, 0.4, 0.2]]).log(), 0.6),
                 t("exercises.top_p.hint.rows")),
            Case(t("exercises.top_p.case.zipf"), (zipf.log(), 0.9), crossing)]


def _top_p_diagnose(case: Case, expected, got) -> str | None:
    if hint := _removed_as_zero(expected, got):
        return hint
    if not (isinstance(got, Tensor) and got.shape == expected.shape):
        return None
    logits, p = case.args
    probs = logits.softmax(-1)
    if torch.equal(got.isneginf(), (probs.cumsum(-1) - probs >= p) | logits.isneginf()):
        return t("exercises.top_p.hint.unsorted")
    kept, want = int(got.isfinite().sum()), int(expected.isfinite().sum())
    if kept < want:
        return t("exercises.top_p.hint.dropped")
    if kept > want:
        return t("exercises.top_p.hint.too_many")
    return t("exercises.top_p.hint.wrong_ones")


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
    return [Case(t("exercises.greedy.case.one"), (_toy_lm(), [1, 2], 1), t("exercises.greedy.hint.one")),
            Case(t("exercises.greedy.case.zero"), (_toy_lm(), [4], 0), t("exercises.greedy.hint.zero")),
            Case(t("exercises.greedy.case.six"), (_toy_lm(), [1, 2, 3], 6), t("exercises.greedy.hint.append")),
            Case(t("exercises.greedy.case.bigram"), (_bigram_lm(), [5], 8), t("exercises.greedy.hint.bigram")),
            Case(t("exercises.greedy.case.one_token_prompt"), (_toy_lm(7), [0], 5), t("exercises.greedy.hint.copy"))]


def _greedy_diagnose(case: Case, expected, got) -> str | None:
    fn, prompt, n = case.args
    if not isinstance(got, (list, tuple)):
        return t("exercises.greedy.hint.list")
    got = list(got)
    if len(got) == len(prompt) + n and got[len(prompt):] == expected:
        return t("exercises.greedy.hint.prompt")
    if len(got) != n:
        return t("exercises.greedy.hint.exactly", n=n)
    if n > 1 and len(set(got)) == 1 and len(set(expected)) > 1:
        return t("exercises.greedy.hint.same")
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
    order = t("exercises.kv_step.hint.order")
    return [Case(t("exercises.kv_step.case.empty"), step(1, 0, 4, 140), order),
            Case(t("exercises.kv_step.case.cached", n_head=2, S=4, d_head=8), step(2, 4, 8, 150), order),
            Case(t("exercises.kv_step.case.cached", n_head=4, S=9, d_head=16), step(4, 9, 16, 160),
                 t("exercises.kv_step.hint.scale")),
            Case(t("exercises.kv_step.case.loop"), run=_kv_loop(2, 6, 8, 170), shown=t("exercises.kv_step.loop_shown"),
                 hint=t("exercises.kv_step.hint.grown"))]


def _kv_step_diagnose(case: Case, expected, got) -> str | None:
    if case.run is not None or not isinstance(got, tuple) or len(got) != 3:
        return None
    q, k_new, v_new, k_cache, v_cache = case.args
    out, k, v = got
    if isinstance(k, Tensor) and k.shape == k_cache.shape:
        return t("exercises.kv_step.hint.no_growth")
    if k_cache.shape[1] and _close(out, F.scaled_dot_product_attention(q, k_cache, v_cache)):
        return t("exercises.kv_step.hint.see_itself")
    k_all, v_all = torch.cat([k_cache, k_new], dim=1), torch.cat([v_cache, v_new], dim=1)
    return _first_match(out, {t("exercises.kv_step.hint.no_scale"):
                              F.scaled_dot_product_attention(q, k_all, v_all, scale=1.0)})


# ---------------------------------------------------------------- 08 cost

def _kv_bytes_reference(n_layer: int, n_kv_head: int, d_head: int, T: int, bytes_per_number: int) -> int:
    config = replace(gpt2_config(), n_layer=n_layer, n_head=n_kv_head, n_kv_head=n_kv_head, d_head=d_head)
    return kv_cache_bytes(config, T, bytes_per_number)


def _kv_bytes_cases() -> list[Case]:
    formula = t("exercises.kv_bytes.hint.formula")
    return [Case(t("exercises.kv_bytes.case.smollm2"), (30, 3, 64, 4096, 4), formula),
            Case(t("exercises.kv_bytes.case.gpt2"), (12, 12, 64, 1024, 2), formula),
            Case(t("exercises.kv_bytes.case.one"), (30, 3, 64, 1, 4), formula),
            Case(t("exercises.kv_bytes.case.int8"), (24, 8, 128, 8192, 1), t("exercises.kv_bytes.hint.bytes")),
            Case(t("exercises.kv_bytes.case.empty"), (30, 3, 64, 0, 4), t("exercises.kv_bytes.hint.empty"))]


def _kv_bytes_diagnose(case: Case, expected, got) -> str | None:
    if not isinstance(got, int) or not expected:
        return t("exercises.kv_bytes.hint.int") if isinstance(got, float) else None
    if got * 2 == expected:
        return t("exercises.kv_bytes.hint.factor_2")
    if got == expected * 8:
        return t("exercises.kv_bytes.hint.bits")
    if got * case.args[-1] == expected:
        return t("exercises.kv_bytes.hint.bytes_per_number")
    return None


def _token_flops_reference(n_layer: int, d_model: int, n_head: int, n_kv_head: int, d_head: int, d_ff: int,
                           vocab_size: int, context: int) -> int:
    """cost.py's count of one decoding step, matrix products only (what torch's FlopCounterMode sees)."""
    config = replace(gpt2_config(), family="llama", n_layer=n_layer, d_model=d_model, n_head=n_head,
                     n_kv_head=n_kv_head, d_head=d_head, d_ff=d_ff, vocab_size=vocab_size, norm="rmsnorm",
                     position="rope", ffn="swiglu")
    return matmul_flops(decode_step_flops(config, context))


def _token_flops_cases() -> list[Case]:
    weights = t("exercises.token_flops.hint.weights")
    return [Case(t("exercises.token_flops.case.tiny"), (1, 8, 2, 2, 4, 16, 10, 2), weights),
            Case(t("exercises.token_flops.case.smollm2_9"), (30, 576, 9, 3, 64, 1536, 49152, 9),
                 t("exercises.token_flops.hint.gqa")),
            Case(t("exercises.token_flops.case.smollm2_4096"), (30, 576, 9, 3, 64, 1536, 49152, 4096),
                 t("exercises.token_flops.hint.context")),
            Case(t("exercises.token_flops.case.gemma"), (18, 640, 4, 1, 256, 2048, 262144, 9),
                 t("exercises.token_flops.hint.q_width")),
            Case(t("exercises.token_flops.case.llama"), (32, 4096, 32, 32, 128, 11008, 32000, 1024), weights)]


def _token_flops_diagnose(case: Case, expected, got) -> str | None:
    if isinstance(got, float):
        return t("exercises.token_flops.hint.int")
    if not isinstance(got, int) or isinstance(got, bool):
        return None
    L, d, h, kv, dh, ff, vocab, s = case.args
    wrong = [(expected / 2, t("exercises.token_flops.hint.factor_2")),
             (expected - 4 * L * h * dh * s, t("exercises.token_flops.hint.no_attention")),
             (expected - 4 * L * h * dh, t("exercises.token_flops.hint.itself")),
             (expected - 4 * L * (h - kv) * dh * s, t("exercises.token_flops.hint.kv_scores")),
             (expected + 4 * L * d * (h - kv) * dh, t("exercises.token_flops.hint.no_gqa")),
             (expected - 2 * L * d * ff, t("exercises.token_flops.hint.two_ffn")),
             (expected - 2 * d * vocab, t("exercises.token_flops.hint.no_head")),
             (expected + 4 * L * d * (d - h * dh), t("exercises.token_flops.hint.square_q"))]
    return next((hint for value, hint in wrong if value != expected and got == value), None)


# ---------------------------------------------------------------- 09 the journey

# A SmolLM2 in miniature (RMSNorm, RoPE, grouped-query attention, SwiGLU, tied head) with random weights: every link
# of the chain changes the logits, and a case runs in milliseconds.
TINY = Config(name="tiny-llama", family="llama", n_layer=3, n_head=4, n_kv_head=2, d_model=32, d_head=8, d_ff=64,
              vocab_size=40, context_length=64, norm="rmsnorm", norm_eps=1e-5, position="rope", ffn="swiglu",
              tied_embeddings=True, rope_theta=100.0)


def _tiny_weights(c: Config = TINY, seed: int = 190) -> Weights:
    """Random weights in checkpoint layout ([d_in, d_out]); norm scales away from 1 so a missing norm shows."""
    g = _gen(seed)

    def lin(d_in: int, d_out: int) -> Linear:
        return Linear(torch.randn(d_in, d_out, generator=g) * d_in ** -0.5)

    def scale(d: int) -> Norm:
        return Norm(1 + 0.5 * torch.rand(d, generator=g))

    blocks = tuple(Block(attn_norm=scale(c.d_model), attn_q=lin(c.d_model, c.n_head * c.d_head),
                         attn_k=lin(c.d_model, c.n_kv_head * c.d_head), attn_v=lin(c.d_model, c.n_kv_head * c.d_head),
                         attn_output=lin(c.n_head * c.d_head, c.d_model), ffn_norm=scale(c.d_model),
                         ffn_up=lin(c.d_model, c.d_ff), ffn_down=lin(c.d_ff, c.d_model),
                         ffn_gate=lin(c.d_model, c.d_ff)) for _ in range(c.n_layer))
    embd = torch.randn(c.vocab_size, c.d_model, generator=g)
    return Weights(token_embd=embd, blocks=blocks, output_norm=scale(c.d_model), output=embd)


def _next_token_reference(weights: Weights, config: Config, ids: Tensor) -> Tensor:
    """llmwalk's whole forward pass, the logits of the last position.  # [T] -> [vocab]"""
    return forward(Model(config, weights, None, "exercise"), ids, record=False, last_only=True).logits[-1]


def _chain(weights: Weights, config: Config, ids: Tensor, *, rope: bool = True, mask: str = "causal",
           layers: slice = slice(None), residual: bool = True, final_norm: bool = True, at: int = -1) -> Tensor:
    """The chain with one link changed, as a learner may write it: the usual wrong answers to diagnose.  # [T] -> [vocab]"""
    n = ids.numel()
    x = token_embedding(ids, weights.token_embd, config.embed_scale)
    angles = rope_angles(torch.arange(n), config.d_head, config.rope_theta) if rope else None
    m = {"causal": causal_mask(n), "none": torch.ones(n, n, dtype=torch.bool), "transposed": causal_mask(n).T}[mask]
    for block in weights.blocks[layers]:
        out = block_forward(x, block, config, m, angles)
        x = out.resid_post if residual else out.ffn_out
    h = x[[at]]                                                    # [1, d]: the position the logits are read at
    return lm_head(norm(h, weights.output_norm, config) if final_norm else h, weights.output)[0]


def _adjacent_pairs(weights: Weights, config: Config) -> Weights:
    """Weights whose rotate-half RoPE computes what RoPE on neighbouring pairs (x_2i, x_2i+1), the RoFormer paper's
    layout, does with the original ones: q·k is unchanged when q and k are permuted alike, so permute the columns of
    W_q and W_k within each head, evens first."""
    d = config.d_head
    within = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])

    def permuted(lin: Linear, n: int) -> Linear:
        cols = (torch.arange(n)[:, None] * d + within).flatten()
        return replace(lin, weight=lin.weight[:, cols])
    return replace(weights, blocks=tuple(replace(b, attn_q=permuted(b.attn_q, config.n_head),
                                                 attn_k=permuted(b.attn_k, config.n_kv_head))
                                         for b in weights.blocks))


def _next_token_case(label: str, ids: list[int], hint: str, weights: Weights) -> Case:
    """One prompt for the tiny model; shown as its ids (the weights are too many numbers to print)."""
    def run(fn):
        return fn(weights, TINY, torch.tensor(ids))
    return Case(label, (weights, TINY, torch.tensor(ids)), hint, run=run,
                shown=t("exercises.next_token.shown", ids=ids, n_layer=TINY.n_layer, d_model=TINY.d_model,
                        vocab=TINY.vocab_size))


def _next_token_cases() -> list[Case]:
    w = _tiny_weights()
    chain, positions = t("exercises.next_token.hint.chain"), t("exercises.next_token.hint.positions")
    long = torch.randperm(TINY.vocab_size, generator=_gen(191))[:12].tolist()
    return [_next_token_case(t("exercises.next_token.case.one"), [7], chain, w),
            _next_token_case(t("exercises.next_token.case.two"), [7, 21], positions, w),
            _next_token_case(t("exercises.next_token.case.repeated"), [3, 30, 3, 3, 12, 5], positions, w),
            _next_token_case(t("exercises.next_token.case.long"), long, positions, w)]


def _next_token_diagnose(case: Case, expected, got) -> str | None:
    w, c, ids = case.args
    if isinstance(got, Tensor) and got.shape == (ids.numel(), c.vocab_size) and _close(got[-1], expected):
        return t("exercises.next_token.hint.every_position")
    if _close(got, softmax(expected)):
        return t("exercises.next_token.hint.probabilities")
    wrong = {t("exercises.next_token.hint.final_norm"): dict(final_norm=False),
             t("exercises.next_token.hint.first_position"): dict(at=0),
             t("exercises.next_token.hint.rope"): dict(rope=False),
             t("exercises.next_token.hint.mask"): dict(mask="none"),
             t("exercises.next_token.hint.transposed"): dict(mask="transposed"),
             t("exercises.next_token.hint.residual"): dict(residual=False),
             t("exercises.next_token.hint.last_layer"): dict(layers=slice(0, -1)),
             t("exercises.next_token.hint.first_layer"): dict(layers=slice(1, None))}
    wrong = {hint: _chain(w, c, ids, **kwargs) for hint, kwargs in wrong.items()}
    wrong[t("exercises.next_token.hint.rope_pairs")] = _chain(_adjacent_pairs(w, c), c, ids)
    return _first_match(got, wrong)


# ---------------------------------------------------------------- deep dive: interventions (direct logit attribution)

def _split_logit_reference(embedding: Tensor, writes: Tensor, norm_weight: Tensor, unembed: Tensor,
                           eps: float) -> Tensor:
    stream = embedding + writes.sum(0)
    return direct_parts(torch.cat([embedding[None], writes]), stream, norm_weight, unembed, eps)


def _split_logit_cases() -> list[Case]:
    d, recipe = 8, t("exercises.split_logit.hint.recipe")
    e, u, w = _randn(d, seed=180), _randn(d, seed=181), 1 + _randn(d, seed=182, scale=0.5)
    sizes = torch.tensor([[1.0], [100.0], [0.1]])                   # one write dwarfs the others
    return [Case(t("exercises.split_logit.case.ones"), (e, _randn(2, d, seed=183), torch.ones(d), u, 1e-6), recipe),
            Case(t("exercises.split_logit.case.weight"), (e, _randn(3, d, seed=184), w, u, 1e-6),
                 t("exercises.split_logit.hint.weight")),
            Case(t("exercises.split_logit.case.sizes"), (e, _randn(3, d, seed=185) * sizes, w, u, 1e-6), recipe),
            Case(t("exercises.split_logit.case.eps"), (e * 0.1, _randn(2, d, seed=186, scale=0.1), w, u, 0.5),
                 t("exercises.split_logit.hint.eps")),
            Case(t("exercises.split_logit.case.none"), (e, torch.zeros(0, d), w, u, 1e-6),
                 t("exercises.split_logit.hint.none")),
            Case(t("exercises.split_logit.case.model"),
                 (_randn(64, seed=187, scale=0.1), _randn(60, 64, seed=188), 1 + _randn(64, seed=189, scale=0.3),
                  _randn(64, seed=190, scale=0.1), 1e-5), recipe)]


def _split_logit_diagnose(case: Case, expected, got) -> str | None:
    e, writes, w, u, eps = case.args
    every, stream = torch.cat([e[None], writes]), e + writes.sum(0)

    def read(scale):                                               # each write through w and u, times a scale
        return scale * ((every * w) @ u)
    if isinstance(got, Tensor) and got.dim() == 0 and _close(got, expected.sum()):
        return t("exercises.split_logit.hint.summed")
    return _first_match(got, {
        t("exercises.split_logit.hint.no_embedding"): expected[1:],
        t("exercises.split_logit.hint.embedding_last"): torch.cat([expected[1:], expected[:1]]),
        t("exercises.split_logit.hint.no_weight"): torch.rsqrt(stream.pow(2).mean() + eps) * (every @ u),
        t("exercises.split_logit.hint.unnormed"): read(1.0),
        t("exercises.split_logit.hint.own_scale"): read(torch.rsqrt(every.pow(2).mean(-1) + eps)),
        t("exercises.split_logit.hint.stream_without_embedding"):
            read(torch.rsqrt(writes.sum(0).pow(2).mean() + eps)),
        t("exercises.split_logit.hint.eps"): read(1 / stream.pow(2).mean().sqrt()),
    })



# ---------------------------------------------------------------- deep dive: speculative decoding

# A target p and a draft q over six tokens: the draft overrates token 1 (p/q = 0.44) and underrates token 0
# (p/q = 4); the target never picks token 5. Residual max(0, p − q) = [0.3, 0, 0.05, 0, 0, 0], normalised.
_P = torch.tensor([0.40, 0.20, 0.25, 0.10, 0.05, 0.00])
_Q = torch.tensor([0.10, 0.45, 0.20, 0.10, 0.10, 0.05])


def _accept_cases() -> list[Case]:
    p, q = torch.softmax(_randn(50, seed=180, scale=2), -1), torch.softmax(_randn(50, seed=181, scale=2), -1)
    x = int((q - p).argmax())                  # the token the draft overrates most: a ratio well below 1
    u = 0.5 * float(p[x] / q[x])               # half the ratio: accepted
    def case(ratio: str, u: float) -> str:
        return t("exercises.speculative_accept.case.ratio", ratio=ratio, u=u)
    return [Case(case("0.44", 0.3), (_P, _Q, 1, 0.3), t("exercises.speculative_accept.hint.below")),
            Case(case("0.44", 0.7), (_P, _Q, 1, 0.7), t("exercises.speculative_accept.hint.ratio")),
            Case(case("4", 0.95), (_P, _Q, 0, 0.95), t("exercises.speculative_accept.hint.always")),
            Case(t("exercises.speculative_accept.case.never"), (_P, _Q, 5, 0.0),
                 t("exercises.speculative_accept.hint.strict")),
            Case(t("exercises.speculative_accept.case.random"), (p, q, x, u),
                 t("exercises.speculative_accept.hint.below"))]


def _accept_diagnose(case: Case, expected, got) -> str | None:
    if not isinstance(got, tuple) or len(got) != 2 or _close(got[1], expected[1]):
        return None                            # the residual is right: the case's own hint names the decision
    p, q = case.args[:2]
    rest, swapped = (p - q).clamp(min=0), (q - p).clamp(min=0)
    return _first_match(got[1], {t("exercises.speculative_accept.hint.residual_p"): p,
                                 t("exercises.speculative_accept.hint.unnormalised"): rest,
                                 t("exercises.speculative_accept.hint.swapped"): swapped / swapped.sum(),
                                 t("exercises.speculative_accept.hint.no_clamp"): p - q})


# ---------------------------------------------------------------- deep dive: quantization

def _int8_reference(w: Tensor) -> tuple[Tensor, Tensor]:
    q = quantize_tensor(w, 8)                  # one scale per output column
    return q.int_codes(), q.scales[0]


def _int8_cases() -> list[Case]:
    w = torch.tensor([[0.51, -0.21], [-1.0, 0.1], [0.26, 0.4], [0.75, -0.05]])     # no code half-way
    between = torch.tensor([[1.27], [0.0361], [-0.0361], [-0.0349]])     # codes 127, 3.61, −3.61, −3.49
    zero = torch.tensor([[0.31, 0.0], [-0.6, 0.0], [0.2, 0.0]])
    return [Case(t("exercises.int8_quantize.case.small"), (w,), t("exercises.int8_quantize.hint.formula")),
            Case(t("exercises.int8_quantize.case.between"), (between,), t("exercises.int8_quantize.hint.round")),
            Case(t("exercises.int8_quantize.case.zero"), (zero,), t("exercises.int8_quantize.hint.zero")),
            Case(t("exercises.int8_quantize.case.layer"), (_randn(64, 32, seed=190, scale=0.05),),
                 t("exercises.int8_quantize.hint.formula"))]


def _int8_diagnose(case: Case, expected, got) -> str | None:
    if not isinstance(got, tuple) or len(got) != 2 or not all(isinstance(g, Tensor) for g in got):
        return None
    (w,), (codes, scales) = case.args, got
    if scales.shape == w.shape[:1] != w.shape[1:]:
        return t("exercises.int8_quantize.hint.per_row")
    if _close(codes.float(), expected[0].float()):
        # the codes are right: the scales are not (a zero column's 0), or the codes' dtype is not int8
        return None if codes.dtype == torch.int8 else t("exercises.int8_quantize.hint.dtype")
    top = w.abs().amax(0)
    s = torch.where(top > 0, top / 127, torch.ones_like(top))
    variants = {t("exercises.int8_quantize.hint.scale_128"): (w / torch.where(top > 0, top / 128, 1)).round()
                .clamp(-128, 127),
                t("exercises.int8_quantize.hint.trunc"): (w / s).trunc(),
                t("exercises.int8_quantize.hint.floor"): (w / s).floor(),
                t("exercises.int8_quantize.hint.per_tensor"): (w / (w.abs().max() / 127)).round(),
                t("exercises.int8_quantize.hint.no_127"): (w / torch.where(top > 0, top, 1)).round()}
    return _first_match(codes.float(), variants)


EXERCISES: dict[str, Exercise] = {ex.name: ex for ex in [
    Exercise("bpe", "02_tokenization", "bpe(piece: bytes, ranks: dict[bytes, int]) -> list[bytes]",
             ("piece", "ranks"), 20, _bpe_reference, _bpe_cases, _bpe_diagnose),
    Exercise("embed", "03_embedding", "embed(ids: [T] int64, table: [vocab, d]) -> [T, d]",
             ("ids", "table"), 5, token_embedding, _embed_cases, _embed_diagnose),
    Exercise("cosine_similarity", "03_embedding", "cosine_similarity(a: [..., d], b: [..., d]) -> [...]",
             ("a", "b"), 10, _cosine_reference, _cosine_cases, _cosine_diagnose),
    Exercise("apply_rope", "03_embedding",
             "apply_rope(x: [n_head, T, d_head], positions: [T] int64, base: float) -> [n_head, T, d_head], "
             "pairs (x_i, x_{i+d/2})",
             ("x", "positions", "base"), 20, _rope_reference, _rope_cases, _rope_diagnose),
    Exercise("causal_mask", "04_layers", "causal_mask(T: int) -> bool [T, T], True where query i may look at key j",
             ("T",), 5, causal_mask, _mask_cases, _mask_diagnose),
    Exercise("attention", "04_layers", "attention(q, k, v: [n_head, T, d_head]) -> [n_head, T, d_head], causal",
             ("q", "k", "v"), 20, _attention_reference, _attention_cases, _attention_diagnose),
    Exercise("rms_norm", "04_layers", "rms_norm(x: [..., d], weight: [d], eps: float) -> [..., d]",
             ("x", "weight", "eps"), 10, _rms_reference, _rms_cases, _rms_diagnose),
    Exercise("layer_norm", "04_layers", "layer_norm(x: [..., d], weight: [d], bias: [d], eps: float) -> [..., d]",
             ("x", "weight", "bias", "eps"), 10, _ln_reference, _ln_cases, _ln_diagnose),
    Exercise("swiglu_ffn", "04_layers", "swiglu_ffn(x: [..., d], w_gate: [d_ff, d], w_up: [d_ff, d], w_down: [d, d_ff]) "
             "-> [..., d], weights as the checkpoint stores them ([out, in])",
             ("x", "w_gate", "w_up", "w_down"), 15, _swiglu_reference, _swiglu_cases, _swiglu_diagnose,
             atol=1e-4),
    Exercise("lm_head", "05_lm_head", "lm_head(h: [T, d], W: [vocab, d]) -> logits [T, vocab]",
             ("h", "W"), 5, lm_head, _lm_head_cases, _lm_head_diagnose),
    Exercise("softmax", "05_lm_head", "softmax(logits: [..., vocab]) -> probabilities [..., vocab]",
             ("logits",), 10, softmax, _softmax_cases, _softmax_diagnose, rtol=1e-4, atol=1e-6),
    Exercise("logit_lens", "05_lm_head",
             "logit_lens(resid: [n_layer + 1, d], norm_weight: [d], eps: float, W_U: [vocab, d]) "
             "-> logits [n_layer + 1, vocab]",
             ("resid", "norm_weight", "eps", "W_U"), 15, _lens_reference, _lens_cases, _lens_diagnose, atol=1e-4),
    Exercise("apply_temperature", "06_sampling", "apply_temperature(logits: [..., vocab], temperature: float) -> logits",
             ("logits", "temperature"), 5, apply_temperature, _temperature_cases, _temperature_diagnose),
    Exercise("top_k_filter", "06_sampling", "top_k_filter(logits: [..., vocab], top_k: int) -> logits, -inf where removed",
             ("logits", "top_k"), 10, top_k_filter, _top_k_cases, _top_k_diagnose),
    Exercise("top_p_filter", "06_sampling", "top_p_filter(logits: [..., vocab], top_p: float) -> logits, -inf where removed",
             ("logits", "top_p"), 20, top_p_filter, _top_p_cases, _top_p_diagnose),
    Exercise("greedy_generate", "07_autoregressive",
             "greedy_generate(next_logits: Callable[[list[int]], Tensor [vocab]], prompt_ids: list[int], n: int) -> list[int]",
             ("next_logits", "prompt_ids", "n"), 10, _greedy_reference, _greedy_cases, _greedy_diagnose),
    Exercise("kv_cache_step", "deep_dives/kv_cache",
             "kv_cache_step(q, k_new, v_new: [n_head, 1, d_head], k_cache, v_cache: [n_head, S, d_head]) "
             "-> (out [n_head, 1, d_head], k_cache [n_head, S+1, d_head], v_cache)",
             ("q", "k_new", "v_new", "k_cache", "v_cache"), 15, _kv_step_reference, _kv_step_cases, _kv_step_diagnose),
    Exercise("kv_cache_bytes", "08_cost", "kv_cache_bytes(n_layer, n_kv_head, d_head, T, bytes_per_number) -> int",
             ("n_layer", "n_kv_head", "d_head", "T", "bytes_per_number"), 5, _kv_bytes_reference, _kv_bytes_cases,
             _kv_bytes_diagnose),
    Exercise("token_flops", "08_cost",
             "token_flops(n_layer, d_model, n_head, n_kv_head, d_head, d_ff, vocab_size, context) -> int",
             ("n_layer", "d_model", "n_head", "n_kv_head", "d_head", "d_ff", "vocab_size", "context"), 15,
             _token_flops_reference, _token_flops_cases, _token_flops_diagnose),
    Exercise("next_token_logits", "09_the_journey", "next_token_logits(weights: Weights, config: Config, ids: [T] int64) "
             "-> logits [vocab] of the token after ids", ("weights", "config", "ids"), 30, _next_token_reference,
             _next_token_cases, _next_token_diagnose, rtol=1e-4, atol=1e-4),
    Exercise("split_logit", "deep_dives/interventions",
             "split_logit(embedding: [d], writes: [n, d], norm_weight: [d], unembed: [d], eps: float) -> [n + 1]",
             ("embedding", "writes", "norm_weight", "unembed", "eps"), 15, _split_logit_reference,
             _split_logit_cases, _split_logit_diagnose),
    Exercise("speculative_accept", "deep_dives/speculative_decoding",
             "speculative_accept(p: [V], q: [V], drafted: int, u: float) -> (accepted: bool, residual: [V])",
             ("p", "q", "drafted", "u"), 15, speculative_accept, _accept_cases, _accept_diagnose),
    Exercise("int8_quantize", "deep_dives/quantization",
             "int8_quantize(w: [d_in, d_out]) -> (codes: int8 [d_in, d_out], scales: [d_out])",
             ("w",), 10, _int8_reference, _int8_cases, _int8_diagnose),
]}
