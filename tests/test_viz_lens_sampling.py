"""viz.token_rank (integer layer ticks, one-token strings without <bos>) and the sampling plots' readability:
value labels clear of the cumulative line and the red ticks, legends clear of every bar, settings in the titles."""
import copy
from types import SimpleNamespace

from viz_fixtures import model, pytestmark, trace  # noqa: F401  fixtures; first: Agg

import numpy as np
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.transforms import Bbox
from tokenizers import Tokenizer as HFBackend
from tokenizers.processors import TemplateProcessing

import llmwalk as lw
import llmwalk.viz as viz

from markers import needs_gemma

@pytest.fixture(scope="module")
def wide(model):
    return lw.forward(model, model.tokenizer.encode("My favourite food is"), record=False, last_only=True).logits[0]


def with_bos(tokenizer):
    """SmolLM2's tokenizer with a post-processor that puts <|endoftext|> in front of every text, as Gemma's does."""
    bos = copy.copy(tokenizer)
    bos.backend = HFBackend.from_str(tokenizer.backend.to_str())
    eot = tokenizer.backend.token_to_id("<|endoftext|>")
    bos.backend.post_processor = TemplateProcessing(single="<|endoftext|> $A", special_tokens=[("<|endoftext|>", eot)])
    return bos


# ---------------------------------------------------------------- token_rank

def test_token_rank_ticks_whole_layers(trace, model):
    gemma_sized = SimpleNamespace(resid=trace.resid[:19])          # embedding + 18 layers, as in Gemma-3-270M
    fig = viz.token_rank(gemma_sized, model, " Paris")
    fig.draw_without_rendering()
    ticks = [t for t in fig.axes[0].get_xticks() if 0 <= t <= 18]
    assert len(ticks) >= 4 and all(float(t).is_integer() for t in ticks), ticks


def test_token_id_ignores_the_bos_the_tokenizer_adds(model, trace):
    tok = with_bos(model.tokenizer)
    paris = model.tokenizer.encode(" Paris")
    assert len(paris) == 1 and tok.encode(" Paris")[1:] == paris and len(tok.encode(" Paris")) == 2
    assert tok.token_id(" Paris") == paris[0]
    bos_model = SimpleNamespace(tokenizer=tok, weights=model.weights, config=model.config)
    fig = viz.token_rank(trace, bos_model, " Paris")
    by_id = viz.token_rank(trace, model, paris[0])
    assert np.array_equal(fig.axes[0].lines[0].get_ydata(), by_id.axes[0].lines[0].get_ydata())
    assert fig.axes[0].get_title() == by_id.axes[0].get_title()
    with pytest.raises(ValueError, match="3 tokens"):              # the clear error still comes, without the <bos>
        viz.token_rank(trace, bos_model, " Parisians and")


def test_token_id_on_gpt2_tiktoken():
    tok = lw.gpt2_tokenizer()
    assert tok.token_id(" Paris") == tok.encode(" Paris")[0]
    with pytest.raises(ValueError, match="2 tokens"):
        tok.token_id(" Paris is")


@needs_gemma
def test_token_rank_on_gemma_takes_a_chinese_word():
    gemma = lw.load_model("gemma3-270m", progress=False)
    ids = gemma.tokenizer.encode("法国的首都是")
    assert ids[0] == gemma.config.bos_token_id                     # Gemma's tokenizer adds <bos> to every text
    g_trace = lw.forward(gemma, ids)
    paris = gemma.tokenizer.token_id("巴黎")
    assert gemma.tokenizer.pieces([paris]) == ["巴黎"]
    by_word, by_id = viz.token_rank(g_trace, gemma, "巴黎"), viz.token_rank(g_trace, gemma, paris)
    assert np.array_equal(by_word.axes[0].lines[0].get_ydata(), by_id.axes[0].lines[0].get_ydata())


# ---------------------------------------------------------------- sampling: nothing hides anything

def drawn(fig):
    """Lay the figure out on an Agg canvas (llmwalk's figures live outside pyplot) and return its renderer."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def extents(fig, artists) -> list[Bbox]:
    renderer = fig.canvas.get_renderer()
    return [a.get_window_extent(renderer) for a in artists]


def value_labels(ax) -> list:
    return [t for t in ax.texts if t.get_text().strip().replace(".", "", 1).isdigit()]


def line_points(ax, line, per_segment: int = 40) -> np.ndarray:
    """Points along a line (display coordinates), dense enough that a label it crosses contains one."""
    xy = ax.transData.transform(line.get_xydata())
    t = np.linspace(0, 1, per_segment)[:, None]
    return np.concatenate([a + t * (b - a) for a, b in zip(xy[:-1], xy[1:])])


def bar_boxes(fig, ax) -> list[Bbox]:
    return extents(fig, [p for p in ax.patches if p.get_width() > 0])


@pytest.mark.parametrize("kw", [dict(temperature=2.0), dict(top_p=0.9, n=15), dict(top_k=5),
                                dict(temperature=0.7, top_k=50, top_p=0.9), dict(temperature=0)])
def test_prob_bars_labels_clear_of_the_line_and_legend_clear_of_bars(trace, model, kw):
    fig = viz.prob_bars(trace.logits[-1], model.tokenizer, **{"n": 12, **kw})
    renderer = drawn(fig)
    ax = fig.axes[0]
    labels = value_labels(ax)
    assert len(labels) == len(ax.patches)
    points = line_points(ax, ax.lines[0])
    for box in extents(fig, labels):
        x, y = points.T
        assert not ((x >= box.x0) & (x <= box.x1) & (y >= box.y0) & (y <= box.y1)).any()
    legend = ax.get_legend().get_window_extent(renderer)
    for box in bar_boxes(fig, ax) + extents(fig, labels):
        assert not legend.overlaps(box)


@pytest.mark.parametrize("kw", [dict(top_k=5), dict(top_k=2), dict(top_p=0.2), dict(top_k=1)])
def test_a_cut_label_covers_neither_the_line_nor_a_bar(model, wide, kw):
    """The "✂ top-k = 5" box sits clear of the running-total line and of the bars beside the cut (06's figures)."""
    fig = viz.prob_bars(wide, model.tokenizer, n=12, **kw)
    renderer = drawn(fig)
    ax = fig.axes[0]
    box, = [t.get_window_extent(renderer) for t in ax.texts if t.get_gid() == "cut"]
    x, y = line_points(ax, ax.lines[0]).T
    assert not ((x >= box.x0) & (x <= box.x1) & (y >= box.y0) & (y <= box.y1)).any()
    assert not any(box.overlaps(bar) for bar in bar_boxes(fig, ax))


def test_sampling_panel_says_what_bars_and_line_are(model, wide):
    fig = viz.sampling_panel(wide, model.tokenizer, temperature=0.7, top_k=50, top_p=0.9)
    ax = fig.axes[0]
    bars, line = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "T = 0.7" in bars and "before the cuts" in bars
    assert "running total of the bars" in line and "p × the mass top-k kept" in line
    scaled = wide.float() / 0.7
    top = scaled.softmax(-1).topk(10)
    assert np.allclose([p.get_width() for p in ax.patches], top.values.numpy(), atol=1e-6)    # bars: before top-k
    assert np.allclose(ax.lines[0].get_xdata(), top.values.cumsum(0).numpy(), atol=1e-5)     # line: their total
    for stage in fig.axes[3:6]:                     # probability stages: one scale, to just past the longest bar
        assert stage.get_xlim() == fig.axes[3].get_xlim()
        assert max(p.get_width() for p in stage.patches) < stage.get_xlim()[1] < 1.4 * max(
            max(p.get_width() for p in s.patches) for s in fig.axes[3:6])
    assert "top-k = 50 keeps 50" in ax.get_xlabel() and "top-p = 0.9 keeps" in ax.get_xlabel()


def test_sample_histogram_title_legend_and_labels(model, wide):
    fig = viz.sample_histogram(wide, model.tokenizer, 1000, temperature=0.7, top_p=0.9, seed=0)
    renderer = drawn(fig)
    ax = fig.axes[0]
    assert ax.get_title() == "1000 draws (seed 0, T = 0.7, top-p = 0.9)"
    legend = ax.get_legend().get_window_extent(renderer)
    ticks = ax.transData.transform(ax.collections[0].get_offsets())
    labels = extents(fig, value_labels(ax))
    assert len(labels) == len(ax.patches)
    for box in bar_boxes(fig, ax) + labels:
        assert not legend.overlaps(box)
    for box, (x, _) in zip(labels, ticks):
        assert box.x0 >= x - 1                                      # each value starts right of its red tick
    others = ax.patches[-1]
    assert ax.get_yticklabels()[-1].get_text() == "(others)" and others.get_width() > 0.2


def test_prob_bars_axis_ends_just_past_what_is_drawn(trace, model):
    """At T = 2 the bars are short: the axis follows the running total (the longest thing drawn) instead of ending
    at 1.05, so the bars fill the chart; a peaked distribution still ends at 1.05."""
    flat = viz.prob_bars(trace.logits[-1], model.tokenizer, temperature=2.0, n=12).axes[0]
    total = flat.lines[0].get_xdata()[-1]
    assert total < 0.5 and total < flat.get_xlim()[1] <= 1.15 * total + 1e-9
    assert max(p.get_width() for p in flat.patches) < total
    peaked = viz.prob_bars(trace.logits[-1], model.tokenizer, temperature=0.3, n=12).axes[0]
    assert peaked.lines[0].get_xdata()[-1] > 0.95 and peaked.get_xlim() == (0, 1.05)


def test_prob_bars_of_a_plain_softmax_share_the_whole_scale(trace, model):
    """Notebook 05 compares plain-softmax charts of several prompts and models: each spans 0–1.05, however much of
    the probability its bars hold."""
    ax = viz.prob_bars(trace.logits[-1], model.tokenizer, n=12).axes[0]
    assert ax.get_xlim() == (0, 1.05)
    flat = viz.prob_bars(trace.logits[-1] / 3, model.tokenizer, n=12).axes[0]        # a flat distribution, T = 1
    assert flat.lines[0].get_xdata()[-1] < 0.5 and flat.get_xlim() == (0, 1.05)


@pytest.mark.parametrize("kw, label", [
    (dict(), "probability"),                                      # notebook 05: no temperature or cut yet
    (dict(temperature=0.7), "probability at T = 0.7   (no cut)"),
    (dict(top_k=3), "probability at T = 1   (top-k = 3 keeps 3)"),
    (dict(temperature=0), "probability at T = 1   (greedy (T = 0) keeps 1)")])
def test_prob_bars_x_label_names_the_settings_once_there_are_any(trace, model, kw, label):
    assert viz.prob_bars(trace.logits[-1], model.tokenizer, n=5, **kw).axes[0].get_xlabel() == label


def test_sampling_panel_bottom_panels_evenly_spaced(model, wide):
    """The top chart (token names left, values right) has its own grid: its margins do not widen the bottom gaps."""
    fig = viz.sampling_panel(wide, model.tokenizer, temperature=0.7, top_k=50, top_p=0.9)
    drawn(fig)
    boxes = [ax.get_position() for ax in fig.axes[1:6]]
    gaps = [b.x0 - a.x1 for a, b in zip(boxes, boxes[1:])]
    assert max(gaps) - min(gaps) < 0.005, gaps
    assert len({round(b.width, 6) for b in boxes}) == 1


def test_surgery_writes_each_value_instead_of_x_ticks(model):
    """Each bar of the five stages has its value written after it (a cut one says so), so the stages carry no x
    ticks; the logits and ÷T stages draw logit − max (so ÷T's wider gaps show), every bar but the top one going left
    from a line at 0, its value on the bar's left, inside the axes."""
    logits = torch.full((model.config.vocab_size,), -3.0)
    logits[:6] = torch.tensor([2.0, 1.5, 1.0, 0.5, -0.5, -1.5])
    n = 6
    fig = viz.surgery_plot(logits, model.tokenizer, temperature=0.5, top_k=3, top_p=0.9, n=n)
    renderer = drawn(fig)
    for k, (ax, step) in enumerate(zip(fig.axes, lw.sampling.surgery(logits, 0.5, 3, 0.9))):
        assert list(ax.get_xticks()) == [], step.name
        kept = step.logits[:n].isfinite().tolist()
        values = (step.logits - step.logits.max() if k < 2 else step.probs)[:n].tolist()
        fmt = "{:.2f}" if k < 2 else "{:.3f}"
        assert [t.get_text().strip() if t.get_visible() else None for t in ax.texts[:n]] == \
            [fmt.format(v) if f else None for v, f in zip(values, kept)], step.name
        assert [t.get_visible() for t in ax.texts[n:]] == [not f for f in kept], step.name      # "✂ cut"
    widths = []
    for ax in fig.axes[:2]:                     # logits and ÷T: bars from 0, which a line marks
        zero, = ax.lines
        assert list(zero.get_xdata()) == [0, 0] and ax.get_xlim()[0] < 0 < ax.get_xlim()[1]
        assert sum(p.get_width() < 0 for p in ax.patches) == n - 1 and ax.patches[0].get_width() == 0
        widths.append([p.get_width() for p in ax.patches])
        left = [t for t in ax.texts[:n] if t.get_text().strip().startswith("-")]
        assert len(left) == n - 1 and all(t.get_horizontalalignment() == "right" for t in left)
        assert all(t.get_window_extent(renderer).x0 >= ax.get_window_extent(renderer).x0 for t in left)
    assert widths[1] == pytest.approx([w / 0.5 for w in widths[0]])     # T = 0.5 doubles every gap to the top
