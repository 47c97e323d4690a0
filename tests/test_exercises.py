"""The grader: every solution and llmwalk's own code pass; a catalogue of classic mistakes is rejected, each on the
case that exposes it and with the hint that names it; a raising, stubbed or shapeless answer never raises."""
import math
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import llmwalk as lw
from llmwalk.exercises import EXERCISES, Case, Exercise, check, exercises, reveal, solutions
from llmwalk.exercises import grader
from llmwalk.exercises.grader import grade

NEG_INF = float("-inf")


@pytest.mark.parametrize("name", list(EXERCISES))
def test_every_solution_passes(name):
    result = check(name, getattr(solutions, name))
    assert result.passed, str(result)


def test_every_notebook_02_to_09_has_an_exercise():
    assert {f"0{i}" for i in range(2, 10)} <= {ex.notebook[:2] for ex in exercises()}


def test_every_exercise_names_a_notebook_of_both_editions():
    root = Path(__file__).resolve().parent.parent / "notebooks"
    for ex in exercises():
        assert (root / f"{ex.notebook}.ipynb").is_file() and (root / "zh" / f"{ex.notebook}.ipynb").is_file(), ex.name


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
    ("swiglu_ffn", lambda x, wg, wu, wd: F.linear(F.silu(F.linear(x.double(), wg.double()))
                                                  * F.linear(x.double(), wu.double()), wd.double()).float()),
    ("causal_mask", lw.causal_mask),
    ("cosine_similarity", lambda a, b: F.cosine_similarity(a, b, dim=-1)),
    ("embed", lambda ids, table: F.embedding(ids, table)),
    ("lm_head", lambda h, W: F.linear(h, W)),
    ("logit_lens", lambda r, w, eps, W: F.linear(F.rms_norm(r.double(), (r.shape[-1],), w.double(), eps), W.double())
     .float()),
    ("apply_temperature", lw.apply_temperature),
    ("top_k_filter", lw.top_k_filter),
    ("top_p_filter", lw.top_p_filter),
    ("kv_cache_bytes", _lw_kv_bytes),
    ("bpe", lambda piece, ranks: [lw.gpt2_tokenizer().token_bytes(i)
                                  for i in lw.gpt2_tokenizer().encode(piece.decode())]),
    ("kv_cache_step", lambda q, k, v, kc, vc: (F.scaled_dot_product_attention(
        q, torch.cat([kc, k], 1), torch.cat([vc, v], 1)), torch.cat([kc, k], 1), torch.cat([vc, v], 1))),
    ("split_logit", lambda e, writes, w, u, eps: _split_by_rms_norm(torch.cat([e[None], writes]), w, u, eps)),
]


def _split_by_rms_norm(every, w, u, eps):
    """The frozen scale read off torch's own RMSNorm of the stream: |rms_norm(stream)| / |stream|."""
    stream = every.sum(0)
    scale = F.rms_norm(stream, stream.shape, None, eps).norm() / stream.norm()
    return scale * (every * w) @ u


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


def _rms(x, eps):
    return x * (x.pow(2).mean(-1, keepdim=True) + eps).rsqrt()


LENS_WRONG = {  # the classic wrong logit lenses, each with the word its hint must contain
    "no final norm": lambda r, w, eps, W: r @ W.T,
    "LayerNorm": lambda r, w, eps, W: F.layer_norm(r, (r.shape[-1],), w, None, eps) @ W.T,
    "weight is forgotten": lambda r, w, eps, W: _rms(r, eps) @ W.T,
    "not transposed": lambda r, w, eps, W: _rms(r, eps) * w @ W,
    "softmax returned": lambda r, w, eps, W: (_rms(r, eps) * w @ W.T).softmax(-1),
    "row 0 is skipped": lambda r, w, eps, W: _rms(r[1:], eps) * w @ W.T,
}


def _attention(q, k, v, scale=None, mask=True):
    scores = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if mask:
        scores = scores.masked_fill(~lw.causal_mask(q.shape[1]), NEG_INF)
    return scores.softmax(-1) @ v


def _swiglu(x, wg, wu, wd):
    return F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd)


def _swiglu_relu_if_all_negative(x, wg, wu, wd):
    """Right unless every gate value is negative, where it uses ReLU: only the all-negative case can tell."""
    g = F.linear(x, wg)
    return F.linear(F.relu(g) * F.linear(x, wu), wd) if (g < 0).all() else _swiglu(x, wg, wu, wd)


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


def _split(e, writes, w, u, eps, *, weight=True, scale="stream", with_eps=True):
    """Direct logit attribution, right or with one classic mistake: no norm weight, no 1/rms ("none"), a scale
    recomputed from each part ("each") or from the writes without the embedding ("writes"), eps left out."""
    eps = eps if with_eps else 0.0
    every = torch.cat([e[None], writes])
    of = {"stream": every.sum(0), "writes": writes.sum(0)}
    inv = (torch.ones(len(every)) if scale == "none" else
           torch.rsqrt(every.pow(2).mean(-1) + eps) if scale == "each" else torch.rsqrt(of[scale].pow(2).mean() + eps))
    return inv * ((every * w if weight else every) @ u)


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
    ("swiglu_ffn", lambda x, wg, wu, wd: F.linear(F.linear(x, wg) * F.silu(F.linear(x, wu)), wd),
     "d = d_ff = 4, three tokens", "swapped"),
    ("swiglu_ffn", lambda x, wg, wu, wd: F.linear(F.relu(F.linear(x, wg)) * F.linear(x, wu), wd),
     "d = d_ff = 4, three tokens", "ReLU"),
    ("swiglu_ffn", lambda x, wg, wu, wd: F.linear(F.gelu(F.linear(x, wg), approximate="tanh") * F.linear(x, wu), wd),
     "d = d_ff = 4, three tokens", "GELU"),
    ("swiglu_ffn", lambda x, wg, wu, wd: F.linear(torch.sigmoid(F.linear(x, wg)) * F.linear(x, wu), wd),
     "d = d_ff = 4, three tokens", "sigmoid"),
    ("swiglu_ffn", lambda x, wg, wu, wd: F.linear(F.silu(F.linear(x, wu)), wd), "d = d_ff = 4, three tokens",
     "plain MLP"),
    ("swiglu_ffn", lambda x, wg, wu, wd: (F.silu(x @ wg) * (x @ wu)) @ wd, "d = d_ff = 4, three tokens",
     "not transposed"),
    ("swiglu_ffn", lambda x, wg, wu, wd: x + F.linear(F.silu(F.linear(x, wg)) * F.linear(x, wu), wd),
     "d = d_ff = 4, three tokens", "residual"),
    ("swiglu_ffn", _swiglu_relu_if_all_negative, "gate values all below 0", "ReLU"),
    ("swiglu_ffn", lambda x, wg, wu, wd: _swiglu(x.half(), wg.half(), wu.half(), wd.half()).float()
     if x.shape[-1] > 100 else _swiglu(x, wg, wu, wd), "SmolLM2's real layer 3 FFN, five tokens (576 → 1536 → 576)",
     "real weights"),
    ("swiglu_ffn", lambda x, wg, wu, wd: F.linear(F.silu(F.linear(x, wg)) * F.silu(F.linear(x, wu)), wd),
     "d = d_ff = 4, three tokens", "both branches"),
    ("swiglu_ffn", lambda x, wg, wu, wd: F.linear(F.silu(F.linear(x, wg) * F.linear(x, wu)), wd),
     "d = d_ff = 4, three tokens", "after the product"),
    ("embed", lambda ids, table: table[ids - 1], "three different ids", "off by one"),
    ("cosine_similarity", lambda a, b: (a * b).sum(-1), "a vector and itself, scaled by 3", "dot product"),
    ("lm_head", lambda h, W: W @ h.T, "one token: h [1, 4], W [6, 4]", "transposed"),
    *(("logit_lens", fn, "4 rows, d = vocab = 8 (a square W_U)", hint) for hint, fn in LENS_WRONG.items()),
    ("logit_lens", lambda r, w, eps, W: r / (r.pow(2).mean(-1, keepdim=True).sqrt() + eps) * w @ W.T,
     "a large eps (0.5) on small values", "inside the square root"),
    ("logit_lens", lambda r, w, eps, W: r * (r.pow(2).mean(0, keepdim=True) + eps).rsqrt() * w @ W.T,
     "4 rows, d = vocab = 8 (a square W_U)", "wrong dimension"),
    ("greedy_generate", _greedy_forgets_append, "six new tokens", "append"),
    ("greedy_generate", _greedy_returns_all, "one new token", "only the n new ids"),
    ("kv_cache_step", _kv_step_no_growth, "the first token: empty cache", "did not grow"),
    ("kv_cache_step", _kv_step_no_scale, "2 heads, 4 cached positions, d_head 8", "scale"),
    ("kv_cache_bytes", lambda n_layer, n_kv, d, t, b: n_layer * n_kv * d * t * b, "SmolLM2, 4,096 tokens, fp32",
     "factor 2"),
    ("kv_cache_bytes", lambda n_layer, n_kv, d, t, b: 2 * n_layer * n_kv * d * t * b * 8, "SmolLM2, 4,096 tokens, fp32",
     "bits"),
    ("bpe", lambda piece, ranks: [bytes([b]) for b in piece], "a common word", "nothing was merged"),
    ("split_logit", lambda e, W, w, u, eps: _split(e, W, w, u, eps, weight=False), "a learned norm weight",
     "norm's weight is missing"),
    ("split_logit", lambda e, W, w, u, eps: _split(e, W, w, u, eps, scale="none"), "two writes, a norm weight of ones",
     "1/rms is missing"),
    ("split_logit", lambda e, W, w, u, eps: _split(e, W, w, u, eps, scale="each"), "two writes, a norm weight of ones",
     "recomputed from each part"),
    ("split_logit", lambda e, W, w, u, eps: _split(e, W, w, u, eps)[1:], "two writes, a norm weight of ones",
     "embedding is a part too"),
    ("split_logit", lambda e, W, w, u, eps: _split(e, W, w, u, eps, scale="writes"),
     "two writes, a norm weight of ones", "includes the embedding"),
    ("split_logit", lambda e, W, w, u, eps: _split(e, W, w, u, eps, with_eps=False), "a large eps (0.5) on small values",
     "inside the square root"),
    ("split_logit", lambda e, W, w, u, eps: _split(e, W, w, u, eps).sum(), "two writes, a norm weight of ones",
     "not their sum"),
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


# ---------------------------------------------------------------- a function that never returns, or returns something odd

def _exercise_threads():
    return [th for th in threading.enumerate() if th.name == "llmwalk-exercise" and th.is_alive()]


def test_a_function_that_never_returns_is_stopped_with_a_friendly_message():
    def bpe(piece, ranks):
        parts = [bytes([b]) for b in piece]
        while len(parts) > 0:                               # never false: the learner forgot to stop
            pass
    result = grade(EXERCISES["bpe"], bpe, timeout=0.2)
    assert not result.passed and result.case == "one byte"
    assert "did not finish within 0.2 s" in result.message and "in bpe, line" in result.message
    assert "Traceback" not in str(result) and not _exercise_threads()


@pytest.mark.parametrize("body", ["sleep", "spin", "settrace"])
def test_a_bare_except_loop_or_settrace_none_cannot_outlive_the_time_limit(body):
    """Report X10, which never returned, and the probe's sys.settrace(None), which switched the stop off: the verdict
    comes in time and the loop itself is ended (the test's own let_go is only a safety net: it must not be needed)."""
    let_go, rounds = threading.Event(), []

    def softmax(logits):
        if body == "settrace":
            sys.settrace(None)
        while not let_go.is_set():
            try:
                rounds.append(1)
                if body == "sleep":
                    time.sleep(0.01)
            except:                                         # noqa: E722  swallows a stop
                pass
    try:
        result = check("softmax", softmax, timeout=0.2)
        ended = not _exercise_threads()
    finally:
        let_go.set()
    assert not result.passed and "did not finish within 0.2 s" in result.message
    assert ended, "the learner's loop is still running after the verdict"
    assert rounds


def test_an_answer_returned_after_the_time_is_up_is_still_too_late():
    """A function that catches the stop and returns the right ids got "all cases pass" after 100 s (report X12)."""
    def greedy_generate(next_logits, prompt_ids, n):
        try:
            while True:
                pass
        except BaseException:
            return solutions.greedy_generate(next_logits, prompt_ids, n)
    result = check("greedy_generate", greedy_generate, timeout=0.2)
    assert not result.passed and "did not finish within 0.2 s" in result.message
    # one line that ends in C code returns its (right) value after the stop without running another line
    result = check("softmax", lambda x: (time.sleep(0.3), x.softmax(-1))[1], timeout=0.2)
    assert not result.passed and "did not finish within 0.2 s" in result.message


def test_a_call_that_cannot_be_interrupted_gets_its_verdict_anyway(monkeypatch):
    """Waiting for a lock, like one huge matmul or time.sleep, runs in C where nothing can stop it: the verdict comes
    after the grace period, says so, and the thread ends once the call returns."""
    monkeypatch.setattr(grader, "_GRACE", 0.05)
    held = threading.Lock()
    held.acquire()

    def softmax(logits):
        held.acquire()                                      # stands for one uninterruptible torch call
        return logits.softmax(-1)
    try:
        result = check("softmax", softmax, timeout=0.2)
    finally:
        held.release()
    assert not result.passed and "cannot be interrupted" in result.message
    assert "in softmax, line" in result.message and "held.acquire()" in result.message
    for th in _exercise_threads():
        th.join(30)
    assert not _exercise_threads()


def test_an_interrupt_stops_a_bare_except_loop_even_when_it_lands_on_the_worker_thread():
    """The kernel's interrupt (SIGINT) may be delivered to any thread; with no time limit, it is the only way out.

    The signal goes to the grader's worker thread while the main thread is still in the grader's first wait, and
    is sent again only while the main thread is provably still there (CPython hands a signal that lands on another
    thread to the main thread at its next bytecode, and may drop one that arrives while the threads trade the GIL:
    a learner would press interrupt again). An earlier test's call still finishing in the background is waited for
    first, so that the signal is not aimed at it."""
    for th in _exercise_threads():
        th.join(30)
    assert not _exercise_threads()
    main = threading.main_thread().ident

    def softmax(logits):
        while True:
            try:
                time.sleep(0.01)
            except:                                         # noqa: E722  swallows the KeyboardInterrupt too
                pass

    def main_is_waiting() -> bool:
        frame = sys._current_frames().get(main)
        while frame is not None and frame.f_code is not grader._wait.__code__:
            frame = frame.f_back
        return frame is not None

    def interrupt():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not done.is_set():
            workers = _exercise_threads()
            if workers and main_is_waiting():
                try:
                    signal.pthread_kill(workers[0].ident, signal.SIGINT)
                except ProcessLookupError:                  # it ended between the two lines
                    pass
                time.sleep(0.5)                             # the main thread wakes every 0.1 s
            else:
                time.sleep(0.01)
    done = threading.Event()
    threading.Thread(target=interrupt, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        check("softmax", softmax, timeout=None)
    done.set()
    for th in _exercise_threads():                          # stopped: it unwinds within moments
        th.join(10)
    assert not _exercise_threads()


def test_the_grader_leaves_no_alarm_tracer_or_thread_behind(monkeypatch):
    """The old alarm could cancel someone else's or fire in a later cell: grading now never touches signals."""
    def refuse(*args):
        raise AssertionError("the grader touched SIGALRM")
    monkeypatch.setattr(signal, "setitimer", refuse)
    monkeypatch.setattr(signal, "signal", refuse)
    tracer = sys.gettrace()
    assert check("softmax", solutions.softmax).passed
    assert sys.gettrace() is tracer and not _exercise_threads()


@pytest.mark.parametrize("timeout, error", [(-1, ValueError), (0, ValueError), (1e-6, ValueError),
                                            (math.inf, ValueError), (math.nan, ValueError), ("10", TypeError),
                                            (True, TypeError)])
def test_a_bad_timeout_is_the_callers_mistake_not_the_learners(timeout, error):
    calls = []
    with pytest.raises(error, match=r"timeout="):
        check("softmax", lambda x: calls.append(x), timeout=timeout)
    assert not calls


def test_the_learners_keyboard_interrupt_goes_through_but_exit_is_a_mistake():
    def interrupted(logits):
        raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        check("softmax", interrupted)
    for stop, name in ((lambda: sys.exit(3), "SystemExit"), (lambda: (_ for _ in ()).throw(GeneratorExit),
                                                              "GeneratorExit")):
        result = check("softmax", lambda x, stop=stop: stop())
        assert not result.passed and f"raised {name}" in result.message and result.case == "three logits"


class _Unprintable:
    def __repr__(self):
        raise RuntimeError("repr fails")


class _UnprintableError(Exception):
    def __str__(self):
        raise RuntimeError("str fails")


def _raise_unprintable(logits):
    raise _UnprintableError


@pytest.mark.parametrize("fn, words", [
    (lambda x: x.softmax(-1).to_sparse(), "sparse_coo tensor"),
    (lambda x: torch.empty_like(x, device="meta"), "device meta"),
    (lambda x: _Unprintable(), "expected a torch.Tensor"),
    (_raise_unprintable, "raised _UnprintableError: <its message cannot be shown"),
], ids=["sparse", "meta", "repr-raises", "str-raises"])
def test_answers_the_grader_cannot_read_get_a_verdict_not_a_traceback(fn, words):
    result = check("softmax", fn)
    assert not result.passed and words in result.message and result.case == "three logits"
    assert str(result) and result._repr_markdown_()


def test_an_answer_that_breaks_the_comparison_itself_gets_a_verdict():
    result = check("kv_cache_bytes", lambda *args: _Unprintable())      # the int comparison shows what it got
    assert not result.passed and "cannot read what your function returned" in result.message


def test_bpe_cases_do_not_share_the_ranks_dict():
    """A bpe that empties `ranks` after its (right) answer: with one dict for every case, case 2 saw 0 entries."""
    def bpe(piece, ranks):
        parts = solutions.bpe(piece, ranks)
        ranks.clear()
        return parts
    assert check("bpe", bpe).passed


# ---------------------------------------------------------------- a learner who rebinds torch, llmwalk or the grader

def _softmax_over_dim_0(logits):
    """Right on one row, wrong on a batch: it normalises over the first dim."""
    e = (logits - logits.max()).exp()
    return e / e.sum(0, keepdim=True)


def test_a_function_that_rebinds_torch_softmax_does_not_pass_and_it_is_put_back():
    original = torch.softmax

    def softmax(logits):
        torch.softmax = lambda x, dim=-1, **kw: _softmax_over_dim_0(x)     # llmwalk's reference calls torch.softmax
        return _softmax_over_dim_0(logits)
    result = check("softmax", softmax)
    assert not result.passed and result.case == "batched [3, 5]", str(result)
    assert "your function replaced torch.softmax; it was put back" in result.message.lower()
    assert torch.softmax is original and check("softmax", solutions.softmax).passed


def test_a_rebinding_made_before_check_does_not_change_the_reference(monkeypatch):
    """torch.softmax = theirs in an earlier cell (report X17): the reference still uses torch's own."""
    monkeypatch.setattr(torch, "softmax", lambda x, dim=-1, **kw: _softmax_over_dim_0(x))
    result = check("softmax", _softmax_over_dim_0)
    assert not result.passed and result.case == "batched [3, 5]", str(result)
    assert torch.softmax is not torch._C._VariableFunctions.softmax        # theirs is left where they put it


def test_an_attention_that_unmasks_sdpa_fails_and_llmwalk_still_generates(smollm2):
    """Report X18: an unmasked attention is right for T = 1 and rebound F.sdpa there; it then "passed" and llmwalk's
    own fast path wrote '__ wishershire.com/' until the kernel restarted."""
    sdpa = F.scaled_dot_product_attention
    before = lw.generate(smollm2, "The capital of France is", 6).new_ids

    def attention(q, k, v):
        F.scaled_dot_product_attention = lambda q, k, v, **kw: sdpa(q, k, v)
        return sdpa(q, k, v)
    result = check("attention", attention)
    assert not result.passed and result.case == "n_head = 2, T = 4, d_head = 8", str(result)
    assert "torch.nn.functional.scaled_dot_product_attention" in result.message
    assert F.scaled_dot_product_attention is sdpa
    assert lw.generate(smollm2, "The capital of France is", 6).new_ids == before


def test_patching_the_graders_compare_does_not_pass_now_or_later():
    compare = grader.compare

    def softmax(logits):
        grader.compare = lambda *args: None
        return logits
    assert not check("softmax", softmax).passed
    assert grader.compare is compare
    assert not check("top_p_filter", lambda logits, p: logits * 0 + 42).passed


def test_a_rebound_builtin_is_put_back_and_reported():
    """The probe's isinstance = lambda *a: True left every later cell of the kernel broken; the grader compares with
    the builtins it was imported with, and puts the learner's rebinding back."""
    import builtins
    original = builtins.isinstance

    def greedy_generate(next_logits, prompt_ids, n):
        builtins.isinstance = lambda obj, cls: True
        return [0] * n
    result = check("greedy_generate", greedy_generate)
    assert builtins.isinstance is original
    assert not result.passed and "builtins.isinstance" in result.message, str(result)
    assert check("greedy_generate", solutions.greedy_generate).passed


def test_a_tensor_method_set_by_the_function_is_removed_again():
    def softmax(logits):
        torch.Tensor.softmax = lambda self, dim: self                       # shadows torch's C method
        return logits.softmax(-1)
    result = check("softmax", softmax)
    assert not result.passed and "torch.Tensor.softmax" in result.message
    assert "softmax" not in vars(torch.Tensor) and torch.ones(2).softmax(-1).tolist() == [0.5, 0.5]


def test_a_right_answer_says_public_checks_passed_no_more():
    result = check("softmax", solutions.softmax)
    assert result.passed and result.message.startswith("public checks passed") and "replaced" not in result.message


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
    assert check("softmax", solutions.softmax).message.startswith("公开检查全部通过")
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
