"""Section 五: translate the last hidden vector back into a score for every word of the vocabulary."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .layers import norm
from .sampling import rank_of
from .weights import Config, Weights

if TYPE_CHECKING:
    from .models import Model
    from .walk import Trace


def lm_head(x: Tensor, output: Tensor) -> Tensor:
    """One dot product per vocabulary entry: logits = x · W_outᵀ.  # [T, d_model] -> [T, vocab]"""
    return x @ output.T


def softmax(logits: Tensor) -> Tensor:
    """Turn logits into probabilities that sum to 1.  # [..., vocab] -> [..., vocab]"""
    return torch.softmax(logits.float(), dim=-1)


def logit_lens(resid: Tensor, weights: Weights, config: Config) -> Tensor:
    """Read any layer's residual stream as if it were the last: final norm, then LM head.  # [..., T, d] -> [..., T, vocab]"""
    return lm_head(norm(resid, weights.output_norm, config), weights.output)


@torch.inference_mode()
def lens_path(model: "Model", trace: "Trace", token: int, position: int = -1) -> dict:
    """Rank and probability of `token` read after every layer through the logit lens, at one position.

    Index 0 is the embedding, index i the residual stream after layer i (the last one is the model's answer).
    "top1_from" / "top10_from": the first index from which the token stays the most likely / among the 10 most likely.
    """
    logits = logit_lens(trace.resid[:, position], model.weights, model.config).float()   # [L + 1, vocab]
    rank = rank_of(logits, token).tolist()
    top1 = [i for i in range(len(rank)) if all(r == 1 for r in rank[i:])]
    top10 = [i for i in range(len(rank)) if all(r <= 10 for r in rank[i:])]
    return {"rank": rank, "prob": logits.softmax(-1)[:, token].tolist(), "top_ids": logits.argmax(-1).tolist(),
            "top1_from": top1[0] if top1 else None, "top10_from": top10[0] if top10 else None}
