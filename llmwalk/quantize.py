"""Section 八, second optimization: store the weights as small integers (weight-only quantization).

Each weight matrix [d_in, d_out] becomes integer codes plus float scales: w ≈ scale · (code − zero). One
scale serves one output column (per-channel) or one group of `group_size` consecutive rows of a column
(group-wise, like GGUF's blocks of 32). Activations stay float: a layer dequantizes, or lets torch's int8
kernel multiply the codes directly.

A quantized weight sits in the same `Linear` container as a float one and `linear()` is unchanged: it
computes `x @ w.weight`, and `QuantizedTensor.__rmatmul__` answers that product (torch hands it over through
`__torch_function__`, the protocol for tensor-like objects).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import accumulate
from functools import cached_property
from typing import TYPE_CHECKING, Callable, NamedTuple, Sequence

import torch
from torch import Tensor

from .checks import is_int
from .i18n import t
from .weights import Weights, tensors, to_dtype

if TYPE_CHECKING:
    from .models import Model

LINEARS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
# Linears that read the same input: quantize_model(fuse=True) stores each group as one matrix, multiplied once.
FUSED = (("attn_q", "attn_k", "attn_v"), ("attn_output",), ("ffn_gate", "ffn_up"), ("ffn_down",))
# torch's CPU kernels that multiply integer codes directly. They are private (aten._…) and come and go between
# torch versions (pyproject allows torch >= 2.5), so each is used only if this torch has it; otherwise a product
# dequantizes the weight and multiplies in the activations' dtype: slower, the same maths.
INT8_KERNEL, INT4_KERNEL = "_weight_int8pack_mm", "_weight_int4pack_mm_for_cpu"


def has_kernel(name: str) -> bool:
    """Whether this torch build has the private aten kernel `name` (INT8_KERNEL or INT4_KERNEL)."""
    return hasattr(torch.ops.aten, name)


class Columns(NamedTuple):
    """Where a column slice of a fused matrix sits in it (QuantizedTensor.columns)."""

    whole: "QuantizedTensor"    # [d_in, Σ d_out]
    start: int
    end: int


class MatrixLike:
    """A weight that is not a tensor but answers `x @ w` (its __rmatmul__), handed over by torch directly.

    Without __torch_function__, torch's `x @ w` would first fail on the unknown type and only then let Python try
    w.__rmatmul__(x): about 10 µs lost per product, an eighth of an int8 decoding step.
    """

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (Tensor.__matmul__, torch.matmul) and len(args) == 2 and isinstance(args[1], cls):
            return args[1].__rmatmul__(args[0])
        return NotImplemented


@dataclass(frozen=True)
class QuantizedTensor(MatrixLike):
    """A weight matrix [d_in, d_out] as integer codes and float scales: w ≈ scales · (codes − zeros).

    Codes are stored one output column after another (`codes.T` is contiguous), which is the [d_out, d_in]
    layout torch's int8 kernel reads. 4-bit codes are packed two per byte (rows 2i and 2i+1 of a column
    share a byte, stored +8 so they are unsigned): `int_codes()` unpacks them.
    """

    codes: Tensor               # int8 [d_in, d_out], or uint8 [d_in / 2, d_out] for 4 bits
    scales: Tensor              # float32 [n_groups, d_out]: one per output column and group of d_in rows
    zeros: Tensor | None = None  # float32 [n_groups, d_out]: the (fractional) code of 0.0, asymmetric only
    # Set when this is a column slice of a fused matrix (`columns`): fast.linears multiplies the whole once for all
    # its slices. A view: the numbers are counted through the slices' own (views of the whole's), not again here.
    fused: Columns | None = field(default=None, repr=False, compare=False, metadata={"view": True})

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

    @property
    def read_bytes(self) -> int:
        """Bytes one product reads: the codes, and the scales (and shifts) as the kernel multiplies with them, in
        bf16 (kernel_scales: torch's kernel and the compiled step read the same) where a kernel fits, else as stored.
        For int4 in groups of 32 that is 0.625 bytes a weight, where nbytes holds 0.75 (fp32 scales and zeros)."""
        if self.kernel_bits is None:
            return self.nbytes
        per_scale = 1 if self.kernel_bits == 8 else 2          # int4: a scale and a shift per group and column
        return self.codes.numel() + 2 * per_scale * self.scales.numel()

    def int_codes(self) -> Tensor:
        """The integer codes, unpacked.  # -> [d_in, d_out] int8"""
        return _code_rows(self).T

    @property
    def kernel_bits(self) -> int | None:
        """8 or 4 when torch has the integer kernel for this format (its products then run in bf16), else None."""
        if self.bits == 8 and self.zeros is None and self.scales.shape[0] == 1 and has_kernel(INT8_KERNEL):
            return 8
        if (self.bits == 4 and self.group_size in (32, 64, 128, 256) and has_kernel(INT4_KERNEL)
                and has_kernel("_convert_weight_to_int4pack_for_cpu")):
            return 4
        return None

    def kernel_scales(self) -> tuple[Tensor, Tensor | None]:
        """The scales and shifts torch's kernel multiplies with, rounded to bf16 as it stores them: w = s·code for
        int8; w = (u − 8)·s + z for int4 codes u = code + 8, so z = −s·zero.  # -> ([n_groups, d_out] x 2)"""
        if self.kernel_bits == 8:
            return self.scales[0].bfloat16(), None
        shift = torch.zeros_like(self.scales) if self.zeros is None else -self.scales * self.zeros
        return self.scales.bfloat16(), shift.bfloat16()

    @cached_property
    def kernel(self) -> tuple[Tensor, Tensor] | None:
        """The weight as torch's CPU kernel for its format reads it, prepared on first use; None: no kernel fits.

        int8, one scale per column: codes [d_out, d_in] and bf16 scales. int4 in groups of 32…256: unsigned codes
        in the kernel's own tiled layout and kernel_scales stacked. (That layout is a second copy of the 4-bit
        codes, made once, the size of `codes`.)
        """
        if self.kernel_bits == 8:
            return self.codes.T, self.kernel_scales()[0]
        if self.kernel_bits == 4:
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(_code_rows(self).int() + 8, 1)
            return packed, torch.stack(self.kernel_scales(), dim=-1)                   # [n_groups, d_out, 2]
        return None

    def columns(self, start: int, end: int) -> "QuantizedTensor":
        """Output columns start..end-1 as a matrix of their own, sharing this one's storage and remembering it
        (fast.linears then multiplies the whole once for all its slices).  # -> [d_in, end - start]"""
        return QuantizedTensor(self.codes[:, start:end], self.scales[:, start:end],
                               None if self.zeros is None else self.zeros[:, start:end], Columns(self, start, end))

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


def _finite(w: Tensor, name: str) -> None:
    """A ValueError for a NaN or inf weight: it would set its group's scale (inf: every code NaN) or be
    rounded silently to 0 (NaN), and the model would run on."""
    if w.sum().isfinite():                  # a NaN or inf weight makes the sum NaN or inf: one pass, nothing allocated
        return
    if bad := (~w.isfinite()).nonzero()[:1].tolist():
        raise ValueError(f"{name} holds {int((~w.isfinite()).sum())} NaN/inf weights (the first at {tuple(bad[0])}):"
                         " they cannot be rounded to integer codes; fix or reload the weights before quantizing")


def quantize_tensor(w: Tensor, bits: int = 8, group_size: int | None = None,
                    symmetric: bool = True) -> QuantizedTensor:
    """Round a matrix to `bits`-bit integer codes, one scale per output column and group of d_in rows.

    Symmetric: scale = max|w| / (2^(b-1) − 1), codes in ±(2^(b-1) − 1), no zero point.
    Asymmetric: [min, max] is cut into 2^b − 1 steps; the zero point is a float (as GGUF's Q4_1 minimum and
    torch's int4 kernel have it), so min and max land exactly on the lowest and highest code.
    Either way every weight is within half a step (scale/2) of its value.  # [d_in, d_out] -> QuantizedTensor
    """
    if not isinstance(bits, int) or bits not in (4, 8):          # 8.0 would name a format "int8.0"
        raise ValueError(f"bits must be 8 or 4, not {bits!r}")
    if not isinstance(w, Tensor) or w.dim() != 2 or 0 in w.shape:
        raise ValueError(f"quantize_tensor takes a [d_in, d_out] matrix, got shape {tuple(getattr(w, 'shape', ()))}"
                         ": pass one layer matrix, e.g. model.weights.blocks[0].attn_q.weight")
    _finite(w, "the matrix")
    d_in, d_out = w.shape
    if group_size is not None and (not is_int(group_size)
                                   or group_size < 1):
        raise ValueError(f"group_size must be an int >= 1 or None (one group per column), got {group_size!r}")
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


def quantize_fused(ws: Sequence[Tensor], bits: int = 8, group_size: int | None = None,
                   symmetric: bool = True) -> list[QuantizedTensor]:
    """Quantize matrices that read the same input as one [d_in, Σ d_out] matrix and return each one's columns.

    Scales are per output column (and group of rows), so every code is the one quantize_tensor gives the matrix
    alone: fusing changes how many products run per token, not a number.  # [d_in, d_out_i]... -> slices
    """
    whole = quantize_tensor(torch.cat(list(ws), dim=1), bits, group_size, symmetric)
    ends = list(accumulate(w.shape[1] for w in ws))
    return [whole.columns(end - w.shape[1], end) for w, end in zip(ws, ends)]


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
    on its LM head, while with fp32 activations it is 3x slower than fp32. See `timings.linear_kernel_times`.
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

    def __getitem__(self, ids: Tensor | int) -> Tensor:
        """Dequantize the rows of the looked-up tokens only, as indexing a table does: [T] ids give [T, d_model]
        rows, one id (an int) one row [d_model].  # [T] -> [T, d_model]"""
        h, one = self.head, torch.as_tensor(ids).dim() == 0
        ids = torch.as_tensor(ids).reshape(-1)
        picked = QuantizedTensor(h.codes[:, ids], h.scales[:, ids], None if h.zeros is None else h.zeros[:, ids])
        rows = dequantize_tensor(picked).T.contiguous()
        return rows[0] if one else rows

    @property
    def nbytes(self) -> int:
        """Storage held: the quantized head's."""
        return self.head.nbytes

    @property
    def read_bytes(self) -> int:
        """Bytes the LM head's product reads (QuantizedTensor.read_bytes)."""
        return self.head.read_bytes

    @property
    def T(self) -> QuantizedTensor:
        """The LM head computes x @ table.T."""
        return self.head

    @property
    def dtype(self) -> torch.dtype:
        """The dtype looked-up rows come out in (what the activations after the embedding are)."""
        return torch.float32


@dataclass(frozen=True)
class Int8Activations(MatrixLike):
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


def map_fused_linears(weights: Weights, fn: Callable) -> Weights:
    """Weights with fn applied to each FUSED group of a block's linear weights at once (fn: list -> list)."""
    def block(b):
        new = {}
        for group in FUSED:
            names = [n for n in group if getattr(b, n) is not None]        # GPT-2 has no ffn_gate
            if names:
                outs = fn([getattr(b, n).weight for n in names])
                new.update({n: replace(getattr(b, n), weight=w) for n, w in zip(names, outs)})
        return replace(b, **new)
    return replace(weights, blocks=tuple(block(b) for b in weights.blocks))


def map_tables(weights: Weights, fn: Callable) -> Weights:
    """Weights with fn applied to the token table and the LM head (once when they are tied)."""
    table = fn(weights.token_embd)
    output = table if weights.output is weights.token_embd else fn(weights.output)
    return replace(weights, token_embd=table, output=output)


def quantize_model(model: "Model", bits: int = 8, group_size: int | None = None, symmetric: bool = True,
                   embeddings: bool = False, *, fuse: bool = True) -> "Model":
    """The same model with the matrices of every layer quantized; runs through the same `forward`.

    The token table / LM head stays fp32 unless embeddings=True: it is a fifth of SmolLM2's weights, and
    every logit goes through it. Int8 per-channel symmetric weights use torch's int8 kernel; other formats
    are dequantized on the fly inside each product (slower than fp32: a format for accuracy studies).
    fuse=True stores q/k/v and gate/up as one matrix each (quantize_fused): the same numbers, fewer products per
    token; fuse=False quantizes every matrix on its own.
    """
    stored = {f"layer {i} {n}": getattr(b, n).weight for i, b in enumerate(model.weights.blocks) for n in LINEARS
              if getattr(b, n) is not None}
    if not all(isinstance(w, Tensor) for w in [*stored.values(), model.weights.token_embd]):
        raise ValueError(f"{model.source!r} is already quantized: quantize the float model instead "
                         "(or lw.dequantize_model(model) first, which keeps the rounding errors it already has)")
    for name, w in {**stored, **({"token_embd": model.weights.token_embd} if embeddings else {})}.items():
        _finite(w, f"{model.source!r} {name}")            # fused matrices would not say which one it is
    def quant(w: Tensor) -> QuantizedTensor:
        return quantize_tensor(w, bits, group_size, symmetric)
    if fuse:
        weights = map_fused_linears(model.weights, lambda ws: quantize_fused(ws, bits, group_size, symmetric))
    else:
        weights = map_linears(model.weights, quant)
    if embeddings:
        weights = map_tables(weights, lambda t: QuantizedTable(quant(t.T)))
    fmt = f"int{bits}" + (f" g{group_size}" if group_size else " per-channel") + ("" if symmetric else " asym")
    return replace(model, weights=weights, source=f"{model.source}, {fmt} weights")


def to_float(w):
    """A stored weight as a plain tensor: quantized ones dequantized, wrappers unwrapped, tensors as they are."""
    if isinstance(w, QuantizedTensor):
        return dequantize_tensor(w)
    if isinstance(w, QuantizedTable):
        return dequantize_tensor(w.head).T.contiguous()
    if isinstance(w, Int8Activations):
        return to_float(w.weight)
    return w


def dequantize_model(model: "Model") -> "Model":
    """Every weight back in fp32: the same rounding errors as the quantized (or bf16) model, fp32 maths and speed."""
    weights = to_dtype(map_tables(map_linears(model.weights, to_float), to_float), torch.float32)
    return replace(model, weights=weights, source=f"{model.source}, dequantized to fp32")


def model_weight_bytes(model: "Model") -> int:
    """Bytes the weights really occupy (codes, scales, zero points, floats; a tied table counted once)."""
    return sum({id(t): t.numel() * t.element_size() for _, t in tensors(model.weights)}.values())


def quantize_activations(model: "Model") -> "Model":
    """The model with every layer matrix's input rounded to int8 per tensor, like torch's quantize_dynamic (which
    also picks each input's 8-bit range on the fly; tests/test_claims_cost.py runs torch's own as a reference)."""
    return replace(model, weights=map_linears(model.weights, Int8Activations),
                   source=f"{model.source}, int8 activations")


def format_label(name: str) -> str:
    """A format's name (one of accuracy.FORMATS) as a table shows it, in the current language."""
    return {"bf16": t("quantize.format.bf16"), "int8": t("quantize.format.int8"),
            "int4 g32 symmetric": t("quantize.format.int4_g32_symmetric"),
            "int4 g32 asymmetric": t("quantize.format.int4_g32_asymmetric"),
            "int8 weights + int8 activations": t("quantize.format.int8_activations")}[name]
