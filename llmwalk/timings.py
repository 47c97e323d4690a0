"""The timings the notebooks print, each a median of repeated runs on this machine: one forward pass
(`pass_seconds`), what one decoding step waits on (`decode_profile`: bytes, bandwidth, matrix products,
operations), and one matrix product per quantized kernel (`linear_kernel_times`). The benchmark command
(`python -m llmwalk.bench`) prints them as tables beside its contenders."""
from __future__ import annotations

import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import fast_decode
from .accuracy import eval_ids
from .fast import linears, lm_head
from .kv_cache import KVCache
from .machine import memory_bandwidth
from .quantize import FUSED, LINEARS
from .quantize_kernels import KERNELS
from .walk import forward

if TYPE_CHECKING:
    from .models import Model


# ---------------------------------------------------------------- one matrix product per kernel (quantization)

def linear_kernel_times(model: Model, rounds: int = 5, repeats: int = 3) -> list[dict]:
    """Time one decode step's matrix-vector products (x: [1, d_in]) per kernel, on an fp32 model's real matrices.

    Each workload runs through the matrices of all layers in turn, as decoding does, so that the weights come
    from memory rather than cache. Kernels are interleaved round by round; the median round is reported.
    Returns rows {workload, kernel, microseconds, speedup_vs_fp32}.
    """
    per_name = {n: [getattr(b, n).weight for b in model.weights.blocks]
                for n in LINEARS if getattr(model.weights.blocks[0], n) is not None}
    workloads = {f"{n} x{len(ws)}": ws for n, ws in per_name.items()}
    workloads["all layer matrices (one decode step)"] = [w for ws in per_name.values() for w in ws]
    workloads["lm_head"] = [model.weights.output.T]
    matrices = {id(w): w for ws in workloads.values() for w in ws}
    prepared = {k: {i: make(w) for i, w in matrices.items()} for k, make in KERNELS.items()}
    gen = torch.Generator().manual_seed(0)
    rows = []
    for workload, ws in workloads.items():
        xs = [torch.randn(1, w.shape[0], generator=gen) for w in ws]
        times: dict[str, list[float]] = {k: [] for k in KERNELS}
        for _ in range(rounds):
            for k in KERNELS:
                times[k].append(_seconds_per_pass([prepared[k][id(w)] for w in ws], xs, repeats))
        med = {k: statistics.median(t) for k, t in times.items()}
        rows += [{"workload": workload, "kernel": k, "microseconds": t * 1e6,
                  "speedup_vs_fp32": med["fp32 x @ W"] / t} for k, t in med.items()]
    return rows


def _seconds_per_pass(fns: list[Callable[[torch.Tensor], torch.Tensor]], xs: list[torch.Tensor], repeats: int) -> float:
    """Seconds per pass through all the matrices."""
    fns[0](xs[0])                                           # warm-up: first-call allocations
    tic = time.perf_counter()
    for _ in range(repeats):
        for f, x in zip(fns, xs):
            f(x)
    return (time.perf_counter() - tic) / repeats


# ---------------------------------------------------------------- does one-token decoding wait on memory?

MEMORY_BOUND_SLACK = 1.5    # memory-bound: a step takes at most this × the time its weight bytes take to stream
RESOLVED_SHARE = 0.1        # the time outside the matrix products is a difference of two medians: below this share
                            # of the step it is within the runs' noise, and nothing is computed from it


def _read_bytes(w) -> int:
    """Bytes a product reads of a weight: a tensor's, or a quantized matrix's codes and scales as its kernel reads
    them (QuantizedTensor.read_bytes: bf16 scales, where the stored ones are fp32)."""
    return int(getattr(w, "read_bytes", w.nbytes))


def weight_bytes_per_token(model: Model) -> int:
    """Bytes of weights one decoding step reads: every layer's matrices (quantized ones as their kernels read them),
    biases and norms, the final norm and the LM head once each, plus the one embedding row looked up (two with
    learned positions). A tied LM head is the token table: it is read in full by the head, so the looked-up row is
    counted once more (it is the same memory, read twice)."""
    w = model.weights
    layer = [x for b in w.blocks for x in vars(b).values() if x is not None]
    tensors = [p for x in layer + [w.output_norm] for p in (x.weight, x.bias) if p is not None] + [w.output]
    rows = [w.token_embd[0]] + ([w.position_embd[0]] if w.position_embd is not None else [])
    return sum(map(_read_bytes, tensors)) + sum(map(_read_bytes, rows))


def _is_matmul(func) -> bool:
    return func.__name__.split(".")[0] in ("mm", "addmm", "matmul", "bmm", "linear", "_weight_int8pack_mm",
                                           "_weight_int4pack_mm_for_cpu")


def count_ops(fn: Callable[[], object]) -> tuple[int, int]:
    """(torch operations fn dispatches, how many of them are matrix products): each is one kernel call with its own
    fixed cost (argument checks, output allocation), however little it computes. Views count too."""
    class Count(TorchDispatchMode):
        ops = matmuls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += 1
            self.matmuls += _is_matmul(func)
            return func(*args, **(kwargs or {}))

    with Count() as counter:
        fn()
    return counter.ops, counter.matmuls


def _median_seconds(fn: Callable[[], object], repeats: int, before: Callable[[], object] = lambda: None) -> float:
    """Median wall seconds of fn over `repeats` runs (before() runs untimed ahead of each): a moment when another
    process takes the CPU delays one run, not the answer."""
    fn()                                                    # warm-up: first-call allocations
    seconds = []
    for _ in range(repeats):
        before()
        tic = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - tic)
    return statistics.median(seconds)


def pass_seconds(model: Model, ids: Sequence[int], *, cached: int = 0, repeats: int = 5) -> float:
    """Median wall seconds of one unrecorded forward pass over ids[cached:] with ids[:cached] already in a KV
    cache (cached=0: the whole of ids in one pass, the logits of the last position only, as generation needs).
    cached=len(ids) - 1 times one decoding step at a context of len(ids)."""
    if not 0 <= cached < len(ids):
        raise ValueError(f"cached must be in [0, {len(ids)}) for {len(ids)} ids, got {cached!r}")
    cache = KVCache.empty(model.config, len(ids)) if cached else None
    if cache is not None:
        forward(model, ids[:cached], cache, record=False, last_only=True)
    return _median_seconds(lambda: forward(model, ids[cached:], cache, record=False, last_only=True), repeats,
                           before=lambda: cache.truncate(cached) if cache is not None else None)


def _step_products(model: Model) -> Callable[[], None]:
    """The matrix products of one decoding step alone, as forward(record=False) runs them, in its order, on random
    vectors: fast.linears per group of linears that read the same input (one product where quantize_model stored the
    group as one matrix), then fast.lm_head."""
    gen = torch.Generator().manual_seed(0)
    groups = [lins for b in model.weights.blocks
              for lins in ([getattr(b, n) for n in names if getattr(b, n) is not None] for names in FUSED) if lins]
    xs = [torch.randn(1, lins[0].weight.shape[0], generator=gen) for lins in groups]
    final = torch.randn(1, model.config.d_model, generator=gen)

    def run() -> None:
        for lins, x in zip(groups, xs):
            linears(x, lins)
        lm_head(final, model.weights.output)
    return run


@dataclass(frozen=True)
class DecodeProfile:
    """One decoding step of a model on this machine: the bytes it must read, how fast memory delivers them, and
    where the step's time goes. Times are medians of repeated runs."""

    weight_bytes: int        # weights one step reads (weight_bytes_per_token)
    bandwidth: float         # bytes/s of a plain sum over a tensor far larger than the CPU's caches
    step_seconds: float      # one cached decoding step (forward of one token)
    matmul_seconds: float    # the same step's matrix products alone, back to back
    n_ops: int               # torch operations (kernel calls) one step dispatches
    n_matmuls: int           # of which matrix products
    compiled: bool = False   # the step ran compiled (fast_decode.py), not as torch's operations (fast.py)

    @property
    def roofline_seconds(self) -> float:
        """The fastest a step can be if reading its weights is all it does: weight bytes ÷ bandwidth."""
        return self.weight_bytes / self.bandwidth

    @property
    def matmul_bandwidth(self) -> float:
        """Bytes/s the matrix products stream the weights at (the matrices are nearly all of weight_bytes)."""
        return self.weight_bytes / self.matmul_seconds

    @property
    def outside_seconds(self) -> float:
        """Step time spent outside the matrix products: the other operations' fixed costs."""
        return max(self.step_seconds - self.matmul_seconds, 0.0)

    @property
    def slow_matmul_seconds(self) -> float:
        """Step time the matrix products take beyond streaming the weights at the plain sum's rate (at most the
        step's time beyond its reading time: the two medians are timed apart)."""
        return min(max(self.matmul_seconds - self.roofline_seconds, 0.0),
                   max(self.step_seconds - self.roofline_seconds, 0.0))

    @property
    def splits(self) -> bool:
        """Whether the step's time beyond its reading time splits into the matrix products' excess and the rest:
        reading ≤ matrix products ≤ step (timed apart, either can come out faster than the other allows)."""
        return self.roofline_seconds <= self.matmul_seconds <= self.step_seconds

    @property
    def overhead_resolved(self) -> bool:
        """Whether the time outside the matrix products is large enough (RESOLVED_SHARE of the step) to tell apart
        from the noise of two separately timed medians."""
        return self.outside_seconds >= RESOLVED_SHARE * self.step_seconds

    @property
    def memory_bound(self) -> bool:
        """True when the step takes at most MEMORY_BOUND_SLACK × its roofline time: memory is what it waits on."""
        return self.step_seconds <= MEMORY_BOUND_SLACK * self.roofline_seconds

    @property
    def memory_bound_bytes(self) -> float:
        """Weight bytes from which a step with this fixed overhead would be memory-bound: overhead + B / bandwidth
        ≤ SLACK · B / bandwidth, i.e. B ≥ overhead · bandwidth / (SLACK − 1) — if its matrix products streamed at the
        plain sum's rate (large matrices come close) and the overhead stayed what it is here (it grows with the
        number of layers, not with their width)."""
        return self.outside_seconds * self.bandwidth / (MEMORY_BOUND_SLACK - 1)


def decode_profile(model: Model, context: int = 64, repeats: int = 15, *, compiled: bool = True) -> DecodeProfile:
    """Measure one decoding step at `context` positions: its time, its matrix products' time, its operations, and
    this machine's memory bandwidth (memory_bandwidth). Medians of `repeats` runs each.

    compiled=True: the step as generation runs it, compiled (fast_decode.py) where it can; compiled=False: torch's
    operations one by one (fast.py), what generation runs without numba. DecodeProfile.compiled says which ran.
    """
    products = fast_decode.step_products(model) if compiled else None
    with nullcontext() if products is not None else fast_decode.off():
        ids = eval_ids(model, context)
        step = pass_seconds(model, ids, cached=context - 1, repeats=repeats)
        matmuls = _median_seconds(products or _step_products(model), repeats)
        cache = KVCache.empty(model.config, context)
        forward(model, ids[:-2], cache, record=False, last_only=True)
        forward(model, ids[-2:-1], cache, record=False, last_only=True)     # a step's one-off costs, not counted
        n_ops, n_matmuls = count_ops(lambda: forward(model, ids[-1:], cache, record=False, last_only=True))
    return DecodeProfile(weight_bytes_per_token(model), memory_bandwidth(), step, matmuls, n_ops, n_matmuls,
                         products is not None)

