"""Section 三: token vectors, how alike they are, and the two ways of telling the model where a token stands."""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from torch import Tensor

from ..embedding import rope_angles
from ..i18n import t
from ._draw import cell_text, heatmap, new_figure


def cosine(a: Tensor, b: Tensor) -> np.ndarray:
    """Cosine similarity between every row of a and every row of b.  # [n, d], [m, d] -> [n, m]"""
    a, b = torch.nn.functional.normalize(a.float(), dim=-1), torch.nn.functional.normalize(b.float(), dim=-1)
    return (a @ b.T).numpy()


def vector_strips(vectors: Tensor, labels: Sequence[str]) -> Figure:
    """Each vector as a 1×d strip of colours, one strip per label.  # [n, d] (or [d])"""
    v = vectors.float().reshape(-1, vectors.shape[-1]).numpy()
    lim = float(np.percentile(np.abs(v), 99)) or 1.0      # a few huge entries would wash out the rest
    fig = new_figure(10, 0.9 + 0.35 * len(v))
    ax = fig.subplots()
    heatmap(ax, v, [], labels, cmap="RdBu_r", vmin=-lim, vmax=lim, colorbar=t("viz.embedding.value"))
    # ticks 0, 100, …: to find the large dimensions a notebook prints (heatmap labels no column here)
    ax.xaxis.set_major_locator(MaxNLocator(10, steps=[1, 2, 5, 10], integer=True))
    ax.xaxis.set_major_formatter("{x:.0f}")
    ax.tick_params(axis="x", length=3)
    ax.set_xlabel(t("viz.embedding.dimensions", last=v.shape[1] - 1))
    return fig


def similarity_matrix(vectors: Tensor, labels: Sequence[str]) -> Figure:
    """Cosine similarity between every pair of vectors.  # [n, d]"""
    sim = cosine(vectors, vectors)
    n = len(labels)
    fig = new_figure(2 + 0.45 * n, 1.5 + 0.4 * n)
    ax = fig.subplots()
    im = heatmap(ax, sim, labels, labels, cmap="RdBu_r", vmin=-1, vmax=1, colorbar=t("viz.embedding.cosine"))
    if n <= 16:
        cell_text(ax, im, [[f"{s:.2f}" for s in row] for row in sim], fontsize=7)
    return fig


def position_table(table: Tensor, n_pos: int = 128) -> Figure:
    """Learned position embeddings (GPT-2): the table, and how alike the vectors of two positions are.  # [n_pos, d]"""
    rows = table[:n_pos].float()
    fig = new_figure(11, 4)
    left, right = fig.subplots(1, 2, width_ratios=(1.6, 1))
    lim = float(np.percentile(rows.abs().numpy(), 99)) or 1.0
    im = left.imshow(rows.numpy(), cmap="RdBu_r", vmin=-lim, vmax=lim, aspect="auto", interpolation="nearest")
    left.set(xlabel=t("viz.embedding.dimension"), ylabel=t("viz.embedding.position"),
             title=t("viz.embedding.position_table", rows=len(rows)))
    fig.colorbar(im, ax=left, shrink=0.8)
    im = right.imshow(cosine(rows, rows), cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
    right.set(xlabel=t("viz.embedding.position"), ylabel=t("viz.embedding.position"),
              title=t("viz.embedding.position_cosine"))
    fig.colorbar(im, ax=right, shrink=0.8)
    return fig


def rope_frequencies(d_head: int = 64, theta: float = 10000.0, n_pos: int = 64) -> Figure:
    """RoPE: the rotation angle of each dimension pair at each position, and how many positions one turn takes."""
    cos, sin = rope_angles(torch.arange(n_pos), d_head, theta)
    half = d_head // 2
    angles = torch.atan2(sin[:, :half], cos[:, :half])          # [n_pos, d_head/2], wrapped to (-π, π]
    cos1, sin1 = rope_angles(torch.ones(1), d_head, theta)
    speed = torch.atan2(sin1[0, :half], cos1[0, :half])           # radians per position of each pair
    fig = new_figure(11, 3.8)
    left, right = fig.subplots(1, 2, width_ratios=(1.6, 1))
    im = left.imshow(angles.T.numpy(), cmap="twilight", vmin=-np.pi, vmax=np.pi, aspect="auto",
                     interpolation="nearest")
    left.set(xlabel=t("viz.embedding.position"), ylabel=t("viz.embedding.pair"),
             title=t("viz.embedding.rope_angle", theta=f"{theta:g}", d_head=d_head))
    fig.colorbar(im, ax=left, shrink=0.8, label=t("viz.embedding.angle"))
    right.semilogy(range(half), (2 * np.pi / speed).numpy(), marker=".")
    right.set(xlabel=t("viz.embedding.pair"), ylabel=t("viz.embedding.per_turn"), title=t("viz.embedding.turn_title"))
    right.grid(alpha=0.3)
    return fig


def order_demo(trace_a, trace_b, labels_a: Sequence[str], labels_b: Sequence[str]) -> Figure:
    """人咬狗 vs 狗咬人: the same token vectors in another order, and how each token drifts apart, layer by layer."""
    order_a, order_b = trace_a.ids.argsort(stable=True), trace_b.ids.argsort(stable=True)
    if not torch.equal(trace_a.ids[order_a], trace_b.ids[order_b]):
        raise ValueError("order_demo compares two orders of the same tokens: the two traces hold different tokens")
    fig = new_figure(12, 4.2)
    left, right = fig.subplots(1, 2, width_ratios=(1, 1.8))
    sim = cosine(trace_a.tok_emb, trace_b.tok_emb)
    # a colourbar without a label: the title names it, and a label would crowd the right panel's y-label
    im = heatmap(left, sim, labels_b, labels_a, cmap="RdBu_r", vmin=-1, vmax=1, colorbar="")
    if max(sim.shape) <= 12:                          # small enough to write every value in its cell
        cell_text(left, im, [[f"{round(float(s), 2) or 0.0:.2f}" for s in row] for row in sim], fontsize=7)
    else:                                             # only mark the pairs that are the same vector
        cell_text(left, im, [["1" if s > 0.9999 else "" for s in row] for row in sim])
    left.set(xlabel=t("viz.embedding.second_text"), ylabel=t("viz.embedding.first_text"))   # which text is which
    same = torch.equal(trace_a.tok_emb[order_a], trace_b.tok_emb[order_b])
    left.set_title(t("viz.embedding.order_same", same=t("viz.embedding.yes") if same else t("viz.embedding.no")))
    stages = [("emb", trace_a.tok_emb, trace_b.tok_emb)]              # layers from 0, as everywhere (resid_axis)
    if trace_a.pos_emb is not None:
        stages.append(("emb + pos", trace_a.x0, trace_b.x0))
    stages += [(str(i), a.resid_post, b.resid_post) for i, (a, b) in enumerate(zip(trace_a.layers, trace_b.layers))]
    # each token against itself in the other sentence
    sims = np.array([np.diag(cosine(a[order_a], b[order_b])) for _, a, b in stages])     # [stages, T]
    x = np.arange(len(stages))
    right.bar(x, sims.mean(1), color="#4c78a8", label=t("viz.embedding.mean_tokens"))
    right.plot(x, sims.min(1), "v", color="#e45756", label=t("viz.embedding.least_similar"))
    right.set_xticks(x, [s for s, _, _ in stages], rotation=90, fontsize=8)
    right.set(xlabel=t("viz.embedding.after_layer"), ylabel=t("viz.embedding.cosine"),
              ylim=(min(0, sims.min()) - 0.05, 1.05), title=t("viz.embedding.order_title"))
    right.axhline(1, color="#888", lw=0.8, ls=":")
    right.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))       # beside the bars, not on them
    right.spines[["top", "right"]].set_visible(False)
    return fig
