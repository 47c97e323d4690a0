"""Decoding's compiled step: one new token through the whole model in one call of machine code per layer.

Generation runs one token at a time after the prompt, and a step then reads every weight once for a few
multiply-adds each: memory, not arithmetic, should bound it. In torch a step is ~1,300–1,900 small operations,
each paying its own dispatch, and torch's integer kernels read their weights at about half the memory's rate
(README, Benchmarks). Here numba compiles the same maths — norms, the q/k/v, output, gate/up and down products,
RoPE, the new key and value written into the KV cache, attention over it, the LM head — to loops over the
weights as they are stored (no copy: the model's own memory, read in place), split over the cores.

This is the fast path of one thing only: forward(record=False) for one new token after a KV cache (what
generation does for every token after the first), without hooks, for the llama and gemma3 families in fp32 or
with quantize_model's int8 / int4 weights. Everything else runs layers.py (the lesson) or fast.py. The numbers
are the readable path's, summed in another order: the quantized formats round the products' inputs and outputs to
bf16 as torch's kernels do (tests/test_fast_decode.py compares the two step by step and token by token).

numba compiles each function once per machine (cached on disk, like the converted models). Where numba is not
installed, decoding runs fast.py's torch operations and says so once (`why_not`).
"""
from __future__ import annotations

import math
import os
import warnings
import weakref
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

import numpy as np
import torch
from torch import Tensor

from .kv_cache import KVCache
from .quantize import QuantizedTable, QuantizedTensor

if TYPE_CHECKING:
    from .models import Model

try:
    import numba
    from numba import literal_unroll, njit, prange
    from numba.extending import overload
except ImportError:                      # the eager path runs instead (why_not says so)
    numba = None

FAMILIES = ("llama", "mistral", "gemma3")     # RMSNorm, RoPE, a gated FFN, no biases
NO_NUMBA = ("numba is not installed, so decoding runs torch's operations one by one (fast.py), a few times slower "
            "per token: pip install numba")


# ---------------------------------------------------------------- the kernels (numba)

if numba is not None:
    # fastmath lets a sum be reordered into vector lanes; infinities and NaN keep their meaning (no nnan / ninf).
    JIT = dict(cache=True, nogil=True, boundscheck=False, error_model="numpy",
               fastmath={"reassoc", "contract", "nsz", "arcp"})
    F16, FI16 = np.float32(16.0), np.float32(1.0 / 16.0)

    @njit(**JIT)
    def _round_bf16(x, out):
        """out = x rounded to the nearest bfloat16 (ties to even), as torch's x.bfloat16() does, kept in float32."""
        b, o = x.view(np.uint32), out.view(np.uint32)
        for i in range(x.shape[0]):
            v = b[i]
            o[i] = (v + np.uint32(0x7FFF) + ((v >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)

    @njit(**JIT)
    def _rms_norm(x, w, eps, out):
        """out = x / sqrt(mean(x²) + eps) · w.  # [d] -> [d]"""
        ss = np.float32(0.0)
        for i in range(x.shape[0]):
            ss += x[i] * x[i]
        r = np.float32(1.0) / np.sqrt(ss / np.float32(x.shape[0]) + np.float32(eps))
        for i in range(x.shape[0]):
            out[i] = x[i] * r * w[i]

    # fp32 linears are stored [d_in, d_out]: y = Σ_k x_k · W[k], rows of W added up (each part of the rows in turn
    # on its own core, into its own partial sum).
    @njit(**JIT)
    def _rows_added(x, W, y):
        K, N = W.shape
        for n in range(N):
            y[n] = 0.0
        for k in range(K):
            xk, row = x[k], W[k]
            for n in range(N):
                y[n] += xk * row[n]

    @njit(parallel=True, **JIT)
    def _rows_added_parallel(x, W, part, parts):
        K = W.shape[0]
        step = (K + parts - 1) // parts
        for p in prange(parts):
            a = p * step
            b = min(K, a + step)
            _rows_added(x[a:b], W[a:b], part[p])

    @njit(**JIT)
    def _fp32_product(W, x, y, threads, part):
        """y = x @ W for W [d_in, d_out].  # [d_in] -> [d_out]"""
        N = W.shape[1]
        if threads == 1:
            _rows_added(x, W, y)
            return
        _rows_added_parallel(x, W, part, threads)
        for n in range(N):
            acc = np.float32(0.0)
            for p in range(threads):
                acc += part[p, n]
            y[n] = acc

    # Output-major matrices (the LM head [vocab, d], quantized codes [d_out, d_in]): one dot product per output,
    # each core a block of outputs.
    @njit(**JIT)
    def _dots(x, W, y):
        for n in range(W.shape[0]):
            row = W[n]
            acc = np.float32(0.0)
            for k in range(W.shape[1]):
                acc += x[k] * row[k]
            y[n] = acc

    @njit(parallel=True, **JIT)
    def _dots_parallel(x, W, y, parts):
        N = W.shape[0]
        step = (N + parts - 1) // parts
        for p in prange(parts):
            a = p * step
            b = min(N, a + step)
            _dots(x, W[a:b], y[a:b])

    @njit(**JIT)
    def _int8_dots(x, codes, scales, y):
        """y[n] = Σ_k x_k · codes[n, k] · scales[n]"""
        for n in range(codes.shape[0]):
            row = codes[n]
            acc = np.float32(0.0)
            for k in range(codes.shape[1]):
                acc += x[k] * np.float32(row[k])
            y[n] = acc * scales[n]

    @njit(parallel=True, **JIT)
    def _int8_dots_parallel(x, codes, scales, y, parts):
        N = codes.shape[0]
        step = (N + parts - 1) // parts
        for p in prange(parts):
            a = p * step
            b = min(N, a + step)
            _int8_dots(x, codes[a:b], scales[a:b], y[a:b])

    # 4-bit codes: byte j of row n holds inputs 2j (low half) and 2j + 1 (high half), as u = code + 8. With the
    # kernel's w = s·u + zz per group (zz = z − 8s), Σ_k x_k w_k = Σ_g s_g Σ_j (x_2j u_lo + x_2j+1 u_hi) + zz_g X_g,
    # X_g the group's sum of x. Splitting a byte f = u_lo + 16 u_hi: x_2j u_lo + x_2j+1 u_hi = x_2j f + (x_2j+1 −
    # 16 x_2j) u_hi, so only the high half is cut out of the byte (a float floor, which vectorizes).
    @njit(**JIT)
    def _int4_dots(xe, xo, X, codes, s, zz, shift, y):
        for n in range(codes.shape[0]):
            row, sn, zn = codes[n], s[n], zz[n]
            acc = np.float32(0.0)
            if shift == 4:       # groups of 32 (16 bytes, one vector of codes): a constant shift keeps s[j >> 4]
                for j in range(codes.shape[1]):      # one broadcast per vector, where a variable one gathers
                    f = np.float32(row[j])
                    acc += sn[j >> 4] * (xe[j] * f + xo[j] * np.floor(f * FI16))
            else:
                for j in range(codes.shape[1]):
                    f = np.float32(row[j])
                    acc += sn[j >> shift] * (xe[j] * f + xo[j] * np.floor(f * FI16))
            z = np.float32(0.0)
            for g in range(sn.shape[0]):
                z += zn[g] * X[g]
            y[n] = acc + z

    @njit(parallel=True, **JIT)
    def _int4_dots_parallel(xe, xo, X, codes, s, zz, shift, y, parts):
        N = codes.shape[0]
        step = (N + parts - 1) // parts
        for p in prange(parts):
            a = p * step
            b = min(N, a + step)
            _int4_dots(xe, xo, X, codes[a:b], s[a:b], zz[a:b], shift, y[a:b])

    @njit(**JIT)
    def _int8_product(codes, scales, x, y, threads, xq):
        """y = x @ W as torch's int8 kernel computes it: x and y rounded to bf16.  # [d_in] -> [d_out]"""
        xb = xq[0, :x.shape[0]]
        _round_bf16(x, xb)
        if threads == 1:
            _int8_dots(xb, codes, scales, y)
        else:
            _int8_dots_parallel(xb, codes, scales, y, threads)
        _round_bf16(y, y)

    @njit(**JIT)
    def _int4_product(codes, s, zz, shift, x, y, threads, xq):
        """y = x @ W as torch's int4 kernel computes it: x and y rounded to bf16.  # [d_in] -> [d_out]"""
        H, G = codes.shape[1], s.shape[1]
        xb = xq[0, :2 * H]
        _round_bf16(x, xb)
        xe, xo, X = xq[1, :H], xq[2, :H], xq[3, :G]
        for j in range(H):
            xe[j] = xb[2 * j]
            xo[j] = xb[2 * j + 1] - F16 * xb[2 * j]
        per = 2 * H // G
        for g in range(G):
            acc = np.float32(0.0)
            for k in range(g * per, g * per + per):
                acc += xb[k]
            X[g] = acc
        if threads == 1:
            _int4_dots(xe, xo, X, codes, s, zz, shift, y)
        else:
            _int4_dots_parallel(xe, xo, X, codes, s, zz, shift, y, threads)
        _round_bf16(y, y)

    def _product(m, x, y, threads, part, xq):
        """y = x @ m for one stored matrix m: (W,) fp32 [d_in, d_out]; (codes, scales) int8; (codes, s, zz, shift)
        int4 (see Plan)."""

    def _width(m):
        """d_out of a stored matrix."""

    OVERLOAD = {k: v for k, v in JIT.items() if k != "cache"}     # compiled into (and cached with) its callers

    @overload(_product, jit_options=OVERLOAD)
    def _product_impl(m, x, y, threads, part, xq):
        kinds = {1: lambda m, x, y, threads, part, xq: _fp32_product(m[0], x, y, threads, part),
                 2: lambda m, x, y, threads, part, xq: _int8_product(m[0], m[1], x, y, threads, xq),
                 4: lambda m, x, y, threads, part, xq: _int4_product(m[0], m[1], m[2], m[3], x, y, threads, xq)}
        return kinds[len(m.types)]

    @overload(_width, jit_options=OVERLOAD)
    def _width_impl(m):
        if len(m.types) == 1:
            return lambda m: m[0].shape[1]
        return lambda m: m[0].shape[0]

    @njit(**JIT)
    def _product_alone(m, x, y, threads, part, xq):
        _product(m, x, y, threads, part, xq)

    @njit(**JIT)
    def _products(ms, x, y, threads, part, xq):
        """y = [x @ m for m in ms] side by side: one product for q/k/v (or gate/up) stored as one matrix, else one
        per matrix.  # [d_in] -> [Σ d_out]"""
        off = 0
        for m in literal_unroll(ms):
            n = _width(m)
            _product(m, x, y[off:off + n], threads, part, xq)
            off += n

    @njit(**JIT)
    def _rope(v, cos, sin):
        """Rotate each (v_i, v_i+d/2) pair of every head by its angle (embedding.apply_rope).  # [n, d_head]"""
        half = v.shape[1] // 2
        for h in range(v.shape[0]):
            for i in range(half):
                a, b = v[h, i], v[h, i + half]
                v[h, i] = a * cos[i] - b * sin[i]
                v[h, i + half] = b * cos[i + half] + a * sin[i + half]

    @njit(**JIT)
    def _attend_head(q, keys, values, first, last, scale, out, scores):
        """One head: softmax(q · k_s · scale) over positions first..last, then the weighted sum of their values."""
        top = np.float32(-np.inf)
        for s in range(first, last + 1):
            acc = np.float32(0.0)
            ks = keys[s]
            for d in range(q.shape[0]):
                acc += q[d] * ks[d]
            scores[s] = acc * scale
            top = max(top, scores[s])
        total = np.float32(0.0)
        for s in range(first, last + 1):
            scores[s] = np.exp(scores[s] - top)
            total += scores[s]
        for d in range(out.shape[0]):
            out[d] = 0.0
        for s in range(first, last + 1):
            w, vs = scores[s] / total, values[s]
            for d in range(out.shape[0]):
                out[d] += w * vs[d]

    @njit(parallel=True, **JIT)
    def _attend_parallel(q, keys, values, first, last, scale, z, scores):
        group = q.shape[0] // keys.shape[0]
        for h in prange(q.shape[0]):
            _attend_head(q[h], keys[h // group], values[h // group], first, last, scale, z[h], scores[h])

    @njit(**JIT)
    def _attend(q, keys, values, first, last, scale, z, scores, threads):
        """Every query head over its key head's cached positions first..last (GQA: a group of query heads shares
        one key head).  # q [n_head, d_head], keys/values [n_kv_head, capacity, d_head] -> z [n_head, d_head]"""
        if threads == 1:
            group = q.shape[0] // keys.shape[0]
            for h in range(q.shape[0]):
                _attend_head(q[h], keys[h // group], values[h // group], first, last, scale, z[h], scores[h])
        else:
            _attend_parallel(q, keys, values, first, last, scale, z, scores)

    @njit(**JIT)
    def _add_norm(x, y, w, eps, tmp):
        """x += y, normalized first where the model has a norm there (Gemma's sandwich norms; w empty: none)."""
        if w.shape[0]:
            _rms_norm(y, w, eps, tmp)
            y = tmp
        for i in range(x.shape[0]):
            x[i] += y[i]

    @njit(**JIT)
    def _layer(x, attn_norm, q_norm, k_norm, post_attn_norm, qkv, attn_output, ffn_norm, post_ffn_norm,
               gate_up, down, keys, values, pos, cos, sin, window, shape, eps, scale, gelu, threads, buf, part, xq,
               scores):
        """One layer for one new token at position `pos`, x updated in place (layers.block_forward), the token's key
        and value written into the cache. shape = (n_head, n_kv_head, d_head, d_ff); window = 0: none."""
        n_head, n_kv, d_head, d_ff = shape
        d, qd, kd = x.shape[0], n_head * d_head, n_kv * d_head
        h, tmp = buf[0, :d], buf[1, :d]
        _rms_norm(x, attn_norm, eps, h)
        y = buf[2, :qd + 2 * kd]
        _products(qkv, h, y, threads, part, xq)
        q, k, v = y[:qd].reshape(n_head, d_head), y[qd:qd + kd].reshape(n_kv, d_head), y[qd + kd:].reshape(n_kv, d_head)
        if q_norm.shape[0]:                                     # Gemma-3: each head's q and k normalized
            for i in range(n_head):
                tmp[:d_head] = q[i]
                _rms_norm(tmp[:d_head], q_norm, eps, q[i])
            for i in range(n_kv):
                tmp[:d_head] = k[i]
                _rms_norm(tmp[:d_head], k_norm, eps, k[i])
        _rope(q, cos, sin)
        _rope(k, cos, sin)
        for j in range(n_kv):
            keys[j, pos] = k[j]
            values[j, pos] = v[j]
        z = buf[3, :qd]
        first = max(0, pos - window + 1) if window else 0
        _attend(q, keys, values, first, pos, scale, z.reshape(n_head, d_head), scores, threads)
        o = buf[4, :d]
        _products(attn_output, z, o, threads, part, xq)
        _add_norm(x, o, post_attn_norm, eps, tmp)
        _rms_norm(x, ffn_norm, eps, h)
        g = buf[5, :2 * d_ff]
        _products(gate_up, h, g, threads, part, xq)
        a = buf[6, :d_ff]
        for i in range(d_ff):
            gi = g[i]
            if gelu:                                            # tanh-approximated GELU (Gemma), else SiLU (Llama)
                act = np.float32(0.5) * gi * (np.float32(1.0) + np.tanh(
                    np.float32(0.7978845608028654) * (gi + np.float32(0.044715) * gi * gi * gi)))
            else:
                act = gi / (np.float32(1.0) + np.exp(-gi))
            a[i] = act * g[d_ff + i]
        _products(down, a, o, threads, part, xq)
        _add_norm(x, o, post_ffn_norm, eps, tmp)

    @njit(**JIT)
    def _head(x, norm_w, eps, head, logits, threads, part, xq, h):
        """The final norm, then the LM head: logits = norm(x) @ head.  # [d_model] -> [vocab]"""
        _rms_norm(x, norm_w, eps, h)
        _product(head, h, logits, threads, part, xq)

    @njit(**JIT)
    def _head_rows(x, norm_w, eps, table, logits, threads, h):
        """The final norm, then the LM head stored as the token table [vocab, d_model]: one dot product per token."""
        _rms_norm(x, norm_w, eps, h)
        if threads == 1:
            _dots(h, table, logits)
        else:
            _dots_parallel(h, table, logits, threads)

    @njit(**JIT)
    def _int4_row(codes, scales, zeros, i, out):
        """Row i of a 4-bit table [vocab, d / 2] dequantized: s · (code − zero) per group, zeros [vocab, G] or empty
        (symmetric), as QuantizedTable's lookup computes it.  # -> [d]"""
        per = 2 * codes.shape[1] // scales.shape[1]
        for j in range(codes.shape[1]):
            c = np.int32(codes[i, j])
            for half in range(2):
                k = 2 * j + half
                u = np.float32((c >> (4 * half)) & 15) - np.float32(8.0)
                zero = zeros[i, k // per] if zeros.shape[0] else np.float32(0.0)
                out[k] = (u - zero) * scales[i, k // per]


# ---------------------------------------------------------------- what the compiled step runs on

def _np(t: Tensor) -> np.ndarray:
    """A tensor's memory as a numpy array (no copy)."""
    return t.detach().numpy()


def _matrix(w) -> tuple | None:
    """A stored linear weight in the form the kernels read (views of its memory), or None when they cannot:
    (W,) fp32 [d_in, d_out]; (codes [d_out, d_in], scales) int8; (codes [d_out, d_in / 2], s, zz, log2 of a
    group's bytes) int4, s and zz bf16-rounded as torch's kernel stores them, zz = z − 8s."""
    if isinstance(w, Tensor):
        return (_np(w),) if w.dtype == torch.float32 and w.is_contiguous() else None
    if not isinstance(w, QuantizedTensor) or w.kernel_bits is None or not w.codes.T.is_contiguous():
        return None
    s, z = w.kernel_scales()
    if w.kernel_bits == 8:
        return _np(w.codes.T), _np(s.float())
    s, z = s.float().T.contiguous(), z.float().T.contiguous()
    return _np(w.codes.T), _np(s), _np(z - 8 * s), int(math.log2(w.group_size // 2))


def _group(lins) -> tuple | None:
    """The matrices of linears that read the same input (q/k/v, gate/up): the one quantize_model fused them into, or
    each on its own; None if any cannot run here."""
    from .fast import fused_whole
    whole = fused_whole(lins)
    ms = (_matrix(whole),) if whole is not None else tuple(_matrix(lin.weight) for lin in lins)
    return None if any(m is None for m in ms) else ms


def _norm(n) -> np.ndarray:
    return _np(n.weight) if n is not None else np.zeros(0, np.float32)


@dataclass
class Plan:
    """One model as the compiled step reads it: per layer the arguments of _layer that do not change between
    steps, the head and the buffers a step writes into. Built once per model (plan), no weight copied."""

    layers: list[tuple]
    head: tuple[str, object]      # _head_matrix of the model's own LM head
    output_norm: np.ndarray       # the final norm's weight
    table: np.ndarray | None      # the token table [vocab, d] when it is fp32 (a quantized one: None)
    width: int

    @classmethod
    def build(cls, model: "Model") -> "Plan | str":
        c, w = model.config, model.weights
        if c.family not in FAMILIES or c.norm != "rmsnorm" or c.position != "rope" or c.ffn == "gelu":
            return f"the {c.family} family runs fast.py's operations"
        layers = []
        for b in w.blocks:
            qkv = _group((b.attn_q, b.attn_k, b.attn_v))
            gate_up = _group((b.ffn_gate, b.ffn_up))
            out, down = _group((b.attn_output,)), _group((b.ffn_down,))
            if None in (qkv, gate_up, out, down) or any(getattr(b, n).bias is not None for n in (
                    "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")):
                return "a weight format the compiled step does not read (fp32 and quantize_model's int8 / int4 run)"
            norms = [b.attn_norm, b.attn_q_norm, b.attn_k_norm, b.post_attention_norm, b.ffn_norm, b.post_ffw_norm]
            if any(n is not None and (n.weight.dtype != torch.float32 or n.bias is not None) for n in norms):
                return "a weight format the compiled step does not read (fp32 and quantize_model's int8 / int4 run)"
            layers.append((_norm(b.attn_norm), _norm(b.attn_q_norm), _norm(b.attn_k_norm),
                           _norm(b.post_attention_norm), qkv, out, _norm(b.ffn_norm), _norm(b.post_ffw_norm),
                           gate_up, down))
        head = _head_matrix(w.output)
        if head[1] is None:
            return "a weight format the compiled step does not read (fp32 and quantize_model's int8 / int4 run)"
        if w.output_norm.weight.dtype != torch.float32 or w.output_norm.bias is not None:
            return "a weight format the compiled step does not read (fp32 and quantize_model's int8 / int4 run)"
        table = _np(w.token_embd) if isinstance(w.token_embd, Tensor) else None
        if table is not None and table.dtype != np.float32:
            return "a weight format the compiled step does not read (fp32 and quantize_model's int8 / int4 run)"
        width = max(c.d_model, (c.n_head + 2 * c.n_kv_head) * c.d_head, 2 * c.d_ff)
        return cls(layers, head, _np(w.output_norm.weight), table, width)


_plans: dict[int, dict] = {}      # id(weights) -> {config: Plan or why not}


def plan(model: "Model") -> Plan | str:
    """The model's Plan (made at the first step, kept while its weights live), or why it cannot run here."""
    if numba is None:
        return NO_NUMBA
    key = id(model.weights)
    if key not in _plans:
        _plans[key] = {}
        weakref.finalize(model.weights, _plans.pop, key, None)
    if model.config not in _plans[key]:
        _plans[key][model.config] = Plan.build(model)
    return _plans[key][model.config]


_said: set[str] = set()


def why_not(model: "Model") -> str | None:
    """Why a one-token step of this model does not run compiled here (None: it does)."""
    p = plan(model)
    return p if isinstance(p, str) else None


def _say_once(reason: str) -> None:
    if reason == NO_NUMBA and reason not in _said:         # a missing package is worth saying; a family is not
        _said.add(reason)
        warnings.warn(f"llmwalk: {reason}", stacklevel=4)


def threads() -> int:
    """The cores a step is split over: torch's thread count (torch.set_num_threads sets both), 1 where numba runs its
    parallel loops without OpenMP (its own thread pool then costs more per loop than it saves)."""
    layer = _threading_layer()                  # first: starting numba's pool may reset a shared OpenMP runtime
    n = max(1, min(torch.get_num_threads(), numba.config.NUMBA_NUM_THREADS))
    if n > 1 and layer != "omp":
        return 1
    if numba.get_num_threads() != n:
        numba.set_num_threads(n)
    return n


_layer_name: list[str] = []


def _threading_layer() -> str:
    """numba's threading layer, found once by running one parallel loop. Where numba and torch share one OpenMP
    runtime (a Linux torch built against the system's libgomp), starting numba's pool sets that runtime's thread
    count to numba's: torch's is put back."""
    if not _layer_name:
        torch_threads = torch.get_num_threads()
        _rows_added_parallel(np.ones(2, np.float32), np.ones((2, 1), np.float32), np.zeros((2, 1), np.float32), 2)
        _layer_name.append(numba.threading_layer())
        torch.set_num_threads(torch_threads)
    return _layer_name[0]


_on: ContextVar[bool] = ContextVar("llmwalk_compiled_step", default=True)


@contextmanager
def off() -> Iterator[None]:
    """Decoding steps run torch's operations (fast.py) while the block runs: to compare the two, or to time the
    eager path. LLMWALK_COMPILED_STEP=0 in the environment does the same for a whole process."""
    token = _on.set(False)
    try:
        yield
    finally:
        _on.reset(token)


def can_step(model: "Model", t: int, cache: KVCache | None, head: Tensor | None, hooks) -> bool:
    """Whether forward's pass runs compiled: one token after a filled KV cache with room, no hooks, no head other
    than the model's own table in either memory order, a model Plan.build accepts."""
    if t != 1 or cache is None or hooks or not _on.get() or os.environ.get("LLMWALK_COMPILED_STEP") == "0":
        return False
    layer0 = cache.layers[0]
    if layer0.keys is None or layer0.keys.dtype != torch.float32 or cache.length >= layer0.capacity:
        return False
    p = plan(model)
    if isinstance(p, str):
        _say_once(p)
        return False
    return head is None or head.dtype == torch.float32


@dataclass
class Buffers:
    """What a step writes into besides the cache, made once per width, thread count and cache capacity."""

    buf: np.ndarray       # [7, width] the layer's intermediates
    part: np.ndarray      # [threads, width] partial sums of the fp32 products (width: the widest, the LM head's)
    xq: np.ndarray        # [4, width] a quantized product's input: rounded, split, summed per group
    scores: np.ndarray    # [n_head, capacity]


_buffers: dict[tuple, Buffers] = {}


def _buffers_for(width: int, n: int, n_head: int, capacity: int) -> Buffers:
    key = (width, n, n_head, capacity)
    if key not in _buffers:
        _buffers.clear()                                        # one at a time: a step is not re-entered
        _buffers[key] = Buffers(np.zeros((7, width), np.float32), np.zeros((n, width), np.float32),
                                np.zeros((4, width), np.float32), np.zeros((n_head, capacity), np.float32))
    return _buffers[key]


_cache_views: dict[int, tuple[list, list]] = {}     # id(KVCache) -> (its buffers, their numpy views)


def _cache_arrays(cache: KVCache) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each layer's key and value buffers as numpy arrays, made once per cache (a tensor's .numpy() is four torch
    operations, and a step would make sixty of them) and again only if its buffers were replaced."""
    tensors = [(lc.keys, lc.values) for lc in cache.layers]
    seen = _cache_views.get(id(cache))
    if seen is None or any(a is not b for pair, old in zip(tensors, seen[0]) for a, b in zip(pair, old)):
        if seen is None:
            weakref.finalize(cache, _cache_views.pop, id(cache), None)
        seen = _cache_views[id(cache)] = (tensors, [(_np(k), _np(v)) for k, v in tensors])
    return seen[1]


def _embedding_row(model: "Model", p: Plan, token: int) -> np.ndarray:
    """The token's row of the table, times the model's embedding scale (embedding.token_embedding).  # -> [d]"""
    table, scale = model.weights.token_embd, model.config.embed_scale
    if p.table is not None:
        row = p.table[token].copy()
    elif isinstance(table, QuantizedTable):
        h = table.head
        if h.bits == 4:
            row = np.empty(model.config.d_model, np.float32)
            zeros = _np(h.zeros.T) if h.zeros is not None else np.zeros((0, 0), np.float32)
            _int4_row(_np(h.codes.T), _np(h.scales.T), zeros, token, row)
        else:
            row = table[token].numpy()
    return row * np.float32(scale) if scale != 1.0 else row


def _head_matrix(output) -> tuple[str, object]:
    """The LM head as the kernels read it: ('rows', table [vocab, d]) for the token table (or an untied head),
    ('matrix', m) for a quantized head (m None: a format they do not read) or decoding_head's column order."""
    if isinstance(output, QuantizedTable):
        return "matrix", _matrix(output.head)
    if output.is_contiguous():
        return "rows", _np(output)
    return "matrix", (_np(output.T),)


def step(model: "Model", token: int, cache: KVCache, head: Tensor | None = None
         ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Run one token at position cache.length through the model and the LM head (`head`: generation.decoding_head
    instead of weights.output); the cache grows by one. Returns (the embedding row x0, the final norm's output, the
    logits).  # -> ([d], [d], [vocab])"""
    from .embedding import rope_angles
    p, c = plan(model), model.config
    n, pos = threads(), cache.length
    b = _buffers_for(max(p.width, c.vocab_size), n, c.n_head, cache.layers[0].capacity)   # the head's partial sums too
    x0 = _embedding_row(model, p, token)
    x = x0.copy()
    angles = {theta: tuple(_np(a[0]) for a in rope_angles(torch.tensor([pos]), c.d_head, theta))
              for theta in {c.theta(i) for i in range(c.n_layer)}}
    shape = (c.n_head, c.n_kv_head, c.d_head, c.d_ff)
    gelu = c.ffn == "geglu"
    for i, (layer, (keys, values)) in enumerate(zip(p.layers, _cache_arrays(cache))):
        cos, sin = angles[c.theta(i)]
        (attn_norm, q_norm, k_norm, post_attn, qkv, out, ffn_norm, post_ffn, gate_up, down) = layer
        _layer(x, attn_norm, q_norm, k_norm, post_attn, qkv, out, ffn_norm, post_ffn, gate_up, down,
               keys, values, pos, cos, sin, c.window(i) or 0, shape, c.norm_eps, c.scale, gelu, n,
               b.buf, b.part, b.xq, b.scores)
    for lc in cache.layers:
        lc.length = pos + 1
    final = np.empty(c.d_model, np.float32)
    logits = np.empty(c.vocab_size, np.float32)
    kind, m = p.head if head is None else _head_matrix(head)
    if kind == "rows":
        _head_rows(x, p.output_norm, c.norm_eps, m, logits, n, final)
    else:
        _head(x, p.output_norm, c.norm_eps, m, logits, n, b.part, b.xq, final)
    return x0, final, logits


def product(w, x: Tensor) -> Tensor:
    """x @ w for one stored weight, computed as the compiled step computes it (for tests and timings: the step
    itself runs whole layers).  # ([d_in], [d_in, d_out] or QuantizedTensor) -> [d_out]"""
    m = _matrix(w)
    if numba is None or m is None:
        raise ValueError(f"the compiled step does not read this weight ({why_not_weight(w)})")
    width = max(w.shape)
    y = np.empty(w.shape[1], np.float32)
    n = threads()
    _product_alone(m, _np(x.float().contiguous()), y, n, np.zeros((n, width), np.float32),
                   np.zeros((4, width), np.float32))
    return torch.from_numpy(y)


def why_not_weight(w) -> str:
    """Why _matrix cannot read w."""
    if numba is None:
        return NO_NUMBA
    if isinstance(w, Tensor):
        return f"a {w.dtype} tensor{'' if w.is_contiguous() else ' not contiguous'}: fp32, contiguous, is read"
    return "a quantized format without torch's integer kernel (int8 per column, int4 in groups of 32 to 256)"


def step_products(model: "Model"):
    """The matrix products of one compiled step alone, in its order, on random vectors: what the step spends in them
    (timings.decode_profile). None when the model's steps do not run compiled.  # -> () -> None"""
    p = plan(model)
    if isinstance(p, str):
        return None
    c = model.config
    n = threads()
    b = _buffers_for(max(p.width, c.vocab_size), n, c.n_head, 1)
    gen = torch.Generator().manual_seed(0)
    x = _np(torch.randn(max(p.width, c.d_model), generator=gen))
    groups = [layer[i] for layer in p.layers for i in (4, 5, 8, 9)]          # q/k/v, output, gate/up, down
    inputs = [x[:_d_in(g[0])] for g in groups]
    kind, head = p.head
    logits = np.empty(c.vocab_size, np.float32)

    def run() -> None:
        for g, xi in zip(groups, inputs):
            _products(g, xi, b.buf[2], n, b.part, b.xq)
        if kind == "rows":
            _head_rows(x[:c.d_model], np.ones(c.d_model, np.float32), c.norm_eps, head, logits, n, b.buf[0])
        else:
            _head(x[:c.d_model], np.ones(c.d_model, np.float32), c.norm_eps, head, logits, n, b.part, b.xq, b.buf[0])
    return run


def _d_in(m: tuple) -> int:
    """d_in of a stored matrix (see _matrix)."""
    return m[0].shape[0] if len(m) == 1 else m[0].shape[1] * (2 if len(m) == 4 else 1)
