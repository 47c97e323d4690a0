"""The reliability probe's inputs for the widgets and the smaller public functions (reviews/reliability.md 1.4, 1.5,
1.10, 1.11, B11, B16, B18, B21): each gets a message naming the fix, never a raw error, a hang or a silent odd value."""
import json
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

import ipywidgets as W  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.patches import FancyBboxPatch  # noqa: E402

import llmwalk as lw  # noqa: E402
import llmwalk.viz as viz  # noqa: E402
from llmwalk.accuracy import perplexity  # noqa: E402
from llmwalk.cost import (flops_by_stage, generation_flops, gpt2_config, n_params,  # noqa: E402
                          weight_bytes)
from llmwalk.i18n import t  # noqa: E402
from llmwalk.quantize import LINEARS, dequantize_tensor, quantize_model, quantize_tensor  # noqa: E402
from llmwalk.sampling import greedy, sample  # noqa: E402
from llmwalk.viz.tokens import MAX_CHIPS  # noqa: E402
from llmwalk.viz.plot_widget import PlotWidget  # noqa: E402

PROMPT = "The capital of France is"
pytestmark = pytest.mark.usefixtures("one_thread")   # see conftest.py


@pytest.fixture(scope="module")
def model(smollm2):
    return smollm2


def texts(fig) -> list[str]:
    return [x.get_text() for x in fig.findobj(matplotlib.text.Text)]


def chips(fig) -> int:
    return sum(isinstance(p, FancyBboxPatch) for p in fig.axes[0].patches)


# ---------------------------------------------------------------- B11: token chips, bounded

# A child under a 6 GB address-space cap: before the bound this text took 6 minutes and 3 GB (B11).
CHILD = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (6 * 2**30, 6 * 2**30))
sys.path.insert(0, sys.argv[1])
import llmwalk as lw, llmwalk.viz as viz
from matplotlib.patches import FancyBboxPatch
tok = lw.load_model("smollm2-135m").tokenizer
w = viz.token_chips_widget({"SmolLM2": tok, "GPT-2": lw.gpt2_tokenizer()})
w.set(text="hello world " * 8334)
fig = w.figure
print(json.dumps({"chips": sum(isinstance(p, FancyBboxPatch) for p in fig.axes[0].patches),
                  "texts": [x.get_text() for x in fig.axes[0].texts], "error": w.error,
                  "png": len(w.output.outputs[0]["data"]["image/png"])}))
"""


def test_token_chips_widget_on_100k_characters_draws_a_bounded_row_and_says_so():
    done = subprocess.run([sys.executable, "-c", CHILD, str(Path(__file__).parents[1])], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["error"] is None and out["chips"] == 2 * MAX_CHIPS       # two rows of MAX_CHIPS, not 33k chips
    counts = {s.split("\n")[0]: int(s.split("\n")[1].split()[0]) for s in out["texts"] if s.count("\n") == 1}
    assert set(counts) == {"SmolLM2", "GPT-2"} and min(counts.values()) > 16000   # the row says the whole count
    assert any("showing the first 100 of" in s and "shorter text" in s for s in out["texts"])
    assert out["png"] < 2_000_000                                         # base64; was tens of MB


def test_token_chips_compare_cuts_each_row_and_only_past_the_limit():
    gpt2 = lw.gpt2_tokenizer()
    text = "hello world " * 100
    fig = viz.token_chips_compare(text, {"GPT-2": gpt2}, max_tokens=30)
    assert chips(fig) == 30
    assert t("viz.tokens.cut", shown=30, n=len(gpt2.encode(text))) in texts(fig)
    short = viz.token_chips_compare("hello world", {"GPT-2": gpt2}, max_tokens=30)
    assert chips(short) == 2 and not any("showing" in s for s in texts(short))


def test_the_cut_note_is_written_in_both_languages():
    lw.set_language("zh")
    try:
        assert "30" in t("viz.tokens.cut", shown=30, n=200) and "更短" in t("viz.tokens.cut", shown=30, n=200)
    finally:
        lw.set_language("en")


# ---------------------------------------------------------------- B16: errors stay inside the widget

@pytest.mark.parametrize("make", [
    lambda m: viz.token_chips_widget({"SmolLM2": m.tokenizer}, "a\ud800b"),
    lambda m: viz.similarity_widget(m, "Paris, \ud800"),
    lambda m: viz.next_token_widget(m, "The capital\ud800"),
])
def test_a_lone_surrogate_becomes_the_widgets_message(model, make):
    w = make(model)                                                       # tokenizers raised a TypeError here
    assert w.figure is None and "'\\ud800'" in w.error and "delete it" in w.error
    assert w.output.outputs[0]["text"].startswith("⚠ ")


def test_a_type_error_from_the_plot_is_shown_not_raised():
    def plot(x):
        raise TypeError(f"cannot draw {x}")
    w = PlotWidget(plot, {"x": W.IntSlider(value=1)})
    w.controls["x"].value = 2                                             # an observer: must not raise
    assert w.error == "cannot draw 2" and w.figure is None


# ---------------------------------------------------------------- B18: a seed torch cannot take

@pytest.mark.parametrize("seed", [2**64, -2**63 - 1, 10**30])
def test_generation_widget_survives_a_seed_outside_int64(model, seed):
    w = viz.generation_widget(model, PROMPT, temperature=0.8, seed=0, n=5)
    w.controls["seed"].value = seed
    assert "out of range" in w.error
    w.reset()
    w.next()                                                              # drew nothing: the message stays
    assert w.steps == [] and "out of range" in w.error
    w.controls["seed"].value = 3
    w.next()
    fresh = viz.generation_widget(model, PROMPT, temperature=0.8, seed=3, n=5)
    fresh.next()
    assert w.error is None and [s.token_id for s in w.steps] == [s.token_id for s in fresh.steps]


# ---------------------------------------------------------------- widget factories (W4, W6, W8, W15)

def test_widget_factories_refuse_what_they_cannot_draw(model):
    ids = model.tokenizer.encode(PROMPT)
    unrecorded = lw.forward(model, ids, record=False)
    with pytest.raises(ValueError, match=r"one \[vocab\] row.*trace.logits\[-1\]"):
        viz.sampling_widget(unrecorded.logits, model.tokenizer)
    for make in (lambda: viz.attention_widget(unrecorded, model.tokenizer),
                 lambda: viz.attention_step_widget(unrecorded, model),
                 lambda: viz.logit_lens_widget(unrecorded, model)):
        with pytest.raises(ValueError, match="record=False"):
            make()
    with pytest.raises(ValueError, match=r"k \(tokens shown per layer\) must be an int in 1\.\.20"):
        viz.logit_lens_widget(lw.forward(model, ids), model, k=10**6)
    with pytest.raises(ValueError, match="at least one model"):
        viz.cost_widget({})
    with pytest.raises(ValueError, match="max_context must be an int >= 1"):
        viz.cost_widget({"SmolLM2": model.config}, max_context=0)


# ---------------------------------------------------------------- sampling and generation (G5, G12, G13)

def test_a_fraction_temperature_samples_like_its_float():
    logits = torch.randn(50, generator=torch.Generator().manual_seed(1))
    draws = [int(sample(logits, temp, top_p=p, min_p=m, generator=torch.Generator().manual_seed(7)))
             for temp, p, m in ((Fraction(1, 2), Fraction(9, 10), Fraction(1, 20)), (0.5, 0.9, 0.05))]
    assert draws[0] == draws[1]


def test_all_minus_inf_logits_are_refused_by_sample_and_greedy():
    dead = torch.full((5,), float("-inf"))
    for choose in (lambda: sample(dead, generator=torch.Generator().manual_seed(0)), lambda: greedy(dead)):
        with pytest.raises(ValueError, match="-inf everywhere"):
            choose()
    assert int(greedy(torch.tensor([float("-inf"), 1.0]))) == 1          # one finite token is enough


def test_top_n_past_the_vocabulary_is_refused_before_the_forward_pass(model, monkeypatch):
    import llmwalk.generation
    monkeypatch.setattr(llmwalk.generation, "forward", lambda *a, **k: pytest.fail("the forward pass ran"))
    with pytest.raises(ValueError, match=rf"top_n must be an int in 0\.\.{model.config.vocab_size}"):
        lw.generate(model, PROMPT, 2, top_n=10**6)


# ---------------------------------------------------------------- quantization (Q4, Q5, Q6)

@pytest.mark.parametrize("w, kwargs, match", [
    (torch.ones(8), {}, r"\[d_in, d_out\] matrix, got shape \(8,\)"),
    (torch.ones(2, 4, 4), {}, r"got shape \(2, 4, 4\)"),
    (torch.ones(0, 4), {}, r"got shape \(0, 4\)"),
    (torch.ones(8, 4), {"group_size": -4}, "group_size must be an int >= 1"),
    (torch.ones(8, 4), {"bits": 8.0}, "bits must be 8 or 4, not 8.0"),
])
def test_quantize_tensor_refuses_shapes_and_settings_it_cannot_round(w, kwargs, match):
    with pytest.raises(ValueError, match=match):
        quantize_tensor(w, **kwargs)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_a_nan_or_inf_weight_is_refused_and_located(bad):
    w = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    w[1, 0] = bad
    with pytest.raises(ValueError, match=r"1 NaN/inf weights \(the first at \(1, 0\)\)"):
        quantize_tensor(w)


def test_finite_weights_whose_sum_overflows_are_quantized():
    """The check sums the weights first (a NaN or inf makes the sum one too): finite weights whose sum overflows to
    inf are then checked one by one, and accepted."""
    w = torch.full((8, 2), 1e38)
    assert not w.sum().isfinite()
    assert dequantize_tensor(quantize_tensor(w)).isfinite().all()


def test_quantize_model_names_the_matrix_with_a_nan_weight():
    w = torch.ones(4, 4)
    w[2, 3] = float("nan")
    blocks = [SimpleNamespace(**{n: None for n in LINEARS}) for _ in range(2)]
    blocks[1].ffn_up = SimpleNamespace(weight=w)
    fake = SimpleNamespace(source="tiny", weights=SimpleNamespace(blocks=blocks, token_embd=torch.ones(3, 4)))
    with pytest.raises(ValueError, match=r"'tiny' layer 1 ffn_up holds 1 NaN/inf weights"):
        quantize_model(fake)


# ---------------------------------------------------------------- accuracy and cost (Z2, Z3, Z4, Z5, Z7)

@pytest.mark.parametrize("text, chunk, match", [
    ("", 512, "text is empty"),
    ("Hi", 512, "only 1 token long"),
    (PROMPT, 1, "chunk must be an int >= 2"),
    (PROMPT, 0, "chunk must be an int >= 2"),
    (PROMPT, -1, "chunk must be an int >= 2"),
])
def test_perplexity_refuses_texts_with_nothing_to_predict(model, text, chunk, match):
    with pytest.raises(ValueError, match=match):
        perplexity(model, text, chunk=chunk)


def test_counts_refuse_negative_token_numbers_and_unknown_names(model):
    cfg = model.config
    for call, match in ((lambda: flops_by_stage(cfg, -5), "tokens must be an int >= 1"),
                        (lambda: lw.cost.decode_step_flops(cfg, 0), "context must be an int >= 1"),
                        (lambda: generation_flops(cfg, 5, -3), "new_tokens must be an int >= 0"),
                        (lambda: weight_bytes(cfg, "int3"), "dtype must be one of 'fp32'"),
                        (lambda: gpt2_config("huge"), "size must be one of 'small'")):
        with pytest.raises(ValueError, match=match):
            call()
    assert n_params(model) == n_params(cfg) > 0                          # a Model, as weight_bytes takes one
