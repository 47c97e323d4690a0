"""Each stage function against its torch.nn.functional (or transformers) counterpart, on random data."""
import pytest
import torch
import torch.nn.functional as F

import llmwalk as lw
from llmwalk.weights import Block, Config, Linear, Norm

torch.manual_seed(0)


def cfg(**kw) -> Config:
    base = dict(name="tiny", family="llama", n_layer=1, n_head=4, n_kv_head=2, d_model=32, d_head=8, d_ff=64,
                vocab_size=100, context_length=64, norm="rmsnorm", norm_eps=1e-5, position="rope", ffn="swiglu",
                tied_embeddings=True)
    return Config(**{**base, **kw})


def rand_block(c: Config, bias: bool = False) -> Block:
    def lin(i, o):
        return Linear(torch.randn(i, o) / i ** 0.5, torch.randn(o) if bias else None)
    return Block(attn_norm=Norm(torch.rand(c.d_model) + 0.5), attn_q=lin(c.d_model, c.n_head * c.d_head),
                 attn_k=lin(c.d_model, c.n_kv_head * c.d_head), attn_v=lin(c.d_model, c.n_kv_head * c.d_head),
                 attn_output=lin(c.n_head * c.d_head, c.d_model), ffn_norm=Norm(torch.rand(c.d_model) + 0.5),
                 ffn_up=lin(c.d_model, c.d_ff), ffn_down=lin(c.d_ff, c.d_model),
                 ffn_gate=lin(c.d_model, c.d_ff) if c.ffn != "gelu" else None)


def test_linear_matches_F_linear():
    x, w, b = torch.randn(5, 16), torch.randn(16, 8), torch.randn(8)
    torch.testing.assert_close(lw.linear(x, Linear(w, b)), F.linear(x, w.T, b))


def test_embeddings_match_F_embedding():
    table, ids = torch.randn(100, 16), torch.tensor([3, 1, 4, 1, 5])
    torch.testing.assert_close(lw.token_embedding(ids, table), F.embedding(ids, table))
    torch.testing.assert_close(lw.token_embedding(ids, table, 2.5), F.embedding(ids, table) * 2.5)
    torch.testing.assert_close(lw.position_embedding(torch.arange(5), table), F.embedding(torch.arange(5), table))


def test_layer_norm_matches_F_layer_norm():
    x, w, b = torch.randn(7, 32) * 3 + 1, torch.randn(32), torch.randn(32)
    torch.testing.assert_close(lw.layer_norm(x, Norm(w, b), 1e-5), F.layer_norm(x, (32,), w, b, 1e-5))


def test_rms_norm_matches_F_rms_norm():
    x, w = torch.randn(7, 32) * 3 + 1, torch.randn(32)
    torch.testing.assert_close(lw.rms_norm(x, Norm(w), 1e-6), F.rms_norm(x, (32,), w, 1e-6))


def test_rope_matches_transformers_llama():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb
    hf = LlamaConfig(hidden_size=64, num_attention_heads=4, rope_theta=100000.0, max_position_embeddings=128)
    pos = torch.arange(3, 40)
    q, k = torch.randn(1, 4, len(pos), 16), torch.randn(1, 4, len(pos), 16)
    cos_hf, sin_hf = LlamaRotaryEmbedding(hf)(q, pos[None])
    q_hf, k_hf = apply_rotary_pos_emb(q, k, cos_hf, sin_hf)
    cos, sin = lw.rope_angles(pos, 16, 100000.0)
    torch.testing.assert_close(lw.apply_rope(q[0], cos, sin), q_hf[0])
    torch.testing.assert_close(lw.apply_rope(k[0], cos, sin), k_hf[0])


def test_rope_preserves_norm_and_only_relative_position_matters():
    q, k = torch.randn(1, 1, 16), torch.randn(1, 1, 16)
    def score(i, j):
        ci, si = lw.rope_angles(torch.tensor([i]), 16, 10000.0)
        cj, sj = lw.rope_angles(torch.tensor([j]), 16, 10000.0)
        return (lw.apply_rope(q, ci, si) * lw.apply_rope(k, cj, sj)).sum()
    c, s = lw.rope_angles(torch.tensor([7]), 16, 10000.0)
    torch.testing.assert_close(lw.apply_rope(q, c, s).norm(), q.norm())
    torch.testing.assert_close(score(5, 2), score(13, 10), atol=1e-4, rtol=1e-4)


def test_causal_mask_is_lower_triangular_and_windowed():
    assert torch.equal(lw.causal_mask(5), torch.ones(5, 5).tril().bool())
    assert torch.equal(lw.causal_mask(2, 5), torch.ones(5, 5).tril().bool()[-2:])   # cached prefix of 3
    band = torch.ones(6, 6).tril().bool() & ~torch.ones(6, 6).tril(-3).bool()
    assert torch.equal(lw.causal_mask(6, window=3), band)


@pytest.mark.parametrize("n_head,n_kv_head", [(4, 4), (4, 2), (4, 1)])
def test_attention_matches_scaled_dot_product_attention(n_head, n_kv_head):
    c = cfg(n_head=n_head, n_kv_head=n_kv_head)
    block, x, t = rand_block(c, bias=True), torch.randn(9, c.d_model), 9
    rope = lw.rope_angles(torch.arange(t), c.d_head, 10000.0)
    a = lw.attention(x, block, c, lw.causal_mask(t), rope)
    q = lw.apply_rope((x @ block.attn_q.weight + block.attn_q.bias).view(t, n_head, -1).transpose(0, 1), *rope)
    k = lw.apply_rope((x @ block.attn_k.weight + block.attn_k.bias).view(t, n_kv_head, -1).transpose(0, 1), *rope)
    v = (x @ block.attn_v.weight + block.attn_v.bias).view(t, n_kv_head, -1).transpose(0, 1)
    g = n_head // n_kv_head                         # each key head serves g query heads (any torch: no enable_gqa)
    ref = F.scaled_dot_product_attention(q[None], k.repeat_interleave(g, 0)[None], v.repeat_interleave(g, 0)[None],
                                         is_causal=True)[0]
    ref = F.linear(ref.transpose(0, 1).reshape(t, -1), block.attn_output.weight.T, block.attn_output.bias)
    torch.testing.assert_close(a.out, ref, atol=1e-5, rtol=1e-4)
    assert a.weights.shape == (n_head, t, t)
    torch.testing.assert_close(a.weights.sum(-1), torch.ones(n_head, t))
    assert torch.all(a.weights.triu(1) == 0)          # nobody looks at the future


def test_sliding_window_attention_matches_sdpa_with_mask():
    c = cfg(n_head=2, n_kv_head=1)
    block, x = rand_block(c), torch.randn(12, c.d_model)
    mask = lw.causal_mask(12, window=4)
    a = lw.attention(x, block, c, mask)
    q = (x @ block.attn_q.weight).view(12, 2, -1).transpose(0, 1)
    k = (x @ block.attn_k.weight).view(12, 1, -1).transpose(0, 1)
    v = (x @ block.attn_v.weight).view(12, 1, -1).transpose(0, 1)
    ref = F.scaled_dot_product_attention(q[None], k.expand(2, -1, -1)[None], v.expand(2, -1, -1)[None],
                                         attn_mask=mask)[0]                # one key head for both query heads
    torch.testing.assert_close(a.out, F.linear(ref.transpose(0, 1).reshape(12, -1), block.attn_output.weight.T),
                               atol=1e-5, rtol=1e-4)


def test_attention_with_cache_equals_full_attention():
    c = cfg()
    block, x = rand_block(c), torch.randn(10, c.d_model)
    rope_all = lw.rope_angles(torch.arange(10), c.d_head, 10000.0)
    full = lw.attention(x, block, c, lw.causal_mask(10), rope_all)
    cache = lw.KVCache.empty(c, capacity=10).layers[0]
    first = lw.attention(x[:6], block, c, lw.causal_mask(6), lw.rope_angles(torch.arange(6), c.d_head, 1e4), cache)
    rest = lw.attention(x[6:], block, c, lw.causal_mask(4, 10), lw.rope_angles(torch.arange(6, 10), c.d_head, 1e4), cache)
    torch.testing.assert_close(torch.cat([first.out, rest.out]), full.out, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", ["gelu", "swiglu", "geglu"])
def test_ffn_matches_functional(kind):
    c = cfg(ffn=kind)
    block, x = rand_block(c, bias=kind == "gelu"), torch.randn(5, c.d_model)
    out, hidden = lw.ffn(x, block, c)
    lin = lambda y, w: F.linear(y, w.weight.T, w.bias)  # noqa: E731
    if kind == "gelu":
        ref_hidden = F.gelu(lin(x, block.ffn_up), approximate="tanh")
    else:
        act = F.silu if kind == "swiglu" else (lambda g: F.gelu(g, approximate="tanh"))
        ref_hidden = act(lin(x, block.ffn_gate)) * lin(x, block.ffn_up)
    torch.testing.assert_close(hidden, ref_hidden)
    torch.testing.assert_close(out, lin(ref_hidden, block.ffn_down))
    assert hidden.shape == (5, c.d_ff)


def test_block_is_pre_norm_with_residuals():
    c = cfg()
    block, x = rand_block(c), torch.randn(4, c.d_model)
    out = lw.block_forward(x, block, c, lw.causal_mask(4), lw.rope_angles(torch.arange(4), c.d_head, 1e4))
    torch.testing.assert_close(out.attn_in, F.rms_norm(x, (c.d_model,), block.attn_norm.weight, c.norm_eps))
    torch.testing.assert_close(out.resid_mid, x + out.attn.out)
    torch.testing.assert_close(out.resid_post, out.resid_mid + out.ffn_out)


def test_lm_head_and_softmax():
    x, table = torch.randn(3, 16), torch.randn(50, 16)
    torch.testing.assert_close(lw.lm_head(x, table), F.linear(x, table))
    torch.testing.assert_close(lw.softmax(x), F.softmax(x, dim=-1))


def _bytes_kept(trace) -> int:
    """Bytes of every distinct tensor storage the trace's layers hold."""
    storages = {}
    for b in trace.layers:
        for t in [*b[:1], *b.attn, *b[2:]]:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values())


def test_record_bytes_is_what_a_recorded_trace_keeps(smollm2):
    ids = smollm2.tokenizer.encode("The capital of France is a city on the Seine")
    trace = lw.forward(smollm2, ids)
    assert lw.walk.record_bytes(smollm2.config, len(ids)) == _bytes_kept(trace)


def test_record_bytes_with_a_cache_counts_the_cached_keys(smollm2):
    cache = lw.KVCache.empty(smollm2.config, capacity=16)
    lw.forward(smollm2, smollm2.tokenizer.encode("The capital of France"), cache=cache, record=False)
    trace = lw.forward(smollm2, smollm2.tokenizer.encode(" is Paris"), cache=cache)
    t, s = len(trace.ids), cache.length
    assert trace.attn.shape[-2:] == (t, s)
    # k and v are views of the cache's buffers: count them as the estimate does, [n_kv, s, d_head] each
    c = smollm2.config
    kv = 2 * c.n_layer * c.n_kv_head * s * c.d_head * 4
    kept = sum(sum(x.numel() * x.element_size() for x in [*b[:1], b.attn.out, b.attn.weights, b.attn.q, b.attn.z,
                                                            *b[2:]]) for b in trace.layers)
    assert lw.walk.record_bytes(c, t, s) == kept + kv


def test_a_recorded_pass_past_the_budget_is_refused_before_it_starts(smollm2):
    c = smollm2.config
    assert lw.walk.record_bytes(c, 4096) > 16 * 2**30          # the issue's ~20 GB at 4096 tokens
    with pytest.raises(ValueError, match=r"record=False.*at most \d+ tokens"):
        lw.forward(smollm2, [1] * 4096)
    fits = lw.walk.pass_bytes(c, 64)                          # the intermediates and the [64, vocab] logits
    with pytest.raises(ValueError, match="max_record_bytes"):
        lw.forward(smollm2, [1] * 65, max_record_bytes=fits)
    assert lw.forward(smollm2, [1] * 64, max_record_bytes=fits).attn.shape == (c.n_layer, c.n_head, 64, 64)
    assert lw.forward(smollm2, [1] * 65, record=False, max_record_bytes=fits).logits.shape == (65, c.vocab_size)


def test_unrecorded_trace_says_how_to_get_the_intermediates(smollm2):
    trace = lw.forward(smollm2, [1, 2, 3], record=False)
    for what in ("attn", "resid", "ffn_hidden"):
        with pytest.raises(ValueError, match="record=False"):
            getattr(trace, what)


def test_attention_steps_match_a_hand_computation_with_copied_kv_heads():
    c = cfg(n_head=6, n_kv_head=2)
    block, x, t = rand_block(c), torch.randn(7, c.d_model), 7
    rope = lw.rope_angles(torch.arange(t), c.d_head, 10000.0)
    q, k, v = lw.layers.project_qkv(x, block, c, rope)
    assert (q.shape, k.shape, v.shape) == ((6, t, 8), (2, t, 8), (2, t, 8))
    k_full, v_full = k.repeat_interleave(3, dim=0), v.repeat_interleave(3, dim=0)  # query head h reads kv head h // 3
    scores = lw.layers.attention_scores(q, k, c)
    torch.testing.assert_close(scores, q @ k_full.transpose(-1, -2) / c.d_head ** 0.5)
    weights = torch.softmax(scores.masked_fill(~lw.causal_mask(t), float("-inf")), -1)
    z = lw.layers.mix_values(weights, v)
    torch.testing.assert_close(z, weights @ v_full)
    a = lw.attention(x, block, c, lw.causal_mask(t), rope)
    torch.testing.assert_close(a.out, lw.layers.merge_heads(z) @ block.attn_output.weight)
    torch.testing.assert_close(a.z, z)
