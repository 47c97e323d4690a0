"""Benchmarks, one subcommand each: `python -m llmwalk.bench generate|quantization|speculative [--threads N] ...`.

Every subcommand is a function taking the parsed arguments, registered in `build_parser`. The numbers are wall
time on a machine that may be doing other things, so the contenders run in the same process, interleaved.
"""
from __future__ import annotations

import argparse
import importlib.resources
import resource
import statistics
import sys
import time
from dataclasses import dataclass, fields
from typing import Callable

import torch

from .generate import decoding_head, generate
from .models import DEFAULT_MODEL, REGISTRY, Model, cache_dir, load_model

TEXT = "data/eval_text.txt"     # shipped with the package; repeated and cut to the token count each run needs

Run = Callable[[], tuple[float, list[float]]]    # () -> (seconds to the first token, seconds of each later token)


def prompt_ids(model: Model, n: int) -> list[int]:
    """Exactly n token ids of the shipped text, repeated as often as needed.  # -> [n]"""
    one = model.tokenizer.encode(importlib.resources.files("llmwalk").joinpath(TEXT).read_text(encoding="utf-8"))
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
    """One generation: seconds to the first new token, decode speed after it, peak memory (MB)."""

    ttft: float
    tokens_per_second: float
    peak_mb: float


def measure(run: Run) -> Timing:
    """Time one run; peak RSS is above the RSS before it where the peak can be reset, else the process peak.

    Decode speed is 1 / the median seconds per token after the first: another process taking the CPU for a
    moment then delays a few tokens instead of shifting the whole figure.
    """
    base = peak_rss_mb() if reset_peak_rss() else 0.0
    ttft, seconds = run()
    return Timing(ttft, 1 / statistics.median(seconds), peak_rss_mb() - base)


def median(timings: list[Timing]) -> Timing:
    """Field by field median of several runs."""
    return Timing(*(statistics.median(getattr(t, f.name) for t in timings) for f in fields(Timing)))


def llmwalk_run(model: Model, ids: list[int], new_tokens: int, kv_cache: bool, head: torch.Tensor | None) -> Run:
    """A greedy llmwalk generation of exactly new_tokens tokens."""
    def run() -> tuple[float, list[float]]:
        g = generate(model, ids, new_tokens, kv_cache=kv_cache, stop_at_eos=False, head=head)
        return g.time_to_first_token, [s.seconds for s in g.steps[1:]]
    return run


def load_transformers(name: str = DEFAULT_MODEL):
    """transformers' model on the same weights: the shipped GGUF dequantized to fp32."""
    from transformers import AutoModelForCausalLM
    path = REGISTRY[name].locate(cache_dir())
    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32).eval()


def transformers_run(hf, ids: list[int], new_tokens: int) -> Run:
    """transformers' greedy generate with its KV cache; a streamer timestamps every new token."""
    from transformers.generation.streamers import BaseStreamer

    class Clock(BaseStreamer):
        def __init__(self):
            self.times: list[float] = []

        def put(self, value):      # called with the prompt first, then once per new token
            self.times.append(time.perf_counter())

        def end(self):
            pass

    def run() -> tuple[float, list[float]]:
        clock, x = Clock(), torch.tensor([ids])
        start = time.perf_counter()
        with torch.inference_mode():
            # min_new_tokens masks EOS out, so every run decodes exactly new_tokens tokens.
            hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                        do_sample=False, streamer=clock, pad_token_id=hf.config.eos_token_id)
        new = clock.times[1:]
        return new[0] - start, [b - a for a, b in zip(new, new[1:])]
    return run


def bench_generate(args: argparse.Namespace) -> None:
    """Time to first token, decode tokens/s and peak memory: llmwalk with/without KV cache vs transformers."""
    from transformers.utils import logging
    logging.set_verbosity_error()
    model = load_model(args.model, progress=False)
    head = decoding_head(model)      # made once per model, like transformers' own conversion at load time
    hf = load_transformers(args.model)
    resettable = reset_peak_rss()
    print(f"{model.config.name}, fp32, greedy, {args.new_tokens} new tokens, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads. Median of {args.repeats} interleaved runs (no cache: 1 run).")
    print("decode tok/s = 1 / median seconds per token after the first. "
          "'+head': generate(head=decoding_head(model)), the LM head stored [d_model, vocab].")
    print("peak MB = " + ("peak RSS during the run minus RSS before it (ru_maxrss, peak reset through "
                          "/proc/self/clear_refs before each run)" if resettable else
                          "process peak RSS so far (ru_maxrss; it only grows: runs go from short to long prompts)"))
    warm = prompt_ids(model, 8)      # first calls pay one-off costs (allocator, lazy initialisation)
    for run in (llmwalk_run(model, warm, 2, True, head), transformers_run(hf, warm, 2)):
        run()

    header = (f"{'prompt':>6} | {'':22} {'TTFT s':>7} {'decode tok/s':>12} {'peak MB':>8} | "
              f"{'vs transformers':>15} {'vs no cache':>11}")
    print(header)
    print("-" * len(header))
    for n in sorted(args.prompt_lengths):
        ids = prompt_ids(model, n)
        fast: dict[str, Run] = {"llmwalk cache +head": llmwalk_run(model, ids, args.new_tokens, True, head),
                                "llmwalk cache": llmwalk_run(model, ids, args.new_tokens, True, None),
                                "transformers (cache)": transformers_run(hf, ids, args.new_tokens)}
        runs: dict[str, list[Timing]] = {name: [] for name in fast}
        for _ in range(args.repeats):
            for name, run in fast.items():
                runs[name].append(measure(run))
        runs["llmwalk no cache +head"] = [measure(llmwalk_run(model, ids, args.new_tokens, False, head))]
        med = {name: median(ts) for name, ts in runs.items()}
        hf_tps = med["transformers (cache)"].tokens_per_second
        no_cache_tps = med["llmwalk no cache +head"].tokens_per_second
        for name, t in med.items():
            ratios = (f"{t.tokens_per_second / hf_tps:>14.2f}x {t.tokens_per_second / no_cache_tps:>10.2f}x"
                      if name.startswith("llmwalk cache") else "")
            print(f"{n:>6} | {name:22} {t.ttft:>7.3f} {t.tokens_per_second:>12.1f} {t.peak_mb:>8.0f} | {ratios}")


def bench_quantization(args: argparse.Namespace) -> None:
    """Decode speed and weight memory of the quantized model (torch's int8 / int4 kernels) vs fp32 and transformers."""
    from transformers.utils import logging
    from .quantize import model_weight_bytes, quantize_model
    logging.set_verbosity_error()
    model = load_model(args.model, progress=False)
    variants = {"llmwalk fp32": model,
                "int8 layers": quantize_model(model, 8),
                "int8 layers + head": quantize_model(model, 8, embeddings=True),
                "int4 g32 asym layers": quantize_model(model, 4, 32, symmetric=False),
                "int4 g32 asym + head": quantize_model(model, 4, 32, symmetric=False, embeddings=True)}
    ids = prompt_ids(model, args.prompt_length)
    runs = {name: llmwalk_run(m, ids, args.new_tokens, True, None) for name, m in variants.items()}
    runs["transformers fp32"] = transformers_run(load_transformers(args.model), ids, args.new_tokens)
    print(f"{model.config.name}, greedy, prompt {args.prompt_length} tokens, {args.new_tokens} new tokens, torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads. decode tok/s = 1 / median seconds per token "
          f"after the first, median of {args.repeats} interleaved runs. int8/int4: torch's CPU kernels with bf16 "
          "activations; '+ head': the tied embedding table / LM head quantized too.")
    for run in runs.values():      # first calls pay one-off costs (allocator, kernel weight packing)
        run()
    times: dict[str, list[Timing]] = {name: [] for name in runs}
    for _ in range(args.repeats):
        for name, run in runs.items():
            times[name].append(measure(run))
    fp32 = median(times["llmwalk fp32"]).tokens_per_second
    print(f"{'weights':22} {'MB':>7} {'decode tok/s':>12} {'x llmwalk fp32':>14}")
    for name, ts in times.items():
        mb = f"{model_weight_bytes(variants[name]) / 1e6:7.1f}" if name in variants else f"{'':7}"
        tps = median(ts).tokens_per_second
        print(f"{name:22} {mb} {tps:12.1f} {tps / fp32:13.2f}x")


def bench_speculative(args: argparse.Namespace) -> None:
    """Speculative decoding: acceptance, target passes per token and speed vs plain generate, per draft and k."""
    from .quantize import compare_to_fp32, eval_text, quantize_model
    from .speculative import BENCH_PROMPTS, compare_speculative, draft_by_name, early_exit_model
    model = load_model(args.model, progress=False)
    print(f"{model.config.name}, fp32, {args.new_tokens} new tokens (stopping at EOS), torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads. Speedup: plain seconds per token (generate with its KV cache) over "
          f"speculative, median of {args.repeats} interleaved runs. Drafts against the full model on the shipped "
          "text's first 1500 characters (top-1 agreement: about the greedy acceptance rate):")
    others = {"int8": quantize_model(model, 8), "int4 g32": quantize_model(model, 4, 32),
              **{f"first {n} layers": early_exit_model(model, n) for n in args.agreement_layers}}
    for name, other in others.items():
        c = compare_to_fp32(model, other, eval_text()[:1500])
        print(f"  {name:>16}: top-1 agreement {c.top1_agreement:.1%}, KL {c.kl_mean:.3g}, "
              f"perplexity {c.perplexity:.4g} (full model {c.perplexity_fp32:.4g})")
    drafts = {name: draft_by_name(model, name) for name in args.drafts}
    prompts = {name: BENCH_PROMPTS[name] for name in args.prompts}
    generate(model, "Hi", 2)         # first calls pay one-off costs (allocator, lazy initialisation)
    rows = compare_speculative(model, drafts, prompts, args.ks, args.temperatures, args.new_tokens, args.repeats)
    for i, row in enumerate(rows):
        if i == 0:
            print(" | ".join(row))
        print(" | ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in row.values()), flush=True)


def build_parser() -> argparse.ArgumentParser:
    """The command line: one subparser per benchmark, each pointing at its function through `run`."""
    common = argparse.ArgumentParser(add_help=False)     # options every subcommand takes
    common.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser = argparse.ArgumentParser(prog="python -m llmwalk.bench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", parents=[common], help=bench_generate.__doc__)
    gen.add_argument("--prompt-lengths", type=int, nargs="+", default=[16, 128, 512], metavar="N")
    gen.add_argument("--new-tokens", type=int, default=64)
    gen.add_argument("--repeats", type=int, default=3, help="interleaved runs of the cached contenders")
    gen.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(REGISTRY))
    gen.set_defaults(run=bench_generate)

    quant = sub.add_parser("quantization", parents=[common], help=bench_quantization.__doc__)
    quant.add_argument("--prompt-length", type=int, default=16, metavar="N")
    quant.add_argument("--new-tokens", type=int, default=32)
    quant.add_argument("--repeats", type=int, default=3, help="interleaved runs of every format")
    quant.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(REGISTRY))
    quant.set_defaults(run=bench_quantization)

    from .speculative import BENCH_PROMPTS
    spec = sub.add_parser("speculative", parents=[common], help=bench_speculative.__doc__)
    spec.add_argument("--drafts", nargs="+", default=["lookup", "int8", "int4", "exit6", "exit15", "exit24"],
                      help="lookup, int8, int4 (the model quantized, head included), exitN (the first N layers)")
    spec.add_argument("--prompts", nargs="+", default=list(BENCH_PROMPTS), choices=list(BENCH_PROMPTS))
    spec.add_argument("--ks", type=int, nargs="+", default=[1, 3, 5], metavar="K", help="tokens drafted per round")
    spec.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0], metavar="T")
    spec.add_argument("--new-tokens", type=int, default=32)
    spec.add_argument("--repeats", type=int, default=1, help="interleaved runs of speculative and plain generation")
    spec.add_argument("--agreement-layers", type=int, nargs="+", default=[6, 12, 18, 24, 28], metavar="N")
    spec.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(REGISTRY))
    spec.set_defaults(run=bench_speculative)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    args.run(args)


if __name__ == "__main__":
    main()
