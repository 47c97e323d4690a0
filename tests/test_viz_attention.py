"""The attention-by-hand and intervention plots draw the numbers the model computed (checked against the trace
and against a hand computation), and the step widget follows its static twin."""
import matplotlib
from viz_fixtures import model, pytestmark, trace  # noqa: F401  fixtures; first: Agg

import numpy as np
import pytest
import torch

import llmwalk as lw
import llmwalk.viz as viz

@pytest.mark.parametrize("layer,head,query", [(23, 4, -1), (16, 0, 2), (0, 8, 0)])
def test_attention_step_draws_scores_weights_and_the_mix(smollm2, trace, layer, head, query):
    fig = viz.attention_step(trace, smollm2, layer, head, query)
    ax_s, ax_w, ax_v = fig.axes[:3]
    c, t = smollm2.config, len(trace.ids)
    q = query % t
    b = trace.layers[layer].attn
    k = b.k.repeat_interleave(c.n_head // c.n_kv_head, dim=0)[head]       # this head's keys, copied as MHA would
    scores = (b.q[head, q] @ k.T / c.d_head ** 0.5).numpy()
    drawn = np.array([p.get_width() for p in ax_s.patches])
    assert np.allclose(drawn[:q + 1], scores[:q + 1], atol=1e-4) and np.all(drawn[q + 1:] == 0)
    assert np.allclose([p.get_width() for p in ax_w.patches], b.weights[head, q].numpy())
    lo, hi = ax_w.get_xlim()                                  # every weight (at most 1) is drawn whole, on one scale
    assert lo == 0 and 1 < hi <= 1.5 and max(p.get_width() for p in ax_w.patches) <= hi
    mix = ax_v.images[0].get_array()[-1]                                    # the Σ row
    assert np.allclose(mix, b.z[head, q].numpy(), atol=1e-5)


def test_attention_step_widget_follows_its_twin(smollm2, trace):
    w = viz.attention_step_widget(trace, smollm2)
    assert w.values == {"layer": 0, "head": 0, "query": len(trace.ids) - 1}
    w.set(layer=23, head=4, query=3)
    twin = viz.attention_step(trace, smollm2, 23, 4, 3)
    assert np.array_equal(w.figure.axes[2].images[0].get_array(), twin.axes[2].images[0].get_array())
    assert w.figure.texts[0].get_text() == twin.texts[0].get_text()


def test_mask_and_attention_shows_the_rule_and_the_weights(smollm2, trace):
    fig = viz.mask_and_attention(trace, smollm2.tokenizer, 23, 4)
    t = len(trace.ids)
    marks = [s.get_text() for s in fig.axes[0].texts]
    assert marks.count("✓") == t * (t + 1) // 2 and marks.count("✗") == t * (t - 1) // 2
    shown = fig.axes[1].images[0].get_array().filled(np.nan)
    w = trace.layers[23].attn.weights[4].numpy()
    assert np.allclose(np.tril(shown), np.tril(w)) and np.all(np.isnan(shown[np.triu_indices(t, 1)]))


def test_last_token_attention_is_the_head_mean_per_layer(smollm2, trace):
    fig = viz.last_token_attention(trace, smollm2.tokenizer)
    drawn = fig.axes[0].images[0].get_array()
    assert drawn.shape == (smollm2.config.n_layer, len(trace.ids))
    assert np.allclose(drawn, trace.attn[:, :, -1].mean(1).numpy())


def test_intervention_plots_draw_the_measured_probabilities(smollm2, trace):
    tok = smollm2.tokenizer
    tokens = [tok.token_id(" Paris"), tok.token_id(" Berlin")]
    effects = {"none": trace.probs[-1, tokens], "head 23.4": torch.tensor([0.25, 0.5])}
    fig = viz.intervention_bars(effects, tok, tokens)
    widths = [p.get_width() for p in fig.axes[0].patches]
    assert np.allclose(sorted(widths), sorted([*trace.probs[-1, tokens].tolist(), 0.25, 0.5]))
    grid = torch.rand(smollm2.config.n_layer + 1, len(trace.ids), generator=torch.Generator().manual_seed(0))
    fig = viz.patching_heatmap(grid, tok, trace.ids, tokens[1], "The capital of Germany is")
    assert np.allclose(fig.axes[0].images[0].get_array(), grid.numpy())
    fig = viz.ablation_sweep({"attention": grid[:-1, 0].tolist(), "FFN": grid[:-1, 1].tolist()}, 0.7, " Paris")
    assert np.allclose(fig.axes[0].lines[1].get_ydata(), grid[:-1, 1].numpy())
    assert fig.get_suptitle() == "P(“ Paris”) next with one layer's attention or FFN switched off"


def test_residual_plots_put_the_embedding_before_layer_0(smollm2, trace):
    fig = viz.token_rank(trace, smollm2, " Paris")
    ax = fig.axes[0]
    assert ax.lines[0].get_xdata()[0] == -1 and ax.lines[0].get_xdata()[-1] == smollm2.config.n_layer - 1
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels[0] == "emb" and labels[-1] == str(smollm2.config.n_layer - 1)
    steps = np.diff(ax.get_xticks())                # equal steps from "emb" on: "0" does not sit against "emb"
    assert steps.min() == steps.max() > 1, ax.get_xticks()
    assert list(viz.residual_norms(trace, smollm2.tokenizer).axes[0].get_xticks()) == list(ax.get_xticks())
    grid = viz.logit_lens_grid(trace, smollm2)
    rows = [t.get_text() for t in grid.axes[0].get_yticklabels()]
    assert rows[0] == "embedding" and rows[1] == "after layer 0" and len(rows) == smollm2.config.n_layer + 1


# ---------------------------------------------------------------- widgets that redraw in place

def decoded(png_bytes: bytes) -> np.ndarray:
    from io import BytesIO

    from PIL import Image
    return np.asarray(Image.open(BytesIO(png_bytes)).convert("RGB"), dtype=int)


def shown_png(widget) -> bytes:
    import base64
    return base64.b64decode(widget.output.outputs[0]["data"]["image/png"])


@pytest.fixture(scope="module")
def long_trace(smollm2):
    ids = smollm2.tokenizer.encode(" ".join(["The capital of France is Paris."] * 12))[:70]
    return lw.forward(smollm2, ids)


def drawn(fig) -> tuple:
    """What a figure shows: its texts, images' data, bar lengths."""
    fig.draw_without_rendering()
    texts = [t.get_text() for t in fig.findobj(matplotlib.text.Text) if t.get_visible()]
    images = [np.ma.filled(im.get_array(), np.nan).round(6).tobytes() for ax in fig.axes for im in ax.images]
    return texts, images, [round(p.get_width(), 6) for ax in fig.axes for p in ax.patches if hasattr(p, "get_width")]


def same_pixels(a: bytes, b: bytes) -> bool:
    a, b = decoded(a), decoded(b)
    return a.shape == b.shape and (np.abs(a - b).max(-1) > 40).mean() < 1e-3     # up to antialiasing


@pytest.mark.parametrize("make, fresh, moves", [
    (lambda m, tr: viz.attention_widget(tr, m.tokenizer), lambda m, tr: viz.attention_heatmap(tr, m.tokenizer, 5, 2),
     [dict(layer=3, head=7), dict(layer=5, head=2)]),
    (lambda m, tr: viz.attention_step_widget(tr, m), lambda m, tr: viz.attention_step(tr, m, 5, 2, 40),
     [dict(layer=3, head=7, query=10), dict(layer=5, head=2, query=40)])])
def test_widget_updated_in_place_shows_the_picture_of_a_fresh_draw(smollm2, long_trace, make, fresh, moves):
    w = make(smollm2, long_trace)
    figure = w.figure
    for move in moves:                        # the second move redraws over the background the first one kept
        w.set(**move)
    assert w.figure is figure                                                 # no new figure per move
    twin = fresh(smollm2, long_trace)
    assert drawn(w.figure) == drawn(twin)                                     # the same texts, data, bars
    assert same_pixels(shown_png(w), viz.png(w.figure, crop=False))           # blitted = the whole figure redrawn


def test_attention_widget_png_equals_a_fresh_figure(smollm2, long_trace):
    w = viz.attention_widget(long_trace, smollm2.tokenizer)
    w.set(layer=3, head=7)
    w.set(layer=5, head=2)
    assert same_pixels(shown_png(w), viz.png(viz.attention_heatmap(long_trace, smollm2.tokenizer, 5, 2), crop=False))


def test_long_prompt_heatmap_labels_every_nth_token_and_writes_no_numbers(smollm2, long_trace):
    from llmwalk.viz._draw import MAX_TICKS
    tok, n = smollm2.tokenizer, len(long_trace.ids)
    fig = viz.attention_heatmap(long_trace, tok, 1, 1)
    ax = fig.axes[0]
    step = -(-n // MAX_TICKS)                                                   # ceil(70 / 40) = 2
    pieces = [viz._draw.show_piece(p, 12) for p in tok.pieces(long_trace.ids)]
    assert [t.get_text() for t in ax.get_xticklabels()] == pieces[::step] and len(ax.get_yticks()) <= MAX_TICKS
    assert not ax.texts                                                          # 70 × 70 cells: no numbers
    assert max(fig.get_size_inches()) <= 12                                # cells shrink, the figure does not grow
    short = viz.attention_heatmap(lw.forward(smollm2, tok.encode("The capital of France is")), tok, 1, 1)
    assert len(short.axes[0].texts) == 5 * 6 // 2                                # a weight in every visible cell


def test_long_prompt_heads_grid_stays_a_page_wide_with_every_nth_token_labelled(smollm2, long_trace):
    from llmwalk.viz.attention import PANEL_TICKS
    tok, n = smollm2.tokenizer, len(long_trace.ids)
    fig = viz.attention_heads(long_trace, tok, layer=1)
    assert max(fig.get_size_inches()) <= 14                          # 70 tokens × 0.22 in would be 50 inches wide
    first = fig.axes[0]
    assert len(first.get_yticks()) <= PANEL_TICKS and len(first.get_xticklabels()) <= PANEL_TICKS
    step = -(-n // PANEL_TICKS)
    assert list(first.get_yticks()) == list(range(0, n, step))
    assert np.allclose(np.ma.filled(first.images[0].get_array(), 0), np.tril(long_trace.attn[1, 0].numpy()))
