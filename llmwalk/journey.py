"""Sections 一 and 九: the whole journey of one prompt, stage by stage, with the time each stage takes."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch import Tensor

from .generation import Generation, generate
from .head import softmax
from .sampling import greedy
from .walk import Trace, forward

if TYPE_CHECKING:
    from .models import Model


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

    def stages(self) -> list[tuple[str, str, float]]:
        """(stage, shape of what it produced, seconds) for the first token: the article's pipeline.

        The layers run every position; the final norm and the LM head only the last one, all the next token needs.
        """
        c, t = self.trace.final.shape[-1], len(self.ids)
        layers = sum(v for k, v in self.seconds.items() if k.startswith("layer "))
        return [("tokenize", f"text → {t} ids", self.seconds["tokenize"]),
                ("embedding", f"[{t}] → [{t}, {c}]", self.seconds["embedding"]),
                (f"{len(self.trace.layers)} × (attention + FFN)", f"[{t}, {c}] → [{t}, {c}]", layers),
                ("final norm, last position", f"[{c}] → [{c}]", self.seconds["final norm"]),
                ("LM head, last position", f"[{c}] → [{self.probs.numel()}] logits", self.seconds["lm head"]),
                ("softmax", f"[{self.probs.numel()}] probabilities", self.seconds["softmax"]),
                ("pick a token", "1 id", self.seconds["pick a token"])]


def journey(model: "Model", prompt: str, chat: bool = False, max_new_tokens: int = 20) -> Journey:
    """Walk `prompt` through the model once, timing every stage, then let the loop write the whole answer.

    As in generation, the final norm and the LM head run on the last position only: trace.logits is [1, vocab].
    """
    seconds: dict[str, float] = {}
    tic = time.perf_counter()
    ids = model.tokenizer.encode(prompt, chat=chat)
    seconds["tokenize"] = time.perf_counter() - tic
    trace = forward(model, ids, last_only=True)
    seconds.update(trace.seconds)
    tic = time.perf_counter()
    probs = softmax(trace.logits[0])
    seconds["softmax"] = time.perf_counter() - tic
    tic = time.perf_counter()
    first = int(greedy(probs))
    seconds["pick a token"] = time.perf_counter() - tic
    answer = generate(model, ids, max_new_tokens=max_new_tokens)
    return Journey(prompt, ids, trace, probs, first, answer, seconds)
