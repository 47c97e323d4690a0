"""Section 四, inside a layer: the residual stream grows, the norm pulls it back, the FFN widens and narrows."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from matplotlib.patches import Circle, FancyBboxPatch

from ..i18n import t
from ..weights import Config
from ._draw import CHIP_COLORS, heatmap, labels, new_figure, show_piece, spaced


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
    """What the attention norm does, per layer: the std of each vector entering and leaving it, and its mean as a
    fraction of its RMS (0 would mean centred, as a LayerNorm leaves it)."""
    before = trace.resid[:-1].float()                                 # [n_layer, T, d]: what enters attn_norm
    after = torch.stack([b.attn_in for b in trace.layers]).float()     # what leaves it
    stats = (("std", t("viz.layers.std"), lambda x: x.std(dim=-1)),
             ("mean_rms", t("viz.layers.mean_rms"), lambda x: x.mean(-1) / x.pow(2).mean(-1).sqrt()))
    fig = new_figure(10, 3.8)
    axes = fig.subplots(1, 2)
    for ax, (_, word, stat) in zip(axes, stats):
        for x, name, color in ((before, t("viz.layers.norm_in"), "#e45756"),
                               (after, t("viz.layers.norm_out"), "#4c78a8")):
            per_token = stat(x)                                        # [n_layer, T]: over the d dimensions
            layers = np.arange(len(per_token))
            ax.plot(layers, per_token.median(1).values.numpy(), marker=".", color=color, label=name)
            ax.fill_between(layers, per_token.amin(1).numpy(), per_token.amax(1).numpy(), color=color, alpha=0.15)
        ax.set(xlabel=t("viz.layers.layer"), title=t("viz.layers.norm_stat", stat=word))
        ax.grid(alpha=0.3)
    axes[0].set_yscale("log")
    axes[0].legend(fontsize=8)
    axes[1].axhline(0, color="#555", ls="--", lw=1, label=t("viz.layers.centred"))
    axes[1].legend(fontsize=8)
    fig.suptitle(t("viz.layers.norm_title", d=trace.x0.shape[-1]), fontsize=10)
    return fig


def ffn_activations() -> Figure:
    """The gate's activation, side by side: SiLU (SmolLM2's SwiGLU) and GELU, tanh form (Gemma-3's GeGLU), each
    next to ReLU."""
    x = torch.linspace(-5, 5, 401)
    fig = new_figure(10, 3.4)
    for ax, (y, title) in zip(fig.subplots(1, 2, sharey=True),
                              ((F.silu(x), t("viz.layers.silu")), (F.gelu(x, approximate="tanh"), t("viz.layers.gelu")))):
        ax.plot(x.numpy(), F.relu(x).numpy(), color="#999", ls="--", lw=1, label=t("viz.layers.relu"))
        ax.plot(x.numpy(), y.numpy(), color="#4c78a8", lw=2)
        low = int(y.argmin())                                          # both dip below 0 for negative inputs
        ax.plot([float(x[low])], [float(y[low])], "o", color="#e45756",
                label=t("viz.layers.act_min", x=f"{float(x[low]):.2f}", y=f"{float(y[low]):.2f}"))
        ax.set(xlabel=t("viz.layers.act_x"), title=title)
        ax.axhline(0, color="#555", lw=0.6)
        ax.axvline(0, color="#555", lw=0.6)
        ax.legend(fontsize=8, loc="upper left")
        ax.grid(alpha=0.3)
    fig.axes[0].set_ylabel(t("viz.layers.act_y"))
    return fig


def block_diagram(config: Config) -> Figure:
    """One pre-norm layer: the residual stream runs straight through; attention and the FFN each read a normalized
    copy of it and add their output back."""
    norm = config.norm_name
    fig = Figure(figsize=(11, 2.7))             # one unit as wide as high: the ⊕ stays round
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set(xlim=(0, 12.6), ylim=(0, 3.1))
    ax.axis("off")
    y0, y1, arrow = 0.75, 2.1, dict(arrowstyle="->", color="#555", lw=1.2)
    ax.annotate("", (12.5, y0), (0.15, y0), arrowprops=dict(arrowstyle="->", color="#e45756", lw=3))   # the stream
    ax.text(0.15, y0 - 0.42, t("viz.layers.block_in"), ha="left", va="center", fontsize=9)
    ax.text(12.5, y0 - 0.42, t("viz.layers.block_out"), ha="right", va="center", fontsize=9)
    ax.text(6.3, 0.12, t("viz.layers.block_stream"), ha="center", va="center", fontsize=9, color="#e45756")
    boxes = ((1.0, t("viz.layers.block_norm", norm=norm, name="attn_norm"), t("viz.layers.block_attn",
                                                                               n_head=config.n_head), 6.0),
             (6.6, t("viz.layers.block_norm", norm=norm, name="ffn_norm"), t("viz.layers.block_ffn",
                                                                              ffn=config.ffn), 11.6))
    for tap, norm_text, part_text, add in boxes:
        ax.plot([tap, tap], [y0, y1], color="#555", lw=1.2)                           # read the stream ...
        for x, text, color in ((tap + 1.2, norm_text, CHIP_COLORS[1]), (tap + 3.5, part_text, CHIP_COLORS[0])):
            ax.add_patch(FancyBboxPatch((x - 1.0, y1 - 0.4), 2.0, 0.8, boxstyle="round,pad=0.05", fc=color, ec="#888"))
            ax.text(x, y1, text, ha="center", va="center", fontsize=9)
        ax.annotate("", (tap + 0.2, y1), (tap, y1), arrowprops=arrow)
        ax.annotate("", (tap + 2.5, y1), (tap + 2.2, y1), arrowprops=arrow)
        ax.plot([tap + 4.5, add], [y1, y1], color="#555", lw=1.2)                    # ... and add back to it
        ax.annotate("", (add, y0 + 0.17), (add, y1), arrowprops=arrow)
        ax.add_patch(Circle((add, y0), 0.17, fc="white", ec="#555", lw=1.2, zorder=3))
        ax.text(add, y0, "+", ha="center", va="center", fontsize=13, zorder=4)
    ax.text(6.3, 2.85, t("viz.layers.block_title", n_layer=config.n_layer), ha="center", va="center", fontsize=10)
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
        widen = (t("viz.layers.ffn_gate_up", d=c.d_model, d_ff=c.d_ff) if gated
                 else t("viz.layers.ffn_up", d=c.d_model, d_ff=c.d_ff))
        for y, matrices in ((2.2, widen), (1.2, t("viz.layers.ffn_down", d=c.d_model, d_ff=c.d_ff))):
            ax.annotate("", (centre, y - 0.36), (centre, y - 0.02), arrowprops=dict(arrowstyle="->", color="#555"))
            ax.text(centre + 0.03, y - 0.19, matrices, ha="left", va="center", fontsize=7.5, color="#555")
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
                label=spaced(t("viz.layers.removed", part=name)))
    ax.axhline(base, color="#555", ls="--", lw=1, label=t("viz.layers.nothing_removed"))
    ax.set(xlabel=t("viz.layers.layer_from_0"), ylabel=t("viz.layers.p_word", word=word), ylim=(0, 1),
           xlim=(-0.5, len(probs) - 0.5))
    ax.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0, 1.01), ncols=3, frameon=False)
    fig.suptitle(t("viz.layers.ablation_title", word=word))         # the figure's: above the legend
    ax.grid(alpha=0.3)
    return fig
