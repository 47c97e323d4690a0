"""Accuracy measures of a changed model against the fp32 one, each checked against torch.nn.functional."""
import dataclasses
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import llmwalk as lw
from llmwalk.accuracy import (activation_outliers, compare_formats, compare_to_fp32, eval_ids, eval_text, kl_divergence,
                              log_probs, perplexity, token_nll, top1_agreement, variant)
from llmwalk.quantize import dequantize_model

pytestmark = pytest.mark.usefixtures("one_thread")   # see conftest.py


def test_kl_of_a_distribution_with_itself_is_zero_and_matches_a_hand_computation():
    p = torch.tensor([[0.7, 0.2, 0.1], [0.25, 0.25, 0.5]])
    q = torch.tensor([[0.5, 0.3, 0.2], [0.25, 0.25, 0.5]])
    assert torch.equal(kl_divergence(p.log(), p.log()), torch.zeros(2))
    by_hand = 0.7 * torch.log(torch.tensor(0.7 / 0.5)) + 0.2 * torch.log(torch.tensor(0.2 / 0.3)) \
        + 0.1 * torch.log(torch.tensor(0.1 / 0.2))
    kl = kl_divergence(p.log(), q.log())
    assert torch.allclose(kl, torch.stack([by_hand, torch.tensor(0.0)]), atol=1e-7)
    # torch's KL(p ‖ q) takes log q as input and p (here as log p) as target
    assert torch.allclose(kl, F.kl_div(q.log(), p.log(), reduction="none", log_target=True).sum(-1), atol=1e-7)
    assert torch.equal(top1_agreement(p.log(), q.log()), torch.tensor([True, True]))
    assert torch.equal(top1_agreement(p.log(), q.flip(-1).log()), torch.tensor([False, False]))


def test_perplexity_is_exp_of_the_mean_cross_entropy(smollm2):
    text = eval_text()[:400]
    ids = smollm2.tokenizer.encode(text)
    logits = lw.forward(smollm2, ids, record=False).logits
    reference = F.cross_entropy(logits[:-1], torch.tensor(ids[1:])).exp()
    assert perplexity(smollm2, text) == pytest.approx(float(reference), rel=1e-5)
    assert torch.allclose(token_nll(log_probs(smollm2, ids), ids),
                          F.cross_entropy(logits[:-1], torch.tensor(ids[1:]), reduction="none"), atol=1e-5)
    # in chunks of 32, each chunk is scored on its own: the mean over every chunk's positions
    nll = torch.cat([F.cross_entropy(lw.forward(smollm2, ids[i:i + 32], record=False).logits[:-1],
                                     torch.tensor(ids[i + 1:i + 32]), reduction="none")
                     for i in range(0, len(ids), 32)])
    assert perplexity(smollm2, text, chunk=32) == pytest.approx(float(nll.mean().exp()), rel=1e-5)


def test_a_model_compared_with_itself_is_identical(smollm2):
    c = compare_to_fp32(smollm2, smollm2, eval_text()[:300])
    assert c.kl_mean == 0 and c.kl_max == 0 and c.top1_agreement == 1
    assert c.perplexity == c.perplexity_fp32
    assert c.n_tokens == len(smollm2.tokenizer.encode(eval_text()[:300]))
    assert all(r["max_abs_error"] == 0 for r in c.weight_error)


def test_compare_to_fp32_matches_torch_on_a_bf16_copy(smollm2):
    text = eval_text()[:300]
    bf16 = dequantize_model(dataclasses.replace(smollm2, weights=lw.to_dtype(smollm2.weights, torch.bfloat16)))
    c = compare_to_fp32(smollm2, bf16, text)
    ids = torch.tensor(smollm2.tokenizer.encode(text))
    ref = F.log_softmax(lw.forward(smollm2, ids, record=False).logits, -1)
    out = F.log_softmax(lw.forward(bf16, ids, record=False).logits, -1)
    kl = F.kl_div(out, ref, reduction="none", log_target=True).sum(-1)
    assert c.kl_mean == pytest.approx(float(kl.mean()), rel=1e-4) and c.kl_max == pytest.approx(float(kl.max()), rel=1e-4)
    assert c.kl_mean > 0
    assert c.top1_agreement == pytest.approx(float((ref.argmax(-1) == out.argmax(-1)).float().mean()))
    assert c.perplexity == pytest.approx(float(F.cross_entropy(out[:-1], ids[1:]).exp()), rel=1e-5)
    w, w16 = smollm2.weights.blocks[3].ffn_up.weight, bf16.weights.blocks[3].ffn_up.weight
    assert c.weight_error[3]["max_abs_error"] >= float((w - w16).abs().max())


def test_compare_formats_scores_fp32_once_and_each_format_as_compare_to_fp32_would(smollm2, monkeypatch):
    """The fp32 reference is shared by the formats (one fp32 pass per chunk, not one per format); every row is still
    what compare_to_fp32 gives for that format alone, and its bytes are the quantized format's."""
    names, n = ("int8", "int4 g32 symmetric"), 40
    passes = []
    real = lw.accuracy.log_probs
    monkeypatch.setattr(lw.accuracy, "log_probs", lambda model, ids: passes.append(model) or real(model, ids))
    rows = compare_formats(smollm2, names, n_tokens=n)
    assert sum(m is smollm2 for m in passes) == 1 and len(passes) == 1 + len(names)
    monkeypatch.undo()
    text = smollm2.tokenizer.decode(eval_ids(smollm2, n))
    for name in names:
        changed, nbytes = variant(smollm2, name)
        alone = compare_to_fp32(smollm2, changed, text)
        assert rows[name] == dataclasses.replace(alone, weight_bytes=nbytes) and nbytes < alone.weight_bytes
    assert rows["int8"].kl_mean != rows["int4 g32 symmetric"].kl_mean


def test_activation_outliers_are_max_over_median_of_each_recorded_input(smollm2):
    # by hand, on a 2-position, 3-channel input: |values| 1 2 3 / 4 100 6, the peak at position 1, channel 1;
    # torch's median of an even count is the lower middle one: sorted 1 2 3 4 6 100 -> 3
    hand = torch.tensor([[1.0, 2.0, -3.0], [4.0, -100.0, 6.0]])
    layer = SimpleNamespace(attn_in=hand, ffn_in=-hand, ffn_hidden=hand.flip(0))
    rows = activation_outliers(SimpleNamespace(layers=[layer]))
    assert [(r["site"], r["position"], r["channel"]) for r in rows] == [
        ("attn_in", 1, 1), ("ffn_in", 1, 1), ("ffn_hidden", 0, 1)]
    assert {(r["max_abs"], r["median_abs"]) for r in rows} == {(100.0, 3.0)}
    assert rows[0]["ratio"] == pytest.approx(100 / 3) and rows[0]["layer"] == 0
    trace = lw.forward(smollm2, smollm2.tokenizer.encode(eval_text())[:64])
    assert [(r["layer"], r["site"]) for r in activation_outliers(trace)] == [
        (i, site) for i in range(smollm2.config.n_layer) for site in ("attn_in", "ffn_in", "ffn_hidden")]
