"""Section 四, causal experiments: one logit split into the direct parts of the embedding, every head and every FFN."""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from ..i18n import t
from ._draw import new_figure, show_piece, si

KIND_COLORS = {"embedding": "#9d9d9d", "attention": "#4c78a8", "ffn": "#e45756"}


def _parts(att) -> list[tuple[str, str, float]]:
    """(kind, label, part) for every writer: the embedding, each head, each FFN."""
    n_layer, n_head = att.heads.shape
    return ([("embedding", t("viz.attribution.embedding"), att.embedding)]
            + [("attention", t("viz.attribution.head", layer=i, head=h), float(att.heads[i, h]))
               for i in range(n_layer) for h in range(n_head)]
            + [("ffn", t("viz.attribution.ffn", layer=i), float(att.ffns[i])) for i in range(n_layer)])


def _bars(ax, names: list[str], values: list[float], colors: list[str]) -> None:
    """Horizontal bars, the first on top, each with its value (3 significant digits) at its end."""
    y = np.arange(len(names))
    ax.barh(y, values, color=colors)
    for j, v in enumerate(values):
        ax.text(v, j, f" {si(v)} ", va="center", ha="left" if v >= 0 else "right", fontsize=7)
    ax.set_yticks(y, names, fontsize=8)
    ax.set_ylim(len(names) - 0.5, -0.5)
    ax.axvline(0, color="#555", lw=0.8)
    lo, hi = min(0.0, *values), max(0.0, *values)
    ax.set_xlim(lo - 0.25 * (hi - lo), hi + 0.2 * (hi - lo))       # room for the values written at the ends
    ax.grid(axis="x", alpha=0.3)


def logit_attribution_bars(att, tokenizer, k: int = 12) -> Figure:
    """Left: the embedding, all heads and all FFNs together, beside the logit they add up to. Right: the k largest
    single parts (by size), the rest summed in one line below.  # att: attribution.logit_attribution(...)"""
    parts = _parts(att)
    word = show_piece(tokenizer.pieces([att.token])[0])
    fig = Figure(figsize=(10, 0.9 + 0.27 * (k + 1)), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=(1, 1.6))
    kinds = [("embedding", t("viz.attribution.embedding"), att.embedding),
             ("attention", t("viz.attribution.all_heads"), float(att.heads.sum())),
             ("ffn", t("viz.attribution.all_ffns"), float(att.ffns.sum()))]
    _bars(left, [label for _, label, _ in kinds] + [t("viz.attribution.logit")], [v for *_, v in kinds] + [att.logit],
          [KIND_COLORS[kind] for kind, *_ in kinds] + ["#333"])
    left.set_title(t("viz.attribution.by_kind"), fontsize=9)
    top = sorted(parts, key=lambda p: -abs(p[2]))[:k]
    _bars(right, [label for _, label, _ in top], [v for *_, v in top], [KIND_COLORS[kind] for kind, *_ in top])
    rest = sum(v for *_, v in parts) - sum(v for *_, v in top)
    right.set_title(t("viz.attribution.largest", k=k), fontsize=9)
    right.set_xlabel(t("viz.attribution.rest", n=len(parts) - k, rest=si(rest)), fontsize=8)
    fig.suptitle(t("viz.attribution.title", word=word, logit=si(att.logit)), fontsize=10)
    return fig


def direct_vs_total(direct: dict, total: dict, word: str) -> Figure:
    """Per layer and part (e.g. attention, FFN): its direct part of the logit (bars) beside the logit's drop when
    it is zeroed (dots), the total effect of removing it. One panel per part.  # direct, total {name: [n_layer]}"""
    fig = new_figure(10, 3.6)
    axes = fig.subplots(1, len(direct), sharey=True, squeeze=False)[0]
    for ax, name, color in zip(axes, direct, (KIND_COLORS["attention"], KIND_COLORS["ffn"], "#54a24b")):
        layers = np.arange(len(direct[name]))
        ax.bar(layers, np.asarray(direct[name], dtype=float), color=color, alpha=0.8,
               label=t("viz.attribution.direct"))
        ax.plot(layers, np.asarray(total[name], dtype=float), "o", ms=4, color="#222",
                label=t("viz.attribution.total"))
        ax.axhline(0, color="#555", lw=0.8)
        ax.set(title=name, xlabel=t("viz.layers.layer_from_0"), xlim=(-0.7, len(layers) - 0.3))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(t("viz.attribution.logit_units", word=word))
    axes[0].legend(fontsize=8, loc="upper left")
    fig.suptitle(t("viz.attribution.versus_title", word=word), fontsize=10)
    return fig
