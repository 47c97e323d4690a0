import itertools
import time

import torch

import llmwalk as lw


def test_journey_times_every_stage_and_answers(smollm2, hf_smollm2, monkeypatch):
    ticks = itertools.count()                  # a clock that advances one second per reading: every stage's
    monkeypatch.setattr(time, "perf_counter", lambda: float(next(ticks)))   # time is its number of timings
    j = lw.journey(smollm2, "The capital of France is", max_new_tokens=6)
    assert j.ids == smollm2.tokenizer.encode("The capital of France is")
    assert smollm2.tokenizer.decode([j.first_token]) == " Paris"
    assert j.answer.new_ids[0] == j.first_token                      # the loop starts where the walk ended
    with torch.no_grad():                                            # the distribution transformers gives
        ref = torch.nn.functional.softmax(hf_smollm2(torch.tensor([j.ids])).logits[0, -1], -1)
    torch.testing.assert_close(j.probs, ref, atol=1e-6, rtol=1e-4)
    assert [s[0] for s in j.stages()] == ["tokenize", "embedding", "30 × (attention + FFN)",
                                          "final norm (last position)", "LM head (last position)", "softmax",
                                          "pick a token"]
    assert j.stages()[1][1] == "[5] → [5, 576]" and j.stages()[2][1] == "[5, 576] → [5, 576]"
    assert j.stages()[3][1] == "[576] → [576]" and j.stages()[4][1] == "[576] → [49152] logits"
    # every stage timed once, between two consecutive clock readings; the layers row adds up the 30 layers
    assert len([k for k in j.seconds if k.startswith("layer ")]) == 30
    assert [s[2] for s in j.stages()] == [1, 1, 30, 1, 1, 1, 1]


def test_journey_runs_the_head_on_the_last_position_only(smollm2):
    """Generation needs only the last position's logits: the journey's norm and LM head skip the other four."""
    j = lw.journey(smollm2, "The capital of France is", max_new_tokens=1)
    assert tuple(j.trace.final.shape) == (1, 576) and tuple(j.trace.logits.shape) == (1, 49152)
    assert all(tuple(b.resid_post.shape) == (5, 576) for b in j.trace.layers)     # the layers still run all 5
    full = lw.forward(smollm2, j.ids)
    assert tuple(full.logits.shape) == (5, 49152)
    torch.testing.assert_close(j.trace.logits[0], full.logits[-1], atol=1e-4, rtol=1e-4)


def test_journey_stages_speak_the_current_language(smollm2):
    """Notebook 09's Chinese table of stages reads Chinese; its layer row still starts with "30 ×", which the
    notebook replaces by "N ×" (a row per model)."""
    j = lw.journey(smollm2, "The capital of France is", max_new_tokens=1)
    lw.set_language("zh")
    try:
        zh = j.stages()
    finally:
        lw.set_language("en")
    assert [s[0] for s in zh] == ["分词", "Embedding", "30 ×（注意力 + FFN）", "最终归一化（最后一个位置）",
                                  "LM Head（最后一个位置）", "Softmax", "选出一个词块"]
    assert [s[1] for s in zh] == ["文本 → 5 个 id", "[5] → [5, 576]", "[5, 576] → [5, 576]", "[576] → [576]",
                                  "[576] → [49152] 个 logit", "[49152] 个概率", "1 个 id"]
    assert [s[2] for s in zh] == [s[2] for s in j.stages()]           # the same timings, only the names differ


def test_timed_forward_times_each_stage_in_order_and_changes_nothing(smollm2, monkeypatch):
    """Stage timings through forward's hook points: the clock is read where each stage ends (the embedding before
    layer 0 starts its work, each layer at its end, the final norm before the LM head), and the trace is forward's
    (the timing hooks return what they were given; their names are not reported)."""
    ids = smollm2.tokenizer.encode("The capital of France is")
    plain = lw.forward(smollm2, ids, last_only=True)
    log = []
    walk = lw.walk
    block_forward, norm, lm_head = walk.block_forward, walk.norm, walk.lm_head

    def block(x, *args, **kwargs):
        log.append("layer")
        out = block_forward(x, *args, **kwargs)
        log.append("end")
        return out
    monkeypatch.setattr(walk, "block_forward", block)
    monkeypatch.setattr(walk, "norm", lambda *a: log.append("final norm") or norm(*a))
    monkeypatch.setattr(walk, "lm_head", lambda *a: log.append("lm head") or lm_head(*a))
    monkeypatch.setattr(time, "perf_counter", lambda: float(len(log.append("clock") or log) ** 2))
    trace, seconds = lw.timed_forward(smollm2, ids, last_only=True)
    n = smollm2.config.n_layer
    # the clock inside a layer: once as it starts (resid_pre of layer 0: the embedding is done), once at its end
    assert log == ["clock", "layer", "clock", "clock", "end"] + ["layer", "clock", "end"] * (n - 1) + \
        ["final norm", "clock", "lm head", "clock"]
    assert list(seconds) == ["embedding", *(f"layer {i}" for i in range(n)), "final norm", "lm head"]
    readings = [float((i + 1) ** 2) for i, e in enumerate(log) if e == "clock"]
    assert list(seconds.values()) == [b - a for a, b in zip(readings, readings[1:])]
    assert torch.equal(trace.logits, plain.logits) and torch.equal(trace.final, plain.final)
    assert trace.unchanged == () and len(trace.layers) == n
