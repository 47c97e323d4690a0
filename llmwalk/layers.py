"""Section 四: the layer every token passes through N times — norm, attention, FFN, residual."""
from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .checks import is_int
from .embedding import apply_rope
from .kv_cache import LayerCache
from .weights import Block, Config, Linear, Norm


def matmul(x: Tensor, w) -> Tensor:
    """x @ w for a float matrix or a quantized one, which multiplies itself.  # [T, d_in] -> [T, d_out]"""
    # For a non-tensor w, `x @ w` first fails inside torch and only then falls back to w.__rmatmul__(x):
    # about 10 µs lost per product, an eighth of an int8 decode step. So ask w directly.
    return x @ w if isinstance(w, Tensor) else w.__rmatmul__(x)


def linear(x: Tensor, w: Linear) -> Tensor:
    """x @ W + b.  # [T, d_in] -> [T, d_out]"""
    y = matmul(x, w.weight)
    return y + w.bias if w.bias is not None else y


def linears(x: Tensor, lins: Sequence[Linear]) -> list[Tensor]:
    """[linear(x, l) for l in lins], as one product when their weights are column slices of one stored matrix
    (quantize_model fuses q/k/v and gate/up so): one kernel call per token instead of three.  # [T, d_in] -> [[T, d_out_i]]
    """
    parents = [getattr(lin.weight, "parent", None) for lin in lins]
    if len(lins) < 2 or parents[0] is None or any(p is None or p[0] is not parents[0][0] for p in parents):
        return [linear(x, lin) for lin in lins]
    y = matmul(x, parents[0][0])                                  # [T, Σ d_out]
    return [y[:, start:end] if lin.bias is None else y[:, start:end] + lin.bias
            for (_, start, end), lin in zip(parents, lins)]


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
    weights: Tensor | None  # [n_head, T, S] softmax(q·k), one row per query (None: attention_fast)
    q: Tensor          # [n_head, T, d_head], after RoPE
    k: Tensor          # [n_kv_head, S, d_head], after RoPE, cached keys included
    v: Tensor          # [n_kv_head, S, d_head]
    z: Tensor          # [n_head, T, d_head] each head's mix of values, before W_O


Hook = Callable[[str, Tensor], Tensor]   # (hook point, activation) -> the activation to use instead


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
    q, k, v = linears(x, (block.attn_q, block.attn_k, block.attn_v))
    q, k, v = split_heads(q, config.n_head), split_heads(k, config.n_kv_head), split_heads(v, config.n_kv_head)
    if block.attn_q_norm is not None:                            # Gemma-3 normalizes each head's q and k
        q = norm(q, block.attn_q_norm, config)
        k = norm(k, block.attn_k_norm, config)
    if rope is not None:
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
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
              hook: Hook | None = None) -> AttentionOut:
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
    z = mix_values(weights, v)                                   # (nh, T, hs)
    if hook is not None:
        z = hook("attn.z", z)
    return AttentionOut(linear(merge_heads(z), block.attn_output), weights, q, k, v, z)


def attention_fast(x: Tensor, block: Block, config: Config, mask: Tensor | None,
                   rope: tuple[Tensor, Tensor] | None = None, cache: LayerCache | None = None,
                   hook: Hook | None = None) -> AttentionOut:
    """`attention` through torch's fused scaled_dot_product_attention: the same output, weights None.

    For passes that record nothing (generation): the [n_head, T, S] scores and their softmax are never stored,
    which at long prompts costs more time than the rest of attention. mask=None: the plain causal mask over
    S = T positions, which the kernel applies itself without building it.  # [T, d_model] -> [T, d_model]
    """
    decoding = x.shape[0] == 1
    if decoding and not SDPA_GQA:       # an older torch: the plain path reads the cache without a copy
        return attention(x, block, config, mask, rope, cache, hook)
    q, k, v = project_qkv(x, block, config)
    q, k = rope_together(q, k, rope)
    if cache is not None:
        k, v = cache.update(k, v)                                # (nkv, S, hs)
    if decoding:
        return _attend_one(q, k, v, mask, block, config, hook)
    # torch's CPU flash kernel takes only 4-D [batch, head, T, d_head] inputs with as many key heads as query heads;
    # anything else falls back to a plain implementation that stores the scores (several times slower). So each key
    # head is copied for the query heads of its group (GQA), which also makes k/v contiguous.
    group = config.n_head // k.shape[0]
    k_all, v_all = (a.repeat_interleave(group, dim=0)[None] for a in (k, v))   # (1, nh, S, hs)
    z = F.scaled_dot_product_attention(q[None], k_all, v_all, attn_mask=mask, is_causal=mask is None,
                                       scale=config.scale)[0]                  # (nh, T, hs)
    if hook is not None:
        z = hook("attn.z", z)
    return AttentionOut(linear(merge_heads(z), block.attn_output), None, q, k, v, z)


def rope_together(q: Tensor, k: Tensor, rope: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor]:
    """apply_rope to q and to k as one tensor (the same angles rotate both): half the small operations, which
    is what a decoding step of one token pays for.  # ([n_head, T, d_head], [n_kv_head, T, d_head]) -> same"""
    if rope is None:
        return q, k
    qk = apply_rope(torch.cat([q, k]), *rope)                   # (nh + nkv, T, hs)
    return qk[:q.shape[0]], qk[q.shape[0]:]


def norm_fast(x: Tensor, w: Norm, config: Config) -> Tensor:
    """`norm` with RMSNorm in torch's one fused operation (F.rms_norm) for float32 activations, where it computes
    the same numbers as rms_norm's six; other dtypes and LayerNorm take `norm`.  # [T, d] -> [T, d]"""
    if config.norm == "layernorm" or x.dtype != torch.float32:
        return norm(x, w, config)
    return F.rms_norm(x, x.shape[-1:], w.weight, config.norm_eps)


# torch >= 2.5's scaled_dot_product_attention reads one key head for a group of query heads itself (enable_gqa).
SDPA_GQA = tuple(int(n) for n in torch.__version__.split(".")[:2]) >= (2, 5)


def _attend_one(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, block: Block, config: Config,
                hook: Hook | None) -> AttentionOut:
    """attention_fast for one new token (decoding): one fused kernel over the cache instead of the ~8 small
    operations of the plain path (scores, scale, mask, softmax, mix), reading the cached keys in place (enable_gqa:
    no copy per query head). The one query is the last position, so it sees every key: no causal mask (is_causal
    would align it with key 0); `mask` [1, S] only for a sliding window.  # q [n_head, 1, d_head] -> out [1, d_model]
    """
    z = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask, scale=config.scale,
                                       enable_gqa=True)[0]                       # (nh, 1, hs)
    if hook is not None:
        z = hook("attn.z", z)
    return AttentionOut(linear(merge_heads(z), block.attn_output), None, q, k, v, z)


def ffn(x: Tensor, block: Block, config: Config) -> tuple[Tensor, Tensor]:
    """Feed-forward network, applied to each token on its own; returns (out, hidden activation).

    GPT-2: down(gelu(up(x))). Llama: down(silu(gate(x)) * up(x)). Gemma: the same with gelu.  # [T, d] -> ([T, d], [T, d_ff])
    """
    if config.ffn == "gelu":
        hidden = F.gelu(linear(x, block.ffn_up), approximate="tanh")
    else:
        act = F.silu if config.ffn == "swiglu" else (lambda g: F.gelu(g, approximate="tanh"))
        gate, up = linears(x, (block.ffn_gate, block.ffn_up))
        hidden = act(gate) * up
    return linear(hidden, block.ffn_down), hidden


class BlockOut(NamedTuple):
    attn_in: Tensor    # [T, d] normalized input of attention
    attn: AttentionOut
    resid_mid: Tensor  # [T, d] residual stream after attention
    ffn_in: Tensor     # [T, d] normalized input of the FFN
    ffn_hidden: Tensor  # [T, d_ff]
    ffn_out: Tensor    # [T, d]
    resid_post: Tensor  # [T, d] residual stream after the whole layer


def block_forward(x: Tensor, block: Block, config: Config, mask: Tensor,
                  rope: tuple[Tensor, Tensor] | None = None, cache: LayerCache | None = None,
                  hook: Hook | None = None, *, fast: bool = False) -> BlockOut:
    """One layer, pre-norm: x + Attention(Norm(x)), then + FFN(Norm(.)). Residuals keep what came in.  # [T, d] -> [T, d]

    `hook(point, activation)` may replace what flows at each hook point: "resid_pre", "attn.z", "attn_out" (what
    attention adds to the stream), "ffn_out" (what the FFN adds) and "resid_post" (interventions.py).
    fast=True: attention_fast and norm_fast, for passes that keep no attention weights.
    """
    hook = hook or (lambda name, a: a)
    norm_ = norm_fast if fast else norm
    x = hook("resid_pre", x)
    attn_in = norm_(x, block.attn_norm, config)
    a = (attention_fast if fast else attention)(attn_in, block, config, mask, rope, cache, hook)
    attn_out = a.out if block.post_attention_norm is None else norm_(a.out, block.post_attention_norm, config)
    resid_mid = x + hook("attn_out", attn_out)
    ffn_in = norm_(resid_mid, block.ffn_norm, config)
    f_out, hidden = ffn(ffn_in, block, config)
    if block.post_ffw_norm is not None:
        f_out = norm_(f_out, block.post_ffw_norm, config)
    f_out = hook("ffn_out", f_out)
    return BlockOut(attn_in, a, resid_mid, ffn_in, hidden, f_out, hook("resid_post", resid_mid + f_out))
