"""Exercises: implement a piece of the model yourself, and let the grader check it against llmwalk's own.

    from llmwalk.exercises import check
    def softmax(logits):
        ...
    check("softmax", softmax)        # a verdict: which case failed, the input, expected vs got, and a hint

`check` runs your function on plain, edge and adversarial cases (large logits, ties, batches, zero vectors,
T = 1, every k and p boundary) and compares it with llmwalk's implementation (or torch.nn.functional's), computed
with the functions as they were when llmwalk.exercises was imported. Passing says your function agrees on these
public cases, no more. It never raises for a wrong answer: an exception in your code (SystemExit too) is reported
with the case and your line that raised; a function still running after 10 s on one case (an endless loop) is
stopped and reported the same way (a bare `except:` in the loop, or sys.settrace(None), does not keep it going),
and one stuck in a single long torch call is reported on time while that call finishes in the background. Whatever
your function rebinds in Python's builtins, math, torch, torch.nn.functional, torch.Tensor or llmwalk is put back
after each call, and the verdict says so. Verdicts, hints and reveal() speak the language set by
`lw.set_language` ("en" or "zh").

The exercises, by notebook (tensors are float32 unless said otherwise):

02_tokenization
    bpe(piece: bytes, ranks: dict[bytes, int]) -> list[bytes]
        GPT-2's byte-pair merge of one pre-split piece: repeatedly join the adjacent pair whose joined bytes have
        the lowest rank in `ranks` (leftmost first on a repeat) until no adjacent pair is in `ranks`.
        `gpt2_ranks()` gives GPT-2's real table.
03_embedding
    embed(ids: [T] int64, table: [vocab, d]) -> [T, d]                one row of the table per token
    cosine_similarity(a: [..., d], b: [..., d]) -> [...]              a·b / (|a| |b|) over the last dim, broadcast
    apply_rope(x: [n_head, T, d_head], positions: [T] int64, base: float) -> [n_head, T, d_head]
        rotate each pair (x_i, x_{i+d/2}) by positions · base^(-2i/d) radians (rotate-half, as llmwalk and Hugging Face's Llama)
04_layers
    causal_mask(T: int) -> bool [T, T]                                True where query i may look at key j
    attention(q, k, v: [n_head, T, d_head]) -> [n_head, T, d_head]    causal scaled dot-product attention
    rms_norm(x: [..., d], weight: [d], eps: float) -> [..., d]
    layer_norm(x: [..., d], weight: [d], bias: [d], eps: float) -> [..., d]
    swiglu_ffn(x: [..., d], w_gate: [d_ff, d], w_up: [d_ff, d], w_down: [d, d_ff]) -> [..., d]
        SmolLM2's gated FFN, weights as the checkpoint stores them ([out, in]): (silu(x Wgᵀ) * x Wuᵀ) Wdᵀ
05_lm_head
    lm_head(h: [T, d], W: [vocab, d]) -> [T, vocab]                   one dot product per vocabulary row
    softmax(logits: [..., vocab]) -> [..., vocab]                     over the last dim, stable for large logits
    logit_lens(resid: [n_layer + 1, d], norm_weight: [d], eps: float, W_U: [vocab, d]) -> [n_layer + 1, vocab]
        every row of the residual stream (emb, after layer 0, ...) through the final RMSNorm and the LM head
06_sampling
    apply_temperature(logits: [..., vocab], temperature: float) -> [..., vocab]
    top_k_filter(logits: [..., vocab], top_k: int) -> [..., vocab]    -inf below the k-th largest; ties kept
    top_p_filter(logits: [..., vocab], top_p: float) -> [..., vocab]  smallest top set reaching p, crossing token kept
07_autoregressive
    greedy_generate(next_logits, prompt_ids: list[int], n: int) -> list[int]
        next_logits(ids: list[int]) -> [vocab] logits of the token after ids; return the n new ids (argmax each round)
08_cost
    kv_cache_bytes(n_layer, n_kv_head, d_head, T, bytes_per_number) -> int
    token_flops(n_layer, d_model, n_head, n_kv_head, d_head, d_ff, vocab_size, context) -> int
        the matrix products of one new token with a KV cache (gated FFN, grouped-query attention, LM head once)
09_the_journey
    next_token_logits(weights: Weights, config: Config, ids: [T] int64) -> [vocab]
        the whole chain: embedding, every layer (causal mask, RoPE), final norm, LM head at the last position
deep_dives/kv_cache
    kv_cache_step(q, k_new, v_new: [n_head, 1, d_head], k_cache, v_cache: [n_head, S, d_head])
            -> (out [n_head, 1, d_head], k_cache [n_head, S + 1, d_head], v_cache [n_head, S + 1, d_head])
        one decoding step: append the new key/value, then attend from the new query to all S + 1 positions
deep_dives/interventions
    split_logit(embedding: [d], writes: [n, d], norm_weight: [d], unembed: [d], eps: float) -> [n + 1]
        direct logit attribution: each write's part of one logit through the final RMSNorm, whose scale is the
        whole stream's (embedding + every write), frozen; the embedding's part first; the parts sum to the logit
deep_dives/speculative_decoding
    speculative_accept(p: [V], q: [V], drafted: int, u: float) -> (accepted: bool, residual: [V])
        the accept/reject rule for one drafted token x: accept when u < min(1, p(x) / q(x)); the residual
        max(0, p − q), normalised, is what a rejected guess is replaced by (returned either way)
deep_dives/quantization
    int8_quantize(w: [d_in, d_out]) -> (codes: int8 [d_in, d_out], scales: [d_out])
        symmetric int8, one scale per output column: max |w| / 127 (1 for a column of zeros), codes round(w / scale)

Solutions, for teachers: `llmwalk/exercises/solutions.py`. `python -m llmwalk.exercises` checks them all.
Graded assignments (nbgrader) from these exercises: `python -m llmwalk.exercises.nbgrader COURSE_DIR`.
"""
from __future__ import annotations

import warnings
from typing import Callable

from ..i18n import t
from .catalogue import EXERCISES, gpt2_ranks
from .grader import TIMEOUT, Case, Exercise, Result, grade


def check(name: str, fn: Callable, *, timeout: float | None = TIMEOUT) -> Result:
    """Grade your function `fn` for exercise `name`; the Result shows itself as a verdict in a notebook. A case
    running longer than `timeout` seconds (at least 0.1) is stopped (None: no limit)."""
    if name not in EXERCISES:
        raise ValueError(t("exercises.grader.unknown", name=repr(name), names=", ".join(EXERCISES)))
    return grade(EXERCISES[name], fn, timeout=timeout)


class ExerciseFailed(AssertionError):
    """A verdict that did not pass, raised by assert_passes; its message is the verdict."""

    def __init__(self, result: Result):
        super().__init__(f"{result.name}: {result}")
        self.result = result

    def _render_traceback_(self) -> list[str]:
        """What IPython shows for it: the verdict alone, no traceback (its frames are the grader's, not yours)."""
        return str(self).splitlines()


def assert_passes(name: str, fn: Callable, *, timeout: float | None = TIMEOUT) -> Result:
    """check(name, fn), raising ExerciseFailed (an AssertionError) with the verdict as its message when it fails: a
    graded assignment's test cell calls this (nbgrader gives a cell's points when it raises nothing), and the
    verdict is the cell's whole error output, in the notebook and in the feedback nbgrader returns."""
    with warnings.catch_warnings(record=True) as caught:   # nbgrader takes a cell's points for anything on stderr,
        warnings.simplefilter("default")                    # a warning too: shown on stdout (once), it costs nothing
        result = check(name, fn, timeout=timeout)
    for warning in caught:
        print(warnings.formatwarning(warning.message, warning.category, warning.filename, warning.lineno).strip())
    if not result.passed:
        raise ExerciseFailed(result)
    return result


def exercises(notebook: str | None = None) -> list[Exercise]:
    """The exercises, all or those of one notebook (e.g. "06_sampling")."""
    return [ex for ex in EXERCISES.values() if notebook is None or ex.notebook == notebook]


def reveal(guess, answer, *, unit: str = "", close: float = 0.1) -> str:
    """Compare a predicted value with the measured one, kindly; a guess of None just shows the answer."""
    shown = f"{answer:,}{unit}" if isinstance(answer, (int, float)) else repr(answer)
    if guess is None:
        return t("exercises.reveal.no_guess", answer=shown)
    if guess == answer or (isinstance(guess, str) and isinstance(answer, str)
                           and guess.strip().casefold() == answer.strip().casefold()):   # " Berlin" or "berlin"
        return t("exercises.reveal.exact", answer=shown)
    if isinstance(answer, (int, float)) and isinstance(guess, (int, float)) and \
            abs(guess - answer) <= close * abs(answer):
        return t("exercises.reveal.close", guess=f"{guess:,}{unit}", answer=shown)
    return t("exercises.reveal.wrong", guess=repr(guess), answer=shown)


__all__ = ["Case", "EXERCISES", "Exercise", "ExerciseFailed", "Result", "assert_passes", "check", "exercises",
           "gpt2_ranks", "reveal"]
