"""Section 三: tokens become vectors, and the vectors learn where they stand."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from .sampling import rank_of

if TYPE_CHECKING:
    from .models import Model


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
    if cos.dtype != x.dtype:                        # the angles are computed in fp32; follow bf16 weights
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


# ---------------------------------------------------------------- which rows of the table are alike

def cosine_to_all(table: Tensor, row: int) -> Tensor:
    """Cosine similarity between one row of the embedding table and every row.  # [vocab, d] -> [vocab]"""
    table = table.float()
    return F.cosine_similarity(table, table[row][None], dim=-1)


def _others(model: "Model", word: str) -> Tensor:
    """cosine_to_all for `word`'s row, with the word itself pushed below every other row.  # -> [vocab]"""
    i = model.tokenizer.token_id(word)
    sims = cosine_to_all(model.weights.token_embd, i)
    sims[i] = -2.0
    return sims


def neighbours(model: "Model", word: str, k: int = 8) -> list[tuple[str, float]]:
    """The k rows of the token embedding table closest (by cosine) to `word`'s row, the word itself left out."""
    top = _others(model, word).topk(k)
    return [(model.tokenizer.pieces([j])[0], float(s)) for s, j in zip(top.values, top.indices.tolist())]


def neighbour_rank(model: "Model", word: str, other: str) -> int:
    """Where `other` ranks among `word`'s neighbours in the embedding table (1 = the closest row)."""
    return int(rank_of(_others(model, word), model.tokenizer.token_id(other)))
