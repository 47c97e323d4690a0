"""llmwalk.viz: every plot on real SmolLM2 data, the CJK font, and the widgets driven from Python (headless)."""
import base64
import warnings
from types import SimpleNamespace

import matplotlib
from viz_fixtures import PROMPT, logits, model, pytestmark, texts, tok, trace  # noqa: F401  fixtures; first: Agg
from viz_fixtures import QUESTION as ZH

import ipywidgets as W
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from matplotlib import font_manager, rcParams
from matplotlib.figure import Figure

import llmwalk as lw
import llmwalk.viz as viz
from llmwalk.cost import decode_step_flops, flops_by_stage, gpt2_config, weight_bytes
from llmwalk.generation import generate
from llmwalk.quantize import dequantize_tensor, quantize_tensor
from llmwalk.sampling import probs_after, surgery
from llmwalk.viz import fonts
from llmwalk.viz._draw import show_piece, si

def signature(fig: Figure) -> tuple:
    """What a figure shows: its texts, image data and patch geometry (PNG bytes also depend on layout passes)."""
    fig.draw_without_rendering()                                        # tick labels exist once drawn
    images = [np.ma.filled(im.get_array(), np.nan).round(6).tobytes() for ax in fig.axes for im in ax.images]
    patches = [p.get_patch_transform().transform(p.get_path().vertices).round(6).tobytes()    # data coordinates
               for ax in fig.axes for p in ax.patches]
    return texts(fig), images, patches


def tick_labels(axis) -> list[str]:
    return [t.get_text() for t in axis.get_ticklabels()]


def shown(tok, ids, limit=12) -> list[str]:
    return [show_piece(p, limit) for p in tok.pieces(ids)]


def in_chinese(build):
    """What `build()` returns when drawn in the Chinese edition."""
    lw.set_language("zh")
    try:
        return build()
    finally:
        lw.set_language("en")


# ---------------------------------------------------------------- fonts

def test_chinese_renders_as_glyphs():
    name = fonts.use_cjk_font()
    if name is None:
        pytest.skip("no CJK font installed (e.g. apt-get install fonts-wqy-microhei)")
    assert rcParams["font.family"] == ["sans-serif", name]         # Latin keeps DejaVu Sans, CJK falls back
    fig = viz.mask_plot(list(ZH))
    fig.suptitle(f"{ZH} The capital of France")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        viz.png(fig)
    assert not [w for w in caught if "missing" in str(w.message)]


def test_font_installed_after_matplotlib_cached_its_list(monkeypatch):
    name = fonts.use_cjk_font()
    if name is None:
        pytest.skip("no CJK font installed")
    stale = [f for f in font_manager.fontManager.ttflist if f.name != name]
    monkeypatch.setattr(font_manager.fontManager, "ttflist", stale)
    assert fonts.use_cjk_font() == name                                 # found on disk and added


def test_missing_cjk_font_warns_once_with_a_hint(monkeypatch):
    monkeypatch.setattr(font_manager.fontManager, "ttflist", [])
    monkeypatch.setattr(font_manager, "findSystemFonts", lambda: [])
    monkeypatch.setattr(fonts, "_warned", False)
    monkeypatch.setitem(rcParams, "font.family", ["sans-serif"])
    with pytest.warns(UserWarning, match="install"):
        assert fonts.use_cjk_font() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fonts.use_cjk_font() is None
    assert rcParams["font.family"] == ["sans-serif"]


# ---------------------------------------------------------------- tokens

def test_token_chips_show_pieces_ids_and_fragments(tok):
    ids = tok.encode(ZH)
    fig = viz.token_chips(ZH, tok)
    drawn = texts(fig)
    assert all(p in drawn for p in shown(tok, ids, None)) and all(str(i) in drawn for i in ids)
    assert "\\xe5\\x9b" in drawn                                         # a fragment of 国 shown as bytes
    edged = [p for p in fig.axes[0].patches if p.get_edgecolor()[3] > 0]
    assert len(edged) == sum(tok.is_fragment(i) for i in ids) > 0       # fragments get an edge


def test_token_chips_compare_counts_tokens(tok):
    gpt2 = lw.gpt2_tokenizer()
    fig = viz.token_chips_compare(ZH, {"SmolLM2": tok, "GPT-2": gpt2})
    drawn = texts(fig)
    assert f"SmolLM2\n{len(tok.encode(ZH))} tokens" in drawn
    assert f"GPT-2\n{len(gpt2.encode(ZH))} tokens" in drawn


# ---------------------------------------------------------------- embeddings and positions

def test_vector_strips_and_similarity(trace, tok):
    names = shown(tok, trace.ids)
    fig = viz.vector_strips(trace.tok_emb, names)
    assert tick_labels(fig.axes[0].yaxis) == names
    assert fig.axes[0].images[0].get_array().shape == tuple(trace.tok_emb.shape)
    fig.draw_without_rendering()                                        # ticks to find a dimension by its number
    (lo, hi), ax = sorted(fig.axes[0].get_xlim()), fig.axes[0]
    shown_ticks = {t.get_text() for v, t in zip(ax.get_xticks(), ax.get_xticklabels()) if lo <= v <= hi}
    assert shown_ticks == {"0", "100", "200", "300", "400", "500"}      # d_model 576
    fig = viz.similarity_matrix(trace.tok_emb, names)
    sim = fig.axes[0].images[0].get_array()
    assert np.allclose(np.diag(sim), 1, atol=1e-5) and tick_labels(fig.axes[0].xaxis) == names
    assert texts(fig).count("1.00") >= len(names)


def test_position_table_and_rope():
    table = torch.randn(300, 16)
    fig = viz.position_table(table, n_pos=50)
    assert [im.get_array().shape for ax in fig.axes for im in ax.images] == [(50, 16), (50, 50)]
    fig = viz.rope_frequencies(64, 10000.0, n_pos=20)
    angles = fig.axes[0].images[0].get_array()                          # [pairs, positions]
    assert angles.shape == (32, 20) and angles[0, 1] == pytest.approx(1.0)   # pair 0 turns 1 rad per position
    turns = fig.axes[1].lines[0].get_ydata()
    assert turns[0] == pytest.approx(2 * np.pi) and np.all(np.diff(turns) > 0)
    assert turns[1] == pytest.approx(2 * np.pi * 10000.0 ** (2 / 64))   # 2π·θ^(2i/d) positions per turn
    assert "2π·θ^(2i/d) positions" in fig.axes[1].get_title() and "pos /" not in fig.axes[1].get_title()


def test_order_demo(model, tok):
    a, b = tok.encode("人咬狗"), tok.encode("狗咬人")
    trace_a = lw.forward(model, a)
    fig = viz.order_demo(trace_a, lw.forward(model, b), tok.pieces(a), tok.pieces(b))
    assert fig.axes[0].get_title().endswith(": yes")                    # the same vectors, reordered
    assert (fig.axes[0].get_ylabel(), fig.axes[0].get_xlabel()) == ("tokens of the first text",
                                                                     "tokens of the second text")
    assert [x.get_text() for x in fig.axes[0].get_yticklabels()] == tok.pieces(a)   # rows: the first text
    sim = fig.axes[0].images[0].get_array()
    cells = [t.get_text() for t in fig.axes[0].texts]
    assert len(cells) == sim.size == len(a) ** 2                         # every cell written, 2 decimals
    assert cells == [f"{round(float(v), 2) or 0.0:.2f}" for v in sim.flatten()] and cells.count("1.00") >= len(a)
    # said once, by the right panel (the left one's title names it too): a colour-bar copy crowded that label
    assert [ax.get_ylabel() for ax in fig.axes].count("cosine similarity") == 1
    bars = [p.get_height() for p in fig.axes[1].patches]
    assert len(bars) == 1 + model.config.n_layer
    assert bars[0] == pytest.approx(1.0) and min(bars[1:]) < 0.99       # identical without positions, not after
    with pytest.raises(ValueError, match="different tokens"):
        viz.order_demo(trace_a, SimpleNamespace(ids=torch.tensor(tok.encode("猫"))), [], [])


# ---------------------------------------------------------------- attention

def test_mask_plot_ticks_and_crosses():
    fig = viz.mask_plot(list(ZH))
    ax = fig.axes[0]
    assert tick_labels(ax.xaxis) == tick_labels(ax.yaxis) == list(ZH)
    cells = {(round(t.get_position()[1]), round(t.get_position()[0])): t.get_text() for t in ax.texts}
    assert len(cells) == len(ZH) ** 2
    assert all(mark == ("✓" if j <= i else "✗") for (i, j), mark in cells.items())


def test_attention_heatmap_labels_and_values(trace, tok):
    fig = viz.attention_heatmap(trace, tok, layer=2, head=4)
    ax = fig.axes[0]
    assert tick_labels(ax.xaxis) == tick_labels(ax.yaxis) == shown(tok, trace.ids)
    w = trace.layers[2].attn.weights[4].numpy()
    shown_w = ax.images[0].get_array().filled(np.nan)
    lower = np.tril(np.ones_like(w, dtype=bool))
    assert np.allclose(shown_w[lower], w[lower]) and np.isnan(shown_w[~lower]).all()


def test_attention_heads_grid(trace, tok, model):
    fig = viz.attention_heads(trace, tok, layer=1)
    assert sum(bool(ax.images) for ax in fig.axes) == model.config.n_head
    assert [ax.get_title() for ax in fig.axes if ax.images] == [f"head {h}" for h in range(model.config.n_head)]


# ---------------------------------------------------------------- inside a layer

def test_residual_norms_and_norm_stats(trace, tok, model):
    fig = viz.residual_norms(trace, tok)
    lines = fig.axes[0].lines
    assert len(lines) == len(trace.ids) and len(lines[0].get_ydata()) == model.config.n_layer + 1
    assert np.allclose(lines[-1].get_ydata(), trace.resid[:, -1].norm(dim=-1).numpy())
    fig = viz.norm_stats(trace)
    assert [ax.get_title() for ax in fig.axes] == ["std of each token's vector", "mean ÷ RMS of each token's vector"]
    zh = [ax.get_title() for ax in in_chinese(lambda: viz.norm_stats(trace)).axes]
    assert zh == ["每个词块向量的标准差", "每个词块向量的均值 ÷ RMS"]        # the statistic's name translated too
    std = fig.axes[0].lines
    assert [line.get_label() for line in std] == ["entering the norm (residual)", "after the norm"]
    assert np.all(std[1].get_ydata()[5:] < std[0].get_ydata()[5:])      # the norm pulls big vectors back
    entering = trace.resid[:-1].double()                                 # mean ÷ RMS, computed here independently
    ratio = entering.mean(-1) / entering.pow(2).mean(-1).sqrt()
    assert np.allclose(fig.axes[1].lines[0].get_ydata(), ratio.median(1).values.numpy(), atol=1e-5)


def test_ffn_activations_are_silu_and_tanh_gelu():
    fig = viz.ffn_activations()
    (_, silu, _), (_, gelu, _) = (ax.lines[:3] for ax in fig.axes)       # ReLU, the activation, its lowest point
    x = np.asarray(silu.get_xdata(), dtype=float)
    assert np.allclose(silu.get_ydata(), x / (1 + np.exp(-x)), atol=1e-6)                  # SiLU = x·σ(x)
    tanh_gelu = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    assert np.allclose(gelu.get_ydata(), tanh_gelu, atol=1e-6)
    assert {"SiLU(x) = x·σ(x): SmolLM2's SwiGLU", "GELU(x), tanh form: Gemma-3's GeGLU"} <= set(texts(fig))


def test_block_diagram_shows_the_pre_norm_recipe(model):
    drawn = texts(viz.block_diagram(model.config))
    assert {"RMSNorm\n(attn_norm)", "RMSNorm\n(ffn_norm)", "attention, 9 heads\nmixes the tokens",
            "FFN (swiglu)\neach token alone"} <= set(drawn)
    assert drawn.count("+") == 2                                          # the two residual additions
    gpt2 = texts(viz.block_diagram(gpt2_config()))
    assert "LayerNorm\n(attn_norm)" in gpt2 and "FFN (gelu)\neach token alone" in gpt2


def test_ffn_widths(model):
    fig = viz.ffn_widths(gpt2_config(), model.config)
    drawn = " ".join(texts(fig))
    assert all(s in drawn for s in ("768  in", "3072  gelu(up)", "576  in", "1536  act(gate) ⊙ up", "smollm2-135m",
                                    "W_up: 768 × 3072", "W_gate, W_up: 576 × 1536 each", "W_down: 1536 × 576"))
    widths = sorted(p.get_width() for p in fig.axes[0].patches)
    assert widths[-1] / widths[0] == pytest.approx(3072 / 576)          # drawn to scale


# ---------------------------------------------------------------- logit lens

def test_logit_lens_grid_last_row_is_the_answer(trace, model, tok):
    fig = viz.logit_lens_grid(trace, model)
    ax = fig.axes[0]
    t, rows = len(trace.ids), model.config.n_layer + 1
    assert tick_labels(ax.yaxis)[-1] == f"after layer {model.config.n_layer - 1}" and len(ax.texts) == rows * t
    last_row = [s.get_text() for s in ax.texts[-t:]]
    assert last_row == shown(tok, trace.logits.argmax(-1), 8)


def test_logit_lens_top_and_rank(trace, model, tok):
    fig = viz.logit_lens_top(trace, model, position=-1, k=3)
    top3 = [s.get_text() for s in fig.axes[0].texts[-3:]]
    assert top3 == shown(tok, trace.logits[-1].topk(3).indices, 8)
    fig = viz.token_rank(trace, model, " Paris")
    rank = fig.axes[0].lines[0].get_ydata()
    paris = tok.encode(" Paris")[0]
    assert rank[-1] == int((trace.logits[-1] > trace.logits[-1, paris]).sum()) + 1
    assert fig.axes[1].lines[0].get_ydata()[-1] == pytest.approx(float(trace.probs[-1, paris]), rel=1e-4)
    with pytest.raises(ValueError, match="3 tokens"):
        viz.token_rank(trace, model, " Parisians and")


# ---------------------------------------------------------------- sampling

def bar_colors(ax) -> list[str]:
    return [matplotlib.colors.to_hex(p.get_facecolor()) for p in ax.patches]


def test_prob_bars_grey_out_the_cut(logits, tok):
    fig = viz.prob_bars(logits, tok, temperature=1.0, top_k=3, n=8, chosen=int(logits.argmax()))
    ax = fig.axes[0]
    assert tick_labels(ax.yaxis) == shown(tok, logits.topk(8).indices)
    assert bar_colors(ax) == ["#e45756"] + ["#4c78a8"] * 2 + ["#cfcfcf"] * 5
    assert "✂ top-k = 3" in texts(fig) and "3 of 49152 tokens kept" in texts(fig)
    cumulative = ax.lines[0].get_xdata()                                # the running total of the bars drawn
    assert np.allclose(cumulative, np.cumsum([p.get_width() for p in ax.patches]), atol=1e-6)
    assert cumulative[2] == pytest.approx(float(logits.softmax(-1).topk(3).values.sum()), abs=1e-5)
    fig = viz.prob_bars(logits, tok, temperature=1.0, top_p=0.8, n=8)
    cumulative = fig.axes[0].lines[0].get_xdata()
    assert np.allclose(cumulative, logits.softmax(-1).topk(8).values.cumsum(0), atol=1e-5)
    kept = int(fig.axes[0].get_title().split()[0])
    assert cumulative[kept - 1] >= 0.8 > cumulative[kept - 2]          # top-p keeps the token that crosses p
    greedy = viz.prob_bars(logits, tok, temperature=0, n=5)
    assert bar_colors(greedy.axes[0]) == ["#4c78a8"] + ["#cfcfcf"] * 4


def test_surgery_plot_titles(logits, tok):
    fig = viz.surgery_plot(logits, tok, temperature=0.7, top_k=20, top_p=0.8, n=6)
    steps = surgery(logits, 0.7, 20, 0.8)
    assert len(fig.axes) == 5
    names = ["logits (entropy at T = 1)", "÷T", "softmax", "top-k (renormalized)", "top-p (renormalized)"]
    for ax, step, name in zip(fig.axes, steps, names):
        assert ax.get_title().startswith(f"{name}\nkept {step.kept} ·")
        assert f"entropy {step.entropy:.2f} nats" in ax.get_title()
    lw.set_language("zh")
    try:                                                # the Chinese figure names the stages in Chinese too
        zh = [ax.get_title().split("\n")[0] for ax in viz.surgery_plot(logits, tok, 0.7, 20, 0.8, n=6).axes]
    finally:
        lw.set_language("en")
    assert zh == ["logits（熵按 T = 1 算）", "÷T", "Softmax", "Top-K（重新归一化）", "Top-P（重新归一化）"]


def test_sample_histogram_matches_probabilities(logits, tok):
    fig = viz.sample_histogram(logits, tok, n_samples=4000, temperature=1.0, top_p=0.9, seed=1, n=5)
    ax = fig.axes[0]
    freq = np.array([p.get_width() for p in ax.patches])
    theory = ax.collections[0].get_offsets()[:, 0]
    assert freq.sum() == pytest.approx(1) and np.allclose(freq, theory, atol=0.03)
    assert np.allclose(theory[:5], probs_after(logits, 1.0, top_p=0.9).topk(5).values.numpy())


# ---------------------------------------------------------------- generation and cost

@pytest.fixture(scope="module")
def generation(model):
    return generate(model, PROMPT, 3)


def test_generation_table_and_figure(generation, tok):
    table = viz.generation_table(generation.steps, tok, generation.prompt_ids)
    assert [r[0] for r in table.rows] == ["第1轮", "第2轮", "第3轮"]
    assert [r[4] for r in table.rows] == [show_piece(s.token) for s in generation.steps]
    assert table.rows[1][3].endswith(show_piece(generation.steps[0].token) + "]")   # round 2 sees round 1's token
    assert "第3轮" in repr(table) and table._repr_html_().count("<tr>") == 4
    drawn = texts(viz.generation_figure(generation.steps, tok, generation.prompt_ids))
    assert all(show_piece(s.token) in drawn for s in generation.steps) and "round 3" in drawn


def test_generation_figure_names_byte_fragments_by_their_character(tok):
    """SmolLM2 spells 国 with two byte tokens: its chips read 国[1/2] and 国[2/2], not their raw bytes."""
    ids = tok.encode("法国")
    assert len(ids) == 3 and tok.decode(ids[1:2]) == "\ufffd"       # 法, then 国 in two byte pieces
    steps = [SimpleNamespace(index=k + 1, context_len=1 + k, token=tok.pieces([i])[0], token_id=i, top=[], prob=1.0)
             for k, i in enumerate(ids[1:])]
    drawn = texts(viz.generation_figure(steps, tok, ids[:1]))
    assert drawn.count("国[1/2]") == 2 and drawn.count("国[2/2]") == 1 and "\\x" not in "".join(drawn)


def test_cost_plots(model):
    stages = flops_by_stage(gpt2_config(), 9)
    fig = viz.flops_bars(stages)
    assert tick_labels(fig.axes[0].yaxis) == list(stages) and "FLOPs in all" in fig.axes[0].get_title()
    fig = viz.time_per_token([8, 64, 256], {"KV cache": [0.01, 0.011, 0.012], "no cache": [0.01, 0.04, 0.15]})
    assert [line.get_label() for line in fig.axes[0].lines] == ["KV cache", "no cache"]
    sizes = {d: weight_bytes(model.config, d) for d in ("fp32", "bf16", "int8", "int4")}
    assert [p.get_width() for p in viz.memory_bars(sizes).axes[0].patches] == list(sizes.values())
    w = model.weights.blocks[0].attn_q.weight
    fig = viz.error_histogram({f"int{b}": dequantize_tensor(quantize_tensor(w, b)) - w for b in (8, 4)})
    assert len(fig.axes[0].patches) == 2 and fig.legends[0].get_texts()[0].get_text().startswith("int8")
    # the wide int4 drawn first, the narrow int8 on top of it (drawn under it, the int8 bars were tinted); the
    # legend keeps the order it was given
    assert [p.get_label().split(":")[0] for p in fig.axes[0].patches] == ["int4", "int8"]


def test_speculative_timeline():
    rounds = [{"proposed": [" Paris", ".", " It"], "accepted": 2, "extra": " The"},
              {"proposed": [" is", " the"], "accepted": 2, "extra": " capital"}]
    drawn = texts(viz.speculative_timeline(rounds))
    assert drawn.count("✓") == 4 and drawn.count("✗") == 1
    assert drawn.count("resample") == 1 and drawn.count("bonus") == 1      # round 1 rejected, round 2 not
    assert "round 1\ntokens +3" in drawn and "round 2\ntokens +3" in drawn
    one = texts(viz.speculative_timeline([{"proposed": [" of"], "accepted": 0, "extra": " France"}]))
    assert "round 1\ntokens +1" in one                                   # reads right for one token as for three
    none = texts(viz.speculative_timeline([{"proposed": [], "accepted": 0, "extra": " France"}]))
    assert "target's token" in none and "bonus" not in none               # nothing guessed: no bonus either
    cut = texts(viz.speculative_timeline(rounds, kept=4))                 # the generation stopped after 4 tokens
    assert "round 2\ntokens +1" in cut and "2 cut: after the end token" in cut
    zh = texts(in_chinese(lambda: viz.speculative_timeline(rounds)))
    assert "重采样" in zh and "奖励词块" in zh and "第 1 轮\n词块 +3" in zh


def test_stage_timeline(trace, model):
    fig = viz.stage_timeline({"tokenize": 0.001, **lw.timed_forward(model, trace.ids)[1], "softmax": 0.0005, "sample": 0.0001})
    assert tick_labels(fig.axes[0].yaxis) == ["tokenize", "embedding", f"{model.config.n_layer} layers",
                                              "final norm", "lm head", "softmax", "sample"]
    title = viz.stage_timeline({"tokenize": 0.2, "embedding": 0.2374}).axes[0].get_title()
    assert title.endswith(": 437 ms in all")                            # whole milliseconds


# ---------------------------------------------------------------- widgets

def png_of(widget) -> str:
    return widget.output.outputs[0]["data"]["image/png"]


@pytest.fixture(scope="module")
def sampler(logits, tok):
    return viz.sampling_widget(logits, tok, n=6)


def test_sampling_widget_follows_its_twin(sampler, logits, tok):
    before = png_of(sampler)
    sampler.set(temperature=0.5, top_k=4, top_p=1.0, min_p=0.0)
    assert png_of(sampler) != before
    twin = viz.sampling_panel(logits, tok, 0.5, 4, None, None, n=6)
    assert signature(sampler.figure) == signature(twin)
    sampler.controls["top_k"].value = 0                                  # one control: redraws on its own
    assert "49152 of 49152 tokens kept" in texts(sampler.figure)
    figure = sampler.figure
    sampler.set(temperature=1.3, top_k=10, top_p=0.9, min_p=0.05)         # redrawn in place, as a new one would be
    assert sampler.figure is figure
    assert signature(figure) == signature(viz.sampling_panel(logits, tok, 1.3, 10, 0.9, 0.05, n=6))


def test_png_of_an_uncropped_figure_holds_exactly_the_canvas_pixels():
    """The widgets' own PNG writer (no row filters, fast deflate): PIL decodes it to the very pixels drawn."""
    from io import BytesIO

    from PIL import Image
    fig = Figure(figsize=(3.1, 1.7), dpi=77)                    # odd sizes: no row or column to spare
    ax = fig.subplots()
    ax.imshow(np.random.default_rng(0).random((9, 13)), cmap="viridis")
    ax.set_title("héllo · ∑")
    data = viz.png(fig, crop=False)
    image = Image.open(BytesIO(data))
    assert image.format == "PNG" and image.mode == "RGB" and image.size == fig.canvas.get_width_height()
    rgba = np.asarray(fig.canvas.buffer_rgba())
    assert np.array_equal(np.asarray(image), rgba[:, :, :3]) and rgba[:, :, :3].std() > 10


def test_sampling_widget_blits_the_picture_of_a_full_draw(logits, tok):
    """Each move draws only the artists settings change, over pixels kept from the first one: the cut marks a move
    removes must vanish, and the picture must equal the same figure drawn whole."""
    from test_viz_attention import decoded, same_pixels
    w = viz.sampling_widget(logits, tok, n=6)
    shown = []
    # T = 2: the x axis shrinks to the flat bars; back to T = 1 without cuts: the long x label gives way to the
    # plain "probability", whose old pixels must not stay behind
    for move in (dict(temperature=0.5, top_k=4, top_p=0.9), dict(temperature=2.0, top_k=0, top_p=1.0),
                 dict(temperature=0.8, min_p=0.05), dict(temperature=1.0, min_p=0.0)):
        w.set(**move)
        shown.append(base64.b64decode(png_of(w)))
        assert w._background is not None and same_pixels(shown[-1], viz.png(w.figure, crop=False))
        v = w.values
        fresh = viz.sampling_panel(logits, tok, v["temperature"], v["top_k"] or None,
                                   v["top_p"] if v["top_p"] < 1 else None, v["min_p"] or None, n=6)
        assert signature(w.figure) == signature(fresh)
        assert [ax.get_xlim() for ax in w.figure.axes] == [ax.get_xlim() for ax in fresh.axes]
    assert w.figure.axes[0].get_xlabel() == "probability"
    assert decoded(shown[0]).shape == decoded(shown[1]).shape and not same_pixels(shown[0], shown[1])


def test_attention_and_lens_widgets_follow_their_twins(trace, tok, model):
    w = viz.attention_widget(trace, tok)
    assert set(w.controls) == {"layer", "head"} and w.controls["head"].max == model.config.n_head - 1
    w.set(layer=7, head=3)
    assert w.figure.axes[0].get_title() == "layer 7, head 3"
    assert signature(w.figure) == signature(viz.attention_heatmap(trace, tok, 7, 3))
    lens = viz.logit_lens_widget(trace, model)
    lens.controls["position"].value = 1
    assert signature(lens.figure) == signature(viz.logit_lens_top(trace, model, 1))


def test_token_chips_widget(tok):
    w = viz.token_chips_widget({"SmolLM2": tok, "GPT-2": lw.gpt2_tokenizer()})
    w.controls["text"].value = "人工智能"
    assert f"SmolLM2\n{len(tok.encode('人工智能'))} tokens" in texts(w.figure)


WORDS = [" Paris", " London", " France", " king", " dog"]


def test_similarity_widget_follows_its_twin(model, tok):
    w = viz.similarity_widget(model, "Paris, London, France")
    assert set(w.controls) == {"words", "space"} and w.error is None
    before = png_of(w)
    w.controls["words"].value = "Paris ,London,France， king, dog,"   # spaces and Chinese commas, a trailing comma
    assert png_of(w) != before
    rows = [tok.encode(word)[0] for word in WORDS]
    twin = viz.similarity_matrix(model.weights.token_embd[rows], [repr(word) for word in WORDS])
    assert signature(w.figure) == signature(twin)
    w.controls["space"].value = False                                   # 'Paris' without its space: another row
    assert tick_labels(w.figure.axes[0].yaxis)[0] == "'Paris'"


def test_similarity_widget_explains_bad_words(model):
    w = viz.similarity_widget(model, "Paris, 巴黎")
    assert w.figure is None and "' 巴黎' is 6 tokens" in w.error and "one token" in w.error
    message = w.output.outputs[0]
    assert message["output_type"] == "stream" and message["text"].startswith("⚠ ' 巴黎' is 6 tokens")
    assert "Traceback" not in message["text"]
    w.controls["words"].value = "Paris"
    assert w.figure is None and "at least two words" in w.error
    w.controls["words"].value = "Paris, dog"                           # fixed: the figure is back
    assert w.error is None and png_of(w)


def test_next_token_widget_follows_its_twin(model, tok):
    w = viz.next_token_widget(model, PROMPT, n=6)
    assert set(w.controls) == {"prompt", "n", "chat"}
    logits = lw.forward(model, tok.encode(PROMPT), record=False, last_only=True).logits[-1]
    assert signature(w.figure) == signature(viz.prob_bars(logits, tok, n=6, title=f"after {PROMPT!r}"))
    before = png_of(w)
    w.controls["n"].value = 3                                           # the slider alone redraws
    assert png_of(w) != before and len(w.figure.axes[0].patches) == 3
    w.set(prompt=ZH, chat=True, n=5)
    chat_logits = lw.forward(model, tok.encode(ZH, chat=True), record=False, last_only=True).logits[-1]
    twin = viz.prob_bars(chat_logits, tok, n=5, title=f"after {ZH!r} (chat template)")
    assert signature(w.figure) == signature(twin)


def test_next_token_widget_explains_bad_prompts(model):
    w = viz.next_token_widget(model, "")
    assert w.figure is None and "prompt is empty" in w.error
    assert w.output.outputs[0]["text"].startswith("⚠ the prompt is empty")
    w.controls["prompt"].value = "I paid $5 and $6 for"                 # two $ would start mathtext
    assert w.error is None and "$5" in w.figure.axes[0].get_title().replace("\\", "") and png_of(w)
    assert "chat" not in viz.next_token_widget(SimpleNamespace(tokenizer=lw.gpt2_tokenizer()), "").controls


def test_next_token_widget_refuses_a_prompt_past_its_limit_before_running_the_model(model, monkeypatch):
    """The probe's unbounded widget work: a pasted book would run one pass for minutes. Past the limit the widget
    says how long the prompt is and what to do, and no forward pass starts."""
    from llmwalk.viz import widgets
    w = viz.next_token_widget(model, "The capital", max_tokens=8)
    monkeypatch.setattr(widgets, "forward", lambda *a, **k: pytest.fail("a forward pass ran"))
    long = "The capital of France is the city of light, and so on"
    w.controls["prompt"].value = long
    n = len(model.tokenizer.encode(long))
    assert w.figure is None and w.error.startswith(f"{n} tokens: a widget runs prompts of at most 8 tokens")


def test_cost_widget_follows_its_twin(model):
    configs = {"GPT-2 small": gpt2_config(), "SmolLM2": model.config}
    w = viz.cost_widget(configs)
    assert set(w.controls) == {"name", "context", "kv_cache"} and w.values == {"name": "GPT-2 small", "context": 9,
                                                                               "kv_cache": True}
    twin = viz.flops_bars(decode_step_flops(gpt2_config(), 9), "GPT-2 small, one token at context 9, KV cache")
    assert signature(w.figure) == signature(twin)
    cached = png_of(w)
    w.controls["kv_cache"].value = False                                 # recompute the prefix: more FLOPs
    assert png_of(w) != cached and "no cache" in w.figure.axes[0].get_title()
    w.set(name="SmolLM2", context=512, kv_cache=True)
    total = sum(decode_step_flops(model.config, 512).values())
    assert w.figure.axes[0].get_title().endswith(f"{si(total)} FLOPs in all")


def test_generation_widget_steps_like_generate(model, tok):
    from test_viz_attention import same_pixels
    w = viz.generation_widget(model, PROMPT, temperature=0.8, seed=3, n=5)
    first = png_of(w)
    for _ in range(2):
        w.controls["next"].click()
    expected = generate(model, PROMPT, 2, temperature=0.8, seed=3, kv_cache=False)
    assert w.ids == expected.ids and png_of(w) != first
    twin = viz.prob_bars(w.logits, tok, 0.8, n=5, title="…" + tok.decode(w.ids)[-60:].replace("\n", "↵"))
    assert signature(w.figure) == signature(twin)                       # redrawn in place for the next round
    assert same_pixels(base64.b64decode(png_of(w)), viz.png(w.figure, crop=False))   # blitted: a full draw's picture
    assert w.table.value.count("<tr>") == 3                             # header and two rounds
    w.controls["reset"].click()
    assert w.ids == tok.encode(PROMPT) and w.table.value.count("<tr>") == 1
    assert signature(w.figure) == signature(viz.prob_bars(w.logits, tok, 0.8, n=5, title="…" + PROMPT))
    w.controls["next"].click()
    assert w.ids == expected.ids[:-1]                                   # re-seeded: the same first draw
    w.controls["seed"].value = 4                                        # a new seed starts over
    assert w.ids == tok.encode(PROMPT)


def test_generation_widget_lays_out_again_for_longer_token_names(model, tok):
    """The widget keeps its first layout (no layout pass per click) until a round's token names need more room than
    it left: then it lays the figure out again, so no name is cut at the figure's edge."""
    from test_viz_attention import same_pixels
    w = viz.generation_widget(model, PROMPT, n=5)
    ax = w.figure.axes[0]
    left = ax.get_position().x0
    long = [i for i in range(2000) if len(show_piece(tok.pieces([i])[0])) >= 11][:5]
    assert len(long) == 5
    w.logits = torch.full_like(w.logits, -10.0).index_put((torch.tensor(long),), torch.arange(10.0, 5.0, -1))
    w.redraw()
    assert [t.get_text() for t in ax.get_yticklabels()] == shown(tok, long)
    assert ax.get_position().x0 > left
    assert ax.yaxis.get_tightbbox(w.figure.canvas.get_renderer()).x0 >= 0                 # inside the figure
    assert same_pixels(base64.b64decode(png_of(w)), viz.png(w.figure, crop=False))
    wider = ax.get_position().x0
    w.reset()                                   # shorter names again: the room stays (the chart does not jump)
    assert ax.get_position().x0 == wider and same_pixels(base64.b64decode(png_of(w)), viz.png(w.figure, crop=False))


def control_values(controls: dict) -> st.SearchStrategy:
    """Any value each slider allows."""
    def one(c):
        if isinstance(c, W.IntSlider):
            return st.integers(c.min, c.max)
        return st.sampled_from([value for _, value in c.options])
    return st.fixed_dictionaries({k: one(c) for k, c in controls.items()})


FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(data=st.data())
def test_sampling_widget_never_raises(sampler, data):
    values = data.draw(control_values(sampler.controls))
    sampler.set(**values)
    assert isinstance(sampler.figure, Figure) and png_of(sampler)


@FUZZ
@given(data=st.data())
def test_attention_widget_never_raises(trace, tok, data):
    w = viz.attention_widget(trace, tok)
    w.set(**data.draw(control_values(w.controls)))
    assert w.figure.axes[0].get_title() == f"layer {w.values['layer']}, head {w.values['head']}"


@FUZZ
@given(text=st.text(max_size=20))
def test_token_chips_widget_never_raises(tok, text):
    w = viz.token_chips_widget({"SmolLM2": tok}, text)
    assert f"SmolLM2\n{len(tok.encode(text))} tokens" in texts(w.figure)


@FUZZ
@given(text=st.text(max_size=30), space=st.booleans())
def test_similarity_widget_never_raises(model, text, space):
    w = viz.similarity_widget(model, text, space)
    assert (w.figure is None) != (w.error is None)                      # a figure or a message, never a traceback
    if w.figure is not None:
        assert png_of(w)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=st.text(max_size=20), chat=st.booleans())
def test_next_token_widget_never_raises(model, prompt, chat):
    w = viz.next_token_widget(model, prompt, n=3, chat=chat)
    assert (w.figure is None) != (w.error is None)
    if w.figure is not None:
        assert len(w.figure.axes[0].patches) == 3


@pytest.fixture(scope="module")
def stepper(model):
    return viz.generation_widget(model, PROMPT, n=5)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), seed=st.integers(-2**53, 2**53))                 # IntText: any JavaScript-safe integer
def test_generation_widget_never_raises(stepper, data, seed):
    temperature = data.draw(control_values({"t": stepper.controls["temperature"]}))["t"]
    stepper.set(temperature=temperature, seed=seed)
    stepper.controls["reset"].click()
    stepper.controls["next"].click()
    assert len(stepper.steps) == 1 and 0 <= stepper.steps[0].prob <= 1
    if temperature == 0:
        assert stepper.steps[0].prob == 1.0                              # greedy


def test_generation_chips_fall_back_to_the_drawn_p_when_the_model_p_is_unknown(tok):
    """A sampled token outside Step.top has no model p to show: its chip shows the p it was drawn with, never "–"."""
    ids = tok.encode("The capital of France is Paris")
    step = SimpleNamespace(index=1, context_len=len(ids) - 1, token=tok.pieces(ids[-1:])[0], token_id=ids[-1],
                           top=[(ids[-1] + 1, "x", 0.9)], prob=0.25)
    drawn = texts(viz.generation_figure([step], tok, ids[:-1]))
    assert "p = 0.25" in drawn and not any("–" in s for s in drawn)
