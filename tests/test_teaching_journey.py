"""Notebook 09's implement-and-check exercise, the whole chain ids → logits of the next token: the teacher's solution
reproduces transformers' SmolLM2, and the classic wrong chains are rejected on the case that exposes them, each with
the hint that names it. The wrong chains are written here from scratch in torch, not with the grader's own code."""
import math

import pytest
import torch

import llmwalk as lw
from llmwalk.exercises import check, solutions

PROMPTS = ["The capital of France is", "法国的首都是什么", "def add(a, b):\n    return a + b"]


def chain(weights, config, ids, *, mask="causal", rope="half", final_norm=True, at=-1, residual=True,
          layers=None, probs=False, every_position=False):
    """A Llama-style forward pass with one link switchable to a classic mistake.  # [T] -> [vocab]"""
    c, T = config, ids.numel()
    rms = lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c.norm_eps) * w.weight   # noqa: E731
    freq = c.rope_theta ** (-torch.arange(0, c.d_head, 2).float() / c.d_head)
    angle = torch.arange(T).float()[:, None] * freq                                   # [T, d_head / 2]

    def rotate(x):                                                                    # [n, T, d_head]
        if rope == "none":
            return x
        cos, sin = angle.cos(), angle.sin()
        if rope == "adjacent":                                                        # RoFormer: (x_2i, x_2i+1)
            a, b = x[..., 0::2], x[..., 1::2]
            return torch.stack([a * cos - b * sin, a * sin + b * cos], -1).flatten(-2)
        a, b = x[..., :c.d_head // 2], x[..., c.d_head // 2:]                         # rotate-half: (x_i, x_i+d/2)
        return torch.cat([a * cos - b * sin, a * sin + b * cos], -1)

    allowed = {"causal": torch.ones(T, T).tril(), "none": torch.ones(T, T), "transposed": torch.ones(T, T).triu()}[mask]
    x = weights.token_embd[ids]
    for blk in weights.blocks[layers or slice(None)]:
        h = rms(x, blk.attn_norm)
        q = rotate((h @ blk.attn_q.weight).view(T, c.n_head, c.d_head).transpose(0, 1))
        k = rotate((h @ blk.attn_k.weight).view(T, c.n_kv_head, c.d_head).transpose(0, 1))
        v = (h @ blk.attn_v.weight).view(T, c.n_kv_head, c.d_head).transpose(0, 1)
        g = c.n_head // c.n_kv_head
        k, v = k.repeat_interleave(g, 0), v.repeat_interleave(g, 0)
        scores = (q @ k.transpose(1, 2) / math.sqrt(c.d_head)).masked_fill(allowed == 0, -math.inf)
        attn = (scores.softmax(-1) @ v).transpose(0, 1).reshape(T, -1) @ blk.attn_output.weight
        mid = x + attn
        h = rms(mid, blk.ffn_norm)
        ffn = (torch.nn.functional.silu(h @ blk.ffn_gate.weight) * (h @ blk.ffn_up.weight)) @ blk.ffn_down.weight
        x = mid + ffn if residual else ffn
    h = rms(x, weights.output_norm) if final_norm else x
    logits = h @ weights.output.T                                                     # [T, vocab]
    if every_position:
        return logits
    return logits[at].softmax(-1) if probs else logits[at]


def test_the_from_scratch_chain_here_passes():
    assert check("next_token_logits", chain).passed


def test_the_solution_reproduces_transformers_smollm2(smollm2, hf_smollm2):
    """Graded against the real model: the teacher's solution and this file's chain give transformers' logits."""
    for prompt in PROMPTS:
        ids = smollm2.tokenizer.encode(prompt)
        with torch.no_grad():
            theirs = hf_smollm2(torch.tensor([ids])).logits[0, -1]
        for fn in (solutions.next_token_logits, chain):
            mine = fn(smollm2.weights, smollm2.config, torch.tensor(ids))
            assert mine.shape == (smollm2.config.vocab_size,)
            assert torch.allclose(mine, theirs, atol=2e-3, rtol=1e-3), (prompt, (mine - theirs).abs().max())
            assert int(mine.argmax()) == int(theirs.argmax())


WRONG = [  # (the mistake, the case that exposes it, a word the hint must contain)
    (dict(final_norm=False), "one token", "final norm"),
    (dict(probs=True), "one token", "not probabilities"),
    (dict(every_position=True), "one token", "last position's logits only"),
    (dict(residual=False), "one token", "residual"),
    (dict(layers=slice(0, -1)), "one token", "the last one"),
    (dict(layers=slice(1, None)), "one token", "layer 0"),
    (dict(at=0), "two tokens", "first position"),
    (dict(rope="none"), "two tokens", "RoPE is missing"),
    (dict(rope="adjacent"), "two tokens", "wrong pairs"),
    (dict(mask="none"), "two tokens", "no causal mask"),
    (dict(mask="transposed"), "two tokens", "transposed"),
]


@pytest.mark.parametrize("mistake, case, hint", WRONG, ids=[next(iter(w[0])) + str(i) for i, w in enumerate(WRONG)])
def test_a_wrong_chain_is_rejected_on_its_case_with_its_hint(mistake, case, hint):
    result = check("next_token_logits", lambda w, c, ids: chain(w, c, ids, **mistake))
    assert not result.passed
    assert result.case == case, str(result)
    assert hint.lower() in result.hint.lower(), str(result)


def test_the_hints_speak_chinese_too():
    lw.set_language("zh")
    try:
        result = check("next_token_logits", lambda w, c, ids: chain(w, c, ids, final_norm=False))
    finally:
        lw.set_language("en")
    assert result.case == "一个词块" and "最终归一化" in result.hint


def test_a_stub_says_not_implemented_yet():
    def next_token_logits(weights, config, ids):
        raise NotImplementedError
    result = check("next_token_logits", next_token_logits)
    assert not result.passed and "not implemented yet" in result.message
