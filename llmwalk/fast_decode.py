"""Decoding's compiled step: one new token through every layer of the model in one call of machine code.

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

numba compiles each function once per user and kind of CPU, kept in the user's own kernel folder (kernel_dir):
a fresh clone loads it compiled. Where numba is not installed, decoding runs fast.py's torch operations and says
so once (`why_not`).
"""
from __future__ import annotations

import math
import os
import warnings
import weakref
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
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
    from llvmlite import ir
    from numba import literal_unroll, njit, prange, types
    from numba.extending import intrinsic, overload
    from numba.typed import List
except ImportError:                      # the eager path runs instead (why_not says so)
    numba = None

FAMILIES = ("llama", "mistral", "gemma3")     # RMSNorm, RoPE, a gated FFN, no biases
NO_NUMBA = ("numba is not installed, so decoding runs torch's operations one by one (fast.py), a few times slower "
            "per token: pip install numba")


# ---------------------------------------------------------------- the kernels (numba)

def kernel_dir() -> Path:
    """Where the compiled kernels are kept: the user's own cache folder (~/.cache/llmwalk/kernels; on Windows
    %LOCALAPPDATA%\\llmwalk\\kernels), found from the account, not $HOME or $LLMWALK_CACHE, which a class server or a
    test may point elsewhere. Machine code is never read from a folder another user could write (a shared model
    cache is one): kept here only while the folder is the user's own (see _private)."""
    if os.name == "nt":
        return Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local") / "llmwalk" / "kernels"
    import pwd
    try:
        home = pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:                                    # an account with no entry (a container's random uid)
        home = os.path.expanduser("~")
    return Path(home) / ".cache" / "llmwalk" / "kernels"


def _private(folder: Path) -> bool:
    """The folder belongs to this user and no one else may write to it, so no one else can put a file in it (a
    folder put in its place by another user is theirs; on Windows a user's LOCALAPPDATA is private by default)."""
    if os.name == "nt":
        return True
    st = folder.stat()
    return st.st_uid == os.getuid() and not st.st_mode & 0o022


if numba is not None:
    from numba.core.caching import CompileResultCacheImpl, FunctionCache, _CacheLocator, _SourceFileBackedLocatorMixin

    class _KernelLocator(_SourceFileBackedLocatorMixin, _CacheLocator):
        """numba's cache of this file's kernels in kernel_dir(), not in the package's __pycache__: a fresh clone or a
        reinstalled package loads them compiled (compiling every format takes ~80 s a CPU kind). numba checks each
        entry against this file's contents and the CPU it was compiled for; elsewhere numba's own places are used."""

        def __init__(self, py_func, py_file):
            self._py_file, self._lineno = py_file, py_func.__code__.co_firstlineno
            self._cache_path = kernel_dir()

        def get_cache_path(self) -> str:
            return str(self._cache_path)

        def ensure_cache_path(self) -> None:
            folder = self._cache_path
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            if not _private(folder):
                raise PermissionError(f"{folder} may be written by other users")
            super().ensure_cache_path()

    class _KernelCacheImpl(CompileResultCacheImpl):
        _locator_classes = [_KernelLocator, *CompileResultCacheImpl._locator_classes]

    class _KernelCache(FunctionCache):
        _impl_class = _KernelCacheImpl

    # fastmath lets a sum be reordered into vector lanes; infinities and NaN keep their meaning (no nnan / ninf).
    JIT = dict(nogil=True, boundscheck=False, error_model="numpy", fastmath={"reassoc", "contract", "nsz", "arcp"})

    def kernel(**options):
        """numba's njit with JIT's options, cached on disk in kernel_dir() (_KernelLocator; njit's cache=True would
        set up numba's own cache first, to be replaced)."""
        def compiled(f):
            dispatcher = njit(**JIT, **options)(f)
            dispatcher._cache = _KernelCache(f)
            return dispatcher
        return compiled

    @kernel()
    def _round_bf16(x, out):
        """out = x rounded to the nearest bfloat16 (ties to even), as torch's x.bfloat16() does, kept in float32."""
        b, o = x.view(np.uint32), out.view(np.uint32)
        for i in range(x.shape[0]):
            v = b[i]
            o[i] = (v + np.uint32(0x7FFF) + ((v >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)

    @kernel()
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
    @kernel()
    def _rows_added(x, W, y):
        K, N = W.shape
        for n in range(N):
            y[n] = 0.0
        for k in range(K):
            xk, row = x[k], W[k]
            for n in range(N):
                y[n] += xk * row[n]

    @kernel(parallel=True)
    def _rows_added_parallel(x, W, part, parts):
        K = W.shape[0]
        step = (K + parts - 1) // parts
        for p in prange(parts):
            a = p * step
            b = min(K, a + step)
            _rows_added(x[a:b], W[a:b], part[p])

    @kernel()
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
    @kernel()
    def _dots(x, W, y):
        for n in range(W.shape[0]):
            row = W[n]
            acc = np.float32(0.0)
            for k in range(W.shape[1]):
                acc += x[k] * row[k]
            y[n] = acc

    @kernel(parallel=True)
    def _dots_parallel(x, W, y, parts):
        N = W.shape[0]
        step = (N + parts - 1) // parts
        for p in prange(parts):
            a = p * step
            b = min(N, a + step)
            _dots(x, W[a:b], y[a:b])

    @kernel()
    def _int8_dots(x, codes, scales, y):
        """y[n] = Σ_k x_k · codes[n, k] · scales[n]"""
        for n in range(codes.shape[0]):
            row = codes[n]
            acc = np.float32(0.0)
            for k in range(codes.shape[1]):
                acc += x[k] * np.float32(row[k])
            y[n] = acc * scales[n]

    @kernel(parallel=True)
    def _int8_dots_parallel(x, codes, scales, y, parts):
        N = codes.shape[0]
        step = (N + parts - 1) // parts
        for p in prange(parts):
            a = p * step
            b = min(N, a + step)
            _int8_dots(x, codes[a:b], scales[a:b], y[a:b])

    # 4-bit codes: byte j of row n holds inputs 2j (low half) and 2j + 1 (high half), as u = code + 8, and torch's
    # kernel computes w = s·u + (z − 8s) per group, s and z in bf16: Σ_k x_k w_k = Σ_g s_g Σ_j (x_2j u_lo + x_2j+1 u_hi)
    # + (z_g − 8 s_g) X_g, X_g the group's sum of x. The first part in integers: the bf16 inputs put on a 16-bit
    # integer grid per unit of 32 (a power of two each: exact for a unit whose values span less than 2^6 in size,
    # else the smallest lose bits below 2^-14 of the unit's largest, far below the bf16 rounding they carry), so that
    # one instruction multiplies 32 codes by 32 inputs and adds them in pairs (x86's vpmaddwd; LLVM picks it from
    # the vector code below, and whatever the machine has elsewhere): half the arithmetic of a float loop per byte.
    # s and z are read as the kernel stores them, 2 bytes each: a fifth of the bytes a token reads, not a third.
    I8, I16, I32, I64, F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64), ir.FloatType()
    LANES = 32                                         # codes per vector: two units of 16 bytes (32 inputs each)
    V8, V16, V32 = (ir.VectorType(t, LANES) for t in (I8, I16, I32))
    H32, HF = ir.VectorType(I32, LANES // 2), ir.VectorType(F32, LANES // 2)
    AHEAD = 2048                    # bytes of codes asked for ahead of the loop (a hint: the next page's too)

    def _declare(module, name, ret, args):
        fn = module.globals.get(name)
        return fn if fn is not None else ir.Function(module, ir.FunctionType(ret, args), name=name)

    def _bf16_value(builder, bits):
        """A bf16 number (its 16 bits, an i16) as float32: the same bits, shifted up into the high half."""
        return builder.bitcast(builder.shl(builder.zext(bits, I32), ir.Constant(I32, 16)), F32)

    @intrinsic
    def _bf16(typingctx, bits):
        """A bf16 number stored as its 16 bits (uint16) as a float32."""
        return types.float32(bits), lambda context, builder, signature, args: _bf16_value(builder, args[0])

    def _pair_products(builder, a, b):
        """a[2i]·b[2i] + a[2i+1]·b[2i+1] in 32 bits, from 16-bit lanes.  # (<32 x i16>, <32 x i16>) -> <16 x i32>"""
        p = builder.mul(builder.sext(a, V32), builder.sext(b, V32))
        undef = ir.Constant(V32, ir.Undefined)
        even = builder.shuffle_vector(p, undef, ir.Constant(H32, list(range(0, LANES, 2))))
        odd = builder.shuffle_vector(p, undef, ir.Constant(H32, list(range(1, LANES, 2))))
        return builder.add(even, odd)

    @intrinsic
    def _int4_dot16(typingctx, row, qe, qo, s, xs, shift):
        """Σ_u s[u >> shift]·xs[u]·Σ_{j in unit u} (qe[j]·lo_j + qo[j]·hi_j) for one row of 4-bit codes (u8 [H],
        units of 16 bytes, an even number of them), bf16 scales s (uint16 bits [G]), 16-bit inputs qe / qo [H] (the
        even and odd inputs) and their units' powers of two xs [H / 16]."""
        def codegen(context, builder, signature, args):
            arrays = [context.make_array(t)(context, builder, value=v) for t, v in zip(signature.args[:5], args[:5])]
            cp, ep, op, sp, xp = (a.data for a in arrays)
            units = builder.extract_value(arrays[4].shape, 0)
            fma = _declare(builder.module, "llvm.fma.v16f32", HF, [HF, HF, HF])
            ahead = _declare(builder.module, "llvm.prefetch.p0", ir.VoidType(), [I8.as_pointer(), I32, I32, I32])
            entry = builder.block
            loop, done = builder.append_basic_block("units"), builder.append_basic_block("sum")
            builder.branch(loop)
            builder.position_at_end(loop)
            u, acc = builder.phi(I64), builder.phi(HF)
            u.add_incoming(ir.Constant(I64, 0), entry)
            acc.add_incoming(ir.Constant(HF, None), entry)
            off = builder.mul(u, ir.Constant(I64, 16))
            builder.call(ahead, [builder.gep(cp, [builder.add(off, ir.Constant(I64, AHEAD))]), ir.Constant(I32, 0),
                                 ir.Constant(I32, 3), ir.Constant(I32, 1)])
            codes = builder.zext(builder.load(builder.bitcast(builder.gep(cp, [off]), V8.as_pointer()), align=1), V16)
            lo = builder.and_(codes, ir.Constant(V16, [15] * LANES))
            hi = builder.lshr(codes, ir.Constant(V16, [4] * LANES))
            even = builder.load(builder.bitcast(builder.gep(ep, [off]), V16.as_pointer()), align=2)
            odd = builder.load(builder.bitcast(builder.gep(op, [off]), V16.as_pointer()), align=2)
            sums = builder.sitofp(builder.add(_pair_products(builder, lo, even), _pair_products(builder, hi, odd)), HF)
            scale = ir.Constant(HF, ir.Undefined)
            for k in range(2):                         # lanes 0-7: unit u, 8-15: unit u + 1
                uk = builder.add(u, ir.Constant(I64, k))
                sk = builder.fmul(_bf16_value(builder, builder.load(builder.gep(sp, [builder.ashr(uk, args[5])]))),
                                  builder.load(builder.gep(xp, [uk])))
                for lane in range(8 * k, 8 * k + 8):
                    scale = builder.insert_element(scale, sk, ir.Constant(I32, lane))
            acc2 = builder.call(fma, [sums, scale, acc])
            u2 = builder.add(u, ir.Constant(I64, 2))
            u.add_incoming(u2, loop)
            acc.add_incoming(acc2, loop)
            builder.cbranch(builder.icmp_signed("<", u2, units), loop, done)
            builder.position_at_end(done)
            total = _declare(builder.module, "llvm.vector.reduce.fadd.v16f32", F32, [F32, HF])
            return builder.call(total, [ir.Constant(F32, 0.0), acc2], fastmath=("fast",))
        return types.float32(row, qe, qo, s, xs, shift), codegen

    @kernel()
    def _int4_dots(qe, qo, xs, X, codes, s, z, shift, y):
        for n in range(codes.shape[0]):
            sn, zn = s[n], z[n]
            shifted = np.float32(0.0)
            for g in range(zn.shape[0]):
                shifted += (_bf16(zn[g]) - np.float32(8.0) * _bf16(sn[g])) * X[g]
            y[n] = _int4_dot16(codes[n], qe, qo, sn, xs, shift) + shifted

    @kernel(parallel=True)
    def _int4_dots_parallel(qe, qo, xs, X, codes, s, z, shift, y, parts):
        N = codes.shape[0]
        step = (N + parts - 1) // parts
        for p in prange(parts):
            a = p * step
            b = min(N, a + step)
            _int4_dots(qe, qo, xs, X, codes[a:b], s[a:b], z[a:b], shift, y[a:b])

    @kernel()
    def _on_int16_grid(xb, qe, qo, xs):
        """xb (bf16 values) as 16-bit integers times a power of two per unit of 32: |q| < 2^14, split into the even
        inputs qe and the odd ones qo (the low and high halves of each code byte)."""
        for u in range(xs.shape[0]):
            top = np.float32(0.0)
            for k in range(32 * u, 32 * u + 32):
                top = max(top, abs(xb[k]))
            e = math.frexp(top)[1] - 14 if top > 0 else 0
            xs[u] = math.ldexp(1.0, e)
            inverse = np.float32(math.ldexp(1.0, -e))         # a power of two: multiplying is exact
            for j in range(16 * u, 16 * u + 16):
                qe[j] = np.int16(np.rint(xb[2 * j] * inverse))
                qo[j] = np.int16(np.rint(xb[2 * j + 1] * inverse))

    @kernel()
    def _int8_product(codes, scales, x, y, threads, xq):
        """y = x @ W as torch's int8 kernel computes it: x and y rounded to bf16.  # [d_in] -> [d_out]"""
        xb = xq[0, :x.shape[0]]
        _round_bf16(x, xb)
        if threads == 1:
            _int8_dots(xb, codes, scales, y)
        else:
            _int8_dots_parallel(xb, codes, scales, y, threads)
        _round_bf16(y, y)

    @kernel()
    def _int4_product(codes, s, z, shift, x, y, threads, xq):
        """y = x @ W as torch's int4 kernel computes it: x and y rounded to bf16.  # [d_in] -> [d_out]

        codes [d_out, H] (H = d_in / 2 bytes, a multiple of 32), s and z [d_out, G] as bf16 bits, per group of
        2^shift bytes."""
        H, G = codes.shape[1], s.shape[1]
        xb, X = xq[0, :2 * H], xq[3, :G]
        _round_bf16(x, xb)
        per = 2 * H // G
        for g in range(G):                                  # each group's sum of inputs, for its z − 8s
            acc = np.float32(0.0)
            for k in range(g * per, g * per + per):
                acc += xb[k]
            X[g] = acc
        units = H // 16
        qe, qo, xs = xq[1].view(np.int16)[:H], xq[2].view(np.int16)[:H], xq[3, G:G + units]
        _on_int16_grid(xb, qe, qo, xs)
        if threads == 1:
            _int4_dots(qe, qo, xs, X, codes, s, z, shift - 4, y)
        else:
            _int4_dots_parallel(qe, qo, xs, X, codes, s, z, shift - 4, y, threads)
        _round_bf16(y, y)

    def _product(m, x, y, threads, part, xq):
        """y = x @ m for one stored matrix m: (W,) fp32 [d_in, d_out]; (codes, scales) int8; (codes, s, z, shift)
        int4 (see _matrix)."""

    def _width(m):
        """d_out of a stored matrix."""

    # The overloads are compiled into (and cached with) the kernels that call them.
    @overload(_product, jit_options=JIT)
    def _product_impl(m, x, y, threads, part, xq):
        kinds = {1: lambda m, x, y, threads, part, xq: _fp32_product(m[0], x, y, threads, part),
                 2: lambda m, x, y, threads, part, xq: _int8_product(m[0], m[1], x, y, threads, xq),
                 4: lambda m, x, y, threads, part, xq: _int4_product(m[0], m[1], m[2], m[3], x, y, threads, xq)}
        return kinds[len(m.types)]

    @overload(_width, jit_options=JIT)
    def _width_impl(m):
        if len(m.types) == 1:
            return lambda m: m[0].shape[1]
        return lambda m: m[0].shape[0]

    @kernel()
    def _product_alone(m, x, y, threads, part, xq):
        _product(m, x, y, threads, part, xq)

    @kernel()
    def _products(ms, x, y, threads, part, xq):
        """y = [x @ m for m in ms] side by side: one product for q/k/v (or gate/up) stored as one matrix, else one
        per matrix.  # [d_in] -> [Σ d_out]"""
        off = 0
        for m in literal_unroll(ms):
            n = _width(m)
            _product(m, x, y[off:off + n], threads, part, xq)
            off += n

    @kernel()
    def _rope(v, cos, sin):
        """Rotate each (v_i, v_i+d/2) pair of every head by its angle (embedding.apply_rope).  # [n, d_head]"""
        half = v.shape[1] // 2
        for h in range(v.shape[0]):
            for i in range(half):
                a, b = v[h, i], v[h, i + half]
                v[h, i] = a * cos[i] - b * sin[i]
                v[h, i + half] = b * cos[i + half] + a * sin[i + half]

    @intrinsic
    def _exp(typingctx, x):
        """e^x in float32 as a few multiply-adds (Cephes' expf: x = n·ln2 + r, e^r by its polynomial, 2^n put in the
        exponent bits), within about one unit in the last place of libm's, for x in [-87, 88]; the clamp below -87
        gives about 1e-38 instead of 0, and NaN stays NaN (the clamp alone would turn it into e^-87: a NaN in the
        cache would vanish from attention). Unlike a call to libm, the loop that uses it runs 16 lanes at a time."""
        def codegen(context, builder, signature, args):
            f = lambda v: ir.Constant(F32, v)                          # noqa: E731
            v = builder.call(_declare(builder.module, "llvm.maxnum.f32", F32, [F32, F32]), [args[0], f(-87.0)])
            n = builder.call(_declare(builder.module, "llvm.rint.f32", F32, [F32]),
                             [builder.fmul(v, f(1.44269504088896341))])
            r = builder.fsub(builder.fsub(v, builder.fmul(n, f(0.693359375))), builder.fmul(n, f(-2.12194440e-4)))
            p = f(1.9875691500e-4)
            for c in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
                p = builder.fadd(builder.fmul(p, r), f(c))
            p = builder.fadd(builder.fadd(builder.fmul(builder.fmul(p, r), r), r), f(1.0))
            bits = builder.shl(builder.add(builder.fptosi(n, I32), ir.Constant(I32, 127)), ir.Constant(I32, 23))
            e = builder.fmul(p, builder.bitcast(bits, F32))
            return builder.select(builder.fcmp_unordered("uno", args[0], args[0]), args[0], e)
        return types.float32(types.float32), codegen

    # Attention for one new token, split over (key head, block of positions) so that both cores share the work at
    # any length. Each block keeps its own softmax — its largest score m, its sum l of e^(score − m), its weighted
    # values o — and the blocks are merged by rescaling to the largest m, which gives the softmax over all positions
    # (as flash decoding does). Within a block the dot products and the weighted sum of values run on 64 of a head's
    # numbers at a time, held in vector registers for the whole block (_dots64, _weighted_rows64): a loop over the
    # numbers of one key would sum 16 lanes into one for every position, and one over the values would read and
    # write the output for every position. The loops below index slices from 0: an index from lo may be negative to
    # numba, which wraps it, and LLVM then leaves the loop (e^x above all) one number at a time.
    WIDE = 64                                            # numbers of a head per call of the two below

    def _row_pointer(builder, rows, j, d0):
        """The address of rows[j, d0], as <16 x float>* (rows 2-D, its rows `stride` bytes apart)."""
        stride = builder.extract_value(rows.strides, 0)
        start = builder.bitcast(rows.data, I8.as_pointer())
        at = builder.add(builder.mul(j, stride), builder.mul(d0, ir.Constant(I64, 4)))
        return builder.bitcast(builder.gep(start, [at]), HF.as_pointer())

    def _lanes(builder, pointer, c):
        """The c-th 16 floats from a <16 x float>* (no alignment assumed)."""
        return builder.load(builder.gep(pointer, [ir.Constant(I64, c)]), align=4)

    def _row_loop(builder, n, after):
        """Open `for j in range(n)` (skipped when n ≤ 0), the builder inside it: j and the entry, loop and `after`
        blocks."""
        entry = builder.block
        loop, done = builder.append_basic_block("rows"), builder.append_basic_block(after)
        builder.cbranch(builder.icmp_signed(">", n, ir.Constant(I64, 0)), loop, done)
        builder.position_at_end(loop)
        j = builder.phi(I64)
        j.add_incoming(ir.Constant(I64, 0), entry)
        return j, entry, loop, done

    def _end_row_loop(builder, j, n, loop, done):
        """Close the loop _row_loop opened (j + 1, back while below n), the builder after it."""
        j2 = builder.add(j, ir.Constant(I64, 1))
        j.add_incoming(j2, loop)
        builder.cbranch(builder.icmp_signed("<", j2, n), loop, done)
        builder.position_at_end(done)

    @intrinsic
    def _dots64(typingctx, q, rows, d0, out, add):
        """out[j] = Σ_{d0 ≤ d < d0 + 64} q[d]·rows[j, d] for every row j (add: out[j] += it).
        # q [d], rows [n, d], out [n]"""
        def codegen(context, builder, signature, args):
            qa, ra, oa = (context.make_array(signature.args[i])(context, builder, value=args[i]) for i in (0, 1, 3))
            muladd = _declare(builder.module, "llvm.fmuladd.v16f32", HF, [HF, HF, HF])
            total = _declare(builder.module, "llvm.vector.reduce.fadd.v16f32", F32, [F32, HF])
            qp = builder.bitcast(builder.gep(qa.data, [args[2]]), HF.as_pointer())
            qs = [_lanes(builder, qp, c) for c in range(WIDE // 16)]
            n = builder.extract_value(oa.shape, 0)
            j, _, loop, done = _row_loop(builder, n, "done")
            kp = _row_pointer(builder, ra, j, args[2])
            ks = [_lanes(builder, kp, c) for c in range(WIDE // 16)]
            a = builder.call(muladd, [qs[2], ks[2], builder.fmul(qs[0], ks[0])])      # two chains, then one sum
            b = builder.call(muladd, [qs[3], ks[3], builder.fmul(qs[1], ks[1])])
            v = builder.call(total, [ir.Constant(F32, 0.0), builder.fadd(a, b)], fastmath=("fast",))
            at = builder.gep(oa.data, [j])
            builder.store(builder.select(args[4], builder.fadd(builder.load(at), v), v), at)
            _end_row_loop(builder, j, n, loop, done)
            return context.get_dummy_value()
        return types.none(q, rows, d0, out, add), codegen

    @intrinsic
    def _weighted_rows64(typingctx, w, rows, d0, out):
        """out[d0 : d0 + 64] = Σ_j w[j]·rows[j, d0 : d0 + 64], the rows added in order (one multiply-add each).
        # w [n], rows [n, d], out [d]"""
        def codegen(context, builder, signature, args):
            wa, ra, oa = (context.make_array(signature.args[i])(context, builder, value=args[i]) for i in (0, 1, 3))
            muladd = _declare(builder.module, "llvm.fmuladd.v16f32", HF, [HF, HF, HF])
            n = builder.extract_value(wa.shape, 0)
            zero = ir.Constant(HF, None)
            j, entry, loop, done = _row_loop(builder, n, "sums")
            sums = [builder.phi(HF) for _ in range(WIDE // 16)]
            wj = builder.load(builder.gep(wa.data, [j]))
            splat = builder.shuffle_vector(builder.insert_element(ir.Constant(HF, ir.Undefined), wj, ir.Constant(I32, 0)),
                                           ir.Constant(HF, ir.Undefined), ir.Constant(H32, [0] * 16))
            vp = _row_pointer(builder, ra, j, args[2])
            added = [builder.call(muladd, [splat, _lanes(builder, vp, c), acc]) for c, acc in enumerate(sums)]
            for acc, value in zip(sums, added):
                acc.add_incoming(zero, entry)
                acc.add_incoming(value, loop)
            _end_row_loop(builder, j, n, loop, done)
            results = [builder.phi(HF) for _ in range(WIDE // 16)]
            for result, value in zip(results, added):
                result.add_incoming(zero, entry)
                result.add_incoming(value, loop)
            op = builder.bitcast(builder.gep(oa.data, [args[2]]), HF.as_pointer())
            for c, result in enumerate(results):
                builder.store(result, builder.gep(op, [ir.Constant(I64, c)]), align=4)
            return context.get_dummy_value()
        return types.none(w, rows, d0, out), codegen

    BLOCKS = 16                                          # at most this many blocks of positions per key head

    @kernel()
    def _attend_block(q, keys, values, g, group, lo, hi, scale, scores, m, l, o, b):
        """Query heads g·group … g·group + group − 1 over positions lo … hi − 1 of key head g: each head's m, l and
        o for block b."""
        ks, vs = keys[g, lo:hi], values[g, lo:hi]
        d_head = ks.shape[1]
        wide = d_head - d_head % WIDE                    # all of it in SmolLM2 and Gemma-3; the rest one by one
        for i in range(group):
            h = g * group + i
            qh, w, oh = q[h], scores[h, lo:hi], o[h, b]
            for d0 in range(0, wide, WIDE):
                _dots64(qh, ks, d0, w, d0 > 0)
            top = np.float32(-np.inf)
            for j in range(w.shape[0]):
                acc = w[j] if wide else np.float32(0.0)
                for d in range(wide, d_head):
                    acc += qh[d] * ks[j, d]
                w[j] = acc * scale
                top = max(top, w[j])
            total = np.float32(0.0)
            for j in range(w.shape[0]):
                e = _exp(w[j] - top)
                w[j] = e
                total += e
            m[h, b], l[h, b] = top, total
            for d0 in range(0, wide, WIDE):
                _weighted_rows64(w, vs, d0, oh)
            oh[wide:] = 0.0
            for j in range(w.shape[0]):
                for d in range(wide, d_head):
                    oh[d] += w[j] * vs[j, d]

    @kernel(parallel=True)
    def _attend_blocks_parallel(q, keys, values, group, first, size, blocks, last, scale, scores, m, l, o):
        for task in prange(keys.shape[0] * blocks):
            g, b = task // blocks, task % blocks
            lo = first + b * size
            _attend_block(q, keys, values, g, group, lo, min(lo + size, last + 1), scale, scores, m, l, o, b)

    @kernel()
    def _attend(q, keys, values, first, last, scale, z, scores, threads, m, l, o):
        """Every query head over its key head's cached positions first..last (GQA: a group of query heads shares
        one key head), softmax(q · k · scale) weighting the values.
        # q [n_head, d_head], keys/values [n_kv_head, capacity, d_head] -> z [n_head, d_head]"""
        n_kv, group = keys.shape[0], q.shape[0] // keys.shape[0]
        positions = last + 1 - first
        blocks = min(BLOCKS, max(1, positions // 64))
        size = (positions + blocks - 1) // blocks
        blocks = (positions + size - 1) // size
        if threads == 1 or positions < 64:
            for task in range(n_kv * blocks):
                g, b = task // blocks, task % blocks
                lo = first + b * size
                _attend_block(q, keys, values, g, group, lo, min(lo + size, last + 1), scale, scores, m, l, o, b)
        else:
            _attend_blocks_parallel(q, keys, values, group, first, size, blocks, last, scale, scores, m, l, o)
        for h in range(q.shape[0]):
            top = np.float32(-np.inf)
            for b in range(blocks):
                top = max(top, m[h, b])
            total = np.float32(0.0)
            z[h, :] = 0.0
            for b in range(blocks):
                w = _exp(m[h, b] - top)
                total += w * l[h, b]
                for d in range(z.shape[1]):
                    z[h, d] += w * o[h, b, d]
            for d in range(z.shape[1]):
                z[h, d] /= total

    @kernel()
    def _add_norm(x, y, w, eps, tmp):
        """x += y, normalized first where the model has a norm there (Gemma's sandwich norms; w empty: none)."""
        if w.shape[0]:
            _rms_norm(y, w, eps, tmp)
            y = tmp
        for i in range(x.shape[0]):
            x[i] += y[i]

    @kernel()
    def _layer(x, attn_norm, q_norm, k_norm, post_attn_norm, qkv, attn_output, ffn_norm, post_ffn_norm,
               gate_up, down, keys, values, pos, cos, sin, window, shape, eps, scale, gelu, threads, buf, part, xq,
               scores, m, l, o):
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
        _attend(q, keys, values, first, pos, scale, z.reshape(n_head, d_head), scores, threads, m, l, o)
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

    @kernel()
    def _as_list(items):
        """A tuple of like items (each layer's weights, each layer's cache) as a numba list, which _layers reads
        in place. Built here, in a function cached on disk: numba.typed.List built from Python compiles its own
        methods again in every process (~2 s of each notebook's first generate)."""
        out = List()
        for i in range(len(items)):
            out.append(items[i])
        return out

    @kernel()
    def _layers(x, layers, kv, pos, angles, rope_of, windows, shape, eps, scale, gelu, threads, buf, part, xq,
                scores, m, l, o):
        """Every layer in turn (_layer), in one call: the model's arguments come as one list, read in place.
        angles [n_bases, 2, d_head] (cos, sin at pos per RoPE base), rope_of / windows [n_layer] per layer."""
        for i in range(len(layers)):
            (attn_norm, q_norm, k_norm, post_attn, qkv, out, ffn_norm, post_ffn, gate_up, down) = layers[i]
            keys, values = kv[i]
            cos, sin = angles[rope_of[i], 0], angles[rope_of[i], 1]
            _layer(x, attn_norm, q_norm, k_norm, post_attn, qkv, out, ffn_norm, post_ffn, gate_up, down, keys,
                   values, pos, cos, sin, windows[i], shape, eps, scale, gelu, threads, buf, part, xq, scores, m, l, o)

    @kernel()
    def _head(x, norm_w, eps, head, logits, threads, part, xq, h):
        """The final norm, then the LM head: logits = norm(x) @ head.  # [d_model] -> [vocab]"""
        _rms_norm(x, norm_w, eps, h)
        _product(head, h, logits, threads, part, xq)

    @kernel()
    def _head_rows(x, norm_w, eps, table, logits, threads, h):
        """The final norm, then the LM head stored as the token table [vocab, d_model]: one dot product per token."""
        _rms_norm(x, norm_w, eps, h)
        if threads == 1:
            _dots(h, table, logits)
        else:
            _dots_parallel(h, table, logits, threads)

    @kernel()
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
    (W,) fp32 [d_in, d_out]; (codes [d_out, d_in], scales) int8; (codes [d_out, d_in / 2], s, z, log2 of a
    group's bytes) int4, s and z the bits of the bf16 numbers torch's kernel multiplies with (kernel_scales)."""
    if isinstance(w, Tensor):
        return (_np(w),) if w.dtype == torch.float32 and w.is_contiguous() else None
    if not isinstance(w, QuantizedTensor) or w.kernel_bits is None or not w.codes.T.is_contiguous():
        return None
    s, z = w.kernel_scales()
    if w.kernel_bits == 8:
        return _np(w.codes.T), _np(s.float())
    if w.shape[0] % 64:                                     # the 4-bit loop reads 64 inputs at a time
        return None
    s, z = (_np(t.T.contiguous().view(torch.int16)).view(np.uint16) for t in (s, z))   # bf16 bits
    return _np(w.codes.T), s, z, int(math.log2(w.group_size // 2))


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

    layers: object                # a numba list (_as_list) of each layer's weights (_layer's arguments), passed as one
    bases: tuple[float, ...]      # the RoPE bases the layers use
    rope_of: np.ndarray           # [n_layer] each layer's base, an index into bases
    windows: np.ndarray           # [n_layer] each layer's attention window (0: none)
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
        bases = tuple(sorted({c.theta(i) for i in range(c.n_layer)}))
        rope_of = np.array([bases.index(c.theta(i)) for i in range(c.n_layer)], np.int64)
        windows = np.array([c.window(i) or 0 for i in range(c.n_layer)], np.int64)
        return cls(_as_list(tuple(layers)), bases, rope_of, windows, head, _np(w.output_norm.weight), table, width)


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
    if layer0.keys.stride(-1) != 1 or layer0.values.stride(-1) != 1:     # attention reads a head's numbers in a row
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
    block_max: np.ndarray  # [n_head, BLOCKS] attention's blocks of positions: each one's largest score,
    block_sum: np.ndarray  # [n_head, BLOCKS] its sum of e^(score − largest),
    block_out: np.ndarray  # [n_head, BLOCKS, d_head] its weighted values


_buffers: dict[tuple, Buffers] = {}


def _buffers_for(width: int, n: int, n_head: int, capacity: int, d_head: int) -> Buffers:
    key = (width, n, n_head, capacity, d_head)
    if key not in _buffers:
        _buffers.clear()                                        # one at a time: a step is not re-entered
        _buffers[key] = Buffers(np.zeros((7, width), np.float32), np.zeros((n, width), np.float32),
                                np.zeros((4, width), np.float32), np.zeros((n_head, capacity), np.float32),
                                np.zeros((n_head, BLOCKS), np.float32), np.zeros((n_head, BLOCKS), np.float32),
                                np.zeros((n_head, BLOCKS, d_head), np.float32))
    return _buffers[key]


_cache_views: dict[int, tuple[list, object]] = {}   # id(KVCache) -> (its buffers, their numpy views in a numba list)


def _cache_arrays(cache: KVCache):
    """Each layer's key and value buffers as numpy arrays in a numba list, made once per cache (a tensor's .numpy() is
    four torch operations, and a step would make sixty of them) and again only if its buffers were replaced."""
    tensors = [(lc.keys, lc.values) for lc in cache.layers]
    seen = _cache_views.get(id(cache))
    if seen is None or any(a is not b for pair, old in zip(tensors, seen[0]) for a, b in zip(pair, old)):
        if seen is None:
            weakref.finalize(cache, _cache_views.pop, id(cache), None)
        seen = _cache_views[id(cache)] = (tensors, _as_list(tuple((_np(k), _np(v)) for k, v in tensors)))
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
    b = _buffers_for(max(p.width, c.vocab_size), n, c.n_head, cache.layers[0].capacity, c.d_head)   # the head's partial sums too
    x0 = _embedding_row(model, p, token)
    x = x0.copy()
    angles = np.stack([np.stack([_np(a[0]) for a in rope_angles(torch.tensor([pos]), c.d_head, theta)])
                       for theta in p.bases])                               # [n_bases, 2 (cos, sin), d_head]
    _layers(x, p.layers, _cache_arrays(cache), pos, angles, p.rope_of, p.windows,
            (c.n_head, c.n_kv_head, c.d_head, c.d_ff), c.norm_eps, c.scale, c.ffn == "geglu", n,
            b.buf, b.part, b.xq, b.scores, b.block_max, b.block_sum, b.block_out)
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
    b = _buffers_for(max(p.width, c.vocab_size), n, c.n_head, 1, c.d_head)
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
