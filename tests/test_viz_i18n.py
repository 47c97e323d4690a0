"""Every public plot and widget of llmwalk.viz speaks the language set with lw.set_language: the same figure drawn
in English and in Chinese shows Chinese text where the English one shows English, and the same data.

LLMWALK_VIZ_PNGS=<dir> also writes each Chinese figure there as PNG (to look at: no boxes, nothing clipped)."""
import os
import re
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.text import Text  # noqa: E402

import llmwalk as lw  # noqa: E402
import llmwalk.viz as viz  # noqa: E402
from llmwalk.attribution import logit_attribution  # noqa: E402
from llmwalk.cost import decode_step_flops, flops_by_stage, gpt2_config  # noqa: E402
from llmwalk.generation import generate  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")   # see conftest.py
PROMPT = "The capital of France is"
CJK = re.compile(r"[\u3400-\u9fff\uff00-\uffef\u3000-\u303f]")


@pytest.fixture(scope="module")
def walk(smollm2):
    """What the plots draw, computed once: a trace, a generation, a journey, interventions' shapes."""
    tok = smollm2.tokenizer
    trace = lw.forward(smollm2, tok.encode(PROMPT))
    other = lw.forward(smollm2, trace.ids.flip(0))                     # the same tokens in another order
    paris, berlin = tok.token_id(" Paris"), tok.token_id(" Berlin")
    return dict(model=smollm2, tok=tok, trace=trace, other=other, tokens=[paris, berlin],
                seconds=lw.timed_forward(smollm2, trace.ids)[1],
                generation=generate(smollm2, PROMPT, max_new_tokens=3, seed=0),
                journey=lw.journey(smollm2, PROMPT, max_new_tokens=3))


PLOTS = {   # name: the plot drawn from `walk` (every public plot function of llmwalk.viz)
    "mask_plot": lambda w: viz.mask_plot(list("法国的首都")),
    "mask_and_attention": lambda w: viz.mask_and_attention(w["trace"], w["tok"], 3, 1),
    "attention_heatmap": lambda w: viz.attention_heatmap(w["trace"], w["tok"], 3, 1),
    "attention_heads": lambda w: viz.attention_heads(w["trace"], w["tok"], 3),
    "attention_step": lambda w: viz.attention_step(w["trace"], w["model"], 3, 1),
    "last_token_attention": lambda w: viz.last_token_attention(w["trace"], w["tok"]),
    "prob_bars": lambda w: viz.prob_bars(w["trace"].logits[-1], w["tok"], 0.7, top_k=5, top_p=0.9),
    "surgery_plot": lambda w: viz.surgery_plot(w["trace"].logits[-1], w["tok"], 0.7, 5, 0.9),
    "sampling_panel": lambda w: viz.sampling_panel(w["trace"].logits[-1], w["tok"], 0.7, 5, 0.9),
    "sample_histogram": lambda w: viz.sample_histogram(w["trace"].logits[-1], w["tok"], 200),
    "residual_norms": lambda w: viz.residual_norms(w["trace"], w["tok"]),
    "norm_stats": lambda w: viz.norm_stats(w["trace"]),
    "ffn_widths": lambda w: viz.ffn_widths(gpt2_config(), w["model"].config),
    "ffn_activations": lambda w: viz.ffn_activations(),
    "block_diagram": lambda w: viz.block_diagram(w["model"].config),
    "intervention_bars": lambda w: viz.intervention_bars({"—": [0.7, 0.1], "FFN 3": [0.2, 0.3]}, w["tok"],
                                                         w["tokens"]),
    "patching_heatmap": lambda w: viz.patching_heatmap(
        torch.rand(w["model"].config.n_layer + 1, 5, generator=torch.Generator().manual_seed(0)), w["tok"],
        w["trace"].ids, w["tokens"][0], "The capital of Germany is"),
    "ablation_sweep": lambda w: viz.ablation_sweep({"FFN": [0.5] * 4}, 0.7, " Paris"),
    "logit_attribution_bars": lambda w: viz.logit_attribution_bars(
        logit_attribution(w["model"], w["trace"], w["tokens"][0]), w["tok"]),
    "direct_vs_total": lambda w: viz.direct_vs_total({"FFN": [0.5, -0.2]}, {"FFN": [1.0, 0.3]}, " Paris"),
    "logit_lens_grid": lambda w: viz.logit_lens_grid(w["trace"], w["model"]),
    "logit_lens_top": lambda w: viz.logit_lens_top(w["trace"], w["model"]),
    "token_rank": lambda w: viz.token_rank(w["trace"], w["model"], " Paris"),
    "vector_strips": lambda w: viz.vector_strips(w["trace"].tok_emb, w["tok"].pieces(w["trace"].ids)),
    "similarity_matrix": lambda w: viz.similarity_matrix(w["trace"].tok_emb, w["tok"].pieces(w["trace"].ids)),
    "position_table": lambda w: viz.position_table(torch.randn(64, 32, generator=torch.Generator().manual_seed(0))),
    "rope_frequencies": lambda w: viz.rope_frequencies(),
    "order_demo": lambda w: viz.order_demo(w["trace"], w["other"], w["tok"].pieces(w["trace"].ids),
                                           w["tok"].pieces(w["other"].ids)),
    "token_chips": lambda w: viz.token_chips(PROMPT, w["tok"]),
    "token_chips_compare": lambda w: viz.token_chips_compare("法国", {"SmolLM2": w["tok"], "again": w["tok"]}),
    "generation_figure": lambda w: viz.generation_figure(w["generation"].steps, w["tok"],
                                                         w["generation"].prompt_ids),
    "journey_diagram": lambda w: viz.journey_diagram(w["journey"]),
    "pipeline_diagram": lambda w: viz.pipeline_diagram(w["journey"], w["tok"]),
    "flops_bars": lambda w: viz.flops_bars(flops_by_stage(gpt2_config(), 9)),
    "memory_bars": lambda w: viz.memory_bars({"fp32": 4e8, "int8": 1e8}),
    "time_per_token": lambda w: viz.time_per_token([8, 64], {"KV": [0.01, 0.011]}),
    "error_histogram": lambda w: viz.error_histogram(torch.randn(1000, generator=torch.Generator().manual_seed(0))),
    "speculative_timeline": lambda w: viz.speculative_timeline([{"proposed": [" a", " b"], "accepted": 1,
                                                                 "extra": " c"}]),
    "stage_timeline": lambda w: viz.stage_timeline({"tokenize": 0.001, **w["seconds"]}),
    "pass_cost": lambda w: viz.pass_cost([1, 2, 4], [1e8, 2e8, 4e8], [5e8, 5e8, 5e8], [0.01, 0.01, 0.012]),
}
WIDGETS = {  # name: the widget built from `walk`
    "sampling_widget": lambda w: viz.sampling_widget(w["trace"].logits[-1], w["tok"]),
    "attention_widget": lambda w: viz.attention_widget(w["trace"], w["tok"]),
    "attention_step_widget": lambda w: viz.attention_step_widget(w["trace"], w["model"]),
    "logit_lens_widget": lambda w: viz.logit_lens_widget(w["trace"], w["model"]),
    "token_chips_widget": lambda w: viz.token_chips_widget({"SmolLM2": w["tok"]}),
    "similarity_widget": lambda w: viz.similarity_widget(w["model"]),
    "next_token_widget": lambda w: viz.next_token_widget(w["model"]),
    "cost_widget": lambda w: viz.cost_widget({"GPT-2": gpt2_config()}),
}


def shown_texts(fig: Figure) -> list[str]:
    """Every non-empty text the figure draws (titles, axis and tick labels, legends, annotations)."""
    fig.draw_without_rendering()
    return [s for s in (t.get_text() for t in fig.findobj(Text)) if s.strip()]


def in_language(language: str, build):
    lw.set_language(language)
    try:
        return build()
    finally:
        lw.set_language("en")


def chinese_only(en: list[str], zh: list[str]) -> list[str]:
    """Texts with Chinese characters that the Chinese figure shows and the English one does not."""
    return [s for s in set(zh) - set(en) if CJK.search(s)]


def test_every_public_plot_is_covered():
    public = {name for name, f in vars(viz).items()
              if callable(f) and getattr(f, "__module__", "").startswith("llmwalk.viz.") and not name.startswith("_")}
    helpers = {"piece_labels", "use_cjk_font", "png", "PlotWidget", "generation_table", "generation_widget"}
    assert public - helpers == set(PLOTS) | set(WIDGETS)


@pytest.mark.parametrize("name", sorted(PLOTS))
def test_plot_speaks_chinese(walk, name):
    en = in_language("en", lambda: PLOTS[name](walk))
    zh = in_language("zh", lambda: PLOTS[name](walk))
    assert chinese_only(shown_texts(en), shown_texts(zh)), f"{name}: no Chinese text in the Chinese figure"
    for a, b in zip(en.findobj(lambda o: hasattr(o, "get_array") and o.get_array() is not None),
                    zh.findobj(lambda o: hasattr(o, "get_array") and o.get_array() is not None)):
        assert np.array_equal(np.ma.filled(a.get_array(), 0), np.ma.filled(b.get_array(), 0))   # the same data
    if os.environ.get("LLMWALK_VIZ_PNGS"):
        out = Path(os.environ["LLMWALK_VIZ_PNGS"])
        out.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():
            warnings.simplefilter("error")                            # a glyph missing from the font fails
            zh.savefig(out / f"{name}.png", bbox_inches="tight")


@pytest.mark.parametrize("name", sorted(WIDGETS))
def test_widget_labels_and_figure_speak_chinese(walk, name):
    en = in_language("en", lambda: WIDGETS[name](walk))
    zh = in_language("zh", lambda: WIDGETS[name](walk))
    labels = lambda w: [c.description for c in w.controls.values()]                 # noqa: E731
    assert all(CJK.search(s) for s in labels(zh)), labels(zh)
    assert not any(CJK.search(s) for s in labels(en)), labels(en)
    if name != "token_chips_widget":                              # chips show the text and its token count only
        assert chinese_only(shown_texts(en.figure), shown_texts(zh.figure)), name


@pytest.mark.parametrize("name", sorted(WIDGETS))
def test_a_widgets_plain_text_names_its_controls_in_its_language(walk, name, monkeypatch):
    """Where widgets do not run (a notebook viewer, a terminal) a reader sees the widget's text/plain: a sentence
    naming its controls in the notebook's language, not ipywidgets' repr (`VBox(children=(… description='温度'`)."""
    shown = []
    monkeypatch.setattr("llmwalk.viz.plot_widget.display", lambda bundle, raw: shown.append((bundle, raw)))
    for language in ("en", "zh"):
        w = in_language(language, lambda: WIDGETS[name](walk))
        w._ipython_display_()
        bundle, raw = shown[-1]
        assert raw and bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == w.box.model_id
        text = bundle["text/plain"]
        assert all(c.description in text for c in w.controls.values()), text
        assert "VBox" not in text and "'" not in text and "JupyterLab" in text, text
        assert bool(CJK.search(text)) == (language == "zh"), text


def test_chinese_tables_and_widget_messages(walk):
    table = in_language("zh", lambda: viz.generation_table(walk["generation"].steps, walk["tok"],
                                                           walk["generation"].prompt_ids))
    assert table.header[:3] == ("轮次", "上下文长度", "本轮计算的词块")
    w = in_language("zh", lambda: viz.similarity_widget(walk["model"], words="Paris"))
    assert w.figure is None and w.error.startswith("请至少输入两个词")


def test_stage_names_in_cost_figures_speak_chinese(walk):
    """The FLOPs bars and the stage timeline name every stage in Chinese (the code keeps its identifiers)."""
    stages = flops_by_stage(walk["model"].config, 9)
    seconds = {"tokenize": 1e-3, **walk["seconds"], "softmax": 1e-4, "pick a token": 1e-4}
    for build in (lambda: viz.flops_bars(stages), lambda: viz.stage_timeline(seconds)):
        en, zh = ([label.get_text() for label in in_language(language, build).axes[0].get_yticklabels()]
                  for language in ("en", "zh"))
        assert len(zh) == len(en) and not set(en) & set(zh), zh          # no stage left with its English name
    assert viz.cost.stage_label("sample") == "sample" and in_language("zh", lambda: viz.cost.stage_label("x")) == "x"
