"""timings.decode_profile and its parts: the bytes one decoding step reads against an independent count from the
architecture, the operation counter against operations counted by hand, and the verdict's arithmetic. Structure
and arithmetic only: no assert on a time measured on a shared test machine."""
import pytest
import torch

import llmwalk as lw
from llmwalk import bench, cost, fast_decode, timings


def test_weight_bytes_per_token_is_every_parameter_once_plus_the_row_looked_up(smollm2):
    c = smollm2.config
    # the architecture's count (cost.n_params: table, layers, final norm; tied head = the table), fp32
    assert timings.weight_bytes_per_token(smollm2) == 4 * (cost.n_params(c) + c.d_model)


def test_weight_bytes_per_token_counts_gemmas_extra_norms(gemma):
    c = gemma.config
    assert c.sandwich_norm and c.qk_norm                       # the norms SmolLM2 lacks are counted too
    assert timings.weight_bytes_per_token(gemma) == 4 * (cost.n_params(c) + c.d_model)


def test_count_ops_counts_operations_and_matrix_products():
    x, w = torch.ones(1, 4), torch.ones(4, 3)
    assert timings.count_ops(lambda: (x @ w + 1).sum()) == (3, 1)          # matmul, add, sum
    assert timings.count_ops(lambda: torch.mm(x, w).relu() @ w.T) == (4, 2)   # mm, relu, transpose (a view), matmul


def test_torchs_decoding_step_runs_one_product_per_weight_matrix(smollm2):
    c, ids = smollm2.config, smollm2.tokenizer.encode("The capital of France is")
    cache = lw.KVCache.empty(c, len(ids) + 1)
    lw.forward(smollm2, ids, cache, record=False, last_only=True)
    with fast_decode.off():
        ops, matmuls = timings.count_ops(lambda: lw.forward(smollm2, [ids[0]], cache, record=False, last_only=True))
    assert matmuls == c.n_layer * len(cost.block_matrices(c)) + 1        # 7 per layer, and the LM head
    assert ops > 3 * matmuls                                             # norms, RoPE, views, attention, ...


def test_pass_seconds_leaves_the_cache_as_it_found_it_and_checks_cached(smollm2, monkeypatch):
    ids = smollm2.tokenizer.encode("The capital of France is")
    seen = []
    real = lw.walk.forward
    monkeypatch.setattr(timings, "forward", lambda m, x, cache=None, **kw: (
        seen.append((len(x), cache.length if cache is not None else 0)), real(m, x, cache, **kw))[1])
    timings.pass_seconds(smollm2, ids, cached=len(ids) - 1, repeats=3)
    # the prefix once, then warm-up and 3 timed steps, each one token after the same cached prefix
    assert seen == [(len(ids) - 1, 0)] + [(1, len(ids) - 1)] * 4
    with pytest.raises(ValueError, match="cached"):
        timings.pass_seconds(smollm2, ids, cached=len(ids))


def test_decode_profile_verdict_is_the_printed_rule():
    p = timings.DecodeProfile(weight_bytes=10**9, bandwidth=1e10, step_seconds=0.12, matmul_seconds=0.1, n_ops=500,
                            n_matmuls=100)
    assert p.roofline_seconds == pytest.approx(0.1)                     # 1 GB at 10 GB/s
    assert p.matmul_bandwidth == pytest.approx(1e10)
    assert p.outside_seconds == pytest.approx(0.02)
    assert p.memory_bound                                               # 0.12 s <= 1.5 × 0.1 s
    assert not timings.DecodeProfile(10**9, 1e10, 0.16, 0.1, 500, 100).memory_bound
    # 0.02 s overhead + B / 10 GB/s <= 1.5 · B / 10 GB/s  ⇔  B >= 0.02 · 1e10 / 0.5 = 400 MB
    assert p.memory_bound_bytes == pytest.approx(4e8)
    assert p.slow_matmul_seconds == pytest.approx(0.0) and p.overhead_resolved        # 0.02 s of 0.12 s: 17 %
    noisy = timings.DecodeProfile(10**9, 1e10, 0.32, 0.31, 500, 100)                       # 0.01 s of 0.32 s: 3 %
    assert not noisy.overhead_resolved and noisy.slow_matmul_seconds == pytest.approx(0.21)
    assert timings.DecodeProfile(10**9, 1e10, 0.3, 0.08, 500, 100).slow_matmul_seconds == 0.0   # faster than the sum
    assert timings.DecodeProfile(10**9, 1e10, 0.15, 0.2, 500, 100).slow_matmul_seconds == pytest.approx(0.05)  # ≤ step


def test_decode_profile_measures_the_model_it_is_given(smollm2):
    p = timings.decode_profile(smollm2, context=16, repeats=1, compiled=False)
    c = smollm2.config
    assert p.weight_bytes == timings.weight_bytes_per_token(smollm2) and not p.compiled
    assert p.n_matmuls == c.n_layer * len(cost.block_matrices(c)) + 1 and p.n_ops > p.n_matmuls
    assert p.step_seconds > 0 and p.matmul_seconds > 0 and p.bandwidth > 0


def test_decode_profile_of_the_compiled_step(smollm2, monkeypatch):
    """The step generation runs: compiled, no torch matrix product, a few torch operations around it (the embedding
    row, RoPE's angles); its products timed through the compiled kernels."""
    timed = []
    products = fast_decode.step_products
    monkeypatch.setattr(fast_decode, "step_products", lambda m: (timed.append(m), products(m))[1])
    p = timings.decode_profile(smollm2, context=16, repeats=1)
    assert p.compiled and timed == [smollm2]
    assert p.n_matmuls == 0 and p.n_ops < 60
    assert p.step_seconds > 0 and p.matmul_seconds > 0


def test_bench_decode_prints_the_profile_with_its_verdict(smollm2, monkeypatch, capsys):
    monkeypatch.setattr(bench, "load_model", lambda name, progress=True: smollm2)
    bench.main(["decode", "--context", "8", "--repeats", "1"])
    machine, compiled, eager = capsys.readouterr().out.splitlines()
    assert machine.startswith("CPU: ")
    assert compiled.startswith(f"{smollm2.config.name} llmwalk fp32, compiled step, one decoding step at context 8")
    assert eager.startswith(f"{smollm2.config.name} llmwalk fp32, torch operations, one decoding step at context 8")
    for line in (compiled, eager):
        assert f"{timings.weight_bytes_per_token(smollm2) / 1e6:.0f} MB of weights read" in line
        assert "Memory-bound (step <= 1.5 x reading time): " in line and ("yes;" in line or "no;" in line)
    assert " 0 of them matrix products" in compiled and " 0 of them" not in eager


def test_bench_decode_profiles_each_format_it_is_asked_for(smollm2, monkeypatch, capsys):
    """One line per format, each with that format's bytes: a '+ head' format (its table quantized, looked up by
    one id to count the row a step reads) is profiled too."""
    monkeypatch.setattr(bench, "load_model", lambda name, progress=True: smollm2)
    bench.main(["decode", "--context", "8", "--repeats", "1", "--formats", "llmwalk fp32", "int4 g32 asym + head"])
    _, fp32, _, int4, _ = capsys.readouterr().out.splitlines()
    small = bench.FORMATS["int4 g32 asym + head"](smollm2)
    assert int4.startswith(f"{smollm2.config.name} int4 g32 asym + head, compiled step, one decoding step")
    assert f"{timings.weight_bytes_per_token(small) / 1e6:.0f} MB of weights read" in int4
    assert timings.weight_bytes_per_token(small) < timings.weight_bytes_per_token(smollm2) / 5
    assert "of the roofline)" in fp32 and "of the roofline)" in int4
