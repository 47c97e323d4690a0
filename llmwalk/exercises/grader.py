"""The grader: run a learner's function on an exercise's cases, compare with llmwalk's own, explain the first miss."""
from __future__ import annotations

import builtins
import math
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from ..checks import is_int
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
    """A deep copy of a case's input, so no call (the learner's or the reference's) changes what a later one sees."""
    if isinstance(x, Tensor):
        return x.clone()
    if isinstance(x, list):
        return [_clone(i) for i in x]
    if isinstance(x, dict):     # bpe's ranks: 50,257 entries, immutable keys and values (deepcopy takes 30 ms)
        return {k: _clone(v) for k, v in x.items()}
    return x


def _call(case: Case, fn: Callable):
    return _bound(case, fn)()


def _bound(case: Case, fn: Callable) -> Callable[[], Any]:
    """fn on a fresh copy of the case's input, copied now: the copy is the grader's time, not the learner's."""
    if case.run is not None:
        return lambda: case.run(fn)
    args = [_clone(a) for a in case.args]
    return lambda: fn(*args)


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


def _shown(x) -> str:
    """show(x) for the learner's answer, which may be a tensor without data (sparse, meta) or raise in __repr__."""
    try:
        return show(x)
    except Exception as odd:
        return t("exercises.show.unreadable", type=type(x).__name__, error=type(odd).__name__)


def _compare_tensor(expected: Tensor, got, ex: Exercise) -> str | None:
    if not isinstance(got, Tensor):
        return t("exercises.compare.not_tensor", type=type(got).__name__)
    if (got.layout, got.device) != (expected.layout, expected.device):
        return t("exercises.compare.kind", layout=str(got.layout).removeprefix("torch."), device=got.device,
                 expected=expected.device)
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
        if any(is_int(e) for e in expected) and not all(is_int(g) for g in got):
            return t("exercises.compare.not_ints")
        if list(got) != expected:
            return t("exercises.compare.returned", got=show(list(got)), expected=show(expected))
        return None
    if is_int(expected):
        if not is_int(got):
            return t("exercises.compare.not_int", type=type(got).__name__, got=show(got))
        return None if got == expected else t("exercises.compare.returned", got=f"{got:,}", expected=f"{expected:,}")
    return None if got == expected else t("exercises.compare.returned", got=show(got), expected=show(expected))


def _first_line(error: BaseException, limit: int = 160) -> str:
    try:
        text = str(error).strip().split("\n")[0]
    except Exception as inner:  # an exception class of the learner's whose __str__ itself fails
        return t("exercises.grader.no_text", error=type(inner).__name__)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _learner_line(frames: traceback.StackSummary) -> str:
    """The last line of the learner's own code among `frames`: not llmwalk's (the grader's), not torch's."""
    own = [f for f in frames if not any(Path(f.filename).resolve().is_relative_to(lib) for lib in (_LLMWALK, _TORCH))]
    if not own:
        return ""
    frame = own[-1]
    if frame.line:
        return t("exercises.grader.where_code", function=frame.name, line=frame.lineno, code=frame.line.strip())
    return t("exercises.grader.where", function=frame.name, line=frame.lineno)


# ---------------------------------------------------------------- what the learner's code may rebind

_MISSING = object()         # "no such name here": Tensor.softmax lives on torch's C base class until someone sets it


def _namespaces() -> list:
    """Where a rebinding changes what the grader or llmwalk computes: Python's builtins and math, torch, F, Tensor
    and every llmwalk module."""
    return [builtins, math, torch, F, Tensor, *(m for name, m in list(sys.modules.items())
                                if name.split(".")[0] == "llmwalk" and isinstance(m, ModuleType))]


def _snapshot() -> dict:
    """(namespace, name) -> what it is bound to now: a module's functions, classes and submodules (its data may
    change legitimately), and every name Tensor answers to (a method set on Tensor shadows torch's C one)."""
    snap = {}
    for space in _namespaces():
        own = vars(space)
        if isinstance(space, type):
            snap.update({(space, name): own.get(name, _MISSING) for name in dir(space)})
        else:
            snap.update({(space, name): v for name, v in own.items() if callable(v) or isinstance(v, ModuleType)})
    return snap


def _restore(snap: dict, missing=_MISSING) -> dict:
    """Bind every name of `snap` back to its object, compared by identity; return what was there instead, in the
    same form, so that restoring the returned dict undoes this."""
    replaced = {}
    for (space, name), value in snap.items():
        now = vars(space).get(name, missing)
        if now is not value:
            replaced[space, name] = now
            if value is missing:
                delattr(space, name)
            else:
                setattr(space, name, value)
    return replaced


def _dotted(space, name: str) -> str:
    return f"{space.__module__}.{space.__qualname__}.{name}" if isinstance(space, type) else f"{space.__name__}.{name}"


_PRISTINE = {}              # filled at the end of this module: the functions as they were when llmwalk.exercises loaded


@contextmanager
def _pristine():
    """Run the grader's own code (references, comparison, diagnosis) with the functions bound at import, whatever the
    learner rebound since (torch.softmax = theirs, in any cell); theirs are put back afterwards."""
    theirs = _restore(_PRISTINE)
    try:
        yield
    finally:
        _restore(theirs)


# ---------------------------------------------------------------- running the learner's function, with a time limit

class _TookTooLong(BaseException):
    """Raised inside the learner's function once its time is up; a BaseException, so `except Exception` lets it go."""


_GRACE = 1.0                # seconds to let a stopped function unwind before the verdict says it is stuck in torch
_MIN_TIMEOUT = 0.1          # below this even a correct function may not have started


def _checked_timeout(timeout) -> float | None:
    """The caller's `timeout=`, refused with a sentence naming the fix when it is no number of seconds."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(t("exercises.grader.timeout_type", got=repr(timeout)))
    if not _MIN_TIMEOUT <= timeout <= threading.TIMEOUT_MAX:        # NaN and inf fail here too
        raise ValueError(t("exercises.grader.timeout_range", got=repr(timeout), low=_MIN_TIMEOUT))
    return float(timeout)


@dataclass
class _Outcome:
    value: Any = None
    error: BaseException | None = None
    late: bool = False                      # the time ran out (whatever the function did afterwards)
    running: traceback.StackSummary | None = None   # where it still runs, when even stopping it did not end it
    stopped_at: traceback.StackSummary | None = None    # where it ran when the time was up


def _wait(event: threading.Event, seconds: float | None) -> bool:
    """event.wait in short waits: an interrupt (SIGINT) that lands on the worker thread reaches the main one only
    when it wakes up. (Not Thread.join: interrupted, it marks a running thread as ended.)"""
    end = math.inf if seconds is None else time.monotonic() + seconds
    while not event.is_set() and (now := time.monotonic()) < end:
        event.wait(min(0.1, end - now))
    return event.is_set()


def _raise_in(thread_id: int, error: type[BaseException]) -> None:
    """Make `error` be raised in another thread at its next bytecode boundary (CPython's PyThreadState_SetAsyncExc;
    where that does not exist, only the trace hook stops a function)."""
    try:
        import ctypes
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(error))
    except (ImportError, AttributeError):
        pass


def _nothing() -> None:
    """A Python call: an exception raised into this thread and not yet delivered is delivered at its start."""


def _run(call: Callable[[], Any], timeout: float | None) -> _Outcome:
    """call() in a worker thread, stopped when `timeout` seconds have passed. Two ways, since either alone can be
    dodged: a trace hook raises _TookTooLong at the next line the function runs (but Python switches tracing off
    after a hook raised, and the learner may call sys.settrace(None)), and for _GRACE seconds _TookTooLong is raised
    into the thread every few milliseconds between bytecodes (a bare `except:` in a loop catches some; the one that
    lands on the loop's jump ends it). One long torch operation (a huge matmul) or time.sleep runs in C, where
    neither reaches: then the verdict comes _GRACE seconds later and says so, and the call finishes in the
    background."""
    stopping, finished, done = [False], threading.Event(), []     # stopping[0]: a list item, read without a call
    learner, quiet = [True], threading.Lock()      # learner[0]: the learner's code may still run; flipped under quiet

    def tracer(frame, event, arg):
        if stopping[0] and event == "line":    # not while unwinding ("return"): that would hide the learner's line
            raise _TookTooLong
        return tracer

    def learners_part():
        sys.settrace(tracer)                    # this thread only
        try:
            done.append((call(), None))
        except BaseException as error:          # the learner's, or the _TookTooLong that stopped it
            done.append((None, error))
        finally:
            with quiet:                         # no stop is raised into the thread from here on
                learner[0] = stopping[0] = False
            sys.settrace(None)

    def work():
        try:
            learners_part()
        except _TookTooLong:                    # a stop that landed in our code after the learner's had returned
            pass
        while True:                             # one stop raised just before the flip may still be on its way
            try:
                _nothing()
                break
            except _TookTooLong:
                pass
        finished.set()

    worker = threading.Thread(target=work, name="llmwalk-exercise", daemon=True)
    worker.start()
    late = False
    try:
        _wait(finished, timeout)
    finally:                                    # the time is up, or the learner interrupted the kernel
        if not finished.is_set():
            late = stopping[0] = True
            at = sys._current_frames().get(worker.ident)
            stopped_at = traceback.extract_stack(at) if at is not None else None
            end = time.monotonic() + _GRACE
            while not finished.is_set() and time.monotonic() < end:
                with quiet:                     # only into the learner's code, not the grader's lines around it
                    frame = sys._current_frames().get(worker.ident)
                    if learner[0] and frame is not None and frame.f_code.co_filename != __file__:
                        _raise_in(worker.ident, _TookTooLong)
                finished.wait(0.02)
    if not late:
        return _Outcome(*done[0])
    error = done[0][1] if done else None
    frame = None if finished.is_set() else sys._current_frames().get(worker.ident)
    return _Outcome(error=error, late=True, running=traceback.extract_stack(frame) if frame else None,
                    stopped_at=stopped_at)


# ---------------------------------------------------------------- grading

def grade(ex: Exercise, fn: Callable, *, timeout: float | None = TIMEOUT) -> Result:
    """Run every case; stop at the first one the function gets wrong. Never raises for a wrong answer (only the
    learner's KeyboardInterrupt goes through). A case that takes longer than `timeout` seconds is stopped (None: no
    limit). Whatever the function rebinds in torch, F, Tensor or llmwalk is put back after each call."""
    timeout = _checked_timeout(timeout)
    if not callable(fn):
        return Result(ex.name, False, t("exercises.grader.not_callable", type=type(fn).__name__, name=ex.name))
    with _pristine():
        cases = ex.cases()
        expected = [_call(case, ex.reference) for case in cases]
    replaced: dict = {}
    for case, want in zip(cases, expected):
        restore, before = _restore, _snapshot()     # bound before the learner's code runs
        try:
            outcome = _run(_bound(case, fn), timeout)
        finally:
            replaced.update(restore(before))
        if isinstance(outcome.error, KeyboardInterrupt):
            raise outcome.error
        with _pristine():
            result = _verdict(ex, case, want, outcome, timeout)
        if result is not None:
            return _noted(result, replaced)
    return _noted(Result(ex.name, True, t("exercises.grader.passed", n=len(cases))), replaced)


def _noted(result: Result, replaced: dict) -> Result:
    if not replaced:
        return result
    names = ", ".join(sorted(_dotted(space, name) for space, name in replaced))
    return replace(result, message=result.message + t("exercises.grader.replaced", names=names))


def _verdict(ex: Exercise, case: Case, expected, outcome: _Outcome, timeout: float | None) -> Result | None:
    """None if the learner's answer on `case` is right, else the Result that says what went wrong."""
    inputs = (((t("exercises.grader.input"), case.shown),) if case.run is not None else
              tuple((name, show(arg)) for name, arg in zip(ex.params, case.args)))
    error = outcome.error
    if outcome.late:
        late = dict(seconds=f"{timeout:g}", case=case.label)
        message = (t("exercises.grader.still_running", **late, where=_learner_line(outcome.running))
                   if outcome.running is not None else
                   t("exercises.grader.timeout", **late,
                     where=_learner_line(traceback.extract_tb(error.__traceback__) if error else [])
                     or _learner_line(outcome.stopped_at or [])))
        return Result(ex.name, False, message, case.label, inputs, case.hint)
    if isinstance(error, NotImplementedError):
        return Result(ex.name, False, t("exercises.grader.not_implemented"))
    if error is not None:       # a wrong answer may raise anything, SystemExit too; the learner sees which case and where
        return Result(ex.name, False, t("exercises.grader.raised", error=type(error).__name__, text=_first_line(error),
                                        case=case.label,
                                        where=_learner_line(traceback.extract_tb(error.__traceback__))),
                      case.label, inputs, case.hint)
    got = outcome.value
    try:
        problem = compare(expected, got, ex)
    except Exception as odd:    # a value the grader cannot even read: an int whose __repr__ raises ...
        return Result(ex.name, False, t("exercises.grader.unreadable", case=case.label, type=type(got).__name__,
                                        error=type(odd).__name__, text=_first_line(odd)), case.label, inputs,
                      case.hint)
    if not problem:
        return None
    details = inputs + ((t("exercises.grader.expected"), show(expected)), (t("exercises.grader.got"), _shown(got)))
    try:
        hint = ex.diagnose(case, expected, got) or case.hint
    except Exception:  # an answer odd enough to trip a diagnosis still gets the case's own hint
        hint = case.hint
    return Result(ex.name, False, t("exercises.grader.failed", case=case.label, problem=problem), case.label,
                  details, hint)


_PRISTINE.update(_snapshot())
