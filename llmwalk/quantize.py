"""Section 八, second optimization: store the weights as small integers (weight-only quantization).

Each weight matrix [d_in, d_out] becomes integer codes plus float scales: w ≈ scale · (code − zero). One
scale serves one output column (per-channel) or one group of `group_size` consecutive rows of a column
(group-wise, like GGUF's blocks of 32). Activations stay float: a layer dequantizes, or lets torch's int8
kernel multiply the codes directly.

A quantized weight sits in the same `Linear` container as a float one and `linear()` is unchanged: it
computes `x @ w.weight` (through `layers.matmul`), and `QuantizedTensor.__rmatmul__` answers that product.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace
from functools import cached_property, partial
from typing import TYPE_CHECKING, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .walk import Trace, forward
from .weights import Weights, tensors, to_dtype

if TYPE_CHECKING:
    from .models import Model

LINEARS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
EVAL_TEXT = "data/eval_text.txt"


@dataclass(frozen=True)
class QuantizedTensor:
    """A weight matrix [d_in, d_out] as integer codes and float scales: w ≈ scales · (codes − zeros).

    Codes are stored one output column after another (`codes.T` is contiguous), which is the [d_out, d_in]
    layout torch's int8 kernel reads. 4-bit codes are packed two per byte (rows 2i and 2i+1 of a column
    share a byte, stored +8 so they are unsigned): `int_codes()` unpacks them.
    """

    codes: Tensor               # int8 [d_in, d_out], or uint8 [d_in / 2, d_out] for 4 bits
    scales: Tensor              # float32 [n_groups, d_out]: one per output column and group of d_in rows
    zeros: Tensor | None = None  # float32 [n_groups, d_out]: the (fractional) code of 0.0, asymmetric only

    @property
    def bits(self) -> int:
        return 4 if self.codes.dtype == torch.uint8 else 8

    @property
    def shape(self) -> tuple[int, int]:
        """(d_in, d_out) of the matrix it stands for."""
        return self.codes.shape[0] * 8 // self.bits, self.codes.shape[1]

    @property
    def group_size(self) -> int:
        """Rows that share a scale (d_in when there is one scale per column)."""
        return self.shape[0] // self.scales.shape[0]

    @property
    def nbytes(self) -> int:
        """Storage actually held: codes, scales and zero points."""
        return sum(t.numel() * t.element_size() for _, t in tensors(self))

    def int_codes(self) -> Tensor:
        """The integer codes, unpacked.  # -> [d_in, d_out] int8"""
        return _code_rows(self).T

    @cached_property
    def kernel(self) -> tuple[Tensor, Tensor] | None:
        """The weight as torch's CPU kernel for its format reads it, prepared on first use; None: no kernel fits.

        int8, one scale per column: codes [d_out, d_in] and bf16 scales. int4 in groups of 32…256: the kernel
        computes (u − 8)·s + z from unsigned codes u = code + 8 in its own tiled layout, so w = s·(code − zero)
        gives z = −s·zero. (That layout is a second copy of the 4-bit codes, made once, the size of `codes`.)
        """
        if self.bits == 8 and self.zeros is None and self.scales.shape[0] == 1:
            return self.codes.T, self.scales[0].bfloat16()
        if self.bits == 4 and self.group_size in (32, 64, 128, 256):
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(_code_rows(self).int() + 8, 1)
            shift = torch.zeros_like(self.scales) if self.zeros is None else -self.scales * self.zeros
            return packed, torch.stack([self.scales, shift], dim=-1).bfloat16()    # [n_groups, d_out, 2]
        return None

    def __rmatmul__(self, x: Tensor) -> Tensor:
        """x @ w, with torch's integer kernel when one fits (bf16 activations), else dequantized.  # [T, d_in] -> [T, d_out]"""
        if self.kernel is None or x.dim() != 2:
            return x @ dequantize_tensor(self).to(x.dtype)
        return (int8_matmul if self.bits == 8 else int4_matmul)(x, self)

    def __repr__(self) -> str:
        kind = "symmetric" if self.zeros is None else "asymmetric"
        return f"QuantizedTensor(int{self.bits}, {kind}, shape={self.shape}, group_size={self.group_size})"


def _code_rows(q: QuantizedTensor) -> Tensor:
    """Codes with one output column per row, unpacked.  # -> [d_out, d_in] int8"""
    rows = q.codes.T
    if q.bits == 8:
        return rows
    return (torch.stack([rows & 15, rows >> 4], dim=-1).reshape(rows.shape[0], -1).to(torch.int8) - 8)


def _pack4(rows: Tensor) -> Tensor:
    """Two 4-bit codes per byte, along d_in.  # [d_out, d_in] int in [-8, 7] -> [d_out, d_in / 2] uint8"""
    u = (rows + 8).to(torch.uint8)
    return u[:, 0::2] | (u[:, 1::2] << 4)


def quantize_tensor(w: Tensor, bits: int = 8, group_size: int | None = None,
                    symmetric: bool = True) -> QuantizedTensor:
    """Round a matrix to `bits`-bit integer codes, one scale per output column and group of d_in rows.

    Symmetric: scale = max|w| / (2^(b-1) − 1), codes in ±(2^(b-1) − 1), no zero point.
    Asymmetric: [min, max] is cut into 2^b − 1 steps; the zero point is a float (as GGUF's Q4_1 minimum and
    torch's int4 kernel have it), so min and max land exactly on the lowest and highest code.
    Either way every weight is within half a step (scale/2) of its value.  # [d_in, d_out] -> QuantizedTensor
    """
    if bits not in (4, 8):
        raise ValueError(f"bits must be 8 or 4, not {bits}")
    d_in, d_out = w.shape
    g = group_size or d_in
    if d_in % g or (bits == 4 and g % 2):
        raise ValueError(f"group_size {g} must divide d_in={d_in} (and be even for 4 bits)")
    groups = w.detach().float().T.contiguous().view(d_out, d_in // g, g)   # [d_out, n_groups, g], rows contiguous
    top = 2 ** (bits - 1) - 1
    if symmetric:
        low, scale = -top, groups.abs().amax(-1) / top                 # code 0 is 0.0; -2^(b-1) stays unused
    else:
        low, scale = -top - 1, (groups.amax(-1) - groups.amin(-1)) / (2 ** bits - 1)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))     # a constant group: any scale will do
    zero = None if symmetric else low - groups.amin(-1) / scale        # puts min on code `low`
    shifted = groups / scale[..., None] + (0 if zero is None else zero[..., None])
    rows = shifted.round().clamp(low, top).reshape(d_out, d_in).to(torch.int8)
    return QuantizedTensor((rows if bits == 8 else _pack4(rows)).T, scale.T, None if zero is None else zero.T)


def dequantize_tensor(q: QuantizedTensor) -> Tensor:
    """w = scales · (codes − zeros).  # QuantizedTensor -> [d_in, d_out] float32"""
    rows = _code_rows(q).float()
    d_out, d_in = rows.shape
    groups = rows.reshape(d_out, -1, q.group_size)                     # [d_out, n_groups, g]
    if q.zeros is not None:
        groups = groups - q.zeros.T[..., None]
    return (groups * q.scales.T[..., None]).reshape(d_out, d_in).T.contiguous()


def int8_matmul(x: Tensor, q: QuantizedTensor) -> Tensor:
    """x @ w with torch's weight-only int8 kernel, in bfloat16.  # [T, d_in] -> [T, d_out]

    The kernel reads int8 codes [d_out, d_in] and one scale per output. On CPU it is fast only with bf16
    activations: on an AVX-512 machine about 2x faster than fp32 x @ W over SmolLM2's layer matrices and 4x
    on its LM head, while with fp32 activations it is 3x slower than fp32. See `bench_linear_kernels`.
    """
    codes, scales = q.kernel
    return torch.ops.aten._weight_int8pack_mm(x.bfloat16().contiguous(), codes, scales).to(x.dtype)


def int4_matmul(x: Tensor, q: QuantizedTensor) -> Tensor:
    """x @ w with torch's int4 kernel (groups of 32…256), in bfloat16.  # [T, d_in] -> [T, d_out]"""
    packed, scale_shift = q.kernel
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x.bfloat16().contiguous(), packed, q.group_size,
                                                      scale_shift).to(x.dtype)


# ---------------------------------------------------------------- whole models

@dataclass(frozen=True)
class QuantizedTable:
    """A tied embedding table [vocab, d] kept as the quantized LM-head matrix [d, vocab]: looked up, or multiplied."""

    head: QuantizedTensor       # [d_model, vocab]; one scale per vocabulary entry (and group)

    def __getitem__(self, ids: Tensor) -> Tensor:
        """Dequantize the rows of the looked-up tokens only.  # [T] -> [T, d_model]"""
        h = self.head
        picked = QuantizedTensor(h.codes[:, ids], h.scales[:, ids], None if h.zeros is None else h.zeros[:, ids])
        return dequantize_tensor(picked).T.contiguous()

    @property
    def T(self) -> QuantizedTensor:
        """The LM head computes x @ table.T."""
        return self.head


@dataclass(frozen=True)
class Int8Activations:
    """A linear weight whose input is rounded to int8 first, one scale for the whole tensor (dynamic quantization)."""

    weight: Tensor | QuantizedTensor

    def __rmatmul__(self, x: Tensor) -> Tensor:
        """round(x) @ w.  # [T, d_in] -> [T, d_out]"""
        return fake_quantize(x) @ self.weight


def fake_quantize(x: Tensor, bits: int = 8) -> Tensor:
    """Round a whole tensor to integers with one scale from its max |value| (per tensor), and back.  # [...] -> [...]"""
    return dequantize_tensor(quantize_tensor(x.reshape(-1, 1), bits)).view_as(x)


def map_linears(weights: Weights, fn: Callable) -> Weights:
    """Weights with fn applied to the weight of every linear layer inside the blocks."""
    def block(b):
        return replace(b, **{name: replace(lin, weight=fn(lin.weight)) for name in LINEARS
                             if (lin := getattr(b, name)) is not None})
    return replace(weights, blocks=tuple(block(b) for b in weights.blocks))


def map_tables(weights: Weights, fn: Callable) -> Weights:
    """Weights with fn applied to the token table and the LM head (once when they are tied)."""
    table = fn(weights.token_embd)
    output = table if weights.output is weights.token_embd else fn(weights.output)
    return replace(weights, token_embd=table, output=output)


def quantize_model(model: "Model", bits: int = 8, group_size: int | None = None, symmetric: bool = True,
                   embeddings: bool = False) -> "Model":
    """The same model with the matrices of every layer quantized; runs through the same `forward`.

    The token table / LM head stays fp32 unless embeddings=True: it is a fifth of SmolLM2's weights, and
    every logit goes through it. Int8 per-channel symmetric weights use torch's int8 kernel; other formats
    are dequantized on the fly inside each product (slower than fp32: a format for accuracy studies).
    """
    def quant(w: Tensor) -> QuantizedTensor:
        return quantize_tensor(w, bits, group_size, symmetric)
    weights = map_linears(model.weights, quant)
    if embeddings:
        weights = map_tables(weights, lambda t: QuantizedTable(quant(t.T)))
    fmt = f"int{bits}" + (f" g{group_size}" if group_size else " per-channel") + ("" if symmetric else " asym")
    return replace(model, weights=weights, source=f"{model.source}, {fmt} weights")


def _to_float(w):
    """A stored weight as a plain tensor: quantized ones dequantized, wrappers unwrapped, tensors as they are."""
    if isinstance(w, QuantizedTensor):
        return dequantize_tensor(w)
    if isinstance(w, QuantizedTable):
        return dequantize_tensor(w.head).T.contiguous()
    if isinstance(w, Int8Activations):
        return _to_float(w.weight)
    return w


def dequantize_model(model: "Model") -> "Model":
    """Every weight back in fp32: the same rounding errors as the quantized (or bf16) model, fp32 maths and speed."""
    weights = to_dtype(map_tables(map_linears(model.weights, _to_float), _to_float), torch.float32)
    return replace(model, weights=weights, source=f"{model.source}, dequantized to fp32")


def model_weight_bytes(model: "Model") -> int:
    """Bytes the weights really occupy (codes, scales, zero points, floats; a tied table counted once)."""
    return sum({id(t): t.numel() * t.element_size() for _, t in tensors(model.weights)}.values())


def quantize_activations(model: "Model") -> "Model":
    """The model with every layer matrix's input rounded to int8 per tensor, like torch's quantize_dynamic (which
    also picks each input's 8-bit range on the fly; tests/test_claims_cost.py runs torch's own as a reference)."""
    return replace(model, weights=map_linears(model.weights, Int8Activations),
                   source=f"{model.source}, int8 activations")


def dynamic_int8_logits(model: "Model", ids: Sequence[int] | Tensor) -> Tensor:
    """Logits with int8 weights (per channel) and int8 inputs to every layer matrix (per tensor, scale from
    max |x|), the way torch's quantize_dynamic works.  # [T] -> [T, vocab]"""
    return forward(quantize_activations(quantize_model(model, 8)), ids, record=False).logits


# ---------------------------------------------------------------- accuracy

def eval_text() -> str:
    """The evaluation text shipped with llmwalk (an original ~800-word explanation of how Paris became a capital)."""
    from importlib.resources import files
    return files("llmwalk").joinpath(EVAL_TEXT).read_text(encoding="utf-8")


def _chunks(ids: Sequence[int], size: int) -> list[list[int]]:
    """Consecutive pieces of at most `size` tokens; each is scored on its own (no context carried over)."""
    return [list(ids[i:i + size]) for i in range(0, len(ids), size)]


def _log_probs(model: "Model", ids: list[int]) -> Tensor:
    """Next-token log-probabilities at every position.  # [T] -> [T, vocab]"""
    return F.log_softmax(forward(model, ids, record=False).logits.float(), dim=-1)


def _nll(log_probs: Tensor, ids: list[int]) -> Tensor:
    """−log p(actual next token) at every position but the last.  # [T, vocab] -> [T - 1]"""
    return -log_probs[:-1].gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


def perplexity(model: "Model", text: str | None = None, chunk: int = 512) -> float:
    """exp(mean −log p(next token)) over the text, in chunks of at most `chunk` tokens."""
    parts = _chunks(model.tokenizer.encode(text or eval_text()), chunk)
    return float(torch.cat([_nll(_log_probs(model, p), p) for p in parts]).mean().exp())


@dataclass(frozen=True)
class Comparison:
    """How far a changed model is from the fp32 one, on one text."""

    weight_bytes: int
    fp32_weight_bytes: int
    weight_error: list[dict]    # per layer: max and mean |w − w_fp32| over its matrices
    kl_mean: float              # KL(p_fp32 ‖ p) of the next-token distributions, mean over positions
    kl_max: float
    top1_agreement: float       # fraction of positions where both pick the same most likely next token
    perplexity_fp32: float
    perplexity: float
    n_tokens: int


def layer_weight_errors(model: "Model", other: "Model") -> list[dict]:
    """Per layer, max and mean |w − w_fp32| over all its matrices (quantized weights dequantized)."""
    rows = []
    for i, (a, b) in enumerate(zip(model.weights.blocks, other.weights.blocks)):
        errs = torch.cat([(_to_float(getattr(b, n).weight).float() - getattr(a, n).weight).abs().flatten()
                          for n in LINEARS if getattr(a, n) is not None])
        rows.append({"layer": i, "max_abs_error": float(errs.max()), "mean_abs_error": float(errs.mean())})
    return rows


def compare_to_fp32(model: "Model", changed: "Model", text: str | None = None, chunk: int = 512) -> Comparison:
    """Memory, weight error, KL, top-1 agreement and perplexity of `changed` against the fp32 `model`."""
    kl, agree, nll_ref, nll = [], [], [], []
    for part in _chunks(model.tokenizer.encode(text or eval_text()), chunk):
        ref, out = _log_probs(model, part), _log_probs(changed, part)
        kl.append((ref.exp() * (ref - out)).sum(-1))
        agree.append(ref.argmax(-1) == out.argmax(-1))
        nll_ref.append(_nll(ref, part))
        nll.append(_nll(out, part))
    kl_all = torch.cat(kl)
    return Comparison(model_weight_bytes(changed), model_weight_bytes(model), layer_weight_errors(model, changed),
                      float(kl_all.mean()), float(kl_all.max()), float(torch.cat(agree).float().mean()),
                      float(torch.cat(nll_ref).mean().exp()), float(torch.cat(nll).mean().exp()), len(kl_all))


def activation_outliers(trace: Trace) -> list[dict]:
    """Per layer and per layer-matrix input, max |activation| against the median: the outliers that break int8.

    A per-tensor int8 scale is set by the largest value; when one channel is 100x the median, the typical
    values get only one or two of the 255 levels.
    """
    rows = []
    for i, layer in enumerate(trace.layers):
        for site in ("attn_in", "ffn_in", "ffn_hidden"):
            a = getattr(layer, site).abs()                     # [T, d]
            peak, median = a.max(), a.median()
            rows.append({"layer": i, "site": site, "max_abs": float(peak), "median_abs": float(median),
                         "ratio": float(peak / median), "channel": int(a.amax(0).argmax()),
                         "position": int(a.amax(1).argmax())})
    return rows


# ---------------------------------------------------------------- speed

def _fp32(w: Tensor) -> Callable[[Tensor], Tensor]:
    return lambda x: x @ w


def _bf16(w: Tensor) -> Callable[[Tensor], Tensor]:
    wb = w.bfloat16()
    return lambda x: (x.bfloat16() @ wb).float()


def _dequantized(w: Tensor, **fmt) -> Callable[[Tensor], Tensor]:
    q = quantize_tensor(w, **fmt)
    return lambda x: x @ dequantize_tensor(q)


def _as_in_model(w: Tensor, **fmt) -> Callable[[Tensor], Tensor]:
    q = quantize_tensor(w, **fmt)
    return lambda x: q.__rmatmul__(x)


def _int8_kernel_fp32(w: Tensor) -> Callable[[Tensor], Tensor]:
    codes, scales = quantize_tensor(w, 8).kernel
    return lambda x: torch.ops.aten._weight_int8pack_mm(x, codes, scales.float())


KERNELS: dict[str, Callable[[Tensor], Callable[[Tensor], Tensor]]] = {
    "fp32 x @ W": _fp32,
    "bf16 x @ W": _bf16,
    "int8 dequantize, then fp32 x @ W": partial(_dequantized, bits=8),
    "int8 _weight_int8pack_mm, fp32 x": _int8_kernel_fp32,
    "int8 _weight_int8pack_mm, bf16 x (quantize_model's path)": partial(_as_in_model, bits=8),
    "int4 g32 dequantize, then fp32 x @ W": partial(_dequantized, bits=4, group_size=32),
    "int4 g32 _weight_int4pack_mm_for_cpu, bf16 x (quantize_model's path)": partial(_as_in_model, bits=4, group_size=32),
}


def bench_linear_kernels(model: "Model", rounds: int = 5, repeats: int = 3) -> list[dict]:
    """Time one decode step's matrix-vector products (x: [1, d_in]) per kernel, on an fp32 model's real matrices.

    Each workload runs through the matrices of all layers in turn, as decoding does, so that the weights come
    from memory rather than cache. Kernels are interleaved round by round; the median round is reported.
    Returns rows {workload, kernel, microseconds, speedup_vs_fp32}.
    """
    per_name = {n: [getattr(b, n).weight for b in model.weights.blocks]
                for n in LINEARS if getattr(model.weights.blocks[0], n) is not None}
    workloads = {f"{n} x{len(ws)}": ws for n, ws in per_name.items()}
    workloads["all layer matrices (one decode step)"] = [w for ws in per_name.values() for w in ws]
    workloads["lm_head"] = [model.weights.output.T]
    matrices = {id(w): w for ws in workloads.values() for w in ws}
    prepared = {k: {i: make(w) for i, w in matrices.items()} for k, make in KERNELS.items()}
    gen = torch.Generator().manual_seed(0)
    rows = []
    for workload, ws in workloads.items():
        xs = [torch.randn(1, w.shape[0], generator=gen) for w in ws]
        times: dict[str, list[float]] = {k: [] for k in KERNELS}
        for _ in range(rounds):
            for k in KERNELS:
                times[k].append(_seconds([prepared[k][id(w)] for w in ws], xs, repeats))
        median = {k: statistics.median(t) for k, t in times.items()}
        rows += [{"workload": workload, "kernel": k, "microseconds": t * 1e6,
                  "speedup_vs_fp32": median["fp32 x @ W"] / t} for k, t in median.items()]
    return rows


def _seconds(fns: list[Callable[[Tensor], Tensor]], xs: list[Tensor], repeats: int) -> float:
    """Seconds per pass through all the matrices."""
    fns[0](xs[0])                                           # warm-up: first-call allocations
    tic = time.perf_counter()
    for _ in range(repeats):
        for f, x in zip(fns, xs):
            f(x)
    return (time.perf_counter() - tic) / repeats
