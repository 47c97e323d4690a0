"""Section 四, attention: who may look at whom (the causal mask), and who actually does (the weights)."""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from ..layers import attention_scores, causal_mask
from ._draw import cell_text, heatmap, labels, new_figure, show_piece


def _mask(ax, tokens: Sequence[str], window: int | None = None) -> None:
    """The ✓/✗ matrix on one axes: row = the token asking, column = the token looked at."""
    allowed = causal_mask(len(tokens), window=window).numpy()
    im = heatmap(ax, allowed, tokens, tokens, cmap=ListedColormap(["#eeeeee", "#b7e1b0"]), vmin=0, vmax=1)
    cell_text(ax, im, [["✓" if a else "✗" for a in row] for row in allowed], fontsize=11)
    ax.xaxis.tick_top()
    ax.set(ylabel="query: the token asking", title="key: the token looked at")


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
    left.set_title("may look (the causal mask)\nkey: the token looked at", fontsize=10)
    im = _attention(right, w, names, numbers=n <= 14)
    right.xaxis.tick_top()
    right.set_title(f"does look: layer {layer}, head {head}", fontsize=10)
    right.set_yticklabels([])
    fig.colorbar(im, ax=right, label="attention weight", shrink=0.8)
    return fig


def _attention(ax, weights: np.ndarray, names: Sequence[str], numbers: bool) -> object:
    """One head's weights [T, S], the future left blank."""
    masked = np.where(np.tril(np.ones_like(weights, dtype=bool), weights.shape[1] - weights.shape[0]), weights, np.nan)
    im = heatmap(ax, masked, names[-weights.shape[1]:], names[-weights.shape[0]:], cmap="Blues", vmin=0, vmax=1)
    if numbers:
        cell_text(ax, im, [["" if np.isnan(w) else f"{w:.2f}" for w in row] for row in masked], fontsize=7)
    return im


def last_token_attention(trace, tokenizer) -> Figure:
    """Where the last token looks in every layer, mean over heads: layers down, keys across."""
    w = trace.attn[:, :, -1, :].mean(1).float().numpy()                       # [n_layer, S]
    names = labels(tokenizer, trace.ids)
    fig = new_figure(2.4 + 0.6 * w.shape[1], 1.0 + 0.17 * w.shape[0])
    ax = fig.subplots()
    heatmap(ax, w, names, [f"layer {i}" for i in range(len(w))], cmap="Blues", vmin=0, vmax=1,
            colorbar="attention weight (mean over heads)")
    ax.xaxis.tick_top()
    ax.tick_params(axis="y", labelsize=7)
    ax.set_title(f"where “{names[-1].strip()}” looks", fontsize=10)
    return fig


def attention_step(trace, model, layer: int, head: int, query: int = -1) -> Figure:
    """One query token's attention in three steps: its scores q·k/√d_head over the keys (the future: −∞), the
    softmax weights, and the mix: each key's value vector times its weight, summed into the head's output."""
    config = model.config
    a = trace.layers[layer].attn
    g = head // (config.n_head // config.n_kv_head)                                 # the k/v head it reads
    t, s = a.q.shape[1], a.k.shape[1]
    query = query % t
    scores = attention_scores(a.q[head:head + 1, query:query + 1], a.k[g:g + 1], config)[0, 0].float()   # [S]
    visible = causal_mask(t, s)[query].numpy()
    weights = a.weights[head, query].float().numpy()                                 # [S]
    parts = weights[:, None] * a.v[g].float().numpy()                                # [S, d_head]
    names = labels(model.tokenizer, trace.ids)
    y = np.arange(s)
    fig = new_figure(12, 1.6 + 0.32 * s)
    ax_s, ax_w, ax_v = fig.subplots(1, 3, width_ratios=(1, 1, 2.2))
    ax_s.barh(y, np.where(visible, scores.numpy(), 0), color="#4c78a8")
    for j in np.flatnonzero(~visible):
        ax_s.text(0, j, " −∞ (future)", va="center", fontsize=8, color="#777")
    ax_w.barh(y, weights, color="#e45756")
    for j, w in enumerate(weights):
        ax_w.text(w, j, f" {w:.2f}" if visible[j] else " 0 (masked)", va="center", fontsize=8)
    ax_w.set_xlim(0, 1.25)
    for ax, title in ((ax_s, "1. score = q·k / √d_head"), (ax_w, "2. softmax → weight")):
        ax.set_yticks(y, names)
        ax.set_ylim(s - 0.5, -0.5)                                                    # first token on top
        ax.axvline(0, color="#555", lw=0.6)
        ax.set_title(title, fontsize=10)
    ax_w.set_yticklabels([])
    rows = np.vstack([parts, parts.sum(0, keepdims=True)])
    lim = float(np.abs(rows).max()) or 1.0
    heatmap(ax_v, rows, [], [f"w·v {n}" for n in names] + ["Σ = mix"], cmap="RdBu_r", vmin=-lim, vmax=lim,
            colorbar="value")
    ax_v.axhline(s - 0.5, color="#333", lw=1.5)
    ax_v.set_xlabel(f"the {parts.shape[1]} dimensions of one head")
    ax_v.set_title("3. weighted values, summed", fontsize=10)
    fig.suptitle(f"layer {layer}, head {head} (reads k/v head {g}): query “{names[query].strip()}” (position {query})",
                 fontsize=11)
    return fig


def attention_step_widget(trace, model):
    """Layer, head and query-token controls bound to attention_step (its static twin)."""
    import ipywidgets as W
    from .widgets import PlotWidget                         # widgets imports this module: import here, not above
    n_layer, n_head, t = len(trace.layers), model.config.n_head, len(trace.ids)
    tokens = [(f"{i}: {show_piece(p)}", i) for i, p in enumerate(model.tokenizer.pieces(trace.ids))]
    return PlotWidget(lambda layer, head, query: attention_step(trace, model, layer, head, query), {
        "layer": W.IntSlider(value=0, min=0, max=n_layer - 1, description="layer", continuous_update=False),
        "head": W.IntSlider(value=0, min=0, max=n_head - 1, description="head", continuous_update=False),
        "query": W.Dropdown(options=tokens, value=t - 1, description="query token")})


def attention_heatmap(trace, tokenizer, layer: int = 0, head: int = 0) -> Figure:
    """Attention weights of one head: row = query token, column = key token it attends to."""
    w = trace.layers[layer].attn.weights[head].float().numpy()
    names = labels(tokenizer, trace.ids)
    fig = new_figure(2.2 + 0.4 * w.shape[1], 1.2 + 0.4 * w.shape[0])
    ax = fig.subplots()
    im = _attention(ax, w, names, numbers=len(names) <= 14)
    fig.colorbar(im, ax=ax, label="attention weight", shrink=0.8)
    ax.set(title=f"layer {layer}, head {head}", xlabel="key (looked at)", ylabel="query (asking)")
    return fig


def attention_heads(trace, tokenizer, layer: int = 0) -> Figure:
    """All heads of one layer side by side."""
    w = trace.layers[layer].attn.weights.float().numpy()           # [n_head, T, S]
    names = labels(tokenizer, trace.ids, limit=8)
    n_head = len(w)
    cols = math.ceil(math.sqrt(n_head))
    rows = math.ceil(n_head / cols)
    side = 1.0 + 0.22 * w.shape[-1]
    fig = new_figure(cols * side + 0.8, rows * side + 0.5)
    axes = fig.subplots(rows, cols, squeeze=False)
    for h, ax in enumerate(axes.flat):
        if h >= n_head:
            ax.axis("off")
            continue
        im = _attention(ax, w[h], names, numbers=False)
        ax.set_title(f"head {h}", fontsize=9)
        ax.tick_params(labelsize=7)
        if h % cols:
            ax.set_yticklabels([])
        if h < n_head - cols:
            ax.set_xticklabels([])
    fig.colorbar(im, ax=axes, label="attention weight", shrink=0.6)
    fig.suptitle(f"layer {layer}: {n_head} heads")
    return fig
