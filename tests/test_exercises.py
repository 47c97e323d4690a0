"""The grader: every solution and llmwalk's own code pass; a catalogue of classic mistakes is rejected, each on the
case that exposes it and with the hint that names it; a raising, stubbed or shapeless answer never raises."""
import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

import llmwalk as lw
from llmwalk.exercises import EXERCISES, Case, Exercise, check, exercises, reveal, solutions
from llmwalk.exercises.grader import grade

NEG_INF = float("-inf")


@pytest.mark.parametrize("name", list(EXERCISES))
def test_every_solution_passes(name):
    result = check(name, getattr(solutions, name))
    assert result.passed, str(result)


def test_every_notebook_02_to_08_has_an_exercise():
    assert {ex.notebook[:2] for ex in exercises()} == {f"0{i}" for i in range(2, 9)}


# Independent implementations (torch.nn.functional, tiktoken's own encode, llmwalk's own functions) must pass.
def _lw_kv_bytes(n_layer, n_kv_head, d_head, T, bytes_per_number):
    config = replace(lw.cost.llama7b_config(), n_layer=n_layer, n_head=n_kv_head, n_kv_head=n_kv_head, d_head=d_head)
    return lw.kv_cache_bytes(config, T, bytes_per_number)


INDEPENDENT = [
    ("softmax", lambda x: F.softmax(x, dim=-1)),
    ("softmax", lw.softmax),
    ("attention", lambda q, k, v: torch.softmax((q.double() @ k.double().transpose(-1, -2) / q.shape[-1] ** 0.5)
                                                .masked_fill(~lw.causal_mask(q.shape[1]), NEG_INF), -1).float() @ v),
    ("rms_norm", lambda x, w, eps: F.rms_norm(x, (x.shape[-1],), w, eps)),
    ("layer_norm", lambda x, w, b, eps: F.layer_norm(x, (x.shape[-1],), w, b, eps)),
    ("causal_mask", lw.causal_mask),
    ("cosine_similarity", lambda a, b: F.cosine_similarity(a, b, dim=-1)),
    ("embed", lambda ids, table: F.embedding(ids, table)),
    ("lm_head", lambda h, W: F.linear(h, W)),
    ("apply_temperature", lw.apply_temperature),
    ("top_k_filter", lw.top_k_filter),
    ("top_p_filter", lw.top_p_filter),
    ("kv_cache_bytes", _lw_kv_bytes),
    ("bpe", lambda piece, ranks: [lw.gpt2_tokenizer().token_bytes(i)
                                  for i in lw.gpt2_tokenizer().encode(piece.decode())]),
    ("kv_cache_step", lambda q, k, v, kc, vc: (F.scaled_dot_product_attention(
        q, torch.cat([kc, k], 1), torch.cat([vc, v], 1)), torch.cat([kc, k], 1), torch.cat([vc, v], 1))),
]


@pytest.mark.parametrize("name, fn", INDEPENDENT, ids=[f"{n}-{i}" for i, (n, _) in enumerate(INDEPENDENT)])
def test_independent_implementations_pass(name, fn):
    result = check(name, fn)
    assert result.passed, str(result)


def test_top_p_cases_are_fair_no_boundary_within_float_noise():
    """A correct top-p written another way (descending cumsum) must not flip a token: no mass sits near p."""
    for case in EXERCISES["top_p_filter"].cases():
        logits, p = case.args
        if p == 1:
            continue
        probs = logits.double().softmax(-1).sort(-1, descending=True).values
        before = probs.cumsum(-1) - probs
        assert (before - p).abs().min() > 1e-4, case.label
        kept_last = probs.gather(-1, ((before < p).sum(-1, keepdim=True) - 1))
        removed_first = probs.gather(-1, (before < p).sum(-1, keepdim=True).clamp(max=probs.shape[-1] - 1))
        assert ((kept_last - removed_first).abs() > 1e-6).all() or (before < p).all(), f"tie at the cut: {case.label}"


# ---------------------------------------------------------------- the catalogue of wrong answers

def _softmax_overflows(x):
    return x.exp() / x.exp().sum(-1, keepdim=True)


def _top_p_drops_crossing(logits, p):
    probs, order = logits.softmax(-1).sort(-1, descending=True)
    remove = probs.cumsum(-1) > p                       # removes the token that crosses p
    return logits.masked_fill(remove.scatter(-1, order, remove), NEG_INF)


def _top_p_unsorted(logits, p):
    probs = logits.softmax(-1)
    remove = probs.cumsum(-1) - probs >= p              # cumulative mass in vocabulary order, not by probability
    return logits.masked_fill(remove, NEG_INF)


def _top_k_exactly_k(logits, k):
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, logits.topk(min(k, logits.shape[-1])).indices, True)
    return logits.masked_fill(~keep, NEG_INF)           # a tie at the k-th place loses one of the tied tokens


def _top_k_zeros(logits, k):
    return torch.where(logits >= logits.topk(min(k, logits.shape[-1])).values[..., -1:], logits, 0.0)


def _attention(q, k, v, scale=None, mask=True):
    scores = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if mask:
        scores = scores.masked_fill(~lw.causal_mask(q.shape[1]), NEG_INF)
    return scores.softmax(-1) @ v


def _greedy_forgets_append(next_logits, prompt_ids, n):
    return [int(next_logits(list(prompt_ids)).argmax()) for _ in range(n)]


def _greedy_returns_all(next_logits, prompt_ids, n):
    ids = list(prompt_ids)
    for _ in range(n):
        ids.append(int(next_logits(ids).argmax()))
    return ids


def _kv_step_no_growth(q, k, v, kc, vc):
    out = F.scaled_dot_product_attention(q, torch.cat([kc, k], 1), torch.cat([vc, v], 1))
    return out, kc, vc


def _kv_step_no_scale(q, k, v, kc, vc):
    k, v = torch.cat([kc, k], 1), torch.cat([vc, v], 1)
    return F.scaled_dot_product_attention(q, k, v, scale=1.0), k, v


def _bpe_first_pair(piece, ranks):
    """Merges the leftmost pair found in ranks instead of the lowest-ranked one."""
    parts = [bytes([b]) for b in piece]
    while True:
        i = next((i for i in range(len(parts) - 1) if parts[i] + parts[i + 1] in ranks), None)
        if i is None:
            return parts
        parts[i:i + 2] = [parts[i] + parts[i + 1]]


WRONG = [  # (exercise, wrong function, the case it must fail on, a word the hint must contain)
    ("softmax", _softmax_overflows, "large logits (~1000)", "subtract"),
    ("softmax", lambda x: x.softmax(0), "batched [3, 5]", "wrong dimension"),
    ("softmax", lambda x: x.exp(), "three logits", "sum to 1"),
    ("apply_temperature", lambda x, t: x * t, "temperature 0.5 sharpens", "multiplies"),
    ("apply_temperature", lambda x, t: (x / t).softmax(-1), "temperature 1 changes nothing", "not probabilities"),
    ("top_k_filter", _top_k_exactly_k, "a tie at the k-th place", "tied"),
    ("top_k_filter", _top_k_zeros, "k = 2", "-inf"),
    ("top_p_filter", _top_p_drops_crossing, "top_p 0.6: 0.5 + 0.3 reaches it", "crosses"),
    ("top_p_filter", _top_p_unsorted, "top_p 0.6: 0.5 + 0.3 reaches it", "descending"),
    ("causal_mask", lambda t: torch.ones(t, t, dtype=torch.bool).tril(-1), "T = 1", "diagonal"),
    ("causal_mask", lambda t: torch.ones(t, t, dtype=torch.bool).tril(1), "T = 2", "next token"),
    ("causal_mask", lambda t: torch.ones(t, t, dtype=torch.bool).triu(), "T = 2", "transposed"),
    ("causal_mask", lambda t: torch.ones(t, t).tril(), "T = 1", "bool"),
    ("attention", lambda q, k, v: _attention(q, k, v, scale=1.0), "n_head = 2, T = 4, d_head = 8", "scale"),
    ("attention", lambda q, k, v: _attention(q, k, v, mask=False), "n_head = 2, T = 4, d_head = 8", "causal mask"),
    ("attention", lambda q, k, v: _attention(q, k, v, scale=1 / q.shape[-1]), "n_head = 2, T = 4, d_head = 8",
     "not d_head"),
    ("rms_norm", lambda x, w, eps: x / x.pow(2).mean(-1, keepdim=True).sqrt() * w, "a zero vector", "eps"),
    ("rms_norm", lambda x, w, eps: x / (x.pow(2).mean(-1, keepdim=True).sqrt() + eps) * w,
     "a large eps (0.5) on small values", "inside the square root"),
    ("rms_norm", lambda x, w, eps: F.layer_norm(x, (x.shape[-1],), w, None, eps), "weight of ones, [3, 8]",
     "LayerNorm"),
    ("layer_norm", lambda x, w, b, eps: (x - x.mean(-1, keepdim=True)) / (x.var(-1, keepdim=True) + eps).sqrt() * w + b,
     "weight 1, bias 0, [3, 8]", "unbiased"),
    ("layer_norm", lambda x, w, b, eps: F.layer_norm(x, (x.shape[-1],), w, None, eps), "a learned weight and bias",
     "bias"),
    ("embed", lambda ids, table: table[ids - 1], "three different ids", "off by one"),
    ("cosine_similarity", lambda a, b: (a * b).sum(-1), "a vector and itself, scaled by 3", "dot product"),
    ("lm_head", lambda h, W: W @ h.T, "one token: h [1, 4], W [6, 4]", "transposed"),
    ("greedy_generate", _greedy_forgets_append, "six new tokens", "append"),
    ("greedy_generate", _greedy_returns_all, "one new token", "only the n new ids"),
    ("kv_cache_step", _kv_step_no_growth, "the first token: empty cache", "did not grow"),
    ("kv_cache_step", _kv_step_no_scale, "2 heads, 4 cached positions, d_head 8", "scale"),
    ("kv_cache_bytes", lambda n_layer, n_kv, d, t, b: n_layer * n_kv * d * t * b, "SmolLM2, 4,096 tokens, fp32",
     "factor 2"),
    ("kv_cache_bytes", lambda n_layer, n_kv, d, t, b: 2 * n_layer * n_kv * d * t * b * 8, "SmolLM2, 4,096 tokens, fp32",
     "bits"),
    ("bpe", lambda piece, ranks: [bytes([b]) for b in piece], "a common word", "nothing was merged"),
    ("bpe", _bpe_first_pair, "a rare long word", "lowest"),
]


@pytest.mark.parametrize("name, fn, case, hint", WRONG, ids=[f"{w[0]}-{i}" for i, w in enumerate(WRONG)])
def test_wrong_implementations_are_rejected_with_the_case_and_a_hint(name, fn, case, hint):
    result = check(name, fn)
    assert not result.passed
    assert result.case == case, str(result)
    assert result.case in result.message and result.case in result._repr_markdown_()
    assert hint.lower() in result.hint.lower(), str(result)
    assert dict(result.details).keys() >= {"expected", "got"}


# ---------------------------------------------------------------- answers that are not even wrong numbers

def test_a_stub_says_not_implemented_yet():
    def softmax(logits):
        raise NotImplementedError
    result = check("softmax", softmax)
    assert not result.passed and "not implemented yet" in result.message and not result.details


def test_an_exception_names_the_case_and_the_learners_line_not_a_traceback():
    def my_top_k(logits, top_k):
        kth = torch.topk(logits, top_k).values[..., -1:]     # no clamp: k > vocab raises inside torch
        return logits.masked_fill(logits < kth, NEG_INF)
    result = check("top_k_filter", my_top_k)
    assert not result.passed and result.case == "k larger than the vocabulary"
    assert "raised RuntimeError" in result.message
    assert "in my_top_k, line" in result.message and "torch.topk(logits, top_k)" in result.message
    assert "Traceback" not in str(result) and "clamp" in result.hint


def test_none_wrong_shape_and_wrong_dtype_get_a_friendly_message():
    def no_return(logits):
        logits.softmax(-1)
    assert "forget the `return`" in check("softmax", no_return).message
    assert "shape [5, 3], expected [3, 5]" in check("softmax", lambda x: x.T.softmax(-1) if x.dim() == 2 else
                                                      x.softmax(-1)).message
    assert "dtype torch.float64, expected torch.float32" in check("softmax", lambda x: x.double().softmax(-1)).message
    assert "expected a torch.Tensor" in check("softmax", lambda x: x.softmax(-1).tolist()).message
    assert "expected an int" in check("kv_cache_bytes", lambda *a: 2.0 * math.prod(a)).message


def test_honest_float_differences_are_accepted():
    """Computed in float64 and rounded back, or with the max subtracted another way: same answer, passes."""
    assert check("softmax", lambda x: x.double().softmax(-1).float()).passed
    assert check("layer_norm", lambda x, w, b, eps: F.layer_norm(x.double(), (x.shape[-1],), w.double(), b.double(),
                                                                 eps).float()).passed


def test_check_refuses_an_unknown_exercise_and_reports_a_non_function():
    with pytest.raises(ValueError, match="no exercise named 'softmaxx'"):
        check("softmaxx", solutions.softmax)
    result = check("softmax", 3)
    assert not result.passed and "pass the function itself" in result.message


def test_reveal_is_friendly_with_no_guess_a_close_guess_and_a_wrong_one():
    assert reveal(None, 6).startswith("The answer is 6.")
    assert reveal(6, 6) == "Spot on: 6."
    assert reveal(100, 188, unit=" MB").startswith("You guessed 100")
    assert reveal(185, 188, unit=" MB").startswith("Close")
    assert reveal("berlin", " Berlin") == "Spot on: ' Berlin'." and reveal(" Rome", " Berlin").startswith("You guessed")


def test_an_error_raised_inside_llmwalk_points_at_the_learners_line():
    def apply_temperature(logits, temperature):
        return lw.apply_temperature(logits, temperature - 1)      # T = 1 becomes 0: llmwalk refuses it
    result = check("apply_temperature", apply_temperature)
    assert not result.passed and "raised ValueError" in result.message
    assert "in apply_temperature, line" in result.message and "temperature - 1" in result.message


def test_an_answer_that_trips_a_diagnosis_still_gets_a_verdict():
    def diagnose(case, expected, got):
        raise TypeError("a diagnosis that cannot handle this answer")
    ex = Exercise("double", "00", "double(x)", ("x",), 1, lambda x: 2 * x, lambda: [Case("ones", (torch.ones(2),),
                                                                                    "multiply by 2")], diagnose)
    result = grade(ex, lambda x: 3 * x)
    assert not result.passed and result.case == "ones" and result.hint == "multiply by 2"


# ---------------------------------------------------------------- a function that never returns; the learner's language

def test_a_function_that_never_returns_is_stopped_with_a_friendly_message():
    def bpe(piece, ranks):
        parts = [bytes([b]) for b in piece]
        while len(parts) > 0:                               # never false: the learner forgot to stop
            pass
    result = grade(EXERCISES["bpe"], bpe, timeout=0.3)
    assert not result.passed and result.case == "one byte"
    assert "did not finish within 0.3 s" in result.message and "in bpe, line" in result.message
    assert "Traceback" not in str(result)


def test_the_time_limit_is_lifted_after_grading():
    """A later slow cell must not be interrupted by a stale alarm."""
    import signal
    import time
    before = signal.getsignal(signal.SIGALRM)
    assert grade(EXERCISES["softmax"], solutions.softmax, timeout=0.3).passed
    time.sleep(0.5)                                         # would raise here if the alarm were still armed
    assert signal.getsignal(signal.SIGALRM) is before and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


@pytest.fixture
def chinese():
    lw.set_language("zh")
    yield
    lw.set_language("en")


def test_verdicts_hints_and_reveal_speak_chinese(chinese):
    result = check("softmax", _softmax_overflows)
    assert not result.passed and result.case == "很大的 logits（~1000）"
    assert result.message.startswith("用例“很大的 logits（~1000）”")
    assert "先减去每行的最大值" in result.hint
    assert dict(result.details).keys() >= {"期望", "实际"} and "提示" in result._repr_markdown_()
    assert "全部" in check("softmax", solutions.softmax).message
    assert "还没有实现" in check("softmax", lambda x: (_ for _ in ()).throw(NotImplementedError)).message
    assert reveal(None, 6).startswith("答案是 6") and reveal(185, 188, unit=" MB").startswith("很接近")


@pytest.mark.parametrize("name", list(EXERCISES))
def test_every_case_label_and_hint_is_chinese_in_the_chinese_edition(name, chinese):
    """No English sentence left over: every case name or hint holds a CJK character unless it is code/maths only."""
    def cjk(text):
        return any("\u4e00" <= ch <= "\u9fff" for ch in text)
    for case in EXERCISES[name].cases():
        for text in (case.label, case.hint):
            assert cjk(text) or not any(word in text.split() for word in ("the", "a", "and", "of", "to")), text


def test_an_alarm_set_by_someone_else_is_left_alone():
    import signal
    fired = []
    previous = signal.signal(signal.SIGALRM, lambda *_: fired.append(True))
    try:
        signal.setitimer(signal.ITIMER_REAL, 30)
        assert grade(EXERCISES["softmax"], solutions.softmax, timeout=0.3).passed
        assert 25 < signal.getitimer(signal.ITIMER_REAL)[0] <= 30 and not fired
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
