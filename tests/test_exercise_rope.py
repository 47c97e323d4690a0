"""The RoPE exercise (notebook 03): transformers' own rotary code and a complex-number rotation pass; the classic
mistakes — the paper's adjacent pairs, the wrong sign, positions from 1, base^(-i/d), half a rotation, a fixed
base, 0, 1, 2, … for the positions, no rotation at all — are each rejected on the case that exposes it, with the
hint that names it. Also: order_check's position-only set-up (notebook 03 c20)."""
import pytest
import torch

import llmwalk as lw
from llmwalk.claims import embedding
from llmwalk.exercises import check, solutions


def _hf_rope(x, positions, base):
    """transformers' Llama rotary embedding, the oracle: cos/sin from LlamaRotaryEmbedding, rotate_half applied.
    (Imported here: nbgrader's kernels import this file for its WRONG list, and transformers takes them ~3 s.)"""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb
    n_head, _, d = x.shape
    rotary = LlamaRotaryEmbedding(LlamaConfig(hidden_size=n_head * d, num_attention_heads=n_head, head_dim=d,
                                              rope_theta=float(base)))
    cos, sin = rotary(x[None], positions[None])
    return apply_rotary_pos_emb(x[None], x[None], cos, sin)[0][0]


def _complex_rope(x, positions, base, *, adjacent=False):
    """Each pair as one complex number, multiplied by e^(i·angle): pairs (x_i, x_{i+d/2}), or the paper's (x_2i, x_2i+1)."""
    d = x.shape[-1]
    angle = positions.double()[:, None] * base ** (-torch.arange(0, d, 2).double() / d)      # [T, d/2]
    turn = torch.polar(torch.ones_like(angle), angle)
    if adjacent:
        z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous()) * turn
        return torch.view_as_real(z).flatten(-2).float()
    z = torch.complex(x[..., :d // 2].double(), x[..., d // 2:].double()) * turn
    return torch.cat([z.real, z.imag], -1).float()


def _rotate(x, positions, base, *, sign=1.0, step=2, second_half=True):
    """Rotate-half written out, with a knob for three classic slips."""
    d = x.shape[-1]
    angle = positions.float()[:, None] * base ** (-step * torch.arange(d // 2).float() / d)
    cos, sin = angle.cos(), sign * angle.sin()
    x1, x2 = x[..., :d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos if second_half else x2], -1)


@pytest.mark.parametrize("fn", [_hf_rope, _complex_rope, solutions.apply_rope,
                                lambda x, positions, base: lw.apply_rope(x, *lw.rope_angles(positions, x.shape[-1], base))],
                         ids=["transformers", "complex", "solution", "llmwalk"])
def test_independent_rotations_pass(fn):
    result = check("apply_rope", fn)
    assert result.passed, str(result)


WRONG = [  # (wrong function, the case it must fail on, a word the hint must contain)
    (lambda x, p, b: x.clone(), "one pair (d_head 2) at positions 0 and 1", "nothing was rotated"),
    (lambda x, p, b: _complex_rope(x, p, b, adjacent=True), "d_head 8, positions 0 to 3", "adjacent"),
    (lambda x, p, b: _rotate(x, p, b, sign=-1.0), "one pair (d_head 2) at positions 0 and 1", "wrong way"),
    (lambda x, p, b: _rotate(x, p + 1, b), "position 0 only", "count from 0"),
    (lambda x, p, b: _rotate(x, p, b, step=1), "d_head 8, positions 0 to 3", "base^(−i/d)"),
    (lambda x, p, b: _rotate(x, p, b, second_half=False), "one pair (d_head 2) at positions 0 and 1", "first half"),
    (lambda x, p, b: _rotate(x, p, 10000.0), "base 100,000 (SmolLM2's)", "wrong base"),
    (lambda x, p, b: _rotate(x, torch.arange(len(p)), b), "positions 5, 6, 7 (a decoding step, not from 0)",
     "instead of the positions"),
]


@pytest.mark.parametrize("fn, case, hint", WRONG, ids=[w[2].split()[0] + f"-{i}" for i, w in enumerate(WRONG)])
def test_wrong_rotations_are_rejected_on_their_case_with_their_hint(fn, case, hint):
    result = check("apply_rope", fn)
    assert not result.passed
    assert result.case == case, str(result)
    assert hint.lower() in result.hint.lower(), str(result)


def test_a_missing_rotation_passes_position_0_but_not_the_exercise():
    """At position 0 every angle is 0, so `return x` is right there: the cases go beyond position 0."""
    x = torch.randn(2, 1, 8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(lw.apply_rope(x, *lw.rope_angles(torch.tensor([0]), 8, 10000.0)), x)
    assert not check("apply_rope", lambda x, p, b: x.clone()).passed


def test_position_alone_tells_the_orders_apart(smollm2):
    o = embedding.order_check(smollm2, "人咬狗", "狗咬人")
    assert o["gap_no_mask_no_position"] < 1e-5 < 1e-3 < o["gap_position_only"]
    assert o["gap_position_only"] == pytest.approx(max(o["token_gaps"]["position_only"]))


def test_the_mask_cannot_tell_a_token_that_sees_the_same_tokens_but_rope_can(smollm2):
    """The final "." sees the same five tokens in both sentences: under the mask alone its output is a weighted sum
    over the same set (order-blind); with RoPE it is not."""
    o = embedding.order_check(smollm2, "The dog bites the man.", "The man bites the dog.")
    gaps = o["token_gaps"]
    assert gaps["causal_mask_only"][-1] < 1e-5 and gaps["no_mask_no_position"][-1] < 1e-5
    assert gaps["mask_and_position"][-1] > 1e-3 and gaps["position_only"][-1] > 1e-3
    # the first token sees only itself under the mask: the same in both sentences, with or without RoPE
    assert gaps["causal_mask_only"][0] < 1e-5 and gaps["mask_and_position"][0] < 1e-5


def test_token_gaps_match_the_forward_pass(smollm2):
    """The real model's set-up (mask and RoPE), token by token, against layer 0 of two forward passes."""
    a_text, b_text = "人咬狗", "狗咬人"
    o = embedding.order_check(smollm2, a_text, b_text)
    ta, tb = lw.forward(smollm2, smollm2.tokenizer.encode(a_text)), lw.forward(smollm2, smollm2.tokenizer.encode(b_text))
    a, b = ta.layers[0].attn.out, tb.layers[0].attn.out
    ids_b = tb.ids.tolist()
    for i, token in enumerate(ta.ids.tolist()):      # every token occurs once in 人咬狗
        j = ids_b.index(token)
        expected = float((a[i] - b[j]).abs().max() / a.abs().max())
        assert o["token_gaps"]["mask_and_position"][i] == pytest.approx(expected, rel=1e-4, abs=1e-6)


def test_the_papers_pairs_are_rotate_half_with_the_dimensions_reordered():
    """Notebook 03 §5.1: the RoFormer paper's adjacent pairs differ from llmwalk's rotate-half, yet are the same
    rotation once even dimensions go first and odd ones after; dot products, hence attention scores, agree."""
    gen = torch.Generator().manual_seed(2)
    q, k = torch.randn(2, 6, 64, generator=gen), torch.randn(2, 6, 64, generator=gen)
    positions, base = torch.arange(6), 100000.0
    perm = torch.cat([torch.arange(0, 64, 2), torch.arange(1, 64, 2)])
    cos, sin = lw.rope_angles(positions, 64, base)
    paper_q = _complex_rope(q, positions, base, adjacent=True)
    assert not torch.allclose(paper_q, lw.apply_rope(q, cos, sin), atol=1e-3)
    assert torch.allclose(paper_q[..., perm], lw.apply_rope(q[..., perm], cos, sin), atol=1e-5)
    paper_k = _complex_rope(k, positions, base, adjacent=True)
    half_q, half_k = lw.apply_rope(q[..., perm], cos, sin), lw.apply_rope(k[..., perm], cos, sin)
    assert torch.allclose(paper_q @ paper_k.transpose(-1, -2), half_q @ half_k.transpose(-1, -2), atol=1e-4)
