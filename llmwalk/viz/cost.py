"""Sections 八 and 九: where the time and the FLOPs go, memory by number format, and the three optimizations."""
from __future__ import annotations

import re
from typing import Sequence

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter
from torch import Tensor

from ..i18n import language, t, table
from ._draw import CHIP_COLORS, KEPT, Chip, chip_figure, new_figure, si, token_bars


def stage_label(stage: str) -> str:
    """How a figure names a stage identifier of cost.flops_by_stage or timed_forward ("attn_q", "lm head", ...) in
    the current language (viz.toml's [stage]); the code keeps the identifiers. Unknown names show as they are."""
    return table(language()).get("viz.stage." + stage.replace(" ", "-"), stage)   # "lm head" (timed) ≠ "lm_head"


def _bars(values: dict[str, float], unit: str, title: str, labels=str) -> Figure:
    """Horizontal bars, one per key (named by `labels(key)`), values written with a k/M/G suffix and `unit`."""
    fig = new_figure(7, 1 + 0.32 * len(values))
    ax = fig.subplots()
    token_bars(ax, [labels(k) for k in values], list(values.values()), KEPT, fmt=lambda v: si(v) + unit)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: si(v)))
    ax.set(xlabel=unit.strip(), title=title)
    return fig


def flops_bars(stages: dict[str, int], title: str | None = None) -> Figure:
    """FLOPs of each stage (e.g. cost.flops_by_stage), with the total in the title."""
    return _bars(stages, " FLOPs", t("viz.cost.flops_total", title=title or t("viz.cost.flops_title"),
                                      total=si(sum(stages.values()))), labels=stage_label)


def _bytes(n: float) -> str:
    """A size in bytes with a k/M/G suffix: 5 GB, 540 MB, 0 B."""
    return si(n) + ("B" if abs(n) >= 1e3 else " B")


def memory_bars(sizes: dict[str, int], title: str | None = None) -> Figure:
    """Bytes per number format or part (e.g. {dtype: cost.weight_bytes(config, dtype)})."""
    fig = _bars(sizes, "B", title or t("viz.cost.memory"))
    ax = fig.axes[0]
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: _bytes(v)))
    ax.set_xlabel(t("viz.cost.bytes"))
    return fig


def time_per_token(context_lens: Sequence[int], series: dict[str, Sequence[float]]) -> Figure:
    """Seconds per generated token against context length, one line per setting (e.g. with / without KV cache)."""
    fig = new_figure(7, 3.8)
    ax = fig.subplots()
    for name, seconds in series.items():
        ax.plot(context_lens, 1000 * np.asarray(seconds, dtype=float), marker=".", label=name)
    ax.set(xlabel=t("viz.cost.context_tokens"), ylabel=t("viz.cost.ms_per_token"), title=t("viz.cost.time_title"),
           ylim=(0, None))
    ax.legend()
    ax.grid(alpha=0.3)
    return fig


def error_histogram(errors: Tensor | dict[str, Tensor], bins: int = 100) -> Figure:
    """Histogram of quantization errors (quantized − original), one step outline per format, log counts."""
    errors = errors if isinstance(errors, dict) else {t("viz.cost.error"): errors}
    fig = new_figure(7, 3.8 + 0.2 * len(errors))
    ax = fig.subplots()
    errors = {name: e.detach().float().flatten() for name, e in errors.items()}
    lim = max(float(e.abs().max()) for e in errors.values()) or 1.0
    colors = {name: f"C{k}" for k, name in enumerate(errors)}     # by the caller's order, whatever the drawing order
    handles = {}
    # outlines, not filled bars: no format hides another; widest first, so a narrow one is drawn on top of it
    for name in sorted(errors, key=lambda n: -float(errors[n].abs().max())):
        e = errors[name]
        *_, (patch,) = ax.hist(e.numpy(), bins=np.linspace(-lim, lim, bins + 1), histtype="step", log=True,
                               ec=colors[name], lw=1.6,
                               label=t("viz.cost.error_label", name=name, mean=f"{e.abs().mean():.2g}",
                                       max=f"{e.abs().max():.2g}"))
        handles[name] = patch
    ax.set(xlabel=t("viz.cost.error"), ylabel=t("viz.cost.count"), title=t("viz.cost.error_title"))
    # in the caller's order; under the axes: off the bars, the axes full width
    fig.legend(handles=[handles[name] for name in errors], fontsize=8, loc="outside lower center", frameon=False)
    return fig


def _field(obj, name: str):
    return obj[name] if isinstance(obj, dict) else getattr(obj, name)


def speculative_timeline(rounds, *, kept: int | None = None) -> Figure:
    """Speculative decoding round by round: drafted tokens accepted ✓ or rejected ✗, then the big model's token.

    Each round has `proposed` (token texts), `accepted` (how many of them the big model kept) and `extra`
    (the token the big model adds: a bonus when all guesses were accepted, a resample at the first rejection —
    its top token when greedy — and simply its own token when nothing was guessed); dicts or objects.
    kept: how many new tokens the generation kept (it stops at the end token); tokens past it are marked as cut.
    """
    rows, made = [], 0
    for n, r in enumerate(rounds, 1):
        proposed, accepted, extra = _field(r, "proposed"), _field(r, "accepted"), _field(r, "extra")
        chips = [Chip(token, "✓" if k < accepted else "✗", CHIP_COLORS[2] if k < accepted else "#eeeeee",
                      "none" if k < accepted else "#e45756") for k, token in enumerate(proposed)]
        kind = (t("viz.cost.target_token") if not proposed else t("viz.cost.bonus") if accepted == len(proposed)
                else t("viz.cost.resample"))
        chips += [Chip("→", color=None), Chip(extra, kind, CHIP_COLORS[1])]
        gained = accepted + 1 if kept is None else max(0, min(accepted + 1, kept - made))
        if gained < accepted + 1:       # past the end token: the round made them, the generation dropped them
            chips.append(Chip("✂", t("viz.cost.spec_cut", n=accepted + 1 - gained), color=None))
        made += accepted + 1
        rows.append((t("viz.cost.spec_round", round=n, gained=gained), chips))
    return chip_figure(rows, width=None)


def stage_timeline(seconds: dict[str, float], title: str | None = None) -> Figure:
    """Where the time goes: one bar per stage, placed where it starts (consecutive 'layer i' share a row)."""
    rows: list[tuple[str, list[tuple[float, float]]]] = []
    start = 0.0
    for name, s in seconds.items():
        row = t("viz.cost.layers") if re.fullmatch(r"layer \d+", name) else stage_label(name)
        if rows and rows[-1][0] == row:
            rows[-1][1].append((start, s))
        else:
            rows.append((row, [(start, s)]))
        start += s
    fig = new_figure(9, 1.1 + 0.38 * len(rows))
    ax = fig.subplots()
    for y, (row, spans) in enumerate(rows):
        ms = [(1000 * a, 1000 * b) for a, b in spans]
        ax.broken_barh(ms, (y - 0.35, 0.7), facecolors=(KEPT, "#72b7b2"))   # alternate: layer by layer
        total = sum(b for _, b in ms)
        ax.text(ms[-1][0] + ms[-1][1], y, f" {total:.2f} ms", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [f"{len(s)} {r}" if len(s) > 1 else r for r, s in rows])
    ax.invert_yaxis()
    ax.set(xlabel=t("viz.cost.milliseconds"), xlim=(0, 1000 * start * 1.15 or 1),
           title=t("viz.cost.timeline_total", title=title or t("viz.cost.timeline_title"), ms=f"{1000 * start:.0f}"))
    ax.spines[["top", "right"]].set_visible(False)
    return fig


def pass_cost(tokens: Sequence[int], flops: Sequence[float], bytes_read: Sequence[float],
              seconds: Sequence[float] | None = None) -> Figure:
    """One forward pass over 1, 2, 4, … tokens: the FLOPs it computes and the bytes it reads (log-log), and with
    `seconds` its measured time, per pass and per token. Flat time while the FLOPs grow: reading, not computing,
    is the limit (memory-bound)."""
    fig = new_figure(11 if seconds is not None else 6, 3.8)
    axes = fig.subplots(1, 2 if seconds is not None else 1, squeeze=False)[0]
    ax = axes[0]
    ax.plot(tokens, flops, "o-", color=KEPT, label=t("viz.cost.flops_computed"))
    ax.plot(tokens, bytes_read, "s-", color="#e45756", label=t("viz.cost.bytes_read"))
    ax.set(xscale="log", yscale="log", xlabel=t("viz.cost.pass_tokens"), ylabel=t("viz.cost.per_pass"),
           title=t("viz.cost.pass_title"))
    ax.set_xticks(tokens, [str(n) for n in tokens])
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: si(v)))
    # the bytes hardly change with the tokens, so their line runs between two labelled ticks: write its size
    ax.annotate(_bytes(bytes_read[-1]), (tokens[-1], bytes_read[-1]), xytext=(0, -4), textcoords="offset points",
                ha="right", va="top", fontsize=8, color="#e45756")
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3, which="both")
    if seconds is not None:
        ms = 1000 * np.asarray(seconds, dtype=float)
        right = axes[1]
        right.plot(tokens, ms, "o-", color=KEPT, label=t("viz.cost.ms_per_pass"))
        right.plot(tokens, ms / np.asarray(tokens), "s-", color="#e45756", label=t("viz.cost.ms_per_token"))
        right.set(xscale="log", xlabel=t("viz.cost.pass_tokens"), ylabel="ms", ylim=(0, None),
                  title=t("viz.cost.measured_here"))
        right.set_xticks(tokens, [str(n) for n in tokens])
        right.legend(fontsize=8, loc="upper left")
        right.grid(alpha=0.3)
    return fig
