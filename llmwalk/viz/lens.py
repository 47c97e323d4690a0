"""Section 五, the logit lens: read every layer's residual stream through the LM head, as if it were the last."""
from __future__ import annotations

import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from ..head import lens_path, logit_lens
from ..i18n import t
from ._draw import cell_text, heatmap, labels, new_figure, show_piece
from .layers import resid_axis


def _text_grid(top_probs: torch.Tensor, top_ids: torch.Tensor, tokenizer, columns: list[str], title: str) -> Figure:
    """Layers down, `columns` across: the token in each cell, coloured by its probability.  # [L + 1, C] each"""
    rows, cols = top_probs.shape
    fig = new_figure(1.6 + 0.8 * cols, 0.8 + 0.2 * rows)
    ax = fig.subplots()
    layers = [t("viz.lens.embedding")] + [t("viz.lens.after_layer", layer=i) for i in range(rows - 1)]
    im = heatmap(ax, top_probs.numpy(), columns, layers, cmap="Blues", vmin=0, vmax=1,
                 colorbar=t("viz.lens.probability"))
    texts = [[show_piece(p, 8) for p in tokenizer.pieces(row)] for row in top_ids.tolist()]
    cell_text(ax, im, texts, fontsize=7)
    ax.xaxis.tick_top()
    ax.tick_params(axis="y", labelsize=7)
    ax.set_title(title)
    return fig


def logit_lens_grid(trace, model) -> Figure:
    """The most likely next token at every layer (down) and position (across); the last row is the model's answer."""
    top = logit_lens(trace.resid, model.weights, model.config).float().softmax(-1).max(dim=-1)   # [L + 1, T]
    return _text_grid(top.values, top.indices, model.tokenizer, labels(model.tokenizer, trace.ids, 8),
                      t("viz.lens.grid_title"))


def logit_lens_top(trace, model, position: int = -1, k: int = 5) -> Figure:
    """The k most likely next tokens after each layer, at one position."""
    top = logit_lens(trace.resid[:, position], model.weights, model.config).float().softmax(-1).topk(k, dim=-1)
    word = labels(model.tokenizer, [trace.ids[position]], limit=None)[0]
    return _text_grid(top.values, top.indices, model.tokenizer, [f"#{r}" for r in range(1, k + 1)],
                      t("viz.lens.top_title", word=word, position=position % len(trace.ids)))


def token_rank(trace, model, token: int | str, position: int = -1) -> Figure:
    """Rank (log scale) and probability of one token, layer by layer, at one position."""
    if isinstance(token, str):
        token = model.tokenizer.token_id(token)     # without the <bos> Gemma's encode() puts in front
    path = lens_path(model, trace, token, position)
    rank, prob = np.array(path["rank"]), np.array(path["prob"])
    layers = np.arange(-1, len(rank) - 1)                             # -1: the embedding, i: after layer i
    fig = new_figure(9, 3.8)
    ax = fig.subplots()
    ax.semilogy(layers, rank, marker="o", color="#4c78a8")
    ax.set_ylim(rank.max() * 2, 0.7)                                   # rank 1 on top
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    word = show_piece(model.tokenizer.pieces([token])[0])
    resid_axis(ax, len(rank) - 1)
    ax.set(title=t("viz.lens.rank_title", word=word))
    ax.grid(alpha=0.3)
    right = ax.twinx()
    right.plot(layers, prob, marker=".", color="#e45756")
    right.set_ylim(0, 1)
    right.set_ylabel(t("viz.lens.probability"), color="#e45756")
    ax.set_ylabel(t("viz.lens.rank"), color="#4c78a8")
    return fig
