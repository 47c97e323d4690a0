"""Turning next-token logits into a token: temperature, top-k, top-p, min-p, greedy and sampling.

A `Sampler` holds the four settings, checked once when it is made. Its filters reproduce transformers' logits
warpers bit for bit (same order as `generate`: temperature, top-k, top-p, min-p), so what a notebook plots is exactly
what `model.generate(do_sample=True)` draws from. Removed tokens get -inf rather than disappearing, so a plot can
still show what was cut. bf16/fp16 logits are upcast to float32 first: a softmax over 49k tokens needs the digits.
Each step is a function that holds its algorithm (`apply_temperature`, `top_k_filter`, `top_p_filter`, `min_p_filter`,
`greedy`); a Sampler runs them in that order (`Sampler.stages`), and `surgery` shows each stage for a plot.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch
from torch import Tensor

NEG_INF = float("-inf")


def _checked(logits: Tensor) -> Tensor:
    """Raise ValueError unless logits are a non-empty float tensor without NaN/+inf; upcast bf16/fp16 to float32."""
    if not isinstance(logits, Tensor) or not logits.is_floating_point():
        raise ValueError(f"logits must be a floating-point tensor, got {getattr(logits, 'dtype', type(logits))}")
    if logits.dim() == 0 or logits.numel() == 0:
        raise ValueError(f"logits must be a non-empty [..., vocab] tensor, got shape {tuple(logits.shape)}")
    if bool(logits.isfinite().all()):          # the usual case, in one pass: nothing below can fail
        return logits.float() if logits.element_size() < 4 else logits
    # +inf is rejected with NaN: softmax turns it into NaN.
    if bad := int((logits.isnan() | logits.isposinf()).sum()):
        raise ValueError(f"logits must be finite or -inf, got {bad} NaN/+inf entries")
    # A row of -inf only gives no token any probability: multinomial fails deep in torch, argmax says 0.
    if bool(logits.isneginf().all(dim=-1).any()):
        raise ValueError("a row of logits is -inf everywhere, so no token can be chosen: keep at least one "
                         "token finite (check the mask or the hook that removed them all)")
    return logits.float() if logits.element_size() < 4 else logits


def _is_number(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _check_temperature(t) -> None:
    if not (_is_number(t) and math.isfinite(t) and t >= 0):
        raise ValueError(f"temperature must be a finite number >= 0, got {t!r}")


def _check_top_k(k) -> None:
    # bool is an int subclass, but top_k=True is almost certainly a bug.
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
        raise ValueError(f"top_k must be an int >= 1, got {k!r}")


def _check_top_p(p) -> None:
    if not (_is_number(p) and 0 < p <= 1):   # chained comparisons are False for NaN
        raise ValueError(f"top_p must be in (0, 1], got {p!r}")


def _check_min_p(m) -> None:
    if not (_is_number(m) and 0 <= m <= 1):
        raise ValueError(f"min_p must be in [0, 1], got {m!r}")


# ---------------------------------------------------------------- the chain, one step at a time

def apply_temperature(logits: Tensor, t: float) -> Tensor:
    """Sharpen (t < 1) or flatten (t > 1) the distribution: logits / t.  # [..., vocab] -> [..., vocab]"""
    _check_temperature(t)
    logits = _checked(logits)
    if t == 0:
        raise ValueError("temperature must be > 0 here, got 0: temperature 0 is greedy decoding, "
                         "which has no distribution to scale or plot (use greedy())")
    scaled = logits / float(t)      # float(): a Fraction passes the check, and a tensor cannot divide by one
    if torch.isinf(scaled[torch.isfinite(logits)]).any():   # e.g. t = 1e-300: the division overflows
        raise ValueError(f"temperature {t} is too small for these logits (they overflow to infinity); "
                         "use temperature=0 for greedy decoding")
    return scaled


def top_k_filter(logits: Tensor, k: int) -> Tensor:
    """Keep every logit >= the k-th largest (ties included), -inf elsewhere.  # [..., vocab] -> [..., vocab]"""
    _check_top_k(k)
    logits = _checked(logits)
    kth = logits.topk(min(int(k), logits.shape[-1])).values[..., -1:]     # the k-th largest logit of each row
    return logits.masked_fill(logits < kth, NEG_INF)


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches p: a token stays while the mass of the tokens
    ranked above it is still below p (so the token that crosses p stays too).  # [..., vocab] -> [..., vocab]"""
    _check_top_p(p)
    logits = _checked(logits)
    # generate() skips the warper at p == 1; running it would also cut tokens whose probability underflows to 0.
    if p == 1:
        return logits
    # Most likely first. Tied tokens are ranked as transformers' ascending sort leaves them, read backwards, so
    # that a tie at the boundary is split the way generate() splits it.
    sorted_logits, order = logits.sort(dim=-1)
    probs, order = sorted_logits.softmax(dim=-1).flip(-1), order.flip(-1)
    above = probs.cumsum(dim=-1) - probs                 # mass of the tokens ranked above; 0 for the top token
    remove = above >= float(p)                           # float(): a tensor cannot compare with a Fraction
    return logits.masked_fill(remove.scatter(-1, order, remove), NEG_INF)   # back to vocabulary order


def min_p_filter(logits: Tensor, p: float) -> Tensor:
    """Keep tokens with probability >= p * (top probability).  # [..., vocab] -> [..., vocab]"""
    _check_min_p(p)
    logits = _checked(logits)
    probs = logits.softmax(dim=-1)
    # p <= 1 makes p * max <= max exactly, so the top token always survives without transformers' topk re-keep.
    remove = probs < float(p) * probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(remove, NEG_INF)


def greedy(logits: Tensor) -> Tensor:
    """The most likely token id.  # [..., vocab] -> [...] int64"""
    return _checked(logits).argmax(dim=-1)


@dataclass(frozen=True)
class Sampler:
    """How the next token is chosen: greedy at temperature 0, else drawn after temperature, top-k, top-p and min-p.

    None switches a filter off. The settings are checked once, here, with a message naming the bad one.
    """

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None

    def __post_init__(self) -> None:
        _check_temperature(self.temperature)
        for value, check in ((self.top_k, _check_top_k), (self.top_p, _check_top_p), (self.min_p, _check_min_p)):
            if value is not None:
                check(value)

    @property
    def is_greedy(self) -> bool:
        """Temperature 0: always the most likely token, no random number drawn."""
        return self.temperature == 0

    def stages(self, logits: Tensor) -> dict[str, Tensor]:
        """The logits after each step of generate()'s chain: "scaled" (÷ temperature), then "top_k", "top_p" and
        "min_p" for the filters that are on, in that order.  # [..., vocab] -> {stage: [..., vocab]}"""
        out = {"scaled": apply_temperature(logits, self.temperature)}
        x = out["scaled"]
        for name, value, cut in (("top_k", self.top_k, top_k_filter), ("top_p", self.top_p, top_p_filter),
                                 ("min_p", self.min_p, min_p_filter)):
            if value is not None:
                x = out[name] = cut(x, value)
        return out

    def filter(self, logits: Tensor) -> Tensor:
        """÷ temperature, then top-k, top-p, min-p: generate()'s order.  # [..., vocab] -> [..., vocab]"""
        return list(self.stages(logits).values())[-1]

    def probs(self, logits: Tensor) -> Tensor:
        """The distribution a token is drawn from (one-hot when greedy).  # [..., vocab] -> [..., vocab]"""
        if self.is_greedy:
            logits = _checked(logits)
            return torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).to(logits.dtype)
        return self.filter(logits).softmax(dim=-1)

    def choose(self, probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """One token id per row of `probs` (from .probs): its argmax when greedy, else a draw.  # [..., V] -> [...]"""
        if self.is_greedy:          # no draw, so the generator is left untouched
            return probs.argmax(dim=-1)
        # multinomial only takes [vocab] or [batch, vocab] and keeps a trailing sample dim: flatten, then drop it.
        ids = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator)
        return ids.reshape(probs.shape[:-1])

    def draw(self, logits: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """One token id per row of logits.  # [..., vocab] -> [...] int64"""
        if self.is_greedy:          # the argmax of the logits is the one-hot's: skip building it
            return greedy(logits)
        return self.choose(self.probs(logits), generator)


def probs_after(logits: Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                min_p: float | None = None) -> Tensor:
    """The distribution `sample` draws from (one-hot for temperature 0).  # [..., vocab] -> [..., vocab]"""
    return Sampler(temperature, top_k, top_p, min_p).probs(logits)


def sample(logits: Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
           min_p: float | None = None, generator: torch.Generator | None = None) -> Tensor:
    """Draw one token id per row from probs_after(logits, ...) (the argmax at temperature 0).  # [..., vocab] -> [...]"""
    return Sampler(temperature, top_k, top_p, min_p).draw(logits, generator)


def rank_of(scores: Tensor, token: int) -> Tensor:
    """Where `token` ranks in each row of scores (logits or probabilities): 1 for the one greedy() picks; tokens
    tied with it share its rank.  # [..., vocab] -> [...] int64"""
    return (scores > scores[..., token, None]).sum(dim=-1) + 1


def entropy(probs: Tensor) -> float:
    """Entropy in nats of a distribution: 0 when one token is certain, ln(vocab) when all are equal.  # [vocab]"""
    return float(torch.special.entr(probs.double()).sum())   # float64: the same sum on any thread count


def kept(logits: Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
         min_p: float | None = None) -> int:
    """How many tokens can still be drawn after the cuts (probability > 0).  # [vocab] -> int"""
    return int((probs_after(logits, temperature, top_k, top_p, min_p) > 0).sum())


@dataclass(frozen=True)
class SurgeryStep:
    """One stage of the sampling pipeline, ready to plot."""

    name: str               # logits, scaled, softmax, top_k, top_p (a figure names it in the learner's language)
    logits: Tensor          # [vocab], -inf where removed
    probs: Tensor           # [vocab], softmax of `logits` (renormalized over the kept tokens)
    removed_mass: float     # mass of the ÷T distribution cut so far
    entropy: float          # nats
    kept: int               # tokens with a finite logit


def surgery(
    logits: Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None
) -> list[SurgeryStep]:
    """The stages logits, ÷T ("scaled"), softmax, top-k, top-p (renormalized).  # [vocab] -> 5 steps"""
    stages = Sampler(temperature, top_k, top_p).stages(logits)     # every setting checked before any work
    logits = _checked(logits)
    if logits.dim() != 1:
        raise ValueError(f"surgery takes a 1-D [vocab] logits vector, got shape {tuple(logits.shape)}")
    scaled = stages["scaled"]
    base = scaled.softmax(dim=-1)
    cut_k = stages.get("top_k", scaled)                         # a filter that is off leaves the stage as it was
    cut_p = stages.get("top_p", cut_k)

    def step(name: str, stage: Tensor) -> SurgeryStep:
        probs = stage.softmax(dim=-1)
        # Summing the full vector with zeros for kept tokens (not a masked selection) keeps one summation order,
        # so removed_mass cannot decrease through rounding as more tokens are cut.
        removed = torch.where(stage.isinf(), base, 0).sum()
        return SurgeryStep(name, stage, probs, float(removed), entropy(probs), int(stage.isfinite().sum()))

    return [step("logits", logits), step("scaled", scaled), step("softmax", scaled),
            step("top_k", cut_k), step("top_p", cut_p)]
