"""The fast path of passes that record nothing: layers.attention_fast (torch's fused attention) against the
readable layers.attention it replaces, on SmolLM2's real weights (grouped-query attention, RoPE)."""
import pytest
import torch

import llmwalk as lw
from llmwalk.embedding import rope_angles
from llmwalk.kv_cache import KVCache
from llmwalk.layers import attention, attention_fast, causal_mask, norm


def _layer_input(model, t: int, seed: int = 0):
    """What layer 3's attention sees for t random tokens, and its RoPE angles.  # -> [t, d_model]"""
    ids = torch.randint(0, model.config.vocab_size, (t,), generator=torch.Generator().manual_seed(seed))
    trace = lw.forward(model, ids)
    block = model.weights.blocks[3]
    rope = rope_angles(torch.arange(t), model.config.d_head, model.config.theta(3))
    return norm(trace.layers[2].resid_post, block.attn_norm, model.config), block, rope


@pytest.mark.parametrize("window", [None, 5])
def test_attention_fast_equals_attention(smollm2, window):
    x, block, rope = _layer_input(smollm2, 24)
    mask = causal_mask(24, 24, window)              # a sliding window (Gemma's local layers) is a mask like any
    slow = attention(x, block, smollm2.config, mask, rope)
    fast = attention_fast(x, block, smollm2.config, mask, rope)
    assert fast.weights is None
    torch.testing.assert_close(fast.out, slow.out, atol=1e-5, rtol=0)
    torch.testing.assert_close(fast.z, slow.z, atol=1e-5, rtol=0)
    # a wrong mask (attending to the future) would change every row but the last
    leaky = attention_fast(x, block, smollm2.config, torch.ones(24, 24, dtype=torch.bool), rope)
    assert (leaky.out[:-1] - slow.out[:-1]).abs().amax() > 1e-2


def test_attention_fast_with_cache(smollm2):
    """Queries after a prefill attend to the cached keys too: the [T, S] mask with S > T."""
    config = smollm2.config
    x, block, rope = _layer_input(smollm2, 20, seed=1)
    caches = [KVCache.empty(config, 20).layers[0] for _ in range(2)]
    outs = []
    for fn, cache in zip((attention, attention_fast), caches):
        fn(x[:15], block, config, causal_mask(15, 15), (rope[0][:15], rope[1][:15]), cache)
        outs.append(fn(x[15:], block, config, causal_mask(5, 20), (rope[0][15:], rope[1][15:]), cache).out)
    torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(caches[1].keys[:, :20], caches[0].keys[:, :20])


def test_unrecorded_forward_matches_recorded(smollm2):
    """forward(record=False) runs attention_fast in every layer: the same logits as the recorded pass."""
    ids = smollm2.tokenizer.encode("The capital of France is Paris, and the capital of Italy is")
    recorded = lw.forward(smollm2, ids)
    fast = lw.forward(smollm2, ids, record=False)
    assert fast.layers == [] and len(recorded.layers) == smollm2.config.n_layer
    torch.testing.assert_close(fast.logits, recorded.logits, atol=1e-4, rtol=1e-5)


def test_attention_fast_without_mask_is_causal(smollm2):
    """mask=None (what an unrecorded forward passes for a fresh prompt): the kernel's own causal mask, same output."""
    x, block, rope = _layer_input(smollm2, 24, seed=2)
    slow = attention(x, block, smollm2.config, causal_mask(24), rope)
    fast = attention_fast(x, block, smollm2.config, None, rope)
    torch.testing.assert_close(fast.out, slow.out, atol=1e-5, rtol=0)


def test_prefill_runs_the_fused_kernel(smollm2):
    """The fast path must reach torch's fused attention kernel, not its fallback that stores the [T, S] scores
    (what 3-D or grouped-query inputs get: several times slower at long prompts)."""
    ids = torch.arange(64)
    with torch.profiler.profile() as prof:
        lw.forward(smollm2, ids, record=False, last_only=True)
    ops = {e.key for e in prof.key_averages()}
    assert "aten::scaled_dot_product_attention" in ops
    assert "aten::_scaled_dot_product_attention_math" not in ops, sorted(o for o in ops if "attention" in o)
