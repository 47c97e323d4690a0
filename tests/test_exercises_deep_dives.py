"""The deep dives' exercises: the speculative accept/reject rule and symmetric int8 quantization. Independent
implementations pass; a catalogue of classic wrong ones is rejected, each on the case that exposes it and with the
hint that names it (the pattern of tests/test_exercises.py)."""
import pytest
import torch

from llmwalk.exercises import EXERCISES, check, exercises


def _residual(p, q):
    rest = (p - q).clamp(min=0)
    return rest / rest.sum()


def _accept(p, q, x, u, *, ratio=None, rest=None, strict=True):
    r = float(p[x] / q[x]) if ratio is None else ratio(p, q, x)
    return (u < r if strict else u <= r), (_residual(p, q) if rest is None else rest(p, q))


def _int8(w, *, divisor=127, rounding=torch.round, per="column", dtype=torch.int8):
    top = {"column": w.abs().amax(0), "tensor": w.abs().max().expand(w.shape[1]), "row": w.abs().amax(1)}[per]
    scales = torch.where(top > 0, top / divisor, torch.ones_like(top))
    codes = rounding(w / (scales if per != "row" else scales[:, None]))
    return codes.clamp(-128, 127).to(dtype), scales


def test_the_deep_dives_have_an_exercise_each():
    assert [ex.name for ex in exercises("deep_dives/speculative_decoding")] == ["speculative_accept"]
    assert [ex.name for ex in exercises("deep_dives/quantization")] == ["int8_quantize"]
    assert [ex.name for ex in exercises("deep_dives/kv_cache")] == ["kv_cache_step"]
    assert [ex.name for ex in exercises("deep_dives/interventions")] == ["split_logit"]


INDEPENDENT = [
    ("speculative_accept", lambda p, q, x, u: _accept(p, q, x, u)),       # no min(1, ·): the same test for u < 1
    ("speculative_accept", lambda p, q, x, u: (bool(u * q[x] < p[x]), torch.relu(p - q) / torch.relu(p - q).sum())),
    ("int8_quantize", lambda w: _int8(w)),
    ("int8_quantize", lambda w: _int8(w.double())[:1] + (_int8(w)[1],)),   # rounded in float64: the same codes
]


@pytest.mark.parametrize("name, fn", INDEPENDENT, ids=[f"{n}-{i}" for i, (n, _) in enumerate(INDEPENDENT)])
def test_independent_implementations_pass(name, fn):
    result = check(name, fn)
    assert result.passed, str(result)


RATIO = "p(x) / q(x) = 0.44, u = 0.3"
WRONG = [  # (exercise, wrong function, the case it must fail on, a word the hint must contain)
    ("speculative_accept", lambda p, q, x, u: _accept(p, q, x, u, ratio=lambda p, q, x: float(q[x] / p[x])),
     "p(x) / q(x) = 0.44, u = 0.7", "p(x) / q(x)"),
    ("speculative_accept", lambda p, q, x, u: (u > float(p[x] / q[x]), _residual(p, q)), RATIO, "u < min"),
    ("speculative_accept", lambda p, q, x, u: (True, _residual(p, q)), "p(x) / q(x) = 0.44, u = 0.7", "reject"),
    ("speculative_accept", lambda p, q, x, u: _accept(p, q, x, u, ratio=lambda p, q, x: float(p[x])), RATIO,
     "u < min"),
    ("speculative_accept", lambda p, q, x, u: (bool(p[x] >= q[x]), _residual(p, q)), RATIO, "u < min"),
    ("speculative_accept", lambda p, q, x, u: _accept(p, q, x, u, strict=False),
     "a token the target never picks: p(x) = 0, u = 0", "strictly"),
    ("speculative_accept", lambda p, q, x, u: _accept(p, q, x, u, rest=lambda p, q: p), RATIO, "not from p"),
    ("speculative_accept", lambda p, q, x, u: _accept(p, q, x, u, rest=lambda p, q: (p - q).clamp(min=0)), RATIO,
     "normalise"),
    ("speculative_accept", lambda p, q, x, u: _accept(p, q, x, u, rest=lambda p, q: _residual(q, p)), RATIO,
     "not max(0, q − p)"),
    ("speculative_accept", lambda p, q, x, u: _accept(p, q, x, u, rest=lambda p, q: p - q), RATIO, "clip at 0"),
    ("int8_quantize", lambda w: _int8(w, divisor=128), "a 4 × 2 matrix", "not 128"),
    ("int8_quantize", lambda w: _int8(w, rounding=torch.trunc), "a 4 × 2 matrix", "truncated"),
    ("int8_quantize", lambda w: _int8(w, rounding=torch.floor), "a 4 × 2 matrix", "floor"),
    ("int8_quantize", lambda w: _int8(w, per="tensor"), "a 4 × 2 matrix", "whole matrix"),
    ("int8_quantize", lambda w: _int8(w, per="row"), "a 4 × 2 matrix", "not per row"),
    ("int8_quantize", lambda w: _int8(w, divisor=1), "a 4 × 2 matrix", "−1, 0 and 1"),
    ("int8_quantize", lambda w: _int8(w, dtype=torch.float32), "a 4 × 2 matrix", "torch.int8"),
    ("int8_quantize", lambda w: ((w / (w.abs().amax(0) / 127)).round().nan_to_num().to(torch.int8),
                                 w.abs().amax(0) / 127), "a column of zeros", "scale 1"),
]


@pytest.mark.parametrize("name, fn, case, hint", WRONG, ids=[f"{w[0]}-{i}" for i, w in enumerate(WRONG)])
def test_wrong_implementations_are_rejected_with_the_case_and_a_hint(name, fn, case, hint):
    result = check(name, fn)
    assert not result.passed
    assert result.case == case, str(result)
    assert hint.lower() in result.hint.lower(), str(result)
    assert dict(result.details).keys() >= {"expected", "got"}


def test_a_stub_says_not_implemented_yet():
    def speculative_accept(p, q, drafted, u):
        raise NotImplementedError
    assert "not implemented yet" in check("speculative_accept", speculative_accept).message
    assert EXERCISES["int8_quantize"].notebook == "deep_dives/quantization"
