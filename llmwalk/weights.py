"""The model as data: a config of the numbers the article talks about, and frozen weight containers.

Tensor names follow the GGUF checkpoint names (token_embd, attn_q, ffn_gate, ...), the same for all three
families. Linear weights are stored as [d_in, d_out] so that a layer is `x @ w` (the maths of the article,
and GPT-2's own Conv1D layout); the LM head `output` is [vocab, d_model] because it is (or is tied to) the
token embedding table.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Iterator

import torch
from torch import Tensor


@dataclass(frozen=True)
class Config:
    """Architecture of one model: the switches that tell GPT-2, Llama (SmolLM2) and Gemma-3 apart."""

    name: str
    family: str                 # "gpt2" | "llama" | "gemma3"
    n_layer: int
    n_head: int
    n_kv_head: int              # < n_head: grouped-query attention (GQA)
    d_model: int
    d_head: int
    d_ff: int
    vocab_size: int
    context_length: int
    norm: str                   # "layernorm" | "rmsnorm"
    norm_eps: float
    position: str               # "learned" | "rope"
    ffn: str                    # "gelu" (GPT-2 MLP) | "swiglu" (Llama) | "geglu" (Gemma)
    tied_embeddings: bool
    rope_theta: float = 10000.0
    rope_theta_local: float | None = None       # Gemma-3: sliding-window layers use another base
    sliding_window: int | None = None
    global_layers: tuple[int, ...] = ()         # Gemma-3: layers with full attention; the rest slide
    embed_scale: float = 1.0                    # Gemma-3 multiplies embeddings by sqrt(d_model)
    attn_scale: float | None = None             # None: 1/sqrt(d_head)
    qk_norm: bool = False                       # Gemma-3: RMSNorm on each head's q and k
    sandwich_norm: bool = False                 # Gemma-3: extra norm after attention and after FFN
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    n_params: int = 0                           # counted from the weights when loaded

    @property
    def scale(self) -> float:
        """Factor applied to q·k before softmax."""
        return self.attn_scale if self.attn_scale is not None else self.d_head ** -0.5

    def window(self, layer: int) -> int | None:
        """How many past positions layer `layer` may see (None: all of them)."""
        if self.sliding_window is None or layer in self.global_layers:
            return None
        return self.sliding_window

    def theta(self, layer: int) -> float:
        """RoPE base frequency of layer `layer`."""
        if self.rope_theta_local is not None and self.window(layer) is not None:
            return self.rope_theta_local
        return self.rope_theta


@dataclass(frozen=True)
class Norm:
    """LayerNorm (weight and bias) or RMSNorm (weight only); weight is the multiplicative scale."""

    weight: Tensor              # [d]
    bias: Tensor | None = None  # [d]


@dataclass(frozen=True)
class Linear:
    """y = x @ weight + bias."""

    weight: Tensor              # [d_in, d_out]
    bias: Tensor | None = None  # [d_out]


@dataclass(frozen=True)
class Block:
    """One transformer layer."""

    attn_norm: Norm
    attn_q: Linear              # [d_model, n_head * d_head]
    attn_k: Linear              # [d_model, n_kv_head * d_head]
    attn_v: Linear              # [d_model, n_kv_head * d_head]
    attn_output: Linear         # [n_head * d_head, d_model]
    ffn_norm: Norm
    ffn_up: Linear              # [d_model, d_ff]
    ffn_down: Linear            # [d_ff, d_model]
    ffn_gate: Linear | None = None              # gated FFN (SwiGLU / GeGLU) only
    attn_q_norm: Norm | None = None             # Gemma-3 QK-norm, [d_head]
    attn_k_norm: Norm | None = None
    post_attention_norm: Norm | None = None     # Gemma-3 sandwich norms
    post_ffw_norm: Norm | None = None


@dataclass(frozen=True)
class Weights:
    """All parameters of a model."""

    token_embd: Tensor                  # [vocab, d_model]
    blocks: tuple[Block, ...]
    output_norm: Norm
    output: Tensor                      # [vocab, d_model]; the same object as token_embd when tied
    position_embd: Tensor | None = None  # [context_length, d_model], GPT-2 only


def tensors(obj) -> Iterator[tuple[str, Tensor]]:
    """Yield (dotted name, tensor) for every tensor in a weights container, depth first."""
    if isinstance(obj, Tensor):
        yield "", obj
    elif isinstance(obj, tuple):
        for i, item in enumerate(obj):
            for name, t in tensors(item):
                yield f"{i}.{name}".rstrip("."), t
    elif obj is not None:
        for f in fields(obj):
            for name, t in tensors(getattr(obj, f.name)):
                yield f"{f.name}.{name}".rstrip("."), t


def count_params(weights: Weights) -> int:
    """Number of parameters, counting a tied tensor once."""
    seen: dict[int, int] = {}
    for _, t in tensors(weights):
        seen[id(t)] = t.numel()
    return sum(seen.values())


def map_tensors(obj, fn):
    """Return a copy of a weights container with fn applied to every tensor (tied tensors stay tied)."""
    memo: dict[int, Tensor] = {}

    def go(o):
        if isinstance(o, Tensor):
            if id(o) not in memo:
                memo[id(o)] = fn(o)
            return memo[id(o)]
        if isinstance(o, tuple):
            return tuple(go(x) for x in o)
        if o is None:
            return None
        return replace(o, **{f.name: go(getattr(o, f.name)) for f in fields(o)})

    return go(obj)


def to_dtype(weights: Weights, dtype: torch.dtype) -> Weights:
    """The same weights in another float dtype (e.g. torch.bfloat16)."""
    return map_tensors(weights, lambda t: t.to(dtype))
