"""Section 四, attention: who may look at whom (the causal mask), and who actually does (the weights).

The widgets' plots come in two parts: one function lays the figure out for a trace, another fills it for a layer,
head (and query); a slider move runs only the second (no new figure, no new tick labels)."""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from ..i18n import t
from ..layers import attention_scores, causal_mask
from ._draw import cell_text, every_nth, heatmap, labels, new_figure, set_xticks

NUMBERS_UP_TO = 14        # tokens: a grid this small gets each weight written in its cell
ROWS_UP_TO = 30           # tokens: attention_step writes each row's value next to its bar up to this many keys
FIGURE_INCHES = 8         # the grid of a long prompt shrinks its cells to fit this many inches
PANEL_INCHES = 2.6        # ... and one head's panel in attention_heads (3 across stay a page wide)
PANEL_TICKS = 16          # tick labels per panel axis: more 7-point labels would overlap on PANEL_INCHES


def _cell(n: int, largest: float, fit: float = FIGURE_INCHES) -> float:
    """Inches per heatmap cell: `largest` for a short prompt, smaller so that n cells fit `fit` inches."""
    return min(largest, fit / max(n, 1))


def _mask(ax, tokens: Sequence[str], window: int | None = None) -> None:
    """The ✓/✗ matrix on one axes: row = the token asking, column = the token looked at."""
    allowed = causal_mask(len(tokens), window=window).numpy()
    im = heatmap(ax, allowed, tokens, tokens, cmap=ListedColormap(["#eeeeee", "#b7e1b0"]), vmin=0, vmax=1)
    cell_text(ax, im, [["✓" if a else "✗" for a in row] for row in allowed], fontsize=11)
    ax.xaxis.tick_top()
    ax.set(ylabel=t("viz.attention.query_asking"), title=t("viz.attention.key_looked_at"))


def mask_plot(tokens: Sequence[str], window: int | None = None) -> Figure:
    """The causal mask as the article draws it: row = the token asking, ✓ where it may look, ✗ where it may not."""
    n = len(tokens)
    fig = new_figure(1.4 + 0.42 * n, 1.1 + 0.42 * n)
    _mask(fig.subplots(), tokens, window)
    return fig


def mask_and_attention(trace, tokenizer, layer: int, head: int) -> Figure:
    """The article's ✓/✗ matrix over the model's own tokens, next to what one head really does with it."""
    names = labels(tokenizer, trace.ids)
    w = trace.layers[layer].attn.weights[head].float().numpy()
    n = len(names)
    fig = new_figure(3.2 + 0.9 * n, 1.4 + 0.45 * n)
    left, right = fig.subplots(1, 2)
    _mask(left, names)
    left.set_title(t("viz.attention.may_look"), fontsize=10)
    im = _attention(right, w, names)
    right.xaxis.tick_top()
    right.set_title(t("viz.attention.does_look", layer=layer, head=head), fontsize=10)
    right.set_yticklabels([])
    fig.colorbar(im, ax=right, label=t("viz.attention.weight"), shrink=0.8)
    return fig


def _future_blank(weights: np.ndarray) -> np.ndarray:
    """One head's weights [T, S] with the future (where the mask allowed nothing) as NaN: drawn blank."""
    return np.where(np.tril(np.ones_like(weights, dtype=bool), weights.shape[1] - weights.shape[0]), weights, np.nan)


def _attention(ax, weights: np.ndarray, names: Sequence[str], numbers: bool | None = None) -> object:
    """One head's weights [T, S], the future left blank, each weight written in its cell on a small grid
    (numbers=None: when there are at most NUMBERS_UP_TO tokens)."""
    im = heatmap(ax, _future_blank(weights), names[-weights.shape[1]:], names[-weights.shape[0]:], cmap="Blues",
                 vmin=0, vmax=1)
    ax.set_gid("numbers" if (len(names) <= NUMBERS_UP_TO if numbers is None else numbers) else None)
    _set_attention(ax, weights)
    return im


def _set_attention(ax, weights: np.ndarray) -> None:
    """Show other weights [T, S] in an _attention axes: the image data, and the cell numbers if it has them."""
    masked = _future_blank(weights)
    im = ax.images[0]
    im.set_data(masked)
    if ax.get_gid() == "numbers":
        for text in list(ax.texts):
            text.remove()
        cell_text(ax, im, [["" if np.isnan(w) else f"{w:.2f}" for w in row] for row in masked], fontsize=7)


def last_token_attention(trace, tokenizer) -> Figure:
    """Where the last token looks in every layer, mean over heads: layers down, keys across."""
    w = trace.attn[:, :, -1, :].mean(1).float().numpy()                       # [n_layer, S]
    names = labels(tokenizer, trace.ids)
    fig = new_figure(2.4 + 1.5 * _cell(w.shape[1], 0.4) * w.shape[1], 1.0 + 0.17 * w.shape[0])
    ax = fig.subplots()
    heatmap(ax, w, names, [t("viz.attention.layer_row", layer=i) for i in range(len(w))], cmap="Blues", vmin=0,
            vmax=1, colorbar=t("viz.attention.weight_mean_heads"))
    ax.xaxis.tick_top()
    ax.tick_params(axis="y", labelsize=7)
    ax.set_title(t("viz.attention.where_looks", token=names[-1].strip()), fontsize=10)
    return fig


def attention_step(trace, model, layer: int, head: int, query: int = -1) -> Figure:
    """One query token's attention in three steps: its scores q·k/√d_head over the keys (the future: −∞), the
    softmax weights, and the mix: each key's value vector times its weight, summed into the head's output."""
    names = labels(model.tokenizer, trace.ids)
    s, d_head = trace.layers[0].attn.k.shape[1], trace.layers[0].attn.v.shape[-1]
    fig = new_figure(12, 1.6 + _cell(s, 0.32) * s)
    _step_axes(fig, names, s, d_head)
    update_attention_step(fig, trace, model, layer, head, query)
    return fig


def _step_axes(fig: Figure, names: Sequence[str], s: int, d_head: int) -> None:
    """The artists of attention_step for S keys, filled with zeros: update_attention_step sets them."""
    y = np.arange(s)
    ax_s, ax_w, ax_v = fig.subplots(1, 3, width_ratios=(1, 1, 2.2))
    ax_s.barh(y, np.zeros(s), color="#4c78a8")
    ax_w.barh(y, np.zeros(s), color="#e45756")
    if s <= ROWS_UP_TO:                    # one text per row, shown or filled by the update
        for j in y:
            ax_s.text(0, j, t("viz.attention.future"), va="center", fontsize=8, color="#777")
            ax_w.text(0, j, "", va="center", fontsize=8)
    ax_w.set_xlim(0, 1.25)                 # room for the value written after a bar; a weight is at most 1
    ax_w.set_xticks([0, 0.5, 1])
    for ax, title in ((ax_s, t("viz.attention.step_score")), (ax_w, t("viz.attention.step_softmax"))):
        ax.set_yticks(*every_nth(names))
        ax.set_ylim(s - 0.5, -0.5)                                                    # first token on top
        ax.axvline(0, color="#555", lw=0.6)
        ax.set_title(title, fontsize=10)
    ax_w.set_yticklabels([])
    heatmap(ax_v, np.zeros((s + 1, d_head)), [], [f"w·v {n}" for n in names] + [t("viz.attention.step_sum")],
            cmap="RdBu_r", vmin=-1, vmax=1, colorbar=t("viz.attention.value"))
    ax_v.axhline(s - 0.5, color="#333", lw=1.5)
    ax_v.set_xlabel(t("viz.attention.head_dims", d=d_head))
    ax_v.set_title(t("viz.attention.step_mix"), fontsize=10)
    fig.suptitle("", fontsize=11)


def update_attention_step(fig: Figure, trace, model, layer: int, head: int, query: int = -1) -> list:
    """Redraw an attention_step figure in place for another layer, head or query token (the same trace); returns
    the artists it changed (a widget draws only these anew)."""
    config = model.config
    a = trace.layers[layer].attn
    g = head // (config.n_head // config.n_kv_head)                                 # the k/v head it reads
    tq, s = a.q.shape[1], a.k.shape[1]
    query = query % tq
    scores = attention_scores(a.q[head:head + 1, query:query + 1], a.k[g:g + 1], config)[0, 0].float()   # [S]
    visible = causal_mask(tq, s)[query].numpy()
    weights = a.weights[head, query].float().numpy()                                 # [S]
    parts = weights[:, None] * a.v[g].float().numpy()                                # [S, d_head]
    ax_s, ax_w, ax_v = fig.axes[:3]
    for bar, value in zip(ax_s.patches, np.where(visible, scores.numpy(), 0)):
        bar.set_width(value)
    for bar, value in zip(ax_w.patches, weights):
        bar.set_width(value)
    for j, (future, text) in enumerate(zip(ax_s.texts, ax_w.texts)):
        future.set_visible(not visible[j])
        text.set(x=weights[j], text=f" {weights[j]:.2f}" if visible[j] else t("viz.attention.masked"))
    ax_s.relim()
    ax_s.autoscale_view()
    rows = np.vstack([parts, parts.sum(0, keepdims=True)])
    lim = float(np.abs(rows).max()) or 1.0
    ax_v.images[0].set_data(rows)
    ax_v.images[0].set_clim(-lim, lim)
    token = labels(model.tokenizer, [int(trace.ids[query])])[0].strip()
    fig.texts[0].set_text(t("viz.attention.step_title", layer=layer, head=head, group=g, token=token,
                            position=query))
    # Not the token names on the y axes, nor the weights' fixed x axis: drawing those again is most of a redraw.
    # The colorbar (axes[3]) keeps its look for any clim: only its tick labels change.
    return [*ax_s.patches, *ax_s.lines, *ax_s.spines.values(), ax_s.xaxis, *ax_s.texts,
            *ax_w.patches, *ax_w.lines, *ax_w.spines.values(), *ax_w.texts,
            ax_v.images[0], *ax_v.lines, *ax_v.spines.values(), fig.axes[3].yaxis, fig.texts[0]]


def attention_heatmap(trace, tokenizer, layer: int = 0, head: int = 0) -> Figure:
    """Attention weights of one head: row = query token, column = key token it attends to. On a long prompt the
    cells shrink to fit, every n-th token is labelled and the weights are not written in the cells."""
    w = trace.layers[layer].attn.weights[head].float().numpy()
    names = labels(tokenizer, trace.ids)
    fig = new_figure(2.2 + _cell(w.shape[1], 0.4) * w.shape[1], 1.2 + _cell(w.shape[0], 0.4) * w.shape[0])
    ax = fig.subplots()
    im = _attention(ax, w, names)
    fig.colorbar(im, ax=ax, label=t("viz.attention.weight"), shrink=0.8)
    ax.set(xlabel=t("viz.attention.key_axis"), ylabel=t("viz.attention.query_axis"))
    update_attention_heatmap(fig, trace, layer, head)
    return fig


def update_attention_heatmap(fig: Figure, trace, layer: int, head: int) -> list:
    """Redraw an attention_heatmap figure in place for another layer and head of the same trace; returns the
    artists it changed (the image, the title, the cell numbers: a widget draws only these anew)."""
    ax = fig.axes[0]
    _set_attention(ax, trace.layers[layer].attn.weights[head].float().numpy())
    ax.set_title(t("viz.attention.layer_head", layer=layer, head=head))
    return [ax.images[0], *ax.spines.values(), ax.title, *ax.texts]           # in drawing order (zorder)


def attention_heads(trace, tokenizer, layer: int = 0) -> Figure:
    """All heads of one layer side by side. On a long prompt the panels stop growing (the cells shrink) and
    label every n-th token."""
    w = trace.layers[layer].attn.weights.float().numpy()           # [n_head, T, S]
    names = labels(tokenizer, trace.ids, limit=8)
    n_head = len(w)
    cols = math.ceil(math.sqrt(n_head))
    rows = math.ceil(n_head / cols)
    side = 1.0 + _cell(w.shape[-1], 0.22, PANEL_INCHES) * w.shape[-1]
    fig = new_figure(cols * side + 0.8, rows * side + 0.5)
    axes = fig.subplots(rows, cols, squeeze=False)
    for h, ax in enumerate(axes.flat):
        if h >= n_head:
            ax.axis("off")
            continue
        im = _attention(ax, w[h], names, numbers=False)
        if len(names) > PANEL_TICKS:
            set_xticks(ax, *every_nth(names, PANEL_TICKS), fontsize=7)
            ax.set_yticks(*every_nth(names, PANEL_TICKS))
        ax.set_title(t("viz.attention.head", head=h), fontsize=9)
        ax.tick_params(labelsize=7)
        if h % cols:
            ax.set_yticklabels([])
        if h < n_head - cols:
            ax.set_xticklabels([])
    fig.colorbar(im, ax=axes, label=t("viz.attention.weight"), shrink=0.6)
    fig.suptitle(t("viz.attention.heads_title", layer=layer, n=n_head))
    return fig
