"""Section 五: translate the last hidden vector back into a score for every word of the vocabulary."""
from __future__ import annotations

import torch
from torch import Tensor

from .layers import norm
from .weights import Config, Weights


def lm_head(x: Tensor, output: Tensor) -> Tensor:
    """One dot product per vocabulary entry: logits = x · W_outᵀ.  # [T, d_model] -> [T, vocab]"""
    return x @ output.T


def softmax(logits: Tensor) -> Tensor:
    """Turn logits into probabilities that sum to 1.  # [..., vocab] -> [..., vocab]"""
    return torch.softmax(logits.float(), dim=-1)


def logit_lens(resid: Tensor, weights: Weights, config: Config) -> Tensor:
    """Read any layer's residual stream as if it were the last: final norm, then LM head.  # [..., T, d] -> [..., T, vocab]"""
    return lm_head(norm(resid, weights.output_norm, config), weights.output)
