"""Section 七: the loop, round by round (第1轮, 第2轮, ...): the context that went in, the token that came out."""
from __future__ import annotations

from typing import Sequence

from matplotlib.figure import Figure

from ..i18n import t
from ..report import Table, table
from ._draw import CHIP_COLORS, Chip, chip_figure, show_piece
from .tokens import piece_labels

CONTEXT = 12      # context tokens shown per round; earlier ones become "…"


def _contexts(steps, tokenizer, prompt_ids: Sequence[int]) -> list[list[str]]:
    """The pieces each round saw: `prompt_ids` (the prompt plus every token chosen before steps[0]) and the steps.

    Raises ValueError when a round's context would not be as long as the step's `context_len`: a slice of the
    steps passed with the bare prompt would silently drop the tokens generated before it.
    """
    for k, step in enumerate(steps):
        if len(prompt_ids) + k != step.context_len:
            raise ValueError(f"round {step.index} saw {step.context_len} tokens, but prompt_ids ({len(prompt_ids)}) "
                             f"plus the {k} steps before it make {len(prompt_ids) + k}: pass the prompt plus the "
                             f"tokens generated before steps[0] (e.g. g.prompt_ids + g.new_ids[:{steps[0].index - 1}])")
    pieces = tokenizer.pieces(list(prompt_ids)) + [s.token for s in steps]
    return [pieces[:len(prompt_ids) + k] for k in range(len(steps))]


def _model_p(step) -> str:
    """The chosen token's probability under the raw model (softmax at T = 1), from step.top; "–" if not in it.
    Two decimals, as p: a third one can flip between CPUs (0.77255 sits 5e-5 from 0.7725)."""
    return next((f"{p:.2f}" for i, _, p in step.top if i == step.token_id), "–")


def generation_table(steps, tokenizer, prompt_ids: Sequence[int]) -> Table:
    """One row per round like the article's 第1轮 … 第4轮: the context, the tokens run, the chosen token and p.

    prompt_ids: the prompt plus every token generated before steps[0] (for g.steps[a:b]: g.prompt_ids + g.new_ids[:a]).
    p is the chosen token's chance under the distribution it was drawn from (1.00 for greedy); when the steps
    carry the model's top tokens (generate's steps do), "model p" adds its probability under the raw softmax.
    """
    raw = any(s.top for s in steps)
    rows = []
    for step, context in zip(steps, _contexts(steps, tokenizer, prompt_ids)):
        shown = ("[…, " if len(context) > CONTEXT else "[") + ", ".join(show_piece(p) for p in context[-CONTEXT:]) + "]"
        rows.append((t("viz.generation.round_cell", index=step.index), str(step.context_len), str(step.input_len),
                     shown, show_piece(step.token),
                     f"{step.prob:.2f}", *((_model_p(step),) if raw else ())))
    return table(rows, (t("viz.generation.round"), t("viz.generation.context_length"), t("viz.generation.tokens_run"),
                        t("viz.generation.context"), t("viz.generation.token"), "p",
                        *((t("viz.generation.model_p"),) if raw else ())))


def generation_figure(steps, tokenizer, prompt_ids: Sequence[int]) -> Figure:
    """The rounds as token chips: the context, an arrow, the chosen token with its probability. A byte fragment
    shows as the character it is part of (国[1/2]: the first of the two tokens that spell 国), as piece_labels does.

    prompt_ids: the prompt plus every token generated before steps[0] (for g.steps[a:b]: g.prompt_ids + g.new_ids[:a]).
    """
    shown = piece_labels(tokenizer, [*prompt_ids, *(s.token_id for s in steps)])    # readable, in full context
    rows = []
    for step, context in zip(steps, _contexts(steps, tokenizer, prompt_ids)):
        n = len(context)
        chips = [Chip("…", color=None)] if n > CONTEXT else []
        chips += [Chip(p, color="#eeeeee") for p in shown[max(0, n - CONTEXT):n]]
        model_p = _model_p(step)                      # the model's own p, as the table; if the token is not in
        p = (t("viz.generation.chip_model_p", p=model_p) if model_p != "–"       # step.top, the p it was drawn with
             else t("viz.generation.chip_p", p=f"{step.prob:.2f}"))
        chips += [Chip("→", color=None), Chip(shown[n], p, CHIP_COLORS[3])]
        rows.append((t("viz.generation.round_row", index=step.index), chips))
    return chip_figure(rows, width=None)
