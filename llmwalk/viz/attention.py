"""Section 四, attention: who may look at whom (the causal mask), and who actually does (the weights)."""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure

from ..layers import causal_mask
from ._draw import cell_text, heatmap, labels, new_figure


def mask_plot(tokens: Sequence[str], window: int | None = None) -> Figure:
    """The causal mask as the article draws it: row = the token asking, ✓ where it may look, ✗ where it may not."""
    allowed = causal_mask(len(tokens), window=window).numpy()
    n = len(tokens)
    fig = new_figure(1.4 + 0.42 * n, 1.1 + 0.42 * n)
    ax = fig.subplots()
    im = heatmap(ax, allowed, tokens, tokens, cmap=ListedColormap(["#eeeeee", "#b7e1b0"]), vmin=0, vmax=1)
    cell_text(ax, im, [["✓" if a else "✗" for a in row] for row in allowed], fontsize=11)
    ax.xaxis.tick_top()
    ax.set(ylabel="query: the token asking", title="key: the token looked at")
    return fig


def _attention(ax, weights: np.ndarray, names: Sequence[str], numbers: bool) -> object:
    """One head's weights [T, S], the future left blank."""
    masked = np.where(np.tril(np.ones_like(weights, dtype=bool), weights.shape[1] - weights.shape[0]), weights, np.nan)
    im = heatmap(ax, masked, names[-weights.shape[1]:], names[-weights.shape[0]:], cmap="Blues", vmin=0, vmax=1)
    if numbers:
        cell_text(ax, im, [["" if np.isnan(w) else f"{w:.2f}" for w in row] for row in masked], fontsize=7)
    return im


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
