"""Section 七: the loop, round by round (第1轮, 第2轮, ...): the context that went in, the token that came out."""
from __future__ import annotations

from typing import Sequence

from matplotlib.figure import Figure

from ..report import Table, table
from ._draw import CHIP_COLORS, Chip, chip_figure, show_piece

CONTEXT = 12      # context tokens shown per round; earlier ones become "…"


def _contexts(steps, tokenizer, prompt_ids: Sequence[int]) -> list[list[str]]:
    """The pieces each round saw: the prompt and every token chosen before it."""
    pieces = tokenizer.pieces(prompt_ids) + [s.token for s in steps]
    return [pieces[:len(prompt_ids) + k] for k in range(len(steps))]


def generation_table(steps, tokenizer, prompt_ids: Sequence[int]) -> Table:
    """One row per round like the article's 第1轮 … 第4轮: the context, the tokens run, the chosen token and p."""
    rows = []
    for step, context in zip(steps, _contexts(steps, tokenizer, prompt_ids)):
        shown = ("[…, " if len(context) > CONTEXT else "[") + ", ".join(show_piece(p) for p in context[-CONTEXT:]) + "]"
        rows.append((f"第{step.index}轮", str(step.context_len), str(step.input_len), shown, show_piece(step.token),
                     f"{step.prob:.3f}"))
    return table(rows, ("round", "context length", "tokens run", "context", "→ token", "p"))


def generation_figure(steps, tokenizer, prompt_ids: Sequence[int]) -> Figure:
    """The rounds as token chips: the context, an arrow, the chosen token with its probability."""
    rows = []
    for step, context in zip(steps, _contexts(steps, tokenizer, prompt_ids)):
        chips = [Chip("…", color=None)] if len(context) > CONTEXT else []
        chips += [Chip(p, color="#eeeeee") for p in context[-CONTEXT:]]
        chips += [Chip("→", color=None), Chip(step.token, f"p = {step.prob:.2f}", CHIP_COLORS[3])]
        rows.append((f"round {step.index}", chips))
    return chip_figure(rows, width=None)
