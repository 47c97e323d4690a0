"""Benchmarks, one subcommand each: `python -m llmwalk.bench generate [--prompt-lengths 16 128 512] [--new-tokens 64]`.

Every subcommand is a function taking the parsed arguments; `build_parser` registers it. Numbers are wall
time on whatever else the machine is doing, so competitors run in the same process, interleaved.
"""
from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from dataclasses import dataclass, fields
from typing import Callable

import torch

from .generate import generate
from .models import DEFAULT_MODEL, REGISTRY, Model, cache_dir, load_model

# Any text works: it is repeated and cut to the exact number of tokens each run needs.
TEXT = ("The printing press changed how ideas travelled. Before it, a book was copied by hand, one page at a "
        "time, and a library of a few hundred volumes was a treasure. Afterwards, pamphlets, maps and almanacs "
        "reached towns that had never seen a scholar, and arguments that once took a generation to spread "
        "crossed a continent in a few years. ")


def prompt_ids(model: Model, n: int) -> list[int]:
    """Exactly n token ids of TEXT, repeated as often as needed.  # -> [n]"""
    one = model.tokenizer.encode(TEXT)
    return (one * (n // len(one) + 1))[:n]


def reset_peak_rss() -> bool:
    """Reset the process's peak resident memory (Linux: /proc/self/clear_refs); False where that is impossible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_mb() -> float:
    """The process's peak resident memory in MB (ru_maxrss: kB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024


@dataclass(frozen=True)
class Timing:
    """One generation run: seconds to the first new token, decode speed after it, peak memory.

    Decode speed is 1 / the median seconds per token after the first: other processes stealing the CPU for a
    moment then shift a few tokens, not the whole figure.
    """

    ttft: float
    tokens_per_second: float
    peak_mb: float


def measure(run: Callable[[], tuple[float, float]]) -> Timing:
    """Call run() -> (ttft, tokens/s) and record the peak RSS it reached (above the RSS before it when resettable)."""
    base = peak_rss_mb() if reset_peak_rss() else 0.0
    ttft, tps = run()
    return Timing(ttft, tps, peak_rss_mb() - base)


def median(timings: list[Timing]) -> Timing:
    """Field by field median of several runs."""
    return Timing(*(statistics.median(getattr(t, f.name) for t in timings) for f in fields(Timing)))


def llmwalk_run(model: Model, ids: list[int], new_tokens: int, kv_cache: bool) -> Callable[[], tuple[float, float]]:
    """A greedy llmwalk generation of exactly new_tokens tokens."""
    def run() -> tuple[float, float]:
        g = generate(model, ids, new_tokens, kv_cache=kv_cache, stop_at_eos=False)
        return g.time_to_first_token, 1 / statistics.median(s.seconds for s in g.steps[1:])
    return run


def load_transformers(name: str = DEFAULT_MODEL):
    """transformers' model on the same weights: the shipped GGUF dequantized to fp32."""
    from transformers import AutoModelForCausalLM
    path = REGISTRY[name].locate(cache_dir())
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


def transformers_run(hf, ids: list[int], new_tokens: int) -> Callable[[], tuple[float, float]]:
    """transformers' greedy generate with its KV cache; a streamer timestamps every new token."""
    from transformers.generation.streamers import BaseStreamer

    class Clock(BaseStreamer):
        def __init__(self):
            self.times: list[float] = []

        def put(self, value):      # called with the prompt first, then with each new token
            self.times.append(time.perf_counter())

        def end(self):
            pass

    def run() -> tuple[float, float]:
        clock = Clock()
        x = torch.tensor([ids])
        start = time.perf_counter()
        with torch.inference_mode():
            # min_new_tokens: EOS is masked out, so every run decodes exactly new_tokens tokens.
            hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                        do_sample=False, streamer=clock, pad_token_id=hf.config.eos_token_id)
        seconds = [b - a for a, b in zip(clock.times[1:], clock.times[2:])]   # one per token after the first
        return clock.times[1] - start, 1 / statistics.median(seconds)
    return run


def bench_generate(args: argparse.Namespace) -> None:
    """Time to first token, decode tokens/s and peak memory: llmwalk with/without KV cache vs transformers."""
    from transformers.utils import logging
    logging.set_verbosity_error()
    model = load_model(args.model)
    hf = load_transformers(args.model)
    resettable = reset_peak_rss()
    print(f"{model.config.name}, fp32, greedy, {args.new_tokens} new tokens, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; cache and transformers: median of {args.repeats} interleaved runs, "
          "no cache: 1 run")
    print("peak MB: " + ("peak RSS during the run minus RSS before it (ru_maxrss, reset via /proc/self/clear_refs)"
                         if resettable else "process peak RSS so far (ru_maxrss, monotonic: runs go small to large)"))
    # Warm-up: first calls pay one-off costs (allocator, lazy initialisation) that belong to no one.
    ids = prompt_ids(model, 8)
    llmwalk_run(model, ids, 2, True)()
    transformers_run(hf, ids, 2)()

    header = (f"{'prompt':>6} | {'':17} {'TTFT s':>7} {'decode tok/s':>12} {'peak MB':>8} | "
              f"{'cache/transformers':>18} {'cache/no-cache':>14}")
    print(header)
    print("-" * len(header))
    for n in sorted(args.prompt_lengths):
        ids = prompt_ids(model, n)
        runs: dict[str, list[Timing]] = {"llmwalk cache": [], "transformers": []}
        for _ in range(args.repeats):
            runs["llmwalk cache"].append(measure(llmwalk_run(model, ids, args.new_tokens, True)))
            runs["transformers"].append(measure(transformers_run(hf, ids, args.new_tokens)))
        runs["llmwalk no cache"] = [measure(llmwalk_run(model, ids, args.new_tokens, False))]
        med = {name: median(ts) for name, ts in runs.items()}
        cache, no_cache, hf_ = med["llmwalk cache"], med["llmwalk no cache"], med["transformers"]
        ratios = (f"{cache.tokens_per_second / hf_.tokens_per_second:>17.2f}x "
                  f"{cache.tokens_per_second / no_cache.tokens_per_second:>13.2f}x")
        for name, t in med.items():
            print(f"{n:>6} | {name:17} {t.ttft:>7.3f} {t.tokens_per_second:>12.1f} {t.peak_mb:>8.0f} | "
                  + (ratios if t is cache else ""))


def build_parser() -> argparse.ArgumentParser:
    """The command line: one subparser per benchmark, each pointing at its function via `run`."""
    common = argparse.ArgumentParser(add_help=False)     # options every subcommand takes
    common.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser = argparse.ArgumentParser(prog="python -m llmwalk.bench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", parents=[common], help=bench_generate.__doc__)
    gen.add_argument("--prompt-lengths", type=int, nargs="+", default=[16, 128, 512], metavar="N")
    gen.add_argument("--new-tokens", type=int, default=64)
    gen.add_argument("--repeats", type=int, default=3, help="interleaved runs of llmwalk (cache) and transformers")
    gen.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(REGISTRY))
    gen.set_defaults(run=bench_generate)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    args.run(args)


if __name__ == "__main__":
    main()
