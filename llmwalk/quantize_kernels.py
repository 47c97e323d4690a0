"""One matrix product per kernel: the ways a decode step's x @ W can run for a weight stored in fp32, bf16, int8 or
int4 (dequantize first, or torch's packed-integer kernels as quantize_model uses them). `timings.linear_kernel_times`
times them side by side; tests/test_quantize.py checks each computes x @ W."""
from __future__ import annotations

from typing import Callable

import torch

from .quantize import dequantize_tensor, quantize_tensor

Product = Callable[[torch.Tensor], torch.Tensor]     # x [1, d_in] -> x @ W [1, d_out]


def _fp32(w: torch.Tensor) -> Product:
    return lambda x: x @ w


def _bf16(w: torch.Tensor) -> Product:
    wb = w.bfloat16()
    return lambda x: (x.bfloat16() @ wb).float()


def _dequantized(w: torch.Tensor, **fmt) -> Product:
    q = quantize_tensor(w, **fmt)
    return lambda x: x @ dequantize_tensor(q)


def _as_in_model(w: torch.Tensor, **fmt) -> Product:
    q = quantize_tensor(w, **fmt)
    return lambda x: q.__rmatmul__(x)


def _int8_kernel_fp32(w: torch.Tensor) -> Product:
    q = quantize_tensor(w, 8)
    if q.kernel is None:                                    # this torch has no int8 kernel: the fallback's product
        return lambda x: x @ dequantize_tensor(q)
    codes, scales = q.kernel
    return lambda x: torch.ops.aten._weight_int8pack_mm(x, codes, scales.float())


KERNELS: dict[str, Callable[[torch.Tensor], Product]] = {     # name: W -> the product x @ W that kernel computes
    "fp32 x @ W": _fp32,
    "bf16 x @ W": _bf16,
    "int8 dequantize, then fp32 x @ W": lambda w: _dequantized(w, bits=8),
    "int8 _weight_int8pack_mm, fp32 x": _int8_kernel_fp32,
    "int8 _weight_int8pack_mm, bf16 x (quantize_model's path)": lambda w: _as_in_model(w, bits=8),
    "int4 g32 dequantize, then fp32 x @ W": lambda w: _dequantized(w, bits=4, group_size=32),
    "int4 g32 _weight_int4pack_mm_for_cpu, bf16 x (quantize_model's path)":
        lambda w: _as_in_model(w, bits=4, group_size=32),
}
