"""Sections 一 and 九: one prompt's journey — its tokens, the first forward pass timed stage by stage, the first
answer token, then the loop writing the whole answer."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from torch import Tensor

from .generation import Generation, generate
from .head import softmax
from .i18n import t
from .sampling import greedy
from .walk import FINAL_NORM, Trace, forward

if TYPE_CHECKING:
    from .models import Model


def timed_forward(model: "Model", ids: Sequence[int] | Tensor, *,
                  last_only: bool = False) -> tuple[Trace, dict[str, float]]:
    """forward(model, ids), recorded, and the wall seconds of each of its stages in the order they ran: "embedding",
    "layer 0" … "layer N-1", "final norm", "lm head".

    Timed through forward's own hook points, each of which notes when it was reached and changes nothing: the end
    of the embedding is the first layer's resid_pre, a layer's end its resid_post, the final norm's end "final_norm".
    """
    n = model.config.n_layer
    stages = ["embedding", *(f"layer {i}" for i in range(n)), "final norm"]
    points = ["blocks.0.resid_pre", *(f"blocks.{i}.resid_post" for i in range(n)), FINAL_NORM]
    reached = [time.perf_counter()]

    def note(a: Tensor) -> Tensor:
        reached.append(time.perf_counter())
        return a
    trace = forward(model, ids, last_only=last_only, hooks=dict.fromkeys(points, note))
    reached.append(time.perf_counter())
    trace.unchanged = ()                    # the timing hooks' own names: they change nothing by design
    return trace, dict(zip([*stages, "lm head"], (b - a for a, b in zip(reached, reached[1:]))))


@dataclass(frozen=True)
class Journey:
    """One prompt's walk: its tokens, the first forward pass, the first answer token, and the whole answer."""

    prompt: str
    ids: list[int]
    trace: Trace                # the forward pass over the prompt (final norm and LM head: last position only)
    probs: Tensor               # [vocab] next-token distribution after the prompt
    first_token: int
    answer: Generation          # the greedy answer, token by token (with a KV cache)
    seconds: dict[str, float]   # wall time per stage of the first token, in the order they happen

    STAGES = ("tokenize", "embedding", "layers", "final norm", "lm head", "softmax", "pick a token")
    """The rows of stages(), by their keys in `seconds` ("layers": every "layer i" together)."""

    def stages(self) -> list[tuple[str, str, float]]:
        """(stage, shape of what it produced, seconds) for the first token: the article's pipeline, one row per
        STAGES, named in the current language (lw.set_language).

        The layers run every position; the final norm and the LM head only the last one, all the next token needs.
        """
        c, n, vocab = self.trace.final.shape[-1], len(self.ids), self.probs.numel()
        seconds = {**self.seconds, "layers": sum(v for k, v in self.seconds.items() if k.startswith("layer "))}
        rows = {"tokenize": (t("walk.journey.tokenize"), t("walk.journey.text_ids", n=n)),
                "embedding": (t("walk.journey.embedding"), f"[{n}] → [{n}, {c}]"),
                "layers": (t("walk.journey.layers", n_layer=len(self.trace.layers)), f"[{n}, {c}] → [{n}, {c}]"),
                "final norm": (t("walk.journey.final_norm"), f"[{c}] → [{c}]"),
                "lm head": (t("walk.journey.lm_head"), t("walk.journey.logits", d=c, vocab=vocab)),
                "softmax": (t("walk.journey.softmax"), t("walk.journey.probabilities", vocab=vocab)),
                "pick a token": (t("walk.journey.pick"), t("walk.journey.one_id"))}
        return [(*rows[key], seconds[key]) for key in self.STAGES]


def journey(model: "Model", prompt: str, chat: bool = False, max_new_tokens: int = 20) -> Journey:
    """Walk `prompt` through the model once, timing every stage, then let the loop write the whole answer.

    As in generation, the final norm and the LM head run on the last position only: trace.logits is [1, vocab].
    """
    tic = time.perf_counter()
    ids = model.tokenizer.encode(prompt, chat=chat)
    seconds = {"tokenize": time.perf_counter() - tic}
    trace, stage_seconds = timed_forward(model, ids, last_only=True)
    seconds.update(stage_seconds)
    tic = time.perf_counter()
    probs = softmax(trace.logits[0])
    seconds["softmax"] = time.perf_counter() - tic
    tic = time.perf_counter()
    first = int(greedy(probs))
    seconds["pick a token"] = time.perf_counter() - tic
    answer = generate(model, ids, max_new_tokens=max_new_tokens)
    return Journey(prompt, ids, trace, probs, first, answer, seconds)
