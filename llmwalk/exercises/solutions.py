"""Solutions to every exercise, for teachers: short, readable, and graded in CI (`python -m llmwalk.exercises`).

Each is the plain textbook version, written from scratch: they use torch, never llmwalk's own implementation.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor


def bpe(piece: bytes, ranks: dict[bytes, int]) -> list[bytes]:
    """Join the adjacent pair with the lowest rank until no pair is in the table."""
    parts = [bytes([b]) for b in piece]
    while len(parts) > 1:
        pairs = [(ranks.get(a + b, math.inf), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
        rank, i = min(pairs)                      # ties: min takes the lowest i, the leftmost pair
        if rank == math.inf:
            break
        parts[i:i + 2] = [parts[i] + parts[i + 1]]
    return parts


def embed(ids: Tensor, table: Tensor) -> Tensor:
    return table[ids]                             # [T] -> [T, d]


def cosine_similarity(a: Tensor, b: Tensor) -> Tensor:
    return (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))


def causal_mask(T: int) -> Tensor:
    return torch.ones(T, T, dtype=torch.bool).tril()    # row i: keys 0..i


def attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    T, d_head = q.shape[-2], q.shape[-1]
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_head)               # [n_head, T, T]
    scores = scores.masked_fill(~causal_mask(T), float("-inf"))
    return softmax(scores) @ v                                         # [n_head, T, d_head]


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)                    # divide by d, not d - 1
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def lm_head(h: Tensor, W: Tensor) -> Tensor:
    return h @ W.T                                                     # [T, d] @ [d, vocab]


def softmax(logits: Tensor) -> Tensor:
    e = (logits - logits.amax(-1, keepdim=True)).exp()                # the max becomes exp(0) = 1: no overflow
    return e / e.sum(-1, keepdim=True)


def apply_temperature(logits: Tensor, temperature: float) -> Tensor:
    return logits / temperature


def top_k_filter(logits: Tensor, top_k: int) -> Tensor:
    kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))            # ties with the k-th stay


def top_p_filter(logits: Tensor, top_p: float) -> Tensor:
    probs, order = softmax(logits).sort(dim=-1, descending=True)
    before = probs.cumsum(-1) - probs                                  # mass of the tokens ranked above
    remove = (before >= top_p).scatter(-1, order, before >= top_p)     # back to vocabulary order
    return logits.masked_fill(remove, float("-inf"))


def greedy_generate(next_logits: Callable[[list[int]], Tensor], prompt_ids: list[int], n: int) -> list[int]:
    ids = list(prompt_ids)
    for _ in range(n):
        ids.append(int(next_logits(ids).argmax()))
    return ids[len(prompt_ids):]


def kv_cache_step(q: Tensor, k_new: Tensor, v_new: Tensor, k_cache: Tensor, v_cache: Tensor):
    k = torch.cat([k_cache, k_new], dim=1)                             # [n_head, S + 1, d_head]
    v = torch.cat([v_cache, v_new], dim=1)
    weights = softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]))   # the newest token sees everything
    return weights @ v, k, v


def kv_cache_bytes(n_layer: int, n_kv_head: int, d_head: int, T: int, bytes_per_number: int) -> int:
    return 2 * n_layer * n_kv_head * d_head * T * bytes_per_number     # keys and values


def speculative_accept(p: Tensor, q: Tensor, drafted: int, u: float) -> tuple[bool, Tensor]:
    accepted = u < min(1.0, float(p[drafted] / q[drafted]))           # keep x with probability min(1, p/q)
    rest = (p - q).clamp(min=0)                                       # what the draft proposes too rarely
    return accepted, rest / rest.sum()


def int8_quantize(w: Tensor) -> tuple[Tensor, Tensor]:
    top = w.abs().amax(dim=0)                                         # [d_out]: one scale per output column
    scales = torch.where(top > 0, top / 127, torch.ones_like(top))    # a column of zeros: any scale will do
    return torch.round(w / scales).to(torch.int8), scales
