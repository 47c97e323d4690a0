"""Section 八: quantization as shipped. SmolLM2's GGUF file stores its layer matrices in Q4_1 blocks.

A Q4_1 block holds 32 consecutive weights of one matrix row (ggml rows run along d_in, so in llmwalk's
[d_in, d_out] layout a block is 32 consecutive rows of one column) in 20 bytes:
    d (fp16 scale) | m (fp16 minimum) | 16 bytes of 4-bit codes q in 0..15
and w = d·q + m. Byte j holds the code of weight j in its low nibble and of weight j + 16 in its high nibble.
That is 5 bits per weight, asymmetric with a float zero point, groups of 32.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

Q4_1_BLOCK_BYTES = 20   # 2 (d) + 2 (m) + 16 (32 codes, two per byte)


@dataclass(frozen=True)
class Q4_1Blocks:
    """The first blocks of a Q4_1 tensor, taken apart."""

    d: np.ndarray          # [n] float16: scale of each block
    m: np.ndarray          # [n] float16: minimum of each block
    codes: np.ndarray      # [n, 32] uint8 in 0..15
    values: np.ndarray     # [n, 32] float32: d·codes + m, the weights the model computes with


def gguf_q4_1_blocks(path: str | os.PathLike, tensor_name: str, n_blocks: int = 4) -> Q4_1Blocks:
    """Read the first `n_blocks` Q4_1 blocks of one tensor of a GGUF file, byte by byte.  # -> [n_blocks, 32] codes"""
    import gguf

    from .convert_gguf import read_gguf
    reader = read_gguf(Path(path))          # its header checked first: a hostile file cannot make it loop
    tensor = next((t for t in reader.tensors if t.name == tensor_name), None)
    if tensor is None:
        raise KeyError(f"{path} has no tensor {tensor_name!r}")
    if tensor.tensor_type != gguf.GGMLQuantizationType.Q4_1:
        raise ValueError(f"{tensor_name} is stored as {tensor.tensor_type.name}, not Q4_1")
    raw = np.asarray(tensor.data).reshape(-1, Q4_1_BLOCK_BYTES)[:n_blocks]     # [n, 20] bytes
    d = raw[:, 0:2].copy().view(np.float16)[:, 0]
    m = raw[:, 2:4].copy().view(np.float16)[:, 0]
    packed = raw[:, 4:]
    codes = np.concatenate([packed & 0x0F, packed >> 4], axis=1)               # weights 0..15, then 16..31
    values = d[:, None].astype(np.float32) * codes + m[:, None].astype(np.float32)
    return Q4_1Blocks(d, m, codes, values)
