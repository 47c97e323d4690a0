"""Section 四: the layer every token passes through N times — norm, attention, FFN, residual.

The readable stages, one idea per function (notebook 04 rebuilds attention from its four steps). Passes that record
nothing run the same block with fast.FAST, torch's fused norm, attention and FFN (tested equal: tests/test_prefill.py).
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .checks import is_int
from .embedding import apply_rope
from .kv_cache import LayerCache
from .weights import Block, Config, Linear, Norm


def linear(x: Tensor, w: Linear) -> Tensor:
    """x @ W + b (W a float matrix, or a quantized one that multiplies itself).  # [T, d_in] -> [T, d_out]"""
    y = x @ w.weight
    return y + w.bias if w.bias is not None else y


def layer_norm(x: Tensor, w: Norm, eps: float) -> Tensor:
    """GPT-2's LayerNorm: subtract the mean, divide by the standard deviation, scale and shift.  # [T, d] -> [T, d]"""
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, keepdim=True, unbiased=False)
    y = (x - mean) / torch.sqrt(var + eps) * w.weight
    return y + w.bias if w.bias is not None else y


def rms_norm(x: Tensor, w: Norm, eps: float, *, scale_in_float32: bool = False) -> Tensor:
    """Llama's RMSNorm: divide by the root mean square only (no centring), then scale.  # [..., d] -> [..., d]

    Computed in float32 and rounded back before the scale, as transformers does: in fp16 the square of a residual
    value of 22552 (SmolLM2 has them) overflows to inf and the whole vector would become 0. Gemma was trained
    rounding after the scale instead, (x * w).to(fp16), so it asks for that (transformers PR 29402).
    """
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    if scale_in_float32:
        return (y * w.weight.float()).to(x.dtype)
    return y.to(x.dtype) * w.weight


def norm(x: Tensor, w: Norm, config: Config) -> Tensor:
    """The model's normalization: LayerNorm for GPT-2, RMSNorm for Llama and Gemma.  # [T, d] -> [T, d]"""
    if config.norm == "layernorm":
        return layer_norm(x, w, config.norm_eps)
    return rms_norm(x, w, config.norm_eps, scale_in_float32=config.family == "gemma3")


def causal_mask(t: int, s: int | None = None, window: int | None = None) -> Tensor:
    """True where query i may look at key j: j <= i (never the future), and within `window` if given.

    The t queries are the last t of the s keys (s > t when a KV cache holds the earlier ones).  # -> [t, s] bool
    """
    s = t if s is None else s
    if not (is_int(t) and is_int(s) and 0 <= t <= s):
        raise ValueError(f"causal_mask needs ints 0 <= t <= s (t queries, the last of s keys), got t={t!r}, s={s!r}")
    if window is not None and not (is_int(window) and window >= 1):
        raise ValueError(f"window must be an int >= 1 (keys within `window` positions), got {window!r}")
    q_pos = torch.arange(s - t, s)[:, None]
    k_pos = torch.arange(s)[None, :]
    allowed = k_pos <= q_pos
    if window is not None:
        allowed &= k_pos > q_pos - window
    return allowed


class AttentionOut(NamedTuple):
    out: Tensor        # [T, d_model]
    weights: Tensor | None  # [n_head, T, S] softmax(q·k), one row per query (None: fast.attention)
    q: Tensor          # [n_head, T, d_head], after RoPE
    k: Tensor          # [n_kv_head, S, d_head], after RoPE, cached keys included
    v: Tensor          # [n_kv_head, S, d_head]
    z: Tensor          # [n_head, T, d_head] each head's mix of values, before W_O


Hook = Callable[[str, Tensor], Tensor]   # (hook point, activation) -> the activation to use instead


def no_hook(point: str, a: Tensor) -> Tensor:
    """The hook of a layer nobody intervenes on: every activation flows on as it is."""
    return a


def split_heads(x: Tensor, n: int) -> Tensor:
    """[T, n * d_head] -> [n, T, d_head]"""
    t = x.shape[0]
    return x.view(t, n, -1).transpose(0, 1)


def merge_heads(x: Tensor) -> Tensor:
    """The heads side by side again.  # [n, T, d_head] -> [T, n * d_head]"""
    return x.transpose(0, 1).reshape(x.shape[1], -1)


def project_qkv(x: Tensor, block: Block, config: Config,
                rope: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """q = x·W_q, k = x·W_k, v = x·W_v, split into heads; q and k rotated by RoPE.

    # [T, d_model] -> ([n_head, T, d_head], [n_kv_head, T, d_head], [n_kv_head, T, d_head])
    """
    q, k, v = split_qkv(linear(x, block.attn_q), linear(x, block.attn_k), linear(x, block.attn_v), block, config)
    if rope is not None:
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    return q, k, v


def split_qkv(q: Tensor, k: Tensor, v: Tensor, block: Block, config: Config) -> tuple[Tensor, Tensor, Tensor]:
    """The projections split into heads (and, for Gemma-3, each head's q and k normalized).

    # ([T, n_head * d_head], [T, n_kv_head * d_head] x 2) -> ([n_head, T, d_head], [n_kv_head, T, d_head] x 2)
    """
    q, k, v = split_heads(q, config.n_head), split_heads(k, config.n_kv_head), split_heads(v, config.n_kv_head)
    if block.attn_q_norm is not None:
        q, k = norm(q, block.attn_q_norm, config), norm(k, block.attn_k_norm, config)
    return q, k, v


def attention_scores(q: Tensor, k: Tensor, config: Config) -> Tensor:
    """Every query's dot product with every key, times the scale (1/√d_head): how well they match.

    GQA: query heads h = g*group .. g*group+group-1 read key head g; stacking them along T avoids copying k.
    # ([n_head, T, d_head], [n_kv_head, S, d_head]) -> [n_head, T, S]
    """
    n_head, t, _ = q.shape
    n_kv, s, _ = k.shape
    q_grouped = q.reshape(n_kv, n_head // n_kv * t, -1)                          # (nkv, group*T, hs)
    return (q_grouped @ k.transpose(-1, -2)).view(n_head, t, s) * config.scale


def mix_values(weights: Tensor, v: Tensor) -> Tensor:
    """Each query's weighted sum of the values it attends to (GQA as in attention_scores).

    # ([n_head, T, S], [n_kv_head, S, d_head]) -> [n_head, T, d_head]
    """
    n_head, t, s = weights.shape
    n_kv = v.shape[0]
    return (weights.reshape(n_kv, n_head // n_kv * t, s) @ v).view(n_head, t, -1)


def attention(x: Tensor, block: Block, config: Config, mask: Tensor | None,
              rope: tuple[Tensor, Tensor] | None = None, cache: LayerCache | None = None,
              hook: Hook = no_hook) -> AttentionOut:
    """Causal self-attention, multi-head or grouped-query.  # [T, d_model] -> [T, d_model]

    With a `cache`, the new keys/values are appended to it and the queries attend to all cached positions;
    `mask` is [T, S] with S = cached + T (None: the plain causal mask, S = T). `hook("attn.z", z)` may replace
    the heads' outputs before W_O.
    """
    q, k, v = project_qkv(x, block, config, rope)
    if cache is not None:
        k, v = cache.update(k, v)                                # (nkv, S, hs)
    mask = causal_mask(q.shape[1], k.shape[1]) if mask is None else mask
    scores = attention_scores(q, k, config)                      # (nh, T, S)
    scores = scores.masked_fill(~mask, float("-inf"))            # the future is not there to look at
    weights = torch.softmax(scores, dim=-1)
    z = hook("attn.z", mix_values(weights, v))                   # (nh, T, hs)
    return AttentionOut(linear(merge_heads(z), block.attn_output), weights, q, k, v, z)


def gate(config: Config) -> Callable[[Tensor], Tensor]:
    """The nonlinearity of a gated FFN: SiLU for Llama's SwiGLU, tanh-approximated GELU for Gemma's GeGLU."""
    return F.silu if config.ffn == "swiglu" else (lambda g: F.gelu(g, approximate="tanh"))


def ffn(x: Tensor, block: Block, config: Config) -> tuple[Tensor, Tensor]:
    """Feed-forward network, applied to each token on its own; returns (out, hidden activation).

    GPT-2: down(gelu(up(x))). Llama: down(silu(gate(x)) * up(x)). Gemma: the same with gelu.  # [T, d] -> ([T, d], [T, d_ff])
    """
    if config.ffn == "gelu":
        hidden = F.gelu(linear(x, block.ffn_up), approximate="tanh")
    else:
        hidden = gate(config)(linear(x, block.ffn_gate)) * linear(x, block.ffn_up)
    return linear(hidden, block.ffn_down), hidden


class Stages(NamedTuple):
    """The norm, attention and FFN a block runs: READABLE here, or fast.FAST for passes that record nothing."""

    norm: Callable[[Tensor, Norm, Config], Tensor]
    attention: Callable[..., AttentionOut]
    ffn: Callable[[Tensor, Block, Config], tuple[Tensor, Tensor]]


READABLE = Stages(norm, attention, ffn)


class BlockOut(NamedTuple):
    attn_in: Tensor    # [T, d] normalized input of attention
    attn: AttentionOut
    resid_mid: Tensor  # [T, d] residual stream after attention
    ffn_in: Tensor     # [T, d] normalized input of the FFN
    ffn_hidden: Tensor  # [T, d_ff]
    ffn_out: Tensor    # [T, d]
    resid_post: Tensor  # [T, d] residual stream after the whole layer


def block_forward(x: Tensor, block: Block, config: Config, mask: Tensor | None,
                  rope: tuple[Tensor, Tensor] | None = None, cache: LayerCache | None = None,
                  hook: Hook = no_hook, *, stages: Stages = READABLE) -> BlockOut:
    """One layer, pre-norm: x + Attention(Norm(x)), then + FFN(Norm(.)). Residuals keep what came in.  # [T, d] -> [T, d]

    `hook(point, activation)` may replace what flows at each hook point: "resid_pre", "attn.z", "attn_out" (what
    attention adds to the stream), "ffn_out" (what the FFN adds) and "resid_post" (interventions.py).
    stages=fast.FAST: torch's fused norm, attention and FFN, for passes that keep no attention weights.
    """
    x = hook("resid_pre", x)
    attn_in = stages.norm(x, block.attn_norm, config)
    a = stages.attention(attn_in, block, config, mask, rope, cache, hook)
    resid_mid = x + hook("attn_out", post_norm(a.out, block.post_attention_norm, config, stages.norm))
    ffn_in = stages.norm(resid_mid, block.ffn_norm, config)
    f_out, hidden = stages.ffn(ffn_in, block, config)
    f_out = hook("ffn_out", post_norm(f_out, block.post_ffw_norm, config, stages.norm))
    return BlockOut(attn_in, a, resid_mid, ffn_in, hidden, f_out, hook("resid_post", resid_mid + f_out))


def post_norm(y: Tensor, w: Norm | None, config: Config, norm_: Callable[[Tensor, Norm, Config], Tensor]) -> Tensor:
    """What attention or the FFN adds, normalized first where the model has a norm there (Gemma-3's "sandwich"
    norms), else as it is.  # [T, d] -> [T, d]"""
    return y if w is None else norm_(y, w, config)
