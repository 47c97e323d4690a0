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


def apply_rope(x: Tensor, positions: Tensor, base: float) -> Tensor:
    d = x.shape[-1]
    freq = base ** (-torch.arange(0, d, 2).float() / d)               # pair i turns base^(-2i/d) rad per position
    angle = positions.float()[:, None] * freq                          # [T, d/2]
    x1, x2 = x[..., :d // 2], x[..., d // 2:]                          # pair i is (x_i, x_{i+d/2}): rotate-half
    return torch.cat([x1 * angle.cos() - x2 * angle.sin(), x1 * angle.sin() + x2 * angle.cos()], -1)


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


def swiglu_ffn(x: Tensor, w_gate: Tensor, w_up: Tensor, w_down: Tensor) -> Tensor:
    gate, up = x @ w_gate.T, x @ w_up.T                                # [..., d_ff]; the checkpoint stores [out, in]
    return (gate * torch.sigmoid(gate) * up) @ w_down.T               # SiLU(g) = g·σ(g) on the gate only


def lm_head(h: Tensor, W: Tensor) -> Tensor:
    return h @ W.T                                                     # [T, d] @ [d, vocab]


def softmax(logits: Tensor) -> Tensor:
    e = (logits - logits.amax(-1, keepdim=True)).exp()                # the max becomes exp(0) = 1: no overflow
    return e / e.sum(-1, keepdim=True)


def logit_lens(resid: Tensor, norm_weight: Tensor, eps: float, W_U: Tensor) -> Tensor:
    normed = resid / torch.sqrt(resid.pow(2).mean(-1, keepdim=True) + eps) * norm_weight   # RMSNorm, each row
    return normed @ W_U.T                                              # [n_layer + 1, d] @ [d, vocab]


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


def next_token_logits(weights, config, ids: Tensor) -> Tensor:
    """SmolLM2's forward pass from the checkpoint's tensors: embedding, n_layer pre-norm blocks (RMSNorm, RoPE,
    grouped-query causal attention, SwiGLU), final norm, and the tied LM head at the last position.  # [T] -> [vocab]"""
    c, T = config, ids.numel()

    def rms(x, w):
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + c.norm_eps) * w.weight

    def rope(x):                                                       # [n, T, d_head]: pairs (x_i, x_{i + d/2})
        freq = c.rope_theta ** (-torch.arange(0, c.d_head, 2).float() / c.d_head)
        angle = torch.arange(T).float()[:, None] * freq                # [T, d_head / 2]
        cos, sin = angle.cos().repeat(1, 2), angle.sin().repeat(1, 2)
        half = c.d_head // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin

    def heads(x, n):                                                   # [T, n * d_head] -> [n, T, d_head]
        return x.view(T, n, c.d_head).transpose(0, 1)

    x = weights.token_embd[ids] * c.embed_scale                        # [T, d_model]
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    for b in weights.blocks:
        h = rms(x, b.attn_norm)
        q, k, v = (heads(h @ lin.weight, n) for lin, n in ((b.attn_q, c.n_head), (b.attn_k, c.n_kv_head),
                                                               (b.attn_v, c.n_kv_head)))
        q, k = rope(q), rope(k)
        group = c.n_head // c.n_kv_head                                # query heads per key/value head
        k, v = k.repeat_interleave(group, 0), v.repeat_interleave(group, 0)
        scores = (q @ k.transpose(-2, -1) / math.sqrt(c.d_head)).masked_fill(future, float("-inf"))
        z = softmax(scores) @ v                                        # [n_head, T, d_head]
        x = x + z.transpose(0, 1).reshape(T, -1) @ b.attn_output.weight
        h = rms(x, b.ffn_norm)
        gate = h @ b.ffn_gate.weight
        x = x + (gate * torch.sigmoid(gate) * (h @ b.ffn_up.weight)) @ b.ffn_down.weight   # SiLU(gate) * up
    return rms(x[-1], weights.output_norm) @ weights.output.T          # [vocab]


def split_logit(embedding: Tensor, writes: Tensor, norm_weight: Tensor, unembed: Tensor, eps: float) -> Tensor:
    every = torch.cat([embedding[None], writes])                      # [n + 1, d]: the embedding is a write too
    stream = every.sum(0)                                              # what the final norm saw
    scale = 1 / torch.sqrt(stream.pow(2).mean() + eps)                 # the run's 1/rms, frozen: one number
    return scale * (every * norm_weight) @ unembed                     # [n + 1], summing to the logit


def speculative_accept(p: Tensor, q: Tensor, drafted: int, u: float) -> tuple[bool, Tensor]:
    accepted = u < min(1.0, float(p[drafted] / q[drafted]))           # keep x with probability min(1, p/q)
    rest = (p - q).clamp(min=0)                                       # what the draft proposes too rarely
    return accepted, rest / rest.sum()


def int8_quantize(w: Tensor) -> tuple[Tensor, Tensor]:
    top = w.abs().amax(dim=0)                                         # [d_out]: one scale per output column
    scales = torch.where(top > 0, top / 127, torch.ones_like(top))    # a column of zeros: any scale will do
    return torch.round(w / scales).to(torch.int8), scales


def token_flops(n_layer: int, d_model: int, n_head: int, n_kv_head: int, d_head: int, d_ff: int, vocab_size: int,
                context: int) -> int:
    """The matrix products of one new token, the earlier context − 1 positions' keys and values cached."""
    q, kv = n_head * d_head, n_kv_head * d_head
    matrices = d_model * q + 2 * d_model * kv + q * d_model + 3 * d_model * d_ff    # W_q, W_k, W_v, W_o; gate, up, down
    attention = 2 * n_head * d_head * context                                          # q·k per key, then Σ w·v
    return n_layer * (2 * matrices + 2 * attention) + 2 * d_model * vocab_size       # 2 FLOPs per multiply-add
