"""Decoding's compiled step (fast_decode.py) against the readable layers it replaces, on the real models.

The step runs the same maths summed in another order, so it is compared step by step with the readable path
(forward with record=True: layers.py) on the same text (teacher forcing: both see the same tokens), within the
rounding its format allows, and token for token where the readable model's choice is not a near tie.
"""
import os
import subprocess
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

import llmwalk as lw
from llmwalk import fast_decode
from llmwalk.kv_cache import KVCache
from llmwalk.quantize import dequantize_tensor, quantize_model, quantize_tensor

pytestmark = pytest.mark.skipif(fast_decode.numba is None, reason="numba is not installed (a dependency of llmwalk)")

TEXT = "The capital of France is Paris. The capital of Italy is Rome, and the capital of Spain is"
FORMATS = {   # name: (the model, the largest logit difference its rounding allows)
    "fp32": (lambda m: m, 1e-3),
    "int8 layers": (lambda m: quantize_model(m, 8), 1.0),
    "int8 layers + head": (lambda m: quantize_model(m, 8, embeddings=True), 1.0),
    "int4 g32 asymmetric": (lambda m: quantize_model(m, 4, 32, symmetric=False), 1.0),
    "int4 g32 asymmetric + head": (lambda m: quantize_model(m, 4, 32, symmetric=False, embeddings=True), 1.0),
    "int4 g64 symmetric + head": (lambda m: quantize_model(m, 4, 64, embeddings=True), 1.0),
    "int8 unfused": (lambda m: quantize_model(m, 8, fuse=False), 1.0),
}
# The bf16 formats: torch's kernels round each product's input and output to bf16 (8 significant bits), the
# compiled step too, but a sum taken in another order can land one bf16 step (1/128 relative) away, and that
# difference travels through 30 layers: measured up to ~0.65 on logits of about ±30. A wrong code, scale or zero
# point, or a missing layer, moves logits by several units.


def compiled_calls(monkeypatch) -> list:
    """Record every compiled step forward runs."""
    calls, step = [], fast_decode.step
    monkeypatch.setattr(fast_decode, "step", lambda *a, **k: calls.append(a[1]) or step(*a, **k))
    return calls


def teacher_forced(model, ids: list[int], start: int):
    """Logits of every position from `start` on, one token at a time after a cache: (compiled, readable) pairs, and
    the two caches."""
    caches = [KVCache.empty(model.config, len(ids)), KVCache.empty(model.config, len(ids))]
    for c in caches:
        lw.forward(model, ids[:start], c, record=False, last_only=True)
    pairs = []
    for p in range(start, len(ids)):
        fast = lw.forward(model, ids[p:p + 1], caches[0], record=False, last_only=True).logits[0]
        readable = lw.forward(model, ids[p:p + 1], caches[1]).logits[0]       # record=True: layers.py
        pairs.append((fast, readable))
    return pairs, caches


@pytest.mark.parametrize("name", FORMATS)
def test_the_compiled_step_is_the_readable_step(smollm2, name, monkeypatch):
    make, tol = FORMATS[name]
    model = make(smollm2)
    ids = model.tokenizer.encode(TEXT)
    calls = compiled_calls(monkeypatch)
    pairs, (fast_cache, readable_cache) = teacher_forced(model, ids, 4)
    assert len(calls) == len(ids) - 4                       # every one-token pass ran compiled
    worst = max(float((f - r).abs().max()) for f, r in pairs)
    assert worst <= tol, f"{name}: logits differ by up to {worst}"
    for f, r in pairs:                                       # the same choice unless the readable one is a near tie
        top2 = r.topk(2).values
        if top2[0] - top2[1] > 2 * tol:
            assert int(f.argmax()) == int(r.argmax())
    n = len(ids)
    for a, b in zip(fast_cache.layers, readable_cache.layers):
        assert a.length == b.length == n
        torch.testing.assert_close(a.keys[:, :n], b.keys[:, :n], atol=tol / 4, rtol=1 / 64)
        torch.testing.assert_close(a.values[:, :n], b.values[:, :n], atol=tol / 4, rtol=1 / 64)


@pytest.mark.parametrize("bits, group, symmetric", [(8, None, True), (4, 32, False), (4, 128, True)])
def test_a_compiled_product_is_torchs_kernel_within_one_bf16_step(smollm2, bits, group, symmetric):
    """The products of the quantized formats round input and output to bf16, as torch's kernels do: each output is a
    bf16 number and within one bf16 step (2^-7 relative) of the kernel's. The 4-bit product multiplies in integers,
    its inputs on a grid of 2^-14 of the largest in each unit of 32 (fast_decode._on_int16_grid): an output whose
    terms cancel may also move by that grid's share of its terms, 2^-14 · Σ_k max|x of k's unit| · |w_k|."""
    w = smollm2.weights.blocks[2].ffn_down.weight              # d_in = 1536: groups of 32 and of 128
    q = quantize_tensor(w, bits, group, symmetric)
    x = torch.randn(1, w.shape[0], generator=torch.Generator().manual_seed(0))
    ours, theirs = fast_decode.product(q, x[0]), (x @ q)[0]
    assert torch.equal(ours, ours.bfloat16().float())
    unit_max = x.bfloat16().float().view(-1, 32).abs().amax(1).repeat_interleave(32)
    grid = 2 ** -14 * (unit_max @ dequantize_tensor(q).abs()) if bits == 4 else 0
    assert ((ours - theirs).abs() <= theirs.abs() * 2 ** -7 + grid + 1e-6).all()
    assert (ours != theirs).float().mean() < 0.2                 # mostly the very same number


def test_a_compiled_fp32_product_is_x_at_w(smollm2):
    w = smollm2.weights.blocks[0].ffn_down.weight
    x = torch.randn(w.shape[0], generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(fast_decode.product(w, x), x @ w, atol=1e-4, rtol=1e-5)


ATTENTION_SHAPES = [(9, 3, 64), (4, 1, 256), (4, 2, 8), (6, 2, 72)]    # SmolLM2, Gemma-3, and heads not of 64


@pytest.mark.parametrize("n_head, n_kv_head, d_head", ATTENTION_SHAPES)
@pytest.mark.parametrize("first, last", [(0, 0), (0, 40), (0, 700), (300, 700)])
@pytest.mark.parametrize("threads", [1, 2])
def test_attention_over_the_cache_is_torchs_attention(n_head, n_kv_head, d_head, first, last, threads):
    """One new token's attention over cached positions first..last (a window when first > 0), in one block or in
    several (from 64 positions on), on one thread or split over two: F.scaled_dot_product_attention's, GQA's
    groups of query heads sharing a key head."""
    g = torch.Generator().manual_seed(n_head * d_head + last)
    q = torch.randn(n_head, d_head, generator=g)
    keys, values = (torch.randn(n_kv_head, 1024, d_head, generator=g) for _ in range(2))
    z, scale = np.zeros((n_head, d_head), np.float32), d_head ** -0.5
    fast_decode._attend(q.numpy(), keys.numpy(), values.numpy(), first, last, np.float32(scale), z,
                        np.zeros((n_head, 1024), np.float32), threads, np.zeros((n_head, fast_decode.BLOCKS), np.float32),
                        np.zeros((n_head, fast_decode.BLOCKS), np.float32),
                        np.zeros((n_head, fast_decode.BLOCKS, d_head), np.float32))
    group = n_head // n_kv_head
    k, v = (t[:, first:last + 1].repeat_interleave(group, 0) for t in (keys, values))
    expected = torch.nn.functional.scaled_dot_product_attention(q[:, None], k, v, scale=scale)[:, 0]
    torch.testing.assert_close(torch.from_numpy(z), expected, atol=2e-6, rtol=1e-5)


def test_a_nan_in_one_key_makes_its_groups_heads_nan_as_in_torch():
    """A NaN in the cache (a hostile or broken model) spreads to the heads that read it, and to no other head."""
    g = torch.Generator().manual_seed(0)
    q, keys, values = torch.randn(9, 64, generator=g), torch.randn(3, 256, 64, generator=g), torch.randn(3, 256, 64, generator=g)
    keys[1, 100, 5] = float("nan")
    z = np.zeros((9, 64), np.float32)
    fast_decode._attend(q.numpy(), keys.numpy(), values.numpy(), 0, 199, np.float32(0.125), z,
                        np.zeros((9, 256), np.float32), 2, np.zeros((9, fast_decode.BLOCKS), np.float32),
                        np.zeros((9, fast_decode.BLOCKS), np.float32), np.zeros((9, fast_decode.BLOCKS, 64), np.float32))
    expected = torch.nn.functional.scaled_dot_product_attention(
        q[:, None], *(t[:, :200].repeat_interleave(3, 0) for t in (keys, values)), scale=0.125)[:, 0]
    assert torch.from_numpy(z)[3:6].isnan().all() and expected[3:6].isnan().all()
    torch.testing.assert_close(torch.from_numpy(z)[[0, 1, 2, 6, 7, 8]], expected[[0, 1, 2, 6, 7, 8]], atol=2e-6, rtol=1e-5)


def test_greedy_decoding_is_the_same_token_for_token(smollm2):
    """fp32: the compiled steps choose what torch's operations and the readable model choose, token for token."""
    g = lw.generate(smollm2, "The capital of France is", 48, stop_at_eos=False)
    with fast_decode.off():
        eager = lw.generate(smollm2, "The capital of France is", 48, stop_at_eos=False)
    assert g.new_ids == eager.new_ids
    readable = lw.forward(smollm2, g.ids[:-1])
    n = len(g.prompt_ids)
    assert readable.logits[n - 1:].argmax(-1).tolist() == g.new_ids


def test_gemma_compiled_step_with_its_window_norms_and_gelu(gemma, monkeypatch):
    """Gemma-3: q/k norms, sandwich norms, GeGLU, the embedding scale, two RoPE bases, and sliding-window layers —
    the window shrunk to 6 positions so that it cuts inside this short text."""
    model = replace(gemma, config=replace(gemma.config, sliding_window=6))
    assert model.config.window(0) == 6 and model.config.window(5) is None
    calls = compiled_calls(monkeypatch)
    pairs, (fast_cache, readable_cache) = teacher_forced(model, model.tokenizer.encode(TEXT), 3)
    assert calls
    for f, r in pairs:
        torch.testing.assert_close(f, r, atol=2e-3, rtol=1e-4)
    torch.testing.assert_close(fast_cache.layers[0].keys, readable_cache.layers[0].keys, atol=1e-4, rtol=1e-4)


def test_a_truncated_cache_steps_again_to_the_same_logits(smollm2):
    """Speculative decoding drops rejected tokens with KVCache.truncate and steps on from there."""
    ids = smollm2.tokenizer.encode(TEXT)
    cache = KVCache.empty(smollm2.config, len(ids))
    lw.forward(smollm2, ids[:5], cache, record=False, last_only=True)
    first = [lw.forward(smollm2, [t], cache, record=False).logits for t in ids[5:9]]
    cache.truncate(6)
    again = [lw.forward(smollm2, [t], cache, record=False).logits for t in ids[6:9]]
    assert cache.length == 9
    for a, b in zip(first[1:], again):
        assert torch.equal(a, b)


def test_what_the_compiled_step_leaves_to_torch(smollm2, monkeypatch):
    """Hooks, a recorded pass, no cache, an empty cache and more than one token run layers.py or fast.py."""
    calls = compiled_calls(monkeypatch)
    ids = smollm2.tokenizer.encode(TEXT)[:6]
    cache = KVCache.empty(smollm2.config, 8)
    lw.forward(smollm2, ids[:1], cache, record=False)                 # an empty cache: its buffers come from torch
    lw.forward(smollm2, ids[1:3], cache, record=False)                # two tokens
    lw.forward(smollm2, ids[3:4], cache)                              # recorded
    lw.forward(smollm2, ids[4:5], cache, record=False, hooks={"blocks.3.attn_out": lambda a: a * 0})
    lw.forward(smollm2, ids, record=False)                            # no cache
    with fast_decode.off():
        lw.forward(smollm2, ids[5:6], cache, record=False)
    assert calls == [] and cache.length == 6
    lw.forward(smollm2, ids[5:6], cache, record=False)
    assert len(calls) == 1


def test_a_hooked_step_runs_the_hook(smollm2):
    """An intervention with the KV cache changes the answer: the step with a hook must not run compiled."""
    ids = smollm2.tokenizer.encode(TEXT)[:8]
    logits = []
    for hooks in (None, {"blocks.10.ffn_out": lambda a: a * 0}):
        cache = KVCache.empty(smollm2.config, 8)
        lw.forward(smollm2, ids[:7], cache, record=False)
        logits.append(lw.forward(smollm2, ids[7:], cache, record=False, hooks=hooks).logits)
    assert (logits[0] - logits[1]).abs().max() > 0.1


def test_a_full_cache_is_still_refused(smollm2):
    cache = KVCache.empty(smollm2.config, 3)
    lw.forward(smollm2, [1, 2, 3], cache, record=False)
    with pytest.raises(ValueError, match="KV cache is full"):
        lw.forward(smollm2, [4], cache, record=False)


def test_a_cache_whose_numbers_are_not_side_by_side_runs_torch(smollm2, monkeypatch):
    """The compiled attention reads each key's and value's numbers as one row: a cache whose buffers are strided
    views (here: every second number of a wider buffer) runs torch's step instead, with the same logits."""
    ids = smollm2.tokenizer.encode(TEXT)[:10]
    cache, plain = KVCache.empty(smollm2.config, 10), KVCache.empty(smollm2.config, 10)
    for c in (cache, plain):
        lw.forward(smollm2, ids[:9], c, record=False)
    for layer in cache.layers:
        for name in ("keys", "values"):
            wide = torch.zeros(*getattr(layer, name).shape[:-1], 2 * getattr(layer, name).shape[-1])
            wide[..., ::2] = getattr(layer, name)
            setattr(layer, name, wide[..., ::2])
    calls = compiled_calls(monkeypatch)
    strided = lw.forward(smollm2, ids[9:], cache, record=False).logits
    assert calls == []
    monkeypatch.undo()
    torch.testing.assert_close(strided, lw.forward(smollm2, ids[9:], plain, record=False).logits, atol=1e-4, rtol=1e-5)


def test_one_thread_computes_the_same_step(smollm2):
    """With one torch thread the step runs its serial loops: the same logits, up to the order of a sum."""
    ids = smollm2.tokenizer.encode(TEXT)[:10]
    before, out = torch.get_num_threads(), []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            cache = KVCache.empty(smollm2.config, 10)
            lw.forward(smollm2, ids[:9], cache, record=False)
            out.append(lw.forward(smollm2, ids[9:], cache, record=False).logits)
            assert fast_decode.threads() == min(n, fast_decode.numba.config.NUMBA_NUM_THREADS)
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(out[0], out[1], atol=1e-4, rtol=1e-5)


def test_starting_numbas_threads_leaves_torchs_thread_count():
    """Where numba and torch share one OpenMP runtime (this Linux torch and the system's libgomp), starting numba's
    thread pool sets the runtime's thread count: torch's must stay what the caller set. A fresh process, so that the
    pool really starts."""
    code = ("import torch; torch.set_num_threads(1); from llmwalk import fast_decode; "
            "n = fast_decode.threads(); print(n, torch.get_num_threads())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["1", "1"]


def test_numba_without_openmp_runs_one_thread(monkeypatch):
    """numba's own thread pool (no OpenMP, e.g. macOS without libomp) costs more per parallel loop than a step's
    loops take: the step then runs serially."""
    monkeypatch.setattr(fast_decode, "_layer_name", ["workqueue"])
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert fast_decode.threads() == 1


def test_without_numba_decoding_runs_torch_and_says_so_once(smollm2, monkeypatch):
    g = lw.generate(smollm2, "Hello", 6)
    monkeypatch.setattr(fast_decode, "numba", None)
    monkeypatch.setattr(fast_decode, "_plans", {})
    monkeypatch.setattr(fast_decode, "_said", set())
    with pytest.warns(UserWarning, match="numba is not installed"):
        again = lw.generate(smollm2, "Hello", 6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lw.generate(smollm2, "Hello", 6)
    assert again.new_ids == g.new_ids
    assert fast_decode.why_not(smollm2) == fast_decode.NO_NUMBA


def test_formats_the_step_does_not_read_run_torch(smollm2):
    """A bias, bf16 weights, GPT-2's family: the step says why not, and forward runs torch's operations."""
    b0 = smollm2.weights.blocks[0]
    biased = replace(smollm2, weights=replace(smollm2.weights, blocks=(
        replace(b0, attn_q=replace(b0.attn_q, bias=torch.zeros(b0.attn_q.weight.shape[1]))),
        *smollm2.weights.blocks[1:])))
    assert "format" in fast_decode.why_not(biased)
    assert "format" in fast_decode.why_not(replace(smollm2, weights=lw.to_dtype(smollm2.weights, torch.bfloat16)))
    gpt2_like = replace(smollm2, config=replace(smollm2.config, family="gpt2", norm="layernorm"))
    assert "gpt2" in fast_decode.why_not(gpt2_like)
    assert fast_decode.why_not(smollm2) is None
    with pytest.raises(ValueError, match="does not read"):
        fast_decode.product(torch.zeros(4, 4, dtype=torch.bfloat16), torch.zeros(4))


def test_the_plan_holds_views_of_the_weights_not_copies(smollm2):
    """The step reads the model's own memory (a class's kernels share it: README, Teaching a class)."""
    plan = fast_decode.plan(smollm2)
    b0 = smollm2.weights.blocks[0]
    attn_norm, _, _, _, (q, k, v), (out,), ffn_norm, _, (gate, up), (down,) = plan.layers[0]
    assert np.shares_memory(q[0], b0.attn_q.weight.numpy()) and np.shares_memory(down[0], b0.ffn_down.weight.numpy())
    assert np.shares_memory(attn_norm, b0.attn_norm.weight.numpy())
    assert np.shares_memory(plan.head[1], smollm2.weights.output.numpy())


def test_a_fresh_copy_of_the_package_loads_the_kernels_compiled(smollm2, tmp_path):
    """A fresh clone or a reinstalled package (the same fast_decode.py at another path, no __pycache__) finds every
    kernel a generate needs in the user's kernel folder: numba loads them, it compiles none (each format takes tens
    of seconds to compile), and writes nothing beside the copy."""
    import shutil
    lw.generate(smollm2, "The capital of France is", 2, stop_at_eos=False)           # compiled here, or loaded
    copy = tmp_path / "another clone"
    shutil.copytree(Path(fast_decode.__file__).parent, copy / "llmwalk", ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import llmwalk as lw; from llmwalk import fast_decode as f\n"
            "model = lw.load_model('smollm2-135m', progress=False)\n"
            "lw.generate(model, 'The capital of France is', 2, stop_at_eos=False)\n"
            "print(f.__file__); print(f._layers.stats.cache_path)\n"
            "print(sum(d.stats.cache_hits.total() for d in (f._layers, f._head_rows)))\n"
            "print(sum(d.stats.cache_misses.total() for d in (f._layers, f._head_rows)))")
    path = os.pathsep.join(filter(None, [str(copy), os.environ.get("PYTHONPATH")]))     # the offline guard kept
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=copy,
                         env={**os.environ, "PYTHONPATH": path}).stdout.split("\n")
    assert Path(out[0]).is_relative_to(copy)                         # the copy ran, not this checkout
    assert out[1] == str(fast_decode.kernel_dir())
    assert int(out[2]) >= 2 and int(out[3]) == 0, out
    assert not list(copy.rglob("*.nbi"))


@pytest.mark.skipif(os.name == "nt", reason="Windows: a user's LOCALAPPDATA is private; no POSIX modes to check")
@pytest.mark.parametrize("mode, used", [(0o700, True), (0o755, True), (0o775, False), (0o777, False)])
def test_kernels_are_kept_only_in_a_folder_no_other_user_can_write(tmp_path, monkeypatch, mode, used):
    """Machine code is read from the kernel folder only while it is the user's own: a folder others may write (a
    class's shared cache, say) is not used, and numba keeps the kernels in its own places instead."""
    folder = tmp_path / "kernels"
    folder.mkdir()
    folder.chmod(mode)
    monkeypatch.setattr(fast_decode, "kernel_dir", lambda: folder)
    locator = fast_decode._KernelLocator.from_function(fast_decode._layers.py_func, fast_decode.__file__)
    assert (locator is not None) == used
    if not used:
        cache = fast_decode._KernelCache(fast_decode._layers.py_func)
        assert cache.cache_path != str(folder)
