"""Section 三: tokens become vectors, and the vectors learn where they stand."""
from __future__ import annotations

import torch
from torch import Tensor


def token_embedding(ids: Tensor, token_embd: Tensor, scale: float = 1.0) -> Tensor:
    """Look up one row of the embedding table per token.  # [T] -> [T, d_model]"""
    return token_embd[ids] * scale if scale != 1.0 else token_embd[ids]


def position_embedding(positions: Tensor, position_embd: Tensor) -> Tensor:
    """GPT-2's learned positions: one trained vector per position, added to the token vector.  # [T] -> [T, d_model]"""
    return position_embd[positions]


def rope_angles(positions: Tensor, d_head: int, theta: float) -> tuple[Tensor, Tensor]:
    """cos and sin of RoPE's rotation angles pos / theta^(2i/d).  # [T] -> ([T, d_head], [T, d_head])"""
    inv_freq = 1.0 / theta ** (torch.arange(0, d_head, 2, dtype=torch.int64).float() / d_head)  # [d_head/2]
    angles = positions.float()[:, None] * inv_freq[None, :]                                    # [T, d_head/2]
    angles = torch.cat([angles, angles], dim=-1)  # the two halves of a head form the rotated pairs
    return angles.cos(), angles.sin()


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate each (x_i, x_{i+d/2}) pair by its position's angle.  # [n_head, T, d_head] -> same"""
    half = x.shape[-1] // 2
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)     # the angles are computed in fp32; follow bf16 weights
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin
