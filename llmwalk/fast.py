"""The fast path of passes that record nothing (generation): layers.py's maths in fewer, fused operations.

forward(record=False) runs every block with FAST instead of layers.READABLE: torch's fused attention kernel (the
[n_head, T, S] scores and their softmax are never stored), RMSNorm in one operation, RoPE on q and k at once, one
product for the linears that quantize_model(fuse=True) stored as one matrix, and a decoding step's matrix-vector
products (and its LM head) split over torch's threads (matvec, lm_head). Each function here is tested equal to
its readable twin in layers.py (tests/test_prefill.py), hooks included.
"""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from . import layers
from .embedding import apply_rope
from .kv_cache import LayerCache
from .layers import AttentionOut, Hook, Stages, gate, merge_heads, no_hook, split_heads, split_qkv
from .quantize import MatrixLike, QuantizedTensor
from .weights import Block, Config, Linear, Norm


def thread_parts(n: int) -> int:
    """Blocks to cut n rows into for torch's threads: the thread count, lowered to a divisor of n."""
    return max(p for p in range(1, torch.get_num_threads() + 1) if n % p == 0)


def matvec(x: Tensor, w: Tensor, parts: int | None = None) -> Tensor:
    """x @ w for one row x, as `parts` products that torch runs on as many threads at once.

    One token's x @ W is a matrix-vector product: it reads each weight once and does one multiply-add with it, so
    memory bounds it. torch runs it on one thread (measured on a 2-core EPYC: one thread streams the weights at
    ~15 GB/s, the same as with two, while a plain sum over both cores reads ~25 GB/s). Cutting W's rows into
    `parts` blocks — W.view(parts, d_in / parts, d_out), a view of the same memory, no copy — makes it a batched
    product, which torch splits over its threads: each thread reads its own block, and the partial products are
    summed. The same multiply-adds, summed in another order: equal to x @ w up to float rounding (tested).
    parts=None: torch's thread count, lowered to a divisor of d_in; 1, or a w that is not a contiguous float
    matrix (a quantized one multiplies itself), is plain x @ w.  # ([1, d_in], [d_in, d_out]) -> [1, d_out]
    """
    if isinstance(w, MatrixLike):          # what x @ w hands it, without torch's detour (~8 µs) through
        return w.__rmatmul__(x)            # __torch_function__
    if x.shape[0] != 1 or not isinstance(w, Tensor) or not w.is_contiguous() or x.dtype != w.dtype:
        return x @ w
    if parts is None:
        parts = thread_parts(w.shape[0])
    if parts == 1 or w.shape[0] % parts:
        return x @ w
    d_in, d_out = w.shape
    return torch.bmm(x.view(parts, 1, d_in // parts), w.view(parts, d_in // parts, d_out)).sum(0)


def linear(x: Tensor, w: Linear) -> Tensor:
    """layers.linear with matvec's threaded product for one token.  # [T, d_in] -> [T, d_out]"""
    y = matvec(x, w.weight)
    return y + w.bias if w.bias is not None else y


def lm_head(x: Tensor, output: Tensor) -> Tensor:
    """head.lm_head (x @ output.T) for one position, on as many threads as torch has.

    output [vocab, d_model] stored row by row (the token table itself): its rows cut into one block of the
    vocabulary per thread, one batched product; each logit is still one whole dot product (no partial sums).
    Stored column by column (generation.decoding_head, output.T contiguous): matvec. Anything else: x @ output.T.
    # [T, d_model] -> [T, vocab]
    """
    if x.shape[0] != 1 or not isinstance(output, Tensor) or not output.is_contiguous() or x.dtype != output.dtype:
        return matvec(x, output.T)
    vocab = output.shape[0]
    parts = thread_parts(vocab)
    if parts == 1:
        return x @ output.T
    blocks = output.view(parts, vocab // parts, -1).transpose(1, 2)             # (parts, d_model, vocab / parts)
    return torch.bmm(x.expand(parts, 1, -1), blocks).view(1, vocab)


def fused_whole(lins: Sequence[Linear]) -> QuantizedTensor | None:
    """The one quantized matrix that lins' weights are the consecutive column slices of, in order (quantize_model
    (fuse=True) stores q/k/v and gate/up so), or None: then each is its own product.  # -> [d_in, Σ d_out] or None"""
    parts = [lin.weight.fused if isinstance(lin.weight, QuantizedTensor) else None for lin in lins]
    if parts[0] is None or any(p is None or p.whole is not parts[0].whole for p in parts):
        return None
    ends = [0] + [p.end for p in parts]
    if [p.start for p in parts] != ends[:-1] or ends[-1] != parts[0].whole.shape[1]:
        return None
    return parts[0].whole


def linears(x: Tensor, lins: Sequence[Linear]) -> list[Tensor]:
    """[linear(x, l) for l in lins], as one product when their weights are the column slices of one quantized
    matrix (fused_whole): one kernel call per token instead of three, its output split in one operation.

    # [T, d_in] -> [[T, d_out_i]]
    """
    whole = fused_whole(lins)
    if whole is None:
        return [linear(x, lin) for lin in lins]
    ys = whole.__rmatmul__(x).split([lin.weight.shape[1] for lin in lins], dim=1)    # [T, Σ d_out] in views
    return [y if lin.bias is None else y + lin.bias for y, lin in zip(ys, lins)]


def norm(x: Tensor, w: Norm, config: Config) -> Tensor:
    """layers.norm with RMSNorm in torch's one fused operation (F.rms_norm) for float32 activations, where it
    computes the same numbers as rms_norm's six; other dtypes and LayerNorm take layers.norm.  # [T, d] -> [T, d]"""
    if config.norm == "layernorm" or x.dtype != torch.float32:
        return layers.norm(x, w, config)
    return F.rms_norm(x, x.shape[-1:], w.weight, config.norm_eps)


def rope_together(q: Tensor, k: Tensor, rope: tuple[Tensor, Tensor] | None) -> tuple[Tensor, Tensor]:
    """apply_rope to q and to k as one tensor (the same angles rotate both): half the small operations, which
    is what a decoding step of one token pays for.  # ([n_head, T, d_head], [n_kv_head, T, d_head]) -> same"""
    if rope is None:
        return q, k
    qk = apply_rope(torch.cat([q, k]), *rope)                   # (nh + nkv, T, hs)
    return qk[:q.shape[0]], qk[q.shape[0]:]


def project_qkv(x: Tensor, block: Block, config: Config,
                rope: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """layers.project_qkv in fewer operations: with q/k/v stored as one matrix, its product split into all the
    heads at once (q's, then k's, then v's: the matrix's column order), q and k rotated as one tensor, then split.

    # [T, d_model] -> ([n_head, T, d_head], [n_kv_head, T, d_head], [n_kv_head, T, d_head])
    """
    lins = (block.attn_q, block.attn_k, block.attn_v)
    whole = fused_whole(lins)
    if whole is None or block.attn_q_norm is not None or any(lin.bias is not None for lin in lins):
        q, k, v = split_qkv(*linears(x, lins), block, config)
        return (*rope_together(q, k, rope), v)
    nh, nkv = config.n_head, config.n_kv_head
    qk, v = split_heads(whole.__rmatmul__(x), nh + 2 * nkv).split([nh + nkv, nkv])  # (nh + nkv, T, hs), (nkv, T, hs)
    q, k = (qk if rope is None else apply_rope(qk, *rope)).split([nh, nkv])
    return q, k, v


def attention(x: Tensor, block: Block, config: Config, mask: Tensor | None,
              rope: tuple[Tensor, Tensor] | None = None, cache: LayerCache | None = None,
              hook: Hook = no_hook) -> AttentionOut:
    """layers.attention through torch's fused scaled_dot_product_attention: the same output, weights None.

    mask=None: the plain causal mask over S = T positions (a whole prompt), which the kernel applies itself without
    building it, or no mask at all for one new token (decoding), which sees every position.
    # [T, d_model] -> [T, d_model]
    """
    q, k, v = project_qkv(x, block, config, rope)
    if cache is not None:
        k, v = cache.update(k, v)                                # (nkv, S, hs)
    z = hook("attn.z", (attend_one if x.shape[0] == 1 else attend_all)(q, k, v, mask, config))   # (nh, T, hs)
    return AttentionOut(linear(merge_heads(z), block.attn_output), None, q, k, v, z)


def attend_all(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, config: Config) -> Tensor:
    """Each head's mix of values for T queries at once.

    # ([n_head, T, d_head], [n_kv_head, S, d_head] x 2) -> [n_head, T, d_head]

    torch's CPU flash kernel takes only 4-D [batch, head, T, d_head] inputs with as many key heads as query heads;
    anything else falls back to a plain implementation that stores the scores (several times slower). So each key
    head is copied for the query heads of its group (GQA), which also makes k/v contiguous.
    """
    group = config.n_head // k.shape[0]
    k_all, v_all = (a.repeat_interleave(group, dim=0)[None] for a in (k, v))   # (1, nh, S, hs)
    return F.scaled_dot_product_attention(q[None], k_all, v_all, attn_mask=mask, is_causal=mask is None,
                                          scale=config.scale)[0]


def attend_one(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, config: Config) -> Tensor:
    """Each head's mix of values for one new token (decoding): one fused kernel over the cache instead of the ~8
    small operations of the plain path (scores, scale, mask, softmax, mix), reading the cached keys in place
    (enable_gqa: no copy per query head). The one query is the last position, so it sees every key: no causal mask
    (is_causal would align it with key 0); `mask` [1, S] only for a sliding window.
    # ([n_head, 1, d_head], [n_kv_head, S, d_head] x 2) -> [n_head, 1, d_head]
    """
    return F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask, scale=config.scale,
                                          enable_gqa=True)[0]


def ffn(x: Tensor, block: Block, config: Config) -> tuple[Tensor, Tensor]:
    """layers.ffn with a gated FFN's gate and up projections as one product when they are stored fused.

    # [T, d] -> ([T, d], [T, d_ff])
    """
    if config.ffn == "gelu":
        hidden = gate(config)(linear(x, block.ffn_up))
        return linear(hidden, block.ffn_down), hidden
    g, up = linears(x, (block.ffn_gate, block.ffn_up))
    hidden = gate(config)(g) * up
    return linear(hidden, block.ffn_down), hidden


def masks(config: Config, t: int, start: int) -> dict[int | None, Tensor | None]:
    """The mask of every distinct attention window for t new positions after `start` cached ones: None where the
    kernel needs none (a whole prompt: it applies the causal mask itself; one new token: it sees every position)
    and the window does not cut.  # -> {window: [t, start + t] bool or None}"""
    plain = start == 0 or t == 1
    return {win: None if plain and (win is None or win >= start + t) else layers.causal_mask(t, start + t, win)
            for win in {config.window(i) for i in range(config.n_layer)}}


FAST = Stages(norm, attention, ffn)
