"""Sections 四 and 五, causal experiments: change one thing inside the forward pass and watch the answer move.

The logit lens shows where " Paris" *appears*; an intervention shows what *causes* it. Each function here returns
hooks for `lw.forward(model, ids, hooks=...)`: {"blocks.{i}.{point}": function(activation) -> activation}, the hook
points of `layers.block_forward`. Layers are numbered from 0, as in `trace.layers[i]` and `model.weights.blocks[i]`.

"zero" ablation replaces an activation by 0; "mean" by its mean over the prompt's positions (what the component
writes on average, with what it says about *this* position removed).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Sequence

import torch
from torch import Tensor

from .i18n import t
from .walk import Trace, forward

if TYPE_CHECKING:
    from .models import Model

Hooks = dict[str, Callable[[Tensor], Tensor]]


def _ablated(a: Tensor, how: str) -> Tensor:
    """0, or the mean over positions (dim -2), in a's shape.  # [..., T, d] -> [..., T, d]"""
    if how == "zero":
        return torch.zeros_like(a)
    if how == "mean":
        return a.mean(-2, keepdim=True).expand_as(a)
    raise ValueError(f"how={how!r}: use 'zero' or 'mean'")


def ablate_head(layer: int, head: int, how: str = "zero") -> Hooks:
    """Remove one head of one layer: its mix of values, before W_O, set to 0 (or its mean)."""
    def hook(z: Tensor) -> Tensor:                        # [n_head, T, d_head]
        z = z.clone()
        z[head] = _ablated(z[head], how)
        return z
    return {f"blocks.{layer}.attn.z": hook}


def ablate_attention(layer: int, how: str = "zero") -> Hooks:
    """Remove what one layer's attention adds to the residual stream (all its heads)."""
    return {f"blocks.{layer}.attn_out": lambda a: _ablated(a, how)}


def ablate_ffn(layer: int, how: str = "zero") -> Hooks:
    """Remove what one layer's FFN adds to the residual stream."""
    return {f"blocks.{layer}.ffn_out": lambda a: _ablated(a, how)}


def patch(source: Trace, layer: int, position: int, point: str = "resid") -> Hooks:
    """Activation patching: at `position`, use what `source` (another prompt's trace) had there instead.

    point="resid": the residual stream entering `layer` (layer = n_layer: what leaves the last layer);
    point="ffn_out": what layer's FFN adds to the stream. Both prompts must have the same number of tokens, so
    that position i means the same slot in both.
    """
    n_layer = len(source.layers)
    if point == "resid" and 0 <= layer <= n_layer:
        value = source.resid[layer][position]                                     # [d_model]
        name = f"blocks.{layer}.resid_pre" if layer < n_layer else f"blocks.{n_layer - 1}.resid_post"
    elif point == "ffn_out" and 0 <= layer < n_layer:
        value, name = source.layers[layer].ffn_out[position], f"blocks.{layer}.ffn_out"
    else:
        raise ValueError(f"cannot patch point={point!r} at layer {layer}: use point='resid' with layer 0..{n_layer} "
                         f"or point='ffn_out' with layer 0..{n_layer - 1}")

    def hook(x: Tensor) -> Tensor:                        # [T, d_model]
        if x.shape[0] != len(source.ids):
            raise ValueError(f"the source prompt has {len(source.ids)} tokens and this one {x.shape[0]}: patch "
                             "between prompts of the same token count, so that positions line up")
        x = x.clone()
        x[position] = value
        return x
    return {name: hook}


def combine(*hooks: Hooks) -> Hooks:
    """Several interventions at once (one function per hook point, applied in the order given)."""
    out: Hooks = {}
    for h in hooks:
        for name, fn in h.items():
            out[name] = fn if name not in out else (lambda a, f=out[name], g=fn: g(f(a)))
    return out


def next_token_probs(model: "Model", ids: Sequence[int] | Tensor, tokens: Sequence[int],
                     hooks: Hooks | None = None) -> Tensor:
    """P(each of `tokens`) as the next token after `ids`, with the interventions `hooks`.  # -> [len(tokens)]"""
    trace = forward(model, ids, record=False, last_only=True, hooks=hooks)
    return torch.softmax(trace.logits[0].float(), dim=-1)[list(tokens)]


def effects(model: "Model", ids: Sequence[int] | Tensor, tokens: Sequence[int],
            interventions: dict[str, Hooks]) -> dict[str, Tensor]:
    """P(tokens) with no intervention (first, named in the current language) and under each named intervention.

    # -> {name: [len(tokens)]}
    """
    return {t("viz.layers.no_intervention"): next_token_probs(model, ids, tokens)} | {
        name: next_token_probs(model, ids, tokens, hooks) for name, hooks in interventions.items()}


def patching_grid(model: "Model", ids: Sequence[int] | Tensor, source: Trace, token: int) -> Tensor:
    """P(token) after `ids` when the residual stream at one (layer, position) comes from `source`.

    Row i patches what enters layer i (row n_layer: what leaves the last one).  # -> [n_layer + 1, T]
    """
    n = len(source.ids)
    return torch.stack([torch.stack([next_token_probs(model, ids, [token], patch(source, layer, pos))[0]
                                     for pos in range(n)]) for layer in range(len(source.layers) + 1)])


def subject_position(ids: Sequence[int] | Tensor, other: Sequence[int] | Tensor) -> int:
    """The one position where two prompts of the same token count differ (" France" vs " Germany")."""
    a, b = torch.as_tensor(ids), torch.as_tensor(other)
    diff = (a != b).nonzero().flatten().tolist() if a.shape == b.shape else []
    if len(diff) != 1:
        raise ValueError(f"need two prompts of the same token count that differ in exactly one token "
                         f"(got {len(a)} and {len(b)} tokens, differing at {diff}): pick words of one token each")
    return diff[0]


def swap_ffn_outputs(model: "Model", ids: Sequence[int] | Tensor, other: Sequence[int] | Tensor,
                     tokens: Sequence[int], layers: Sequence[int]) -> Tensor:
    """P(tokens) after `ids` when, at the one token where the prompts differ, the FFNs of `layers` write what they
    wrote for `other` instead: do those FFNs carry the fact that makes the answer Paris rather than Berlin?  # -> [len(tokens)]
    """
    source = forward(model, other)
    pos = subject_position(ids, other)
    return next_token_probs(model, ids, tokens, combine(*[patch(source, i, pos, "ffn_out") for i in layers]))
