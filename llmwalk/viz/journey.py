"""Sections 一 and 九: the article's chain drawn with one journey's real stages, shapes and rounds."""
from __future__ import annotations

from typing import TYPE_CHECKING

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..i18n import t
from ._draw import CHIP_COLORS, CHOSEN, show_piece, text_width

if TYPE_CHECKING:
    from ..journey import Journey

FONT = 10                       # points; box geometry is in em of this size
NOT_IN_ARTICLE = "#e5e5e5"      # the final norm: a stage the article's chain leaves out


def _boxes(j: "Journey") -> list[tuple[str, str, str]]:
    """(name, note, colour) for every box: the input, the journey's stages (their shapes), the token chosen."""
    text = repr(j.prompt) if len(repr(j.prompt)) <= 20 else repr(j.prompt)[:19] + "…"
    boxes = [(t("viz.journey.input"), text.replace("$", r"\$"), CHIP_COLORS[1])]
    names = {"tokenize": t("viz.journey.tokenize"), "embedding": t("viz.journey.embedding"),   # the article's words
             "layers": t("viz.journey.layers", n=len(j.trace.layers)), "lm head": t("viz.journey.lm_head"),
             "softmax": t("viz.journey.softmax"), "pick a token": t("viz.journey.pick")}   # the final norm: the stage's
    for key, (stage, shape, _) in zip(j.STAGES, j.stages(), strict=True):
        boxes.append((names.get(key, stage), shape, NOT_IN_ARTICLE if key == "final norm" else CHIP_COLORS[0]))
    first = j.answer.steps[0].token if j.answer.steps else str(j.first_token)
    return boxes + [(t("viz.journey.output"), repr(show_piece(first)), CHIP_COLORS[3])]


def _loop_label(j: "Journey") -> str:
    """What the rounds after the first did: 加回输入 → 重复, how many tokens each ran, and why the loop stopped."""
    steps = j.answer.steps
    if len(steps) < 2:
        return t("viz.journey.no_second", n=len(steps))
    later = steps[1:]
    run = (t("viz.journey.run_cached", first=later[0].context_len, last=later[-1].context_len)
           if all(s.input_len == 1 for s in later)
           else t("viz.journey.run_whole", first=later[0].input_len, last=later[-1].input_len))
    end = (t("viz.journey.until_eos", token=show_piece(steps[-1].token)) if j.answer.stopped == "eos"
           else t("viz.journey.max_tokens", n=len(steps)))
    return t("viz.journey.loop", last=len(steps), run=run, end=end)


def _rows(widths: list[float], gap: float, max_width: float) -> list[list[int]]:
    """Box indices per row: 输入 and Token 化 alone, so the loop can enter Embedding from the left; then as many
    boxes as fit in max_width em."""
    rows, row = [[0, 1]], []
    for i in range(2, len(widths)):
        if row and sum(widths[k] for k in row) + gap * len(row) + widths[i] > max_width:
            rows.append(row)
            row = []
        row.append(i)
    return rows + [row]


def journey_diagram(j: "Journey", width: float = 64) -> Figure:
    """The article's chain as boxes with this journey's stages and shapes, wrapped into rows of at most `width` em
    (64 em of 10 pt is about 900 px), and the loop arrow of the later rounds back into the Embedding box."""
    return _chain_figure(_boxes(j), t("viz.journey.round_1", n=len(j.ids)), _loop_label(j), width)


def _clip(s: str, limit: int = 30) -> str:
    """A box's value line, cut to `limit` characters."""
    return s if len(s) <= limit else s[:limit - 1] + "…"


def pipeline_diagram(j: "Journey", tokenizer, width: float = 64) -> Figure:
    """Notebook 01's map: one prompt through every stage — text, tokens, ids, embedding, the layers, final norm,
    LM head, probabilities, the pick — each box with this journey's value and the notebook that opens it, and the
    loop back into the ids. `tokenizer`: the model's, to show the tokens."""
    n, d, vocab = len(j.ids), j.trace.final.shape[-1], j.probs.numel()
    first = show_piece(tokenizer.decode([j.first_token]))
    pieces = "|".join(show_piece(p) for p in tokenizer.pieces(j.ids))
    tokenizing, stage, chosen = CHIP_COLORS[1], CHIP_COLORS[0], CHIP_COLORS[3]
    p = f"{float(j.probs[j.first_token]):.2f}"
    boxes = [(t("viz.pipeline.text"), _clip(repr(j.prompt)).replace("$", r"\$"), tokenizing),
             (t("viz.pipeline.tokens"), _clip(pieces), tokenizing),
             (t("viz.pipeline.ids"), _clip(str(j.ids)), tokenizing),
             (t("viz.pipeline.embedding"), f"[{n}] → [{n}, {d}]", stage),
             (t("viz.pipeline.layers", n_layer=len(j.trace.layers)), f"[{n}, {d}] → [{n}, {d}]", stage),
             (t("viz.pipeline.final_norm"), f"[{d}] → [{d}]", stage),
             (t("viz.pipeline.lm_head"), t("viz.pipeline.logits", vocab=vocab), stage),
             (t("viz.pipeline.softmax"), t("viz.pipeline.p", token=repr(first), p=p), stage),
             (t("viz.pipeline.pick"), repr(first), chosen)]
    steps = j.answer.steps
    loop = t("viz.pipeline.loop", token=repr(first), rounds=len(steps), text=_clip(repr(j.answer.text), 40))
    return _chain_figure(boxes, t("viz.pipeline.header", n=n), loop.replace("$", r"\$"), width)


def _chain_figure(boxes: list[tuple[str, str, str]], header: str, loop: str, width: float) -> Figure:
    """Boxes (name, note, colour) joined by arrows, wrapped into rows of at most `width` em: the first two boxes
    alone on the first row, so the loop arrow from the last box can enter the third from the left; `header` above,
    `loop` written under the loop arrow."""
    gap, pitch = 2.2, 5.0                                     # em: between boxes, between rows
    widths = [max(text_width(name), text_width(note)) + 1.2 for name, note, _ in boxes]
    rows, left = _rows(widths, gap, width - 3), 2.5          # room on the left for the loop arrow
    centre, y = {}, {}
    for r, row in enumerate(rows):
        x = left
        for i in row:
            centre[i], y[i] = x + widths[i] / 2, -r * pitch
            x += widths[i] + gap
    bottom = -(len(rows) - 1) * pitch - 3.2                  # the loop runs under the last row
    below = 0.8 + 1.4 * (loop.count("\n") + 1)                # room for the loop's lines
    height = 3.5 - bottom + below
    fig = Figure(figsize=(width * FONT / 72, height * FONT / 72))     # no layout engine: one axes, placed by hand
    ax = fig.add_axes((0, 0, 1, 1), xlim=(0, width), ylim=(bottom - below, 3.5), frame_on=False, xticks=[], yticks=[])
    ax.text(0.5, 2.3, header, fontsize=FONT * 0.9, color="#555")
    texts = [ax.text(centre[i], y[i], f"{name}\n{note}", ha="center", va="center", fontsize=FONT,
                     bbox=dict(boxstyle="round", fc=colour, ec="none")) for i, (name, note, colour) in enumerate(boxes)]
    to_data, renderer = ax.transData.inverted(), FigureCanvasAgg(fig).get_renderer()
    for box in texts:                                        # place each box's patch around its text now
        box.update_bbox_position_size(renderer)
    edges = [to_data.transform(box.get_bbox_patch().get_window_extent(renderer)) for box in texts]  # [[x0, y0], [x1, y1]]
    for a in range(len(boxes) - 1):                          # an arrow to the next box, bent down to a new row
        b = a + 1
        if y[a] == y[b]:
            path = [(edges[a][1][0], y[a]), (edges[b][0][0], y[b])]
        else:
            mid = (edges[a][0][1] + edges[b][1][1]) / 2
            path = [(centre[a], edges[a][0][1]), (centre[a], mid), (centre[b], mid), (centre[b], edges[b][1][1])]
        _arrow(ax, path, "black")
    target, last = 2, len(boxes) - 1                         # the loop: the last box → back into the third, from the left
    _arrow(ax, [(centre[last], edges[last][0][1]), (centre[last], bottom), (0.8, bottom), (0.8, y[target]),
                (edges[target][0][0], y[target])], CHOSEN)
    ax.text(width / 2, bottom - 0.5, loop, ha="center", va="top", fontsize=FONT, color=CHOSEN)
    return fig


def _arrow(ax, path: list[tuple[float, float]], colour: str) -> None:
    """A polyline through `path` (data coordinates, em) with an arrow head at its end."""
    xs, ys = zip(*path)
    ax.plot(xs[:-1], ys[:-1], color=colour, lw=1)
    ax.annotate("", path[-1], path[-2], arrowprops=dict(arrowstyle="->", color=colour, shrinkA=0, shrinkB=1))
