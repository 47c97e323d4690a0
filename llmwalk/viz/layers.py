"""Section 四, inside a layer: the residual stream grows, the norm pulls it back, the FFN widens and narrows."""
from __future__ import annotations

import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch

from ..i18n import t
from ..weights import Config
from ._draw import CHIP_COLORS, heatmap, labels, new_figure, show_piece


def residual_norms(trace, tokenizer) -> Figure:
    """Length of each token's residual-stream vector after every layer (log scale), one line per position."""
    norms = trace.resid.float().norm(dim=-1).numpy()                 # [n_layer + 1, T]
    fig = new_figure(9, 4)
    ax = fig.subplots()
    for name, column in zip(labels(tokenizer, trace.ids), norms.T):
        ax.plot(np.arange(-1, len(column) - 1), column, marker=".", label=name)
    resid_axis(ax, len(norms) - 1)
    ax.set(yscale="log", ylabel="‖x‖", title=t("viz.layers.resid_title"))
    ax.legend(fontsize=8, ncols=max(1, len(norms.T) // 16 + 1), loc="center left", bbox_to_anchor=(1, 0.5))
    ax.grid(alpha=0.3)
    return fig


def resid_axis(ax, n_layer: int) -> None:
    """The x axis of a plot over the residual stream, x = -1 .. n_layer - 1: "emb" (what enters layer 0), then
    after layer 0, 1, … (layers are numbered from 0, as trace.layers[i]). About 10 ticks in equal steps, counted
    back from the last layer and none nearer "emb" than one step ("emb" next to "0" would touch)."""
    step = max(1, round(n_layer / 10))
    ticks = [-1] + list(range(n_layer - 1, step - 2, -step))[::-1]
    ax.set_xticks(ticks, ["emb"] + [str(i) for i in ticks[1:]])
    ax.set_xlabel(t("viz.layers.resid_axis"))


def norm_stats(trace) -> Figure:
    """What the attention norm does: mean and std of each vector entering it and leaving it, per layer."""
    before = trace.resid[:-1].float()                                 # [n_layer, T, d]: what enters attn_norm
    after = torch.stack([b.attn_in for b in trace.layers]).float()     # what leaves it
    fig = new_figure(10, 3.8)
    axes = fig.subplots(1, 2)
    for ax, stat, word in zip(axes, ("std", "mean"), (t("viz.layers.std"), t("viz.layers.mean"))):
        for x, name, color in ((before, t("viz.layers.norm_in"), "#e45756"),
                               (after, t("viz.layers.norm_out"), "#4c78a8")):
            per_token = getattr(x, stat)(dim=-1)                       # [n_layer, T]: over the d dimensions
            layers = np.arange(len(per_token))
            ax.plot(layers, per_token.median(1).values.numpy(), marker=".", color=color, label=name)
            ax.fill_between(layers, per_token.amin(1).numpy(), per_token.amax(1).numpy(), color=color, alpha=0.15)
        ax.set(xlabel=t("viz.layers.layer"), title=t("viz.layers.norm_stat", stat=word))
        ax.grid(alpha=0.3)
    axes[0].set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.suptitle(t("viz.layers.norm_title", d=trace.x0.shape[-1]), fontsize=10)
    return fig


def ffn_widths(*configs: Config) -> Figure:
    """The FFN of each model drawn to scale: d_model → d_ff → d_model (gated FFNs have two d_ff projections)."""
    widest = max(c.d_ff for c in configs)
    fig = Figure(figsize=(4.2 * len(configs), 3.2))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set(xlim=(0, len(configs)), ylim=(0, 3.2))
    ax.axis("off")
    for n, c in enumerate(configs):
        centre = n + 0.5
        gated = c.ffn != "gelu"
        hidden = f"{c.d_ff}" + ("  act(gate) ⊙ up" if gated else "  gelu(up)")
        params = (3 if gated else 2) * c.d_model * c.d_ff
        for y, dim, text, color, two in ((2.2, c.d_model, t("viz.layers.ffn_in", d=c.d_model), CHIP_COLORS[1], False),
                                         (1.2, c.d_ff, hidden, CHIP_COLORS[0], gated),
                                         (0.2, c.d_model, t("viz.layers.ffn_out", d=c.d_model), CHIP_COLORS[1],
                                          False)):
            w = 0.9 * dim / widest
            for dx, fc in ((0.02, CHIP_COLORS[3]), (0, color)) if two else ((0, color),):   # gate behind up
                ax.add_patch(FancyBboxPatch((centre - w / 2 + dx, y + 3 * dx), w, 0.42, boxstyle="round,pad=0.01",
                                            fc=fc, ec="#888"))
            ax.text(centre, y + 0.21, text, ha="center", va="center", fontsize=9)
        for y in (2.2, 1.2):
            ax.annotate("", (centre, y - 0.36), (centre, y - 0.02), arrowprops=dict(arrowstyle="->", color="#555"))
        ax.text(centre, 2.85, t("viz.layers.ffn_params", name=c.name, ffn=c.ffn, millions=f"{params / 1e6:.2f}"),
                ha="center", va="center", fontsize=10)
    return fig


def intervention_bars(effects: dict, tokenizer, tokens) -> Figure:
    """P(each token) next, with no intervention (top) and under each one: one row per intervention.

    `effects` maps a name to [P(token) for token in tokens] (interventions.effects).
    """
    names = list(effects)
    probs = np.array([[float(p) for p in effects[n]] for n in names])             # [interventions, tokens]
    words = [show_piece(p) for p in tokenizer.pieces(list(tokens))]
    y = np.arange(len(names))
    fig = new_figure(9, 1.0 + 0.36 * len(names))
    ax = fig.subplots()
    height = 0.8 / len(words)
    for k, (word, color) in enumerate(zip(words, ("#4c78a8", "#e45756", "#54a24b", "#b279a2"))):
        ax.barh(y + (k - (len(words) - 1) / 2) * height, probs[:, k], height, color=color, label=f"P(“{word}”)")
        for j, p in enumerate(probs[:, k]):
            ax.text(p, y[j] + (k - (len(words) - 1) / 2) * height, f" {p:.2f}", va="center", fontsize=7)
    ax.set_yticks(y, names)
    ax.set_ylim(len(names) - 0.5, -0.5)
    ax.axhline(0.5, color="#888", lw=0.8)
    ax.set(xlim=(0, 1.08), xlabel=t("viz.layers.p_next"))
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    return fig


def patching_heatmap(grid, tokenizer, ids, token, source: str) -> Figure:
    """P(token) when the residual stream entering one layer (rows) at one position (columns) comes from `source`.

    # grid [n_layer + 1, T] (interventions.patching_grid)
    """
    word = show_piece(tokenizer.pieces([token])[0])
    rows = [t("viz.layers.into_layer", layer=i) for i in range(len(grid) - 1)] + [t("viz.layers.after_last")]
    fig = new_figure(2.6 + 0.75 * grid.shape[1], 1.0 + 0.16 * len(grid))
    ax = fig.subplots()
    heatmap(ax, grid.numpy(), labels(tokenizer, ids), rows, cmap="Reds", vmin=0, vmax=1,
            colorbar=t("viz.layers.p_word", word=word))
    ax.xaxis.tick_top()
    ax.tick_params(axis="y", labelsize=7)
    ax.set_title(t("viz.layers.patched_from", source=repr(source)), fontsize=10)
    return fig


def ablation_sweep(sweeps: dict, base: float, word: str) -> Figure:
    """P(word) when one layer's part is removed, for every layer: one line per part (e.g. attention, FFN).

    # sweeps {name: [n_layer]}; base: P(word) with nothing removed
    """
    fig = new_figure(9, 3.4)
    ax = fig.subplots()
    for (name, probs), color in zip(sweeps.items(), ("#4c78a8", "#e45756", "#54a24b")):
        ax.plot(np.arange(len(probs)), np.asarray(probs, dtype=float), marker="o", ms=4, color=color,
                label=t("viz.layers.removed", part=name))
    ax.axhline(base, color="#555", ls="--", lw=1, label=t("viz.layers.nothing_removed"))
    ax.set(xlabel=t("viz.layers.layer_from_0"), ylabel=t("viz.layers.p_word", word=word), ylim=(0, 1),
           xlim=(-0.5, len(probs) - 0.5))
    ax.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0, 1.01), ncols=3, frameon=False)
    fig.suptitle(t("viz.layers.ablation_title", word=word))         # the figure's: above the legend
    ax.grid(alpha=0.3)
    return fig
