"""The FLOPs exercise (notebook 08): one new token's matrix products, with a KV cache. The oracle is torch's own
FlopCounterMode counting a real decoding step of SmolLM2; the classic slips — multiply-adds counted as one FLOP,
the attention forgotten, the new token not attending to itself, the attention counted per key/value head, no
grouped-query attention, two FFN matrices, no LM head, W_q taken as d_model × d_model — are each rejected on the
case that exposes it, with the hint that names it."""
import pytest

import llmwalk as lw
from llmwalk import cost
from llmwalk.exercises import check, exercises, solutions


def _torch_counted_step(model, ids) -> int:
    """FLOPs torch counts for the last of `ids` while SmolLM2 runs it, the others' keys and values cached."""
    cache = lw.KVCache.empty(model.config, len(ids))
    lw.forward(model, ids[:-1], cache, record=False)
    return cost.measured_flops(model, ids[-1:], cache, last_only=True)


def _args(config, context):
    c = config
    return c.n_layer, c.d_model, c.n_head, c.n_kv_head, c.d_head, c.d_ff, c.vocab_size, context


@pytest.mark.parametrize("n_tokens", [2, 9, 33])
def test_the_solution_equals_what_torch_counts_on_smollm2(n_tokens):
    model = lw.load_model()
    ids = (model.tokenizer.encode("The capital of France is Paris, and the capital of Germany is Berlin. " * 3))[:n_tokens]
    assert len(ids) == n_tokens
    assert solutions.token_flops(*_args(model.config, n_tokens)) == _torch_counted_step(model, ids)


def test_the_exercise_belongs_to_notebook_08():
    assert "token_flops" in [ex.name for ex in exercises("08_cost")]


def _flops(L, d, h, kv, dh, ff, vocab, s, *, per_weight=2, attention=True, keys=None, attn_heads=None,
           kv_width=None, ffn_mats=3, head=True, q_width=None):
    """The count written out, with a knob for each classic slip."""
    q = q_width(d, h, dh) if q_width else h * dh
    kvw = (kv_width or kv) * dh
    mats = d * q + 2 * d * kvw + q * d + ffn_mats * d * ff
    att = 2 * (attn_heads or h) * dh * (s if keys is None else keys(s)) if attention else 0
    return L * (per_weight * mats + 2 * att) + (per_weight * d * vocab if head else 0)


WRONG = [
    (lambda *a: _flops(*a) // 2, "a tiny model", "half"),
    (lambda *a: _flops(*a, attention=False), "a tiny model", "attention itself is missing"),
    (lambda *a: _flops(*a, keys=lambda s: s - 1), "a tiny model", "attends to itself"),
    (lambda *a: _flops(*a, attn_heads=a[3]), "SmolLM2 (3 key/value heads", "n_head, not n_kv_head"),
    (lambda *a: _flops(*a, kv_width=a[2]), "SmolLM2 (3 key/value heads", "only n_kv_head heads"),
    (lambda *a: _flops(*a, ffn_mats=2), "a tiny model", "three matrices"),
    (lambda *a: _flops(*a, head=False), "a tiny model", "LM head is missing"),
    (lambda *a: _flops(*a, q_width=lambda d, h, dh: d), "Gemma-3-270M's shape", "not d_model × d_model"),
    (lambda *a: float(_flops(*a)), "a tiny model", "return an int"),
]


@pytest.mark.parametrize("fn, case, hint", WRONG, ids=[w[2] for w in WRONG])
def test_wrong_counts_are_rejected_with_the_case_and_a_hint(fn, case, hint):
    result = check("token_flops", fn)
    assert not result.passed
    assert result.case.startswith(case), str(result)
    assert hint.lower() in result.hint.lower(), str(result)


def test_the_written_out_count_passes():
    assert check("token_flops", _flops).passed
