"""The grader: run a learner's function on an exercise's cases, compare with llmwalk's own, explain the first miss."""
from __future__ import annotations

import math
import signal
import threading
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor

from ..i18n import t

_LLMWALK = Path(__file__).resolve().parent.parent
_TORCH = Path(torch.__file__).resolve().parent
TIMEOUT = 10.0      # seconds a learner's function may take on one case (every reference takes milliseconds)


@dataclass(frozen=True)
class Case:
    """One input to try. `hint` names the mistake this case usually catches."""

    label: str                              # e.g. "large logits (~1000)"
    args: tuple = ()                        # passed to the function, tensors and lists cloned first
    hint: str = ""
    run: Callable[[Callable], Any] | None = None   # loops: run(fn) calls fn itself (then `shown` describes it)
    shown: str = ""


@dataclass(frozen=True)
class Exercise:
    """What the learner implements, where it belongs, and how it is graded."""

    name: str
    notebook: str                           # e.g. "06_sampling"
    signature: str                          # e.g. "top_p_filter(logits, top_p) -> logits"
    params: tuple[str, ...]                 # argument names, to show a failing input
    minutes: int                            # about how long a learner needs
    reference: Callable                     # llmwalk's (or torch's) implementation, same signature
    cases: Callable[[], list[Case]]         # built on demand: some need GPT-2's merges
    diagnose: Callable[[Case, Any, Any], str | None] = lambda case, expected, got: None
    rtol: float = 1e-4
    atol: float = 1e-5


@dataclass(frozen=True)
class Result:
    """The verdict. `.passed` says it all; `.message` explains; a notebook shows it as a short card."""

    name: str
    passed: bool
    message: str
    case: str | None = None                 # label of the first case that failed
    details: tuple[tuple[str, str], ...] = ()   # (what, value): the input, expected, got
    hint: str = ""

    def __str__(self) -> str:
        lines = [self.message] + [f"  {what}: {value}" for what, value in self.details]
        return "\n".join(lines + ([t("exercises.grader.hint", hint=self.hint)] if self.hint else []))

    __repr__ = __str__

    def _repr_markdown_(self) -> str:
        icon = "✅" if self.passed else "❌"
        lines = [t("exercises.grader.verdict", icon=icon, name=self.name, message=self.message)]
        lines += [f"- {what}: `{value}`" for what, value in self.details]
        return "\n".join(lines + ([t("exercises.grader.hint_markdown", hint=self.hint)] if self.hint else []))


def _clone(x):
    if isinstance(x, Tensor):
        return x.clone()
    if isinstance(x, list):
        return [_clone(i) for i in x]
    return x


def _call(case: Case, fn: Callable):
    return case.run(fn) if case.run is not None else fn(*(_clone(a) for a in case.args))


def _round(v):
    return [_round(i) for i in v] if isinstance(v, list) else float(f"{v:.4g}")


def show(x, limit: int = 12) -> str:
    """A short readable form of a value: small tensors in full (4 significant digits), big ones by shape."""
    if isinstance(x, Tensor):
        if x.numel() > limit:
            kind = t("exercises.show.tensor", shape=list(x.shape), dtype=str(x.dtype).removeprefix("torch."))
            if not x.is_floating_point():
                return kind
            row = x.reshape(-1, x.shape[-1])[0]        # the first row says more than the shape alone
            return t("exercises.show.first_row", kind=kind,
                     row=f"{_round(row[:6].tolist())}{' ...' if row.numel() > 6 else ''}")
        if x.is_floating_point():
            return str(_round(x.tolist()))
        return str(x.tolist())
    if isinstance(x, dict):
        return t("exercises.show.dict", n=len(x))
    if isinstance(x, (tuple, list)) and any(isinstance(i, Tensor) for i in x):
        return "(" + ", ".join(show(i, limit) for i in x) + ")"
    text = repr(x)
    return text if len(text) <= 120 else text[:117] + "..."


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _compare_tensor(expected: Tensor, got, ex: Exercise) -> str | None:
    if not isinstance(got, Tensor):
        return t("exercises.compare.not_tensor", type=type(got).__name__)
    if got.shape != expected.shape:
        return t("exercises.compare.shape", got=list(got.shape), expected=list(expected.shape))
    if got.dtype != expected.dtype:
        return t("exercises.compare.dtype", got=got.dtype, expected=expected.dtype)
    if not expected.is_floating_point():
        if torch.equal(got, expected):
            return None
        where = tuple((got != expected).nonzero()[0].tolist())
        return t("exercises.compare.differs_at", index=list(where), expected=expected[where].item(),
                 got=got[where].item())
    if got.isnan().any() and not expected.isnan().any():
        return t("exercises.compare.nan", index=got.isnan().nonzero()[0].tolist())
    removed, got_removed = expected.isneginf(), got.isneginf()
    if not torch.equal(removed, got_removed):
        if int(removed.sum()) == int(got_removed.sum()):
            where = (removed != got_removed).nonzero()[0].tolist()
            return (t("exercises.compare.wrong_removed", index=where) if removed[tuple(where)] else
                    t("exercises.compare.wrong_kept", index=where))
        return t("exercises.compare.removed_count", got=int(got_removed.sum()), expected=int(removed.sum()),
                 got_kept=int((~got_removed).sum()), expected_kept=int((~removed).sum()))
    if torch.allclose(got, expected, rtol=ex.rtol, atol=ex.atol):
        return None
    diff = (got - expected).abs().nan_to_num(nan=math.inf)
    where = tuple(torch.unravel_index(diff.argmax(), diff.shape)) if diff.dim() else ()
    where = tuple(int(i) for i in where)
    return t("exercises.compare.values", index=list(where), expected=f"{expected[where].item():.4g}",
             got=f"{got[where].item():.4g}")


def compare(expected, got, ex: Exercise) -> str | None:
    """None if `got` matches `expected`, else what is wrong, in one sentence."""
    if got is None:
        return t("exercises.compare.none")
    if isinstance(expected, Tensor):
        return _compare_tensor(expected, got, ex)
    if isinstance(expected, tuple):
        if not isinstance(got, tuple) or len(got) != len(expected):
            return t("exercises.compare.not_tuple", type=type(got).__name__, got=show(got), n=len(expected))
        for i, (e, g) in enumerate(zip(expected, got)):
            if problem := compare(e, g, ex):
                return t("exercises.compare.output", i=i + 1, n=len(expected), problem=problem)
        return None
    if isinstance(expected, list):
        if not isinstance(got, (list, tuple)):
            return t("exercises.compare.not_list", type=type(got).__name__)
        if any(_is_int(e) for e in expected) and not all(_is_int(g) for g in got):
            return t("exercises.compare.not_ints")
        if list(got) != expected:
            return t("exercises.compare.returned", got=show(list(got)), expected=show(expected))
        return None
    if _is_int(expected):
        if not _is_int(got):
            return t("exercises.compare.not_int", type=type(got).__name__, got=show(got))
        return None if got == expected else t("exercises.compare.returned", got=f"{got:,}", expected=f"{expected:,}")
    return None if got == expected else t("exercises.compare.returned", got=show(got), expected=show(expected))


def _first_line(error: BaseException, limit: int = 160) -> str:
    text = str(error).strip().split("\n")[0]
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _learner_frame(error: BaseException) -> str:
    """The last line of the learner's own code in the traceback: not llmwalk's (the grader's), not torch's."""
    own = [f for f in traceback.extract_tb(error.__traceback__)
           if not any(Path(f.filename).resolve().is_relative_to(lib) for lib in (_LLMWALK, _TORCH))]
    if not own:
        return ""
    frame = own[-1]
    if frame.line:
        return t("exercises.grader.where_code", function=frame.name, line=frame.lineno, code=frame.line.strip())
    return t("exercises.grader.where", function=frame.name, line=frame.lineno)


class _TookTooLong(BaseException):
    """Raised inside the learner's function by the alarm; a BaseException, so their own `except Exception` cannot
    swallow it."""


def _raise_took_too_long(signum, frame):
    raise _TookTooLong


@contextmanager
def _time_limit(seconds: float | None):
    """Interrupt the block after `seconds` with _TookTooLong. SIGALRM exists only on Unix and reaches only the main
    thread (a Jupyter kernel runs cells there); elsewhere, with seconds=None, or while someone else's alarm is set
    (we would cancel it), there is no limit."""
    if not seconds or not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread() \
            or signal.getitimer(signal.ITIMER_REAL)[0] > 0:
        yield
        return
    previous = signal.signal(signal.SIGALRM, _raise_took_too_long)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def grade(ex: Exercise, fn: Callable, *, timeout: float | None = TIMEOUT) -> Result:
    """Run every case; stop at the first one the function gets wrong. Never raises for a wrong answer. A case that
    takes longer than `timeout` seconds is stopped (Unix, main thread; None: no limit)."""
    if not callable(fn):
        return Result(ex.name, False, t("exercises.grader.not_callable", type=type(fn).__name__, name=ex.name))
    cases = ex.cases()
    for case in cases:
        expected = _call(case, ex.reference)
        inputs = (((t("exercises.grader.input"), case.shown),) if case.run is not None else
                  tuple((name, show(arg)) for name, arg in zip(ex.params, case.args)))
        try:
            with _time_limit(timeout):
                got = _call(case, fn)
        except NotImplementedError:
            return Result(ex.name, False, t("exercises.grader.not_implemented"))
        except _TookTooLong as error:
            return Result(ex.name, False, t("exercises.grader.timeout", seconds=f"{timeout:g}", case=case.label,
                                            where=_learner_frame(error)), case.label, inputs, case.hint)
        except Exception as error:  # a wrong answer may raise anything; the learner sees which case and where
            return Result(ex.name, False, t("exercises.grader.raised", error=type(error).__name__,
                                            text=_first_line(error), case=case.label, where=_learner_frame(error)),
                          case.label, inputs, case.hint)
        if problem := compare(expected, got, ex):
            try:
                hint = ex.diagnose(case, expected, got) or case.hint
            except Exception:  # an answer odd enough to trip a diagnosis still gets the case's own hint
                hint = case.hint
            return Result(ex.name, False, t("exercises.grader.failed", case=case.label, problem=problem), case.label,
                          inputs + ((t("exercises.grader.expected"), show(expected)), (t("exercises.grader.got"),
                                                                                       show(got))), hint)
    return Result(ex.name, True, t("exercises.grader.passed", n=len(cases)))
