"""Sections 四 and 五, causal experiments: change one thing inside the forward pass and watch the answer move.

The logit lens shows where " Paris" *appears*; an intervention shows what *causes* it. Each function here returns
hooks for `lw.forward(model, ids, hooks=...)`: {"blocks.{i}.{point}": function(activation) -> activation}, the hook
points of `layers.block_forward`. Layers are numbered from 0, as in `trace.layers[i]` and `model.weights.blocks[i]`.

"zero" ablation replaces an activation by 0; "mean" by its mean over the prompt's positions (what the component
writes on average, with what it says about *this* position removed).
"""
from __future__ import annotations

import sys
import warnings
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import torch
from torch import Tensor

from .checks import is_int
from .i18n import t
from .walk import Trace, check_ids, forward

if TYPE_CHECKING:
    from .models import Model

Hooks = dict[str, Callable[[Tensor], Tensor]]


class NoEffectWarning(UserWarning):
    """An intervention left what it was meant to change as it was: its result is the plain run's."""


def _index(value, what: str) -> int:
    """A layer, head or position: an int >= 0 (a negative one would silently count from the end)."""
    if not is_int(value):
        raise TypeError(f"{what} must be an int, got {value!r}")
    if value < 0:
        raise ValueError(f"{what} must be >= 0, got {value}: they count from 0 (a negative {what} would silently "
                         "count from the end)")
    return value


def _ablation(how: str, what: str) -> Callable[[Tensor], Tensor]:
    """a -> 0, or a -> its mean over positions (dim -2), in a's shape, warning when that is `a` itself.

    # [..., T, d] -> [..., T, d]
    """
    if how not in ("zero", "mean"):
        raise ValueError(f"how={how!r}: use 'zero' or 'mean'")

    def ablated(a: Tensor) -> Tensor:
        out = torch.zeros_like(a) if how == "zero" else a.mean(-2, keepdim=True).expand_as(a)
        if torch.equal(out, a):
            warnings.warn(f"{what} changed nothing: the activation already is its {how} ablation ("
                          + ("0 at every position" if how == "zero" else
                             "the same at every position; a single position is its own mean") + ")",
                          NoEffectWarning, stacklevel=2)
        return out
    return ablated


def _marked(fn: Callable[[Tensor], Tensor], sequence) -> Callable[[Tensor], Tensor]:
    """fn, with what it needs of a pass (generation._check_hooks): "whole" (a mean over every position) or n (a
    patch lines up with a source prompt of n tokens)."""
    fn.sequence = sequence
    return fn


def ablate_head(layer: int, head: int, how: str = "zero") -> Hooks:
    """Remove one head of one layer: its mix of values, before W_O, set to 0 (or its mean)."""
    _index(layer, "layer")
    _index(head, "head")
    ablated = _ablation(how, f"ablate_head({layer}, {head}, {how!r})")

    def hook(z: Tensor) -> Tensor:                        # [n_head, T, d_head]
        if head >= z.shape[0]:
            raise ValueError(f"ablate_head({layer}, {head}): layer {layer} has {z.shape[0]} heads: "
                             f"use head 0..{z.shape[0] - 1}")
        z = z.clone()
        z[head] = ablated(z[head])
        return z
    return {f"blocks.{layer}.attn.z": _marked(hook, "whole" if how == "mean" else None)}


def ablate_attention(layer: int, how: str = "zero") -> Hooks:
    """Remove what one layer's attention adds to the residual stream (all its heads)."""
    ablated = _ablation(how, f"ablate_attention({_index(layer, 'layer')}, {how!r})")
    return {f"blocks.{layer}.attn_out": _marked(ablated, "whole" if how == "mean" else None)}


def ablate_ffn(layer: int, how: str = "zero") -> Hooks:
    """Remove what one layer's FFN adds to the residual stream."""
    ablated = _ablation(how, f"ablate_ffn({_index(layer, 'layer')}, {how!r})")
    return {f"blocks.{layer}.ffn_out": _marked(ablated, "whole" if how == "mean" else None)}


def patch(source: Trace, layer: int, position: int, point: str = "resid") -> Hooks:
    """Activation patching: at `position`, use what `source` (another prompt's trace) had there instead.

    point="resid": the residual stream entering `layer` (layer = n_layer: what leaves the last layer);
    point="ffn_out": what layer's FFN adds to the stream. Both prompts must have the same number of tokens, so
    that position i means the same slot in both. A position where both prompts already agree (a shared
    prefix) changes nothing, as it should: the pass's trace.unchanged names it. A source that agrees everywhere
    (the same prompt) warns.
    """
    if not isinstance(source, Trace):
        raise TypeError(f"source must be a trace, got {type(source).__name__}: e.g. lw.forward(model, other_ids)")
    resid, n, n_layer = source.resid, len(source.ids), len(source.layers)    # resid: refused when record=False
    if point == "resid" and 0 <= layer <= n_layer:
        full = resid[layer]                                                    # [T, d_model]
        name = f"blocks.{layer}.resid_pre" if layer < n_layer else f"blocks.{n_layer - 1}.resid_post"
    elif point == "ffn_out" and 0 <= layer < n_layer:
        full, name = source.layers[layer].ffn_out, f"blocks.{layer}.ffn_out"
    else:
        raise ValueError(f"cannot patch point={point!r} at layer {layer}: use point='resid' with layer 0..{n_layer} "
                         f"or point='ffn_out' with layer 0..{n_layer - 1}")
    if _index(position, "position") >= n:
        raise ValueError(f"position {position} is outside the source prompt's {n} tokens: use 0..{n - 1}")

    def hook(x: Tensor) -> Tensor:                        # [T, d_model]
        if x.shape[0] != n:
            raise ValueError(f"the source prompt has {n} tokens and this pass runs {x.shape[0]}: patch between "
                             "prompts of the same token count, so that positions line up (a pass with a KV cache "
                             "runs only its new positions: patch without one)")
        if torch.equal(x, full):
            warnings.warn(f"patch(source, {layer}, {position}, {point!r}) changed nothing: the source's activations "
                          "equal this prompt's at every position (the same prompt?): patch from another prompt's "
                          "trace", NoEffectWarning, stacklevel=2)
        x = x.clone()
        x[position] = full[position]
        return x
    return {name: _marked(hook, n)}


def combine(*hooks: Hooks) -> Hooks:
    """Several interventions at once (one function per hook point, applied in the order given)."""
    out: Hooks = {}
    for h in hooks:
        if not isinstance(h, Mapping):
            raise TypeError(f"combine takes the hook dicts that ablate_head, patch, ... return, got "
                            f"{type(h).__name__}: e.g. combine(iv.ablate_ffn(0), iv.ablate_ffn(1))")
        for name, fn in h.items():
            out[name] = fn if name not in out else _then(out[name], fn)
    return out


def _then(f: Callable[[Tensor], Tensor], g: Callable[[Tensor], Tensor]) -> Callable[[Tensor], Tensor]:
    """g after f, needing of a pass what either needs."""
    return _marked(lambda a: g(f(a)), getattr(f, "sequence", None) or getattr(g, "sequence", None))


def next_token_probs(model: "Model", ids: Sequence[int] | Tensor, tokens: Sequence[int],
                     hooks: Hooks | None = None) -> Tensor:
    """P(each of `tokens`) as the next token after `ids`, with the interventions `hooks`.  # -> [len(tokens)]"""
    try:
        tokens = check_ids(tokens, model.config.vocab_size, sys.maxsize)
    except (TypeError, ValueError) as e:
        raise type(e)(f"tokens (the ids whose probabilities to return, e.g. [model.tokenizer.token_id(' Paris')]): "
                      f"{e}") from None
    return torch.softmax(next_token_logits(model, ids, hooks), dim=-1)[tokens]


def next_token_logits(model: "Model", ids: Sequence[int] | Tensor, hooks: Hooks | None = None) -> Tensor:
    """The logits of the token after `ids`, with the interventions `hooks`.  # -> [vocab]"""
    return forward(model, ids, record=False, last_only=True, hooks=hooks).logits[0].float()


def effects(model: "Model", ids: Sequence[int] | Tensor, tokens: Sequence[int],
            interventions: dict[str, Hooks]) -> dict[str, Tensor]:
    """P(tokens) with no intervention (first, named in the current language) and under each named intervention.

    # -> {name: [len(tokens)]}
    """
    return {t("viz.layers.no_intervention"): next_token_probs(model, ids, tokens)} | {
        name: next_token_probs(model, ids, tokens, hooks) for name, hooks in interventions.items()}


def patching_grid(model: "Model", ids: Sequence[int] | Tensor, source: Trace, token: int) -> Tensor:
    """P(token) after `ids` when the residual stream at one (layer, position) comes from `source`.

    Row i patches what enters layer i (row n_layer: what leaves the last one). Positions before the first one where
    the prompts differ hold the same stream in both (the causal mask: nothing later reaches them), so patching
    them is the plain run: it is run once for all of them.  # -> [n_layer + 1, T]
    """
    n, ids_ = len(source.ids), check_ids(ids, model.config.vocab_size, sys.maxsize)
    shared = next((i for i, (a, b) in enumerate(zip(ids_.tolist(), source.ids.tolist())) if a != b), n)
    plain = next_token_probs(model, ids, [token])[0]
    def row(layer: int) -> Tensor:                        # [T]
        return torch.stack([plain] * shared + [next_token_probs(model, ids, [token], patch(source, layer, pos))[0]
                                               for pos in range(shared, n)])
    return torch.stack([row(layer) for layer in range(len(source.layers) + 1)])


def subject_position(ids: Sequence[int] | Tensor, other: Sequence[int] | Tensor) -> int:
    """The one position where two prompts of the same token count differ (" France" vs " Germany")."""
    if any(isinstance(x, (str, bytes)) for x in (ids, other)):
        raise TypeError("subject_position compares token ids, got text: encode both prompts first, "
                        "e.g. model.tokenizer.encode('The capital of France is')")
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
