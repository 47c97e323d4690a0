"""Turning next-token logits into a token: temperature, top-k, top-p, min-p, greedy and sampling.

The filters reproduce transformers' logits warpers bit for bit (same order as `generate`: temperature, top-k,
top-p, min-p), so what a notebook plots is exactly what `model.generate(do_sample=True)` draws from. Removed
tokens get -inf rather than disappearing, so a plot can still show what was cut.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

NEG_INF = float("-inf")


def _check(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    *,
    greedy_ok: bool = True,
) -> None:
    """Raise ValueError naming the parameter, the value received and the valid range."""
    if not isinstance(logits, Tensor) or not logits.is_floating_point():
        raise ValueError(f"logits must be a floating-point tensor, got {getattr(logits, 'dtype', type(logits))}")
    if logits.dim() == 0 or logits.numel() == 0:
        raise ValueError(f"logits must be a non-empty [..., vocab] tensor, got shape {tuple(logits.shape)}")
    # +inf is rejected with NaN: softmax turns it into NaN.
    if bad := int((logits.isnan() | logits.isposinf()).sum()):
        raise ValueError(f"logits must be finite or -inf, got {bad} NaN/+inf entries")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if temperature == 0 and not greedy_ok:
        raise ValueError("temperature must be > 0 here, got 0: temperature 0 is greedy decoding, "
                         "which has no distribution to scale or plot (use greedy())")
    # bool is an int subclass, but top_k=True is almost certainly a bug.
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be an int >= 1, got {top_k!r}")
    if top_p is not None and not 0 < top_p <= 1:  # chained comparisons are False for NaN
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    if min_p is not None and not 0 <= min_p <= 1:
        raise ValueError(f"min_p must be in [0, 1], got {min_p!r}")


def apply_temperature(logits: Tensor, t: float) -> Tensor:
    """Sharpen (t < 1) or flatten (t > 1) the distribution.  # [..., vocab] -> [..., vocab]"""
    _check(logits, temperature=t, greedy_ok=False)
    scaled = logits / t
    if torch.isinf(scaled[torch.isfinite(logits)]).any():   # e.g. t = 1e-300: the division overflows
        raise ValueError(f"temperature {t} is too small for these logits (they overflow to infinity); "
                         "use temperature=0 for greedy decoding")
    return scaled


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Keep every logit >= the k-th largest (ties included), -inf elsewhere.  # [..., vocab] -> [..., vocab]"""
    _check(logits, top_k=k)
    kth = torch.topk(logits, min(k, logits.shape[-1]))[0][..., -1:]
    return logits.masked_fill(logits < kth, NEG_INF)


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """Keep the smallest top set whose mass reaches p (the crossing token too).  # [..., vocab] -> [..., vocab]"""
    _check(logits, top_p=p)
    # generate() skips the warper at p == 1; running it would also cut tokens whose probability underflows to 0.
    if p == 1:
        return logits
    # Same ascending sort as transformers: tied tokens at the boundary are split by sort order, not all kept.
    sorted_logits, order = torch.sort(logits, descending=False)
    remove = sorted_logits.softmax(dim=-1).cumsum(dim=-1) <= 1 - p
    remove[..., -1] = False  # float32 cumsum can end below 1 - p for tiny p; the top token must survive
    return logits.masked_fill(remove.scatter(-1, order, remove), NEG_INF)


def min_p_filter(logits: Tensor, p: float) -> Tensor:
    """Keep tokens with probability >= p * (top probability).  # [..., vocab] -> [..., vocab]"""
    _check(logits, min_p=p)
    probs = logits.softmax(dim=-1)
    # p <= 1 makes p * max <= max exactly, so the top token always survives without transformers' topk re-keep.
    remove = probs < p * probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(remove, NEG_INF)


def greedy(logits: Tensor) -> Tensor:
    """The most likely token id.  # [..., vocab] -> [...] int64"""
    _check(logits)
    return logits.argmax(dim=-1)


def _filtered(
    logits: Tensor, temperature: float, top_k: int | None, top_p: float | None, min_p: float | None
) -> Tensor:
    """Temperature, then top-k, top-p, min-p: generate()'s order.  # [..., vocab] -> [..., vocab]"""
    logits = apply_temperature(logits, temperature)
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    if min_p is not None:
        logits = min_p_filter(logits, min_p)
    return logits


def probs_after(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
) -> Tensor:
    """The distribution `sample` draws from (one-hot for temperature 0).  # [..., vocab] -> [..., vocab]"""
    _check(logits, temperature, top_k, top_p, min_p)
    if temperature == 0:
        return torch.nn.functional.one_hot(greedy(logits), logits.shape[-1]).to(logits.dtype)
    return _filtered(logits, temperature, top_k, top_p, min_p).softmax(dim=-1)


def sample(
    logits: Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Draw one token id per row.  # [..., vocab] -> [...] int64"""
    _check(logits, temperature, top_k, top_p, min_p)
    if temperature == 0:  # greedy: no draw, so the generator is left untouched
        return greedy(logits)
    probs = probs_after(logits, temperature, top_k, top_p, min_p)
    # multinomial only takes [vocab] or [batch, vocab] and keeps a trailing sample dim: flatten, then drop it.
    ids = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator)
    return ids.reshape(probs.shape[:-1])


@dataclass(frozen=True)
class SurgeryStep:
    """One stage of the sampling pipeline, ready to plot."""

    name: str
    logits: Tensor          # [vocab], -inf where removed
    probs: Tensor           # [vocab], softmax of `logits` (renormalized over the kept tokens)
    removed_mass: float     # mass of the ÷T distribution cut so far
    entropy: float          # nats
    kept: int               # tokens with a finite logit


def surgery(
    logits: Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> list[SurgeryStep]:
    """The stages logits, ÷T, softmax, top-k, top-p (renormalized).  # [vocab] -> 5 steps"""
    _check(logits, temperature, top_k, top_p, greedy_ok=False)
    if logits.dim() != 1:
        raise ValueError(f"surgery takes a 1-D [vocab] logits vector, got shape {tuple(logits.shape)}")
    scaled = apply_temperature(logits, temperature)
    base = scaled.softmax(dim=-1)
    cut_k = scaled if top_k is None else top_k_filter(scaled, top_k)
    cut_p = cut_k if top_p is None else top_p_filter(cut_k, top_p)

    def step(name: str, stage: Tensor) -> SurgeryStep:
        probs = stage.softmax(dim=-1)
        # Summing the full vector with zeros for kept tokens (not a masked selection) keeps one summation order,
        # so removed_mass cannot decrease through rounding as more tokens are cut.
        removed = torch.where(stage.isinf(), base, 0).sum()
        return SurgeryStep(name, stage, probs, float(removed), float(torch.special.entr(probs).sum()),
                           int(stage.isfinite().sum()))

    return [step("logits", logits), step("÷T", scaled), step("softmax", scaled),
            step("top-k", cut_k), step("top-p (renormalized)", cut_p)]
