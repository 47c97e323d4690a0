"""Section 六: the next-token distribution, what temperature and the top-k / top-p / min-p cuts leave of it."""
from __future__ import annotations

import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.transforms import ScaledTranslation
from torch import Tensor

from ..sampling import apply_temperature, min_p_filter, probs_after, surgery, top_k_filter, top_p_filter
from ._draw import CHOSEN, KEPT, REMOVED, labels, new_figure, token_bars


def _cuts(logits: Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
         min_p: float | None = None) -> tuple[Tensor, dict[str, int]]:
    """Which tokens survive, and how many are left after each cut (generate()'s order).  # [vocab] -> [vocab] bool"""
    if temperature == 0:
        return torch.arange(logits.shape[-1]) == logits.argmax(), {"greedy (T = 0)": 1}
    x, left = apply_temperature(logits, temperature), {}
    for name, value, cut in (("top-k", top_k, top_k_filter), ("top-p", top_p, top_p_filter),
                             ("min-p", min_p, min_p_filter)):
        if value is not None:
            x = cut(x, value)
            left[f"{name} = {value:g}"] = int(x.isfinite().sum())
    return x.isfinite(), left


def _values_at_right(ax) -> None:
    """Move the value labels token_bars wrote after each bar to a column right of the axes, clear of any line."""
    for text in ax.texts:
        text.set_x(1.0)
        text.set_transform(ax.get_yaxis_transform())              # x: axes fraction, y: the bar's row
        text.set_horizontalalignment("left")


def _legend_below(ax, handles, texts, drop: float = 0.45) -> None:
    """The legend under the x axis label (`drop` inches below the axes), where it can hide no bar and no label."""
    below = ax.transAxes + ScaledTranslation(0, -drop, ax.figure.dpi_scale_trans)
    ax.legend(handles, texts, loc="upper center", bbox_to_anchor=(0.5, 0), bbox_transform=below, fontsize=8,
              frameon=False)


def _settings(temperature, top_k=None, top_p=None, min_p=None) -> str:
    """'T = 0.7, top-k = 50, top-p = 0.9': the settings in effect, for a title or label."""
    parts = [f"T = {temperature:g}"] + [f"{name} = {value:g}" for name, value in
                                       (("top-k", top_k), ("top-p", top_p), ("min-p", min_p)) if value is not None]
    return ", ".join(parts)


def _prob_bars(ax, logits: Tensor, tokenizer, temperature, top_k, top_p, min_p, n: int, chosen: int | None,
               title: str | None) -> None:
    """Bars of the ÷T distribution's top n, removed tokens grey, cumulative mass line and the cuts marked."""
    scaled = logits.float() / (temperature or 1.0)            # greedy (T = 0) shows the T = 1 distribution
    probs = scaled.softmax(-1)
    kept, left = _cuts(logits, temperature, top_k, top_p, min_p)
    top = probs.topk(min(n, len(probs)))
    ids = top.indices.tolist()
    colors = [CHOSEN if i == chosen else KEPT if kept[i] else REMOVED for i in ids]
    token_bars(ax, labels(tokenizer, ids), top.values.numpy(), colors)
    _values_at_right(ax)
    after_k = bool(top_k and temperature)                     # top-p adds up what top-k left, renormalized
    seen = top_k_filter(scaled, top_k).softmax(-1) if after_k else probs
    line, = ax.plot(seen[ids].cumsum(0).numpy(), range(len(ids)), color="#f58518", marker=".", lw=1,
                    label="cumulative" + (" after top-k" if after_k else ""))
    marks: dict[int, list[str]] = {}
    for name, count in left.items():
        marks.setdefault(count, []).append(name)
    for count, names in marks.items():
        if count < len(ids):
            ax.axhline(count - 0.5, color="#222", ls="--", lw=1)
            ax.text(0.55, count - 0.5, "✂ " + " · ".join(names), ha="center", va="center", fontsize=8,
                    transform=ax.get_yaxis_transform(), bbox=dict(fc="white", ec="#222", boxstyle="round"))
    t = f"{temperature or 1:g}"
    cuts = " · ".join(f"{name} keeps {count:,}" for name, count in left.items()) or "no cut"
    ax.set(xlim=(0, 1.05), xlabel=f"probability at T = {t}   ({cuts})",
           title=title or f"{int(kept.sum())} of {len(kept)} tokens kept")
    bars = f"bars: probability at T = {t}" + (", before the cuts (grey: cut)" if left else "") + "; value at right"
    total = ("line: running total after top-k, i.e. of top-k's survivors renormalized (top-p cuts where it reaches p)"
             if after_k else "line: running total of the bars" + (" (top-p cuts where it reaches p)" if top_p else ""))
    _legend_below(ax, [ax.containers[0], line], [bars, total])


def prob_bars(logits: Tensor, tokenizer, temperature: float = 1.0, top_k: int | None = None,
              top_p: float | None = None, min_p: float | None = None, n: int = 15, chosen: int | None = None,
              title: str | None = None) -> Figure:
    """The n most likely next tokens: kept blue, cut grey, `chosen` red, each cut a dashed line.  # [vocab]"""
    fig = new_figure(7, 1.2 + 0.28 * n)
    ax = fig.subplots()
    _prob_bars(ax, logits, tokenizer, temperature, top_k, top_p, min_p, n, chosen, title)
    return fig


def _surgery(axes, logits: Tensor, tokenizer, temperature: float, top_k, top_p, n: int) -> None:
    """One subplot per stage of sampling.surgery, the same n tokens in each."""
    steps = surgery(logits, temperature, top_k, top_p)
    ids = logits.topk(min(n, len(logits))).indices       # ÷T keeps the order: the same tokens lead at every stage
    names = labels(tokenizer, ids)
    for k, (ax, step) in enumerate(zip(axes, steps)):
        values = (step.logits if k < 2 else step.probs)[ids].float().numpy()
        cut = ~np.isfinite(step.logits[ids].numpy())
        token_bars(ax, names, np.where(cut, np.nan, values), KEPT, ("{:.2f}" if k < 2 else "{:.3f}").format)
        for y in np.flatnonzero(cut):
            ax.text(0, y, " ✂ cut", va="center", fontsize=8, color="#888")
        if k >= 2:
            ax.set_xlim(0, 1.2)
        ax.set_title(f"{step.name}\nkept {step.kept} · removed {step.removed_mass:.1%}\n"
                     f"entropy {step.entropy:.2f} nats", fontsize=9)
        ax.set_xlabel("logit" if k < 2 else "probability", fontsize=8)
        ax.tick_params(labelsize=8)
        if k:
            ax.set_yticklabels([])


def surgery_plot(logits: Tensor, tokenizer, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, n: int = 10) -> Figure:
    """The stages logits → ÷T → softmax → top-k → top-p side by side, removed mass and entropy.  # [vocab]"""
    fig = new_figure(14, 1.6 + 0.3 * n)
    _surgery(fig.subplots(1, 5), logits, tokenizer, temperature, top_k, top_p, n)
    return fig


def sampling_panel(logits: Tensor, tokenizer, temperature: float = 1.0, top_k: int | None = None,
                   top_p: float | None = None, min_p: float | None = None, n: int = 10) -> Figure:
    """prob_bars above surgery_plot for the same settings (what sampling_widget shows).  # [vocab]"""
    fig = new_figure(14, 2.6 + 0.56 * n)
    grid = fig.add_gridspec(2, 5)
    _prob_bars(fig.add_subplot(grid[0, 1:4]), logits, tokenizer, temperature, top_k, top_p, min_p, n, None, None)
    _surgery([fig.add_subplot(grid[1, i]) for i in range(5)], logits, tokenizer, temperature, top_k, top_p, n)
    return fig


def sample_histogram(logits: Tensor, tokenizer, n_samples: int = 1000, temperature: float = 1.0,
                     top_k: int | None = None, top_p: float | None = None, min_p: float | None = None,
                     seed: int = 0, n: int = 12) -> Figure:
    """How often each token comes out of n_samples seeded draws (bars) next to its probability (ticks).  # [vocab]"""
    # sample() is torch.multinomial over probs_after; drawing n_samples at once with replacement is the same
    # distribution as n_samples calls, without n_samples full-vocabulary passes (seconds for 1000 draws).
    theory = probs_after(logits, temperature, top_k, top_p, min_p).float()
    draws = torch.multinomial(theory, n_samples, replacement=True, generator=torch.Generator().manual_seed(seed))
    freq = torch.bincount(draws, minlength=len(logits)).float() / n_samples
    ids = theory.topk(min(n, len(theory))).indices
    names = labels(tokenizer, ids) + ["(others)"]
    shown_freq = np.append(freq[ids].numpy(), 1 - freq[ids].sum().item())
    shown_theory = np.append(theory[ids].numpy(), max(0.0, 1 - theory[ids].sum().item()))
    fig = new_figure(7, 1.4 + 0.3 * len(names))
    ax = fig.subplots()
    token_bars(ax, names, shown_freq, [KEPT] * len(ids) + [REMOVED])
    ax.scatter(shown_theory, range(len(names)), marker="|", s=250, linewidths=2, color=CHOSEN, zorder=3,
               label="probability (probs_after)")
    for text, x in zip(ax.texts, np.maximum(shown_freq, shown_theory)):
        text.set_x(x)                                         # past the red tick too, so it never crosses a value
    settings = _settings(temperature, top_k, top_p, min_p)
    ax.set(xlabel="share of draws", title=f"{n_samples} draws (seed {seed}, {settings})")
    _legend_below(ax, [ax.containers[0], ax.collections[0]],
                  ["bars: share of the draws (grey: all other tokens together)",
                   "red tick: probability after the cuts (probs_after)"])
    return fig
