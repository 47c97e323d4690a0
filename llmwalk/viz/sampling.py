"""Section 六: the next-token distribution, what temperature and the top-k / top-p / min-p cuts leave of it."""
from __future__ import annotations

import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.transforms import ScaledTranslation
from torch import Tensor

from ..i18n import t
from ..sampling import Sampler, probs_after, surgery
from ._draw import CHOSEN, KEPT, REMOVED, labels, new_figure, token_bars


def _cuts(logits: Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
         min_p: float | None = None) -> tuple[Tensor, dict[str, int]]:
    """Which tokens survive, and how many are left after each cut (generate()'s order).  # [vocab] -> [vocab] bool"""
    if temperature == 0:
        return torch.arange(logits.shape[-1]) == logits.argmax(), {t("viz.sampling.greedy"): 1}
    stages = Sampler(temperature, top_k, top_p, min_p).stages(logits)
    settings = {"top_k": top_k, "top_p": top_p, "min_p": min_p}
    left = {f"{_cut_name(name)} = {settings[name]:g}": int(x.isfinite().sum())
            for name, x in stages.items() if name != "scaled"}
    return list(stages.values())[-1].isfinite(), left


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


def _cut_name(name: str) -> str:
    """A cut's name as the reader's language writes it: top-k (English), Top-K (Chinese, as the article)."""
    return {"top_k": t("viz.sampling.cut_top_k"), "top_p": t("viz.sampling.cut_top_p"),
            "min_p": t("viz.sampling.cut_min_p")}[name]


def _settings(temperature, top_k=None, top_p=None, min_p=None) -> str:
    """'T = 0.7, top-k = 50, top-p = 0.9': the settings in effect, for a title or label."""
    parts = [f"T = {temperature:g}"] + [f"{_cut_name(name)} = {value:g}" for name, value in
                                       (("top_k", top_k), ("top_p", top_p), ("min_p", min_p)) if value is not None]
    return t("viz.sampling.settings_sep").join(parts)


def _prob_bars(ax, logits: Tensor, tokenizer, n: int) -> None:
    """The artists of prob_bars, drawn once for the n most likely tokens; _set_prob_bars fills them in."""
    ids = logits.topk(min(n, len(logits))).indices        # ÷T keeps the order: the same tokens at every temperature
    token_bars(ax, labels(tokenizer, ids), np.zeros(len(ids)), KEPT)
    _values_at_right(ax)
    ax.plot(np.zeros(len(ids)), range(len(ids)), color="#f58518", marker=".", lw=1, label=t("viz.sampling.cumulative"))
    _legend_below(ax, [ax.containers[0], ax.lines[0]], ["bars", "line"])


def _clear_x(line: np.ndarray, bars: np.ndarray) -> float:
    """Where (axes fraction) a cut's label box goes: the place farthest from the running-total line's points and
    from the ends of the bars on the two rows beside the cut, so the box covers neither."""
    def room(x: float) -> float:
        return min([*np.abs(x - line), *(x - bars)])       # a bar fills [0, its end]: only its right is free
    return max((0.3, 0.55, 0.8), key=room)


def _set_prob_bars(ax, logits: Tensor, tokenizer, temperature, top_k, top_p, min_p, chosen: int | None,
                   title: str | None) -> list:
    """Bars of the ÷T distribution's top n, removed tokens grey, their running total, the cuts marked. Returns the
    artists other settings change (not the token names on the y axis: only other logits change those)."""
    for artist in [a for a in (*ax.lines, *ax.texts) if a.get_gid() == "cut"]:
        artist.remove()                                         # the previous settings' cut marks
    probs = probs_after(logits, temperature or 1.0)              # greedy (T = 0) shows the T = 1 distribution
    kept, left = _cuts(logits, temperature, top_k, top_p, min_p)
    ids = logits.topk(len(ax.patches)).indices.tolist()
    values = probs[ids].numpy()
    ax.set_yticks(range(len(ids)), labels(tokenizer, ids))     # new logits (the next round) lead with other tokens
    for bar, text, value, i in zip(ax.patches, ax.texts, values, ids):
        bar.set_width(value)
        bar.set_facecolor(CHOSEN if i == chosen else KEPT if kept[i] else REMOVED)
        text.set_text(f" {value:.3f}")
    running = values.cumsum()
    ax.lines[0].set_xdata(running)
    # The plain softmax (notebook 05, before temperature and cuts come in) spans the whole 0–1 scale, so charts of
    # two prompts or two models compare by eye. Otherwise the axis ends just past the running total (the longest
    # thing drawn), so a flat distribution's bars (T = 2) fill the width instead of its left eighth; a running
    # total of probabilities never passes 1: at most 1.05.
    plain = temperature == 1 and not left
    right = 1.05 if plain else min(1.05, 1.15 * max(running[-1], 0.05))
    ax.set_xlim(0, right)
    marks: dict[int, list[str]] = {}
    for name, count in left.items():
        marks.setdefault(count, []).append(name)
    for count, names in marks.items():
        if count < len(ids):
            ax.axhline(count - 0.5, color="#222", ls="--", lw=1, gid="cut")
            ax.text(_clear_x(running[count - 1:count + 1] / right, values[count - 1:count + 1] / right), count - 0.5,
                    "✂ " + " · ".join(names), ha="center", va="center", fontsize=8, gid="cut",
                    transform=ax.get_yaxis_transform(), bbox=dict(fc="white", ec="#222", boxstyle="round"))
    temp = f"{temperature or 1:g}"
    cuts = (" · ".join(t("viz.sampling.keeps", cut=name, count=f"{count:,}") for name, count in left.items())
            or t("viz.sampling.no_cut"))
    ax.set(xlabel=t("viz.sampling.probability") if plain else t("viz.sampling.prob_at", temperature=temp, cuts=cuts),
           title=title or t("viz.sampling.kept_of", kept=int(kept.sum()), total=len(kept)))
    bars = (t("viz.sampling.legend_bars_cut", temperature=temp) if left
            else t("viz.sampling.legend_bars", temperature=temp))
    if top_k and top_p and temperature:     # top-p adds up top-k's survivors renormalized: p of their mass
        total = t("viz.sampling.legend_total_top_k_p")
    else:
        total = t("viz.sampling.legend_total_top_p") if top_p else t("viz.sampling.legend_total")
    for legend_text, text in zip(ax.get_legend().get_texts(), (bars, total)):
        legend_text.set_text(text)
    return [*ax.patches, *ax.spines.values(), ax.xaxis, *ax.lines, *ax.texts, ax.title, ax.get_legend()]


def prob_bars(logits: Tensor, tokenizer, temperature: float = 1.0, top_k: int | None = None,
              top_p: float | None = None, min_p: float | None = None, n: int = 15, chosen: int | None = None,
              title: str | None = None) -> Figure:
    """The n most likely next tokens: kept blue, cut grey, `chosen` red, each cut a dashed line.  # [vocab]"""
    fig = new_figure(7, 1.2 + 0.28 * n)
    _prob_bars(fig.subplots(), logits, tokenizer, n)
    update_prob_bars(fig, logits, tokenizer, temperature, top_k, top_p, min_p, chosen, title)
    return fig


def update_prob_bars(fig: Figure, logits: Tensor, tokenizer, temperature: float = 1.0, top_k: int | None = None,
                     top_p: float | None = None, min_p: float | None = None, chosen: int | None = None,
                     title: str | None = None) -> list:
    """Redraw a prob_bars figure in place for other logits or settings (the same number of bars); returns the
    artists it changed, token names included (a widget draws only these anew).  # [vocab]"""
    ax = fig.axes[0]
    return [ax.yaxis, *_set_prob_bars(ax, logits, tokenizer, temperature, top_k, top_p, min_p, chosen, title)]


def _surgery(axes, logits: Tensor, tokenizer, n: int) -> None:
    """The artists of surgery_plot, one subplot per stage, the same n tokens in each; _set_surgery fills them in."""
    ids = logits.topk(min(n, len(logits))).indices        # ÷T keeps the order: the same tokens lead at every stage
    names = labels(tokenizer, ids)
    for k, ax in enumerate(axes):
        token_bars(ax, names, np.zeros(len(ids)), KEPT)
        for y in range(len(ids)):
            ax.text(0, y, t("viz.sampling.cut"), va="center", fontsize=8, color="#888", visible=False)
        ax.set_xlabel(t("viz.sampling.logit_minus_max") if k < 2 else t("viz.sampling.probability"), fontsize=8)
        ax.set_xticks([])                 # every bar has its value written after it: ticks would say it twice
        if k < 2:
            ax.axvline(0, color="#888", lw=0.8)           # where a bar starts when a logit is negative
        ax.tick_params(labelsize=8)
        if k:
            ax.set_yticklabels([])


def _stage_name(stage: str) -> str:
    """What a figure calls a stage of sampling.surgery (which names them by identifier), in the current language."""
    return {"logits": t("viz.sampling.stage_logits"), "scaled": t("viz.sampling.stage_scaled"),
            "softmax": t("viz.sampling.stage_softmax"), "top_k": t("viz.sampling.stage_top_k"),
            "top_p": t("viz.sampling.stage_top_p")}[stage]


def _set_surgery(axes, logits: Tensor, temperature: float, top_k, top_p) -> list:
    """Bars of each stage of sampling.surgery: logits and ÷T as logit − max (softmax ignores a shift, so only the
    gaps matter: from 0 they would look alike whatever T does), then probabilities on one shared scale. Returns the
    artists other settings change: all but the first stage's (the logits themselves)."""
    steps = surgery(logits, temperature, top_k, top_p)
    n = len(axes[0].patches)
    ids = logits.topk(n).indices            # the top token is among them: its logit − max is 0
    shown = [np.where(np.isfinite(step.logits[ids].numpy()),
                      (step.logits[ids] - step.logits.max() if k < 2 else step.probs[ids]).float().numpy(), np.nan)
             for k, step in enumerate(steps)]
    top_prob = max(np.nanmax(v, initial=0) for v in shown[2:])
    for k, (ax, step, values) in enumerate(zip(axes, steps, shown)):
        fmt = "{:.2f}" if k < 2 else "{:.3f}"
        for bar, text, cut, v in zip(ax.patches, ax.texts[:n], ax.texts[n:], values):
            finite = bool(np.isfinite(v))
            bar.set_width(v if finite else 0)
            text.set(x=v if finite else 0, text=" " + fmt.format(v), visible=finite,
                     horizontalalignment="left" if not finite or v >= 0 else "right")
            cut.set_visible(not finite)
        if k < 2:                         # bars to the left of 0, room for the values on both sides
            lo = min(-1e-3, np.nanmin(values))
            ax.set_xlim(1.25 * lo, -0.2 * lo)
        else:                             # one scale for the three probability stages, room for the values
            ax.set_xlim(0, top_prob * 1.35)
        ax.set_title(t("viz.sampling.stage", stage=_stage_name(step.name), kept=step.kept,
                       removed=f"{step.removed_mass:.1%}", entropy=f"{step.entropy:.2f}"), fontsize=9)
    return [a for ax in axes[1:] for a in (*ax.patches, *ax.lines, *ax.spines.values(), *ax.texts, ax.title)]


def surgery_plot(logits: Tensor, tokenizer, temperature: float = 1.0, top_k: int | None = None,
                 top_p: float | None = None, n: int = 10) -> Figure:
    """The stages logits → ÷T → softmax → top-k → top-p side by side, removed mass and entropy.  # [vocab]"""
    fig = new_figure(14, 1.6 + 0.3 * n)
    axes = fig.subplots(1, 5)
    _surgery(axes, logits, tokenizer, n)
    _set_surgery(axes, logits, temperature, top_k, top_p)
    return fig


def sampling_panel(logits: Tensor, tokenizer, temperature: float = 1.0, top_k: int | None = None,
                   top_p: float | None = None, min_p: float | None = None, n: int = 10) -> Figure:
    """prob_bars above surgery_plot for the same settings (what sampling_widget shows).  # [vocab]"""
    fig = new_figure(14, 2.6 + 0.56 * n)
    rows = fig.add_gridspec(2, 1)      # one grid per row: the top chart's margins do not widen the bottom's gaps
    _prob_bars(fig.add_subplot(rows[0].subgridspec(1, 3, width_ratios=(1, 3, 1))[1]), logits, tokenizer, n)
    bottom = rows[1].subgridspec(1, 5)
    _surgery([fig.add_subplot(bottom[i]) for i in range(5)], logits, tokenizer, n)
    update_sampling_panel(fig, logits, tokenizer, temperature, top_k, top_p, min_p)
    return fig


def update_sampling_panel(fig: Figure, logits: Tensor, tokenizer, temperature: float = 1.0, top_k: int | None = None,
                          top_p: float | None = None, min_p: float | None = None) -> list:
    """Redraw a sampling_panel figure in place for other settings of the same logits: bar lengths, colours, texts,
    cut marks. Returns the artists it changed (a widget draws only these anew).  # [vocab]"""
    return [*_set_prob_bars(fig.axes[0], logits, tokenizer, temperature, top_k, top_p, min_p, None, None),
            *_set_surgery(fig.axes[1:6], logits, temperature, top_k, top_p)]


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
    names = labels(tokenizer, ids) + [t("viz.sampling.others")]
    shown_freq = np.append(freq[ids].numpy(), 1 - freq[ids].sum().item())
    shown_theory = np.append(theory[ids].numpy(), max(0.0, 1 - theory[ids].sum().item()))
    fig = new_figure(7, 1.4 + 0.3 * len(names))
    ax = fig.subplots()
    token_bars(ax, names, shown_freq, [KEPT] * len(ids) + [REMOVED])
    ax.scatter(shown_theory, range(len(names)), marker="|", s=250, linewidths=2, color=CHOSEN, zorder=3,
               label=t("viz.sampling.probs_after"))
    for text, x in zip(ax.texts, np.maximum(shown_freq, shown_theory)):
        text.set_x(x)                                         # past the red tick too, so it never crosses a value
    settings = _settings(temperature, top_k, top_p, min_p)
    ax.set(xlabel=t("viz.sampling.share"), title=t("viz.sampling.draws", n=n_samples, seed=seed, settings=settings))
    _legend_below(ax, [ax.containers[0], ax.collections[0]],
                  [t("viz.sampling.legend_share"), t("viz.sampling.legend_tick")])
    return fig
