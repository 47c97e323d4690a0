"""Section 四: the layer every token passes through N times — norm, attention, FFN, residual."""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

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


def layer_norm(x: Tensor, w: Norm, eps: float) -> Tensor:
    """GPT-2's LayerNorm: subtract the mean, divide by the standard deviation, scale and shift.  # [T, d] -> [T, d]"""
    mean = x.mean(-1, keepdim=True)
    var = x.var(-1, keepdim=True, unbiased=False)
    y = (x - mean) / torch.sqrt(var + eps) * w.weight
    return y + w.bias if w.bias is not None else y


def rms_norm(x: Tensor, w: Norm, eps: float) -> Tensor:
    """Llama's RMSNorm: divide by the root mean square only (no centring), then scale.  # [..., d] -> [..., d]"""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.weight


def norm(x: Tensor, w: Norm, config: Config) -> Tensor:
    """The model's normalization: LayerNorm for GPT-2, RMSNorm for Llama and Gemma.  # [T, d] -> [T, d]"""
    if config.norm == "layernorm":
        return layer_norm(x, w, config.norm_eps)
    return rms_norm(x, w, config.norm_eps)


def causal_mask(t: int, s: int | None = None, window: int | None = None) -> Tensor:
    """True where query i may look at key j: j <= i (never the future), and within `window` if given.

    The t queries are the last t of the s keys (s > t when a KV cache holds the earlier ones).  # -> [t, s] bool
    """
    s = t if s is None else s
    q_pos = torch.arange(s - t, s)[:, None]
    k_pos = torch.arange(s)[None, :]
    allowed = k_pos <= q_pos
    if window is not None:
        allowed &= k_pos > q_pos - window
    return allowed


class AttentionOut(NamedTuple):
    out: Tensor        # [T, d_model]
    weights: Tensor    # [n_head, T, S] softmax(q·k), one row per query
    q: Tensor          # [n_head, T, d_head], after RoPE
    k: Tensor          # [n_kv_head, S, d_head], after RoPE, cached keys included
    v: Tensor          # [n_kv_head, S, d_head]


def split_heads(x: Tensor, n: int) -> Tensor:
    """[T, n * d_head] -> [n, T, d_head]"""
    t = x.shape[0]
    return x.view(t, n, -1).transpose(0, 1)


def attention(x: Tensor, block: Block, config: Config, mask: Tensor,
              rope: tuple[Tensor, Tensor] | None = None, cache: LayerCache | None = None) -> AttentionOut:
    """Causal self-attention, multi-head or grouped-query.  # [T, d_model] -> [T, d_model]

    With a `cache`, the new keys/values are appended to it and the queries attend to all cached positions;
    `mask` is [T, S] with S = cached + T.
    """
    t = x.shape[0]
    q = split_heads(linear(x, block.attn_q), config.n_head)      # (nh, T, hs)
    k = split_heads(linear(x, block.attn_k), config.n_kv_head)   # (nkv, T, hs)
    v = split_heads(linear(x, block.attn_v), config.n_kv_head)
    if block.attn_q_norm is not None:                            # Gemma-3 normalizes each head's q and k
        q = rms_norm(q, block.attn_q_norm, config.norm_eps)
        k = rms_norm(k, block.attn_k_norm, config.norm_eps)
    if rope is not None:
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    if cache is not None:
        k, v = cache.update(k, v)                                # (nkv, S, hs)
    # GQA: query heads h = g*group .. g*group+group-1 share k/v head g; stacking them along T avoids copying k/v.
    group = config.n_head // config.n_kv_head
    s = k.shape[1]
    q_grouped = q.reshape(config.n_kv_head, group * t, -1)                        # (nkv, group*T, hs)
    scores = (q_grouped @ k.transpose(-1, -2)).view(config.n_head, t, s) * config.scale  # (nh, T, S)
    scores = scores.masked_fill(~mask, float("-inf"))            # the future is not there to look at
    weights = torch.softmax(scores, dim=-1)
    mixed = (weights.view(config.n_kv_head, group * t, s) @ v).view(config.n_head, t, -1)  # (nh, T, hs)
    mixed = mixed.transpose(0, 1).reshape(t, -1)                 # (T, nh*hs): heads side by side again
    return AttentionOut(linear(mixed, block.attn_output), weights, q, k, v)


def ffn(x: Tensor, block: Block, config: Config) -> tuple[Tensor, Tensor]:
    """Feed-forward network, applied to each token on its own; returns (out, hidden activation).

    GPT-2: down(gelu(up(x))). Llama: down(silu(gate(x)) * up(x)). Gemma: the same with gelu.  # [T, d] -> ([T, d], [T, d_ff])
    """
    if config.ffn == "gelu":
        hidden = F.gelu(linear(x, block.ffn_up), approximate="tanh")
    else:
        act = F.silu if config.ffn == "swiglu" else (lambda g: F.gelu(g, approximate="tanh"))
        hidden = act(linear(x, block.ffn_gate)) * linear(x, block.ffn_up)
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
                  rope: tuple[Tensor, Tensor] | None = None, cache: LayerCache | None = None) -> BlockOut:
    """One layer, pre-norm: x + Attention(Norm(x)), then + FFN(Norm(.)). Residuals keep what came in.  # [T, d] -> [T, d]"""
    attn_in = norm(x, block.attn_norm, config)
    a = attention(attn_in, block, config, mask, rope, cache)
    attn_out = a.out if block.post_attention_norm is None else norm(a.out, block.post_attention_norm, config)
    resid_mid = x + attn_out
    ffn_in = norm(resid_mid, block.ffn_norm, config)
    f_out, hidden = ffn(ffn_in, block, config)
    if block.post_ffw_norm is not None:
        f_out = norm(f_out, block.post_ffw_norm, config)
    return BlockOut(attn_in, a, resid_mid, ffn_in, hidden, f_out, resid_mid + f_out)

