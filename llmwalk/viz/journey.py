"""Sections 一 and 九: the article's chain drawn with one journey's real stages, shapes and rounds."""
from __future__ import annotations

from typing import TYPE_CHECKING

from matplotlib.figure import Figure

from ._draw import CHIP_COLORS, CHOSEN, show_piece, text_width

if TYPE_CHECKING:
    from ..journey import Journey

FONT = 10                       # points; box geometry is in em of this size
ARTICLE = {"tokenize": "Token 化", "embedding": "Embedding", "softmax": "Softmax"}   # the article's names
NOT_IN_ARTICLE = "#e5e5e5"      # the final norm: a stage the article's chain leaves out


def _boxes(j: "Journey") -> list[tuple[str, str, str]]:
    """(name, note, colour) for every box: the input, the journey's stages (their shapes), the token chosen."""
    text = repr(j.prompt) if len(repr(j.prompt)) <= 20 else repr(j.prompt)[:19] + "…"
    boxes = [("输入", text.replace("$", r"\$"), CHIP_COLORS[1])]
    for stage, shape, _ in j.stages():
        if stage.endswith("(attention + FFN)"):
            name = stage.replace("(attention + FFN)", "Attention/FFN")
        elif stage.startswith("LM head"):
            name = "LM Head" + stage[len("LM head"):]
        elif stage == "pick a token":
            name = "pick a token (greedy)"
        else:
            name = ARTICLE.get(stage, stage)
        boxes.append((name, shape, NOT_IN_ARTICLE if stage.startswith("final norm") else CHIP_COLORS[0]))
    first = j.answer.steps[0].token if j.answer.steps else str(j.first_token)
    return boxes + [("输出词", repr(show_piece(first)), CHIP_COLORS[3])]


def _loop_label(j: "Journey") -> str:
    """What the rounds after the first did: 加回输入 → 重复, how many tokens each ran, and why the loop stopped."""
    steps = j.answer.steps
    if len(steps) < 2:
        return f"加回输入 → 重复: no second round (max_new_tokens = {len(steps)})"
    later = steps[1:]
    run = (f"1 new token each (KV cache), attending to {later[0].context_len}…{later[-1].context_len}"
           if all(s.input_len == 1 for s in later) else f"{later[0].input_len}…{later[-1].input_len} tokens each")
    end = (f"until {show_piece(steps[-1].token)} = [EOS]" if j.answer.stopped == "eos"
           else f"stopped by max_new_tokens = {len(steps)}: no [EOS]")
    return f"加回输入 → 重复: rounds 2–{len(steps)} run {run} … {end}"


def journey_diagram(j: "Journey") -> Figure:
    """The article's chain as boxes with this journey's stages and shapes, and the loop arrow of the later rounds."""
    boxes, gap = _boxes(j), 2.2
    widths = [max(text_width(name), text_width(note)) + 1.2 for name, note, _ in boxes]
    centres, x = [], 0.5
    for w in widths:
        centres.append(x + w / 2)
        x += w + gap
    width, height = x - gap + 0.5, 9
    fig = Figure(figsize=(width * FONT / 72, height * FONT / 72))     # no layout engine: one axes, placed by hand
    ax = fig.add_axes((0, 0, 1, 1), xlim=(0, width), ylim=(-5.5, 3.5), frame_on=False, xticks=[], yticks=[])
    ax.text(0.5, 2.3, f"round 1: the first token, {len(j.ids)} tokens in", fontsize=FONT * 0.9, color="#555")
    before = None
    for (name, note, colour), cx in zip(boxes, centres):      # a box per stage, an arrow from the box before it
        before = ax.annotate(f"{name}\n{note}", (1, 0.5), (cx, 0), before or "data", "data", ha="center",
                             va="center", fontsize=FONT, bbox=dict(boxstyle="round", fc=colour, ec="none"),
                             arrowprops=before and dict(arrowstyle="<-"))
    ax.annotate("", (centres[2], -1.6), (centres[-1], -1.6), arrowprops=dict(
        arrowstyle="->", connectionstyle=f"bar,fraction={-1.6 / (centres[-1] - centres[2])}", color=CHOSEN))
    ax.text(width / 2, -4.4, _loop_label(j), ha="center", va="center", fontsize=FONT, color=CHOSEN)
    return fig
