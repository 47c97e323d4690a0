"""Drawing helpers shared by the plots: figures, token labels, heatmaps, text grids, bars and token chips."""
from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch

KEPT, REMOVED, CHOSEN = "#4c78a8", "#cfcfcf", "#e45756"
CHIP_COLORS = ("#fde2a8", "#c9e4f6", "#d5efc9", "#f6cfd8", "#e2d6f3", "#fbd5b5")
VISIBLE = {" ": "␣", "\n": "↵", "\t": "⇥"}
MAX_TICKS = 40            # tick labels per heatmap axis; a longer prompt labels every n-th token


def show_figures_in_ipython() -> None:
    """Let a notebook cell that returns a Figure show it as PNG even when pyplot was never imported."""
    from IPython import get_ipython
    from IPython.core.pylabtools import select_figure_formats
    shell = get_ipython()
    if shell is not None and Figure not in shell.display_formatter.formatters["image/png"].type_printers:
        select_figure_formats(shell, {"png"})


def new_figure(width: float, height: float) -> Figure:
    """A figure outside pyplot: nothing to close, shown once when a notebook cell returns it."""
    return Figure(figsize=(width, height), layout="constrained")


def show_piece(piece: str, limit: int | None = None) -> str:
    """A token as a label: visible whitespace, escaped control characters and $, cut to `limit` characters."""
    s = "".join(VISIBLE.get(c, c if c.isprintable() else c.encode("unicode_escape").decode()) for c in piece)
    if limit is not None and len(s) > limit:
        s = s[:limit - 1] + "…"
    return s.replace("$", r"\$") if s.count("$") % 2 == 0 else s   # an even number of $ starts mathtext


def spaced(text: str) -> str:
    """A space between a Chinese character and a Latin letter or digit beside it ("去掉该层的 FFN", as the Chinese
    edition's typography has it); English text is unchanged."""
    return re.sub(r"(?<=[\u4e00-\u9fff])(?=[A-Za-z0-9])|(?<=[A-Za-z0-9])(?=[\u4e00-\u9fff])", " ", text)


def labels(tokenizer, ids, limit: int | None = 12) -> list[str]:
    """Tick labels for token ids."""
    return [show_piece(p, limit) for p in tokenizer.pieces(ids)]


def text_width(s: str) -> float:
    """Approximate width of a string in em (CJK characters are one em, others about 0.6)."""
    return sum(1.0 if unicodedata.east_asian_width(c) in "WF" else 0.6 for c in s)


def si(x: float) -> str:
    """A number with a k/M/G/T suffix: 3.6e8 -> '360 M'."""
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {suffix}"
    return f"{x:.3g}"


def ink(background) -> str:
    """Black or white, whichever reads better on `background`."""
    r, g, b = to_rgb(background)
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"


def every_nth(names: Sequence[str], most: int = MAX_TICKS) -> tuple[range, list[str]]:
    """Tick positions and labels for `names`, every n-th one when there are more than `most` (a long prompt's
    150 labels would overlap and cost a text artist each on every draw)."""
    step = max(1, math.ceil(len(names) / most))
    return range(0, len(names), step), list(names[::step])


def _wide(label: str) -> bool:
    """True if the label holds a CJK (east-Asian wide) character: such a label turned on its side reads badly."""
    return any(unicodedata.east_asian_width(c) in "WF" for c in label)


def set_xticks(ax, positions, labels: Sequence[str], fontsize: float = 10) -> None:
    """Column labels: labels longer than 2 characters stand on their side, except labels with Chinese (or other
    wide) characters, which stay upright in a font small enough to fit their column; only when even 6 points would
    not fit do they turn too. A wide character is counted as 1 em, any other as 0.6 em."""
    labels = list(labels)
    if max(map(len, labels), default=0) <= 2:
        ax.set_xticks(positions, labels)
        return
    if not any(map(_wide, labels)):
        ax.set_xticks(positions, labels, rotation=90)
        return
    column = ax.get_position().width * ax.figure.get_figwidth() / max(1, len(labels))       # inches per label
    ems = max(sum(1.0 if unicodedata.east_asian_width(c) in "WF" else 0.6 for c in s) for s in labels)
    size = min(fontsize, 0.9 * column * 72 / ems)
    if size >= 6:
        ax.set_xticks(positions, labels, fontsize=size)
    else:
        ax.set_xticks(positions, labels, rotation=90)


def heatmap(ax, values, xlabels: Sequence[str], ylabels: Sequence[str], cmap: str = "viridis",
            vmin: float | None = None, vmax: float | None = None, colorbar: str | None = None):
    """Matrix as colours with a label on every row and column (every n-th past MAX_TICKS); returns the image."""
    im = ax.imshow(np.asarray(values, dtype=float), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto",
                   interpolation="nearest")
    set_xticks(ax, *every_nth(xlabels))
    ax.set_yticks(*every_nth(ylabels))
    ax.tick_params(length=0)
    if colorbar is not None:
        ax.figure.colorbar(im, ax=ax, label=colorbar, shrink=0.8)
    return im


def cell_text(ax, im, texts, fontsize: float = 8) -> None:
    """Write texts[i][j] in each cell of a heatmap, in the ink that reads on the cell's colour."""
    values = im.get_array().filled(np.nan)
    for i, row in enumerate(texts):
        for j, s in enumerate(row):
            if s:
                color = ink(im.cmap(im.norm(values[i, j])))
                ax.text(j, i, s, ha="center", va="center", fontsize=fontsize, color=color)


def token_bars(ax, names: Sequence[str], values, colors, fmt: Callable[[float], str] = "{:.3f}".format) -> None:
    """Horizontal bars, first name on top, value written after each bar."""
    y = np.arange(len(names))
    ax.barh(y, values, color=colors)
    ax.set_yticks(y, names)
    ax.set_ylim(len(y) - 0.5, -0.5)            # first name on top, whatever values are missing
    for yi, v in zip(y, values):
        if np.isfinite(v):
            ax.text(v, yi, " " + fmt(v), va="center", ha="left" if v >= 0 else "right", fontsize=8)
    ax.spines[["top", "right"]].set_visible(False)
    ax.margins(x=0.2)


@dataclass(frozen=True)
class Chip:
    """One box of a chip row: text inside, a small caption under it."""

    text: str
    caption: str = ""
    color: str | None = CHIP_COLORS[0]   # None: no box (an arrow, an ellipsis)
    edge: str = "none"


FONT = 12                 # chip text size in points; chip geometry is in em of this size
LINE, SEP = 2.9, 0.8      # em from one chip line to the next; extra em between two labelled rows
PAD, GAP = 0.5, 0.3       # em inside a chip and between chips


def chip_figure(rows: Sequence[tuple[str, Sequence[Chip]]], width: float | None = 48,
                note: str | None = None) -> Figure:
    """Rows of token chips, each with a label on the left, wrapped at `width` em (None: never); a `note` line
    under them."""
    label_w = max((max(text_width(s) for s in label.split("\n")) for label, _ in rows), default=0) * 0.9 + 1
    lines = []                     # (label or "", y of the chips' centre, [(x, chip width, text, chip)])
    y = -1.1 + SEP
    for label, chips in rows:
        x, y, line = label_w, y - SEP, []
        lines.append((label, y, line))
        for chip in chips:
            text = show_piece(chip.text)
            w = max(text_width(text), 0.7 * text_width(chip.caption), 1) + PAD
            if line and width is not None and x + w > width:
                x, y, line = label_w, y - LINE, []
                lines.append(("", y, line))
            line.append((x, w, text, chip))
            x += w + GAP
        y -= LINE
    if note is not None:
        note_y, y = y + LINE - 2.2, y - 1.2
    total_w = max([width or 0] + [x + w for _, _, line in lines for x, w, _, _ in line[-1:]])
    height = -y - 1.1 + 0.4
    fig = Figure(figsize=(total_w * FONT / 72, height * FONT / 72))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set(xlim=(0, total_w), ylim=(-height, 0))
    ax.axis("off")
    if note is not None:
        ax.text(0.3, note_y, note, ha="left", va="center", fontsize=FONT * 0.8, color="#b00")
    for label, y, line in lines:
        ax.text(0.3, y, label, ha="left", va="center", fontsize=FONT * 0.8)
        for x, w, text, chip in line:
            if chip.color is not None:
                ax.add_patch(FancyBboxPatch((x, y - 0.75), w, 1.5, boxstyle="round,pad=0,rounding_size=0.3",
                                            fc=chip.color, ec=chip.edge, lw=1.2))
            ax.text(x + w / 2, y, text, ha="center", va="center", fontsize=FONT)
            ax.text(x + w / 2, y - 1.25, chip.caption, ha="center", va="center", fontsize=FONT * 0.65, color="#555")
    return fig
