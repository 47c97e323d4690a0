"""Section 九: one walk through the model. `forward` returns a trace holding every intermediate."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import torch
from torch import Tensor

from .embedding import position_embedding, rope_angles, token_embedding
from .head import lm_head
from .kv_cache import KVCache
from .layers import BlockOut, block_forward, causal_mask, norm

if TYPE_CHECKING:
    from .models import Model


@dataclass
class Trace:
    """Everything one forward pass computed, position by position."""

    ids: Tensor                     # [T]
    positions: Tensor               # [T]
    tok_emb: Tensor                 # [T, d_model]
    pos_emb: Tensor | None          # [T, d_model] (GPT-2's learned positions; None with RoPE)
    x0: Tensor                      # [T, d_model] what enters layer 0
    layers: list[BlockOut]          # one per layer (empty when record=False)
    final: Tensor                   # [T, d_model] after the final norm
    logits: Tensor                  # [T, vocab] ([1, vocab] with last_only)
    seconds: dict[str, float] = field(default_factory=dict)  # wall time per stage

    @property
    def resid(self) -> Tensor:
        """Residual stream before layer 0 and after every layer.  # [n_layer + 1, T, d_model]"""
        return torch.stack([self.x0] + [b.resid_post for b in self.layers])

    @property
    def attn(self) -> Tensor:
        """Attention weights of every layer and head.  # [n_layer, n_head, T, S]"""
        return torch.stack([b.attn.weights for b in self.layers])

    @property
    def ffn_hidden(self) -> Tensor:
        """FFN activations (after the nonlinearity/gate).  # [n_layer, T, d_ff]"""
        return torch.stack([b.ffn_hidden for b in self.layers])

    @property
    def probs(self) -> Tensor:
        """Next-token distribution at every position.  # [T, vocab]"""
        return torch.softmax(self.logits.float(), dim=-1)


def check_ids(ids: Sequence[int] | Tensor, vocab_size: int, context_length: int, already: int = 0) -> Tensor:
    """Validate token ids and return them as an int64 tensor.  # [T]"""
    ids = torch.as_tensor(ids, dtype=torch.long).flatten()
    if ids.numel() == 0:
        raise ValueError("empty token list: encode some text first, e.g. model.tokenizer.encode('Hello')")
    bad = ids[(ids < 0) | (ids >= vocab_size)]
    if bad.numel():
        raise ValueError(f"token id {int(bad[0])} is outside the vocabulary [0, {vocab_size}): "
                         "were these ids made by another model's tokenizer?")
    if already + ids.numel() > context_length:
        raise ValueError(f"sequence of {already + ids.numel()} tokens is longer than the context length "
                         f"{context_length}: shorten the prompt")
    return ids


@torch.inference_mode()
def forward(model: "Model", ids: Sequence[int] | Tensor, cache: KVCache | None = None,
            record: bool = True, last_only: bool = False, head: Tensor | None = None) -> Trace:
    """Run token ids through the whole model.  # [T] -> Trace (logits [T, vocab])

    With a `cache`, `ids` are the new positions only: they attend to the cached ones, and the cache grows.
    record=False keeps no per-layer intermediates (for fast generation); last_only computes logits for the
    last position only. `head` replaces weights.output in the LM head: the same [vocab, d_model] numbers
    stored in another memory order (generate.decoding_head).
    """
    config, w = model.config, model.weights
    start = cache.length if cache is not None else 0
    ids = check_ids(ids, config.vocab_size, config.context_length, start)
    t = ids.numel()
    positions = torch.arange(start, start + t)
    seconds: dict[str, float] = {}

    tic = time.perf_counter()
    tok = token_embedding(ids, w.token_embd, config.embed_scale)
    pos = position_embedding(positions, w.position_embd) if config.position == "learned" else None
    x = tok + pos if pos is not None else tok
    x0 = x
    # RoPE angles depend only on position and the layer's base: compute once per distinct base.
    ropes = {}
    if config.position == "rope":
        for theta in {config.theta(i) for i in range(config.n_layer)}:
            ropes[theta] = rope_angles(positions, config.d_head, theta)
    masks = {win: causal_mask(t, start + t, win) for win in {config.window(i) for i in range(config.n_layer)}}
    seconds["embedding"] = time.perf_counter() - tic

    layers = []
    for i, block in enumerate(w.blocks):
        tic = time.perf_counter()
        out = block_forward(x, block, config, masks[config.window(i)], ropes.get(config.theta(i)),
                            cache.layers[i] if cache is not None else None)
        x = out.resid_post
        if record:
            layers.append(out)
        seconds[f"layer {i}"] = time.perf_counter() - tic

    tic = time.perf_counter()
    final = norm(x[-1:] if last_only else x, w.output_norm, config)
    seconds["final norm"] = time.perf_counter() - tic
    tic = time.perf_counter()
    logits = lm_head(final, w.output if head is None else head)
    seconds["lm head"] = time.perf_counter() - tic
    return Trace(ids, positions, tok, pos, x0, layers, final, logits, seconds)
