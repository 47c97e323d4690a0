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
    ref = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True, enable_gqa=True)[0]
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
    ref = F.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask, enable_gqa=True)[0]
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
