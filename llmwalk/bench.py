"""Benchmarks, one subcommand each: `python -m llmwalk.bench generate|prefill|quantization|speculative|widgets|decode|kernels [--threads N]`.

Every subcommand is a function taking the parsed arguments, registered in `build_parser`. The numbers are wall
time on a machine that may be doing other things, so the contenders (llmwalk, transformers, llama.cpp) run in the
same process, interleaved. This is a command at the top of the package, imported by nothing in it: the timings the
notebooks print themselves live in `timings.py`, the machine's facts (CPU, peak memory, bandwidth) in `machine.py`.
"""
from __future__ import annotations

import argparse
import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass, fields
from functools import partial
from itertools import product
from typing import Callable, Iterator, Sequence

import torch

from . import fast_decode
from .accuracy import eval_ids, eval_text
from .generation import Generation, decoding_head, generate
from .machine import cpu_line, memory_bandwidth, peak_rss_mb, reset_peak_rss
from .models import DEFAULT_MODEL, REGISTRY, Model, cache_dir, load_model
from .prompts import PROMPT, SPECULATIVE_PROMPTS
from .quantize import model_weight_bytes, quantize_model
from .speculative import Draft, SpeculativeResult, draft_by_name, early_exit_model, speculative_generate
from .timings import MEMORY_BOUND_SLACK, decode_profile, linear_kernel_times, weight_bytes_per_token

Run = Callable[[], tuple[float, list[float]]]    # () -> (seconds to the first token, seconds of each later token)


LLAMA_CPP_HINT = ("llama.cpp not installed, so not in this table. To add it as a contender on the same GGUF file: "
                  "pip install llama-cpp-python (a source build of several minutes; never a dependency of llmwalk).")


def load_llama_cpp(name: str, context: int):
    """llama.cpp (llama-cpp-python) on the model's own GGUF file, or None when it is not installed."""
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    path = REGISTRY[name].locate(cache_dir())
    return Llama(model_path=str(path), n_ctx=context, n_batch=512, n_threads=torch.get_num_threads(),
                 verbose=False)


def llama_cpp_run(llm, ids: list[int], new_tokens: int) -> Run:
    """llama.cpp's greedy generation of exactly new_tokens tokens (EOS does not stop it), each timestamped."""
    def run() -> tuple[float, list[float]]:
        # Without reset(), llama-cpp-python keeps the previous run's prompt in its KV cache and skips it, even with
        # generate(reset=True): every run after the first would show a time to first token without the prefill.
        llm.reset()
        start, times = time.perf_counter(), []
        tokens = llm.generate(ids, temp=0.0, reset=True)    # temp=0: greedy; the prompt is run at the first next()
        for _ in range(new_tokens):
            next(tokens)
            times.append(time.perf_counter())
        tokens.close()
        return times[0] - start, [b - a for a, b in zip(times, times[1:])]
    return run


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


def llmwalk_run(model: Model, ids: list[int], new_tokens: int, kv_cache: bool, head: torch.Tensor | None,
                compiled: bool = True) -> Run:
    """A greedy llmwalk generation of exactly new_tokens tokens (compiled=False: its decoding steps in torch's
    operations, fast.py, as where numba is missing)."""
    def run() -> tuple[float, list[float]]:
        with nullcontext() if compiled else fast_decode.off():
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


def benchmarked_model(args: argparse.Namespace) -> Model:
    """The model a subcommand times (--model), with transformers' log quiet: its notes would land inside the table."""
    from transformers.utils import logging
    logging.set_verbosity_error()
    return load_model(args.model, progress=False)


def warm_up(*runs: Callable[[], object]) -> None:
    """Run each once, untimed: first calls pay one-off costs (allocator, lazy initialisation, kernel weight packing)."""
    for run in runs:
        run()


# The format nearest SmolLM2's GGUF file, which llama.cpp runs: its layers are Q4_1, whose numbers this format
# reproduces (test_quantize); its token table / LM head is Q8_0 there, 4-bit here.
GGUF_LIKE = "int4 g32 asym + head"
FORMATS: dict[str, Callable[[Model], Model]] = {       # the number formats decoding is timed in: name -> the model
    "llmwalk fp32": lambda m: m,
    "int8 layers": lambda m: quantize_model(m, 8),
    "int8 layers + head": lambda m: quantize_model(m, 8, embeddings=True),
    "int4 g32 asym layers": lambda m: quantize_model(m, 4, 32, symmetric=False),
    "int4 g32 asym + head": lambda m: quantize_model(m, 4, 32, symmetric=False, embeddings=True)}
TORCH_OPS_FORMATS = ("llmwalk fp32", GGUF_LIKE)       # also timed as torch's operations, beside the compiled step


def bench_generate(args: argparse.Namespace) -> None:
    """Time to first token, decode tokens/s and peak memory: llmwalk with/without KV cache vs transformers."""
    model = benchmarked_model(args)
    head = decoding_head(model)      # made once per model, like transformers' own conversion at load time
    small = FORMATS[GGUF_LIKE](model)
    hf = load_transformers(args.model)
    llm = load_llama_cpp(args.model, max(args.prompt_lengths) + args.new_tokens)
    resettable = reset_peak_rss()
    print(f"{model.config.name}, fp32 (and '{GGUF_LIKE}', nearest the GGUF file llama.cpp runs), greedy, "
          f"{args.new_tokens} new tokens, torch {torch.__version__}, {torch.get_num_threads()} threads. Median of "
          f"{args.repeats} interleaved runs (no cache: 1 run).")
    print("decode tok/s = 1 / median seconds per token after the first; x: speed relative to the other (higher is "
          "faster; TTFT: transformers' seconds / llmwalk's). "
          "'+head': generate(head=decoding_head(model)), the LM head stored [d_model, vocab]. Decoding steps run "
          f"compiled (fast_decode.py){'' if fast_decode.numba else ' where numba is installed (it is not here)'}; "
          "'torch ops': as torch's operations one by one (fast.py).")
    print("peak MB = " + ("peak RSS during the run minus RSS before it (ru_maxrss, peak reset through "
                          "/proc/self/clear_refs before each run)" if resettable else
                          "process peak RSS so far (ru_maxrss; it only grows: runs go from short to long prompts)"))
    if llm is None:
        print(LLAMA_CPP_HINT)
    warm = eval_ids(model, 8)
    warm_up(llmwalk_run(model, warm, 2, True, head), transformers_run(hf, warm, 2))

    header = (f"{'prompt':>6} | {'':24} {'TTFT s':>7} {'decode tok/s':>12} {'peak MB':>8} | "
              f"{'vs transformers':>15} {'vs no cache':>11} {'TTFT vs transformers':>20}")
    print(header)
    print("-" * len(header))
    for n in sorted(args.prompt_lengths):
        ids = eval_ids(model, n)
        fast: dict[str, Run] = {"llmwalk cache +head": llmwalk_run(model, ids, args.new_tokens, True, head),
                                "llmwalk cache": llmwalk_run(model, ids, args.new_tokens, True, None),
                                "llmwalk cache, torch ops": llmwalk_run(model, ids, args.new_tokens, True, None,
                                                                       compiled=False),
                                "llmwalk int4 + head": llmwalk_run(small, ids, args.new_tokens, True, None),
                                "transformers (cache)": transformers_run(hf, ids, args.new_tokens)}
        if llm is not None:
            fast["llama.cpp (same GGUF)"] = llama_cpp_run(llm, ids, args.new_tokens)
        runs: dict[str, list[Timing]] = {name: [] for name in fast}
        for _ in range(args.repeats):
            for name, run in fast.items():
                runs[name].append(measure(run))
        runs["llmwalk no cache +head"] = [measure(llmwalk_run(model, ids, args.new_tokens, False, head))]
        med = {name: median(ts) for name, ts in runs.items()}
        hf_tps, hf_ttft = med["transformers (cache)"].tokens_per_second, med["transformers (cache)"].ttft
        no_cache_tps = med["llmwalk no cache +head"].tokens_per_second
        for name, t in med.items():
            ratios = (f"{t.tokens_per_second / hf_tps:>14.2f}x {t.tokens_per_second / no_cache_tps:>10.2f}x"
                      f"{hf_ttft / t.ttft:>20.2f}x" if name.startswith("llmwalk cache") else "")
            print(f"{n:>6} | {name:24} {t.ttft:>7.3f} {t.tokens_per_second:>12.1f} {t.peak_mb:>8.0f} | {ratios}")
        if llm is not None:
            ours, theirs = med["llmwalk int4 + head"], med["llama.cpp (same GGUF)"]
            print(f"{n:>6} | llmwalk int4 + head vs llama.cpp on its own file: decode "
                  f"{ours.tokens_per_second / theirs.tokens_per_second:.2f}x, time to first token "
                  f"{theirs.ttft / ours.ttft:.2f}x (llama.cpp's seconds / llmwalk's; above 1: llmwalk is faster)")


def bench_prefill(args: argparse.Namespace) -> None:
    """Time to first token (a prompt in, one token out): llmwalk vs transformers, interleaved, per prompt length."""
    model = benchmarked_model(args)
    head = decoding_head(model)
    hf = load_transformers(args.model)
    print(f"{model.config.name}, fp32, time to first token of a greedy generate of 1 token (the prompt's forward "
          f"pass, final norm and LM head on the last position), median of {args.repeats} interleaved runs. "
          "ratio: transformers' seconds / llmwalk's (above 1: llmwalk is faster).")
    contenders = {"llmwalk": lambda ids: llmwalk_run(model, ids, 1, True, head)()[0],
                  "transformers": lambda ids: transformers_run(hf, ids, 1)()[0]}
    warm = eval_ids(model, 8)
    warm_up(*(partial(ttft, warm) for ttft in contenders.values()))
    header = f"{'prompt':>6} | {'llmwalk s':>9} {'transformers s':>14} | {'ratio':>6}"
    print(header)
    print("-" * len(header))
    for n in sorted(args.prompt_lengths):
        ids = eval_ids(model, n)
        seconds: dict[str, list[float]] = {name: [] for name in contenders}
        for _ in range(args.repeats):
            for name, ttft in contenders.items():
                seconds[name].append(ttft(ids))
        ours, theirs = (statistics.median(seconds[name]) for name in ("llmwalk", "transformers"))
        print(f"{n:>6} | {ours:>9.3f} {theirs:>14.3f} | {theirs / ours:>5.2f}x", flush=True)


def bench_quantization(args: argparse.Namespace) -> None:
    """Decode speed and weight memory of every format (fp32, int8, int4, their LM head quantized too) against its
    roofline, transformers and llama.cpp."""
    model = benchmarked_model(args)
    variants = {name: make(model) for name, make in FORMATS.items()}
    ids = eval_ids(model, args.prompt_length)
    runs = {name: llmwalk_run(m, ids, args.new_tokens, True, None) for name, m in variants.items()}
    for name in TORCH_OPS_FORMATS:
        runs[f"{name}, torch ops"] = llmwalk_run(variants[name], ids, args.new_tokens, True, None, compiled=False)
    runs["transformers fp32"] = transformers_run(load_transformers(args.model), ids, args.new_tokens)
    llm = load_llama_cpp(args.model, args.prompt_length + args.new_tokens)
    if llm is not None:
        runs["llama.cpp (same GGUF)"] = llama_cpp_run(llm, ids, args.new_tokens)
    print(f"{model.config.name}, greedy, prompt {args.prompt_length} tokens, {args.new_tokens} new tokens, torch "
          f"{torch.__version__}, {torch.get_num_threads()} threads. decode tok/s = 1 / median seconds per token "
          f"after the first, median of {args.repeats} interleaved runs. Decoding steps run compiled "
          f"(fast_decode.py{'' if fast_decode.numba else ': numba is not installed here, so they do not'}), the "
          "quantized products rounding their inputs and outputs to bf16 as torch's kernels do; 'torch ops': the same "
          "steps as torch's operations one by one (fast.py). '+ head': the tied embedding table / LM head quantized "
          "too.")
    if llm is None:
        print(LLAMA_CPP_HINT)
    warm_up(*runs.values())
    times: dict[str, list[Timing]] = {name: [] for name in runs}
    bandwidths = []
    for _ in range(args.repeats):
        bandwidths.append(memory_bandwidth())          # each round beside the runs it bounds: the host's rate moves
        for name, run in runs.items():
            times[name].append(measure(run))
    bandwidth = statistics.median(bandwidths)
    print(f"memory read bandwidth (a sum over a 256 MB tensor, fastest of 5, before each round; median of the "
          f"rounds, this run): {bandwidth / 1e9:.1f} GB/s (rounds: "
          f"{', '.join(f'{b / 1e9:.1f}' for b in bandwidths)}). MB held: the weights in memory; MB read: what one "
          "step reads (timings.weight_bytes_per_token: every weight once, quantized scales as the kernels read them, "
          "in bf16); roofline: MB read / bandwidth, the fastest possible decode; % roofline: how near the format gets.")
    fp32 = median(times["llmwalk fp32"]).tokens_per_second
    print(f"{'weights':33} {'MB held':>7} {'MB read':>7} {'decode tok/s':>12} {'x llmwalk fp32':>14} "
          f"{'roofline tok/s':>14} {'% roofline':>10}")
    for name, ts in times.items():
        tps = median(ts).tokens_per_second
        fmt = name.removesuffix(", torch ops")
        if fmt in variants:
            held, read = model_weight_bytes(variants[fmt]), weight_bytes_per_token(variants[fmt])
            limit = bandwidth / read
            print(f"{name:33} {held / 1e6:7.1f} {read / 1e6:7.1f} {tps:12.1f} {tps / fp32:13.2f}x {limit:14.1f} "
                  f"{tps / limit:10.0%}")
        else:
            print(f"{name:33} {'':7} {'':7} {tps:12.1f} {tps / fp32:13.2f}x")


def _timed(run: Callable[[], SpeculativeResult | Generation]) -> tuple[SpeculativeResult | Generation, float, float]:
    """Run once: the result, then seconds of wall time and of this process's CPU time per new token."""
    wall, cpu = time.perf_counter(), time.process_time()
    out = run()
    n = len(out.new_ids)
    return out, (time.perf_counter() - wall) / n, (time.process_time() - cpu) / n


def compare_speculative(target: Model, drafts: dict[str, Draft], prompts: dict[str, tuple[str, bool]],
                        ks: Sequence[int] = (1, 3, 5), temperatures: Sequence[float] = (0.0, 1.0),
                        max_new_tokens: int = 32, repeats: int = 1, seed: int = 0) -> Iterator[dict]:
    """Speculative vs plain (KV-cached) generation, one row per prompt, temperature, draft and k, as measured.

    Speedup is plain seconds per token over speculative seconds per token, each the median of `repeats` interleaved
    runs (sampling makes the two produce different tokens). CPU time is the steadier figure when other processes
    share the cores: wall time then also counts the moments this process waited for one.
    """
    for (label, (text, chat)), t, (name, draft), k in product(prompts.items(), temperatures, drafts.items(), ks):
        run = dict(max_new_tokens=max_new_tokens, temperature=t, seed=seed if t > 0 else None, chat=chat)
        pairs = [(_timed(partial(speculative_generate, target, draft, text, k=k, **run)),
                  _timed(partial(generate, target, text, **run))) for _ in range(repeats)]
        spec, plain = zip(*pairs)
        s = spec[-1][0]
        draft_s = sum(r.draft_seconds for r in s.rounds)
        pass_ratio = (draft_s / s.draft_forward_passes) / ((s.seconds - draft_s) / s.target_forward_passes) \
            if s.draft_forward_passes else float("nan")
        yield {"prompt": label, "temperature": t, "draft": name, "k": k, "tokens": len(s.new_ids),
               "acceptance": s.acceptance_rate, "target passes/token": s.target_forward_passes / len(s.new_ids),
               "draft passes/token": s.draft_forward_passes / len(s.new_ids), "draft pass / target pass": pass_ratio,
               "speedup (CPU)": statistics.median(c for _, _, c in plain) / statistics.median(c for _, _, c in spec),
               "speedup (wall)": statistics.median(w for _, w, _ in plain) / statistics.median(w for _, w, _ in spec)}


def bench_speculative(args: argparse.Namespace) -> None:
    """Speculative decoding: acceptance, target passes per token and speed vs plain generate, per draft and k."""
    from .accuracy import compare_to_reference, fp32_reference
    model = benchmarked_model(args)
    print(f"{model.config.name}, fp32, {args.new_tokens} new tokens (stopping at EOS), torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads. Speedup: plain seconds per token (generate with its KV cache) over "
          f"speculative, median of {args.repeats} interleaved runs. Drafts against the full model on the shipped "
          "text's first 1500 characters (top-1 agreement: about the greedy acceptance rate):")
    others = {"int8": quantize_model(model, 8), "int4 g32": quantize_model(model, 4, 32),
              **{f"first {n} layers": early_exit_model(model, n) for n in args.agreement_layers}}
    reference = fp32_reference(model, eval_text()[:1500])
    for name, other in others.items():
        c = compare_to_reference(reference, other)
        print(f"  {name:>16}: top-1 agreement {c.top1_agreement:.1%}, KL {c.kl_mean:.3g}, "
              f"perplexity {c.perplexity:.4g} (full model {c.perplexity_fp32:.4g})")
    drafts = {name: draft_by_name(model, name) for name in args.drafts}
    prompts = {name: SPECULATIVE_PROMPTS[name] for name in args.prompts}
    warm_up(partial(generate, model, "Hi", 2))
    rows = compare_speculative(model, drafts, prompts, args.ks, args.temperatures, args.new_tokens, args.repeats)
    for i, row in enumerate(rows):
        if i == 0:
            print(" | ".join(row))
        print(" | ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in row.values()), flush=True)


LEARNER_TOKENS = 150      # the attention widget is also timed on a prompt of this many tokens


def bench_widgets(args: argparse.Namespace) -> None:
    """Each widget's control-change-to-figure time: a new value set, the figure redrawn and rendered to PNG."""
    import matplotlib
    matplotlib.use("Agg")                    # headless: the widgets render PNGs themselves
    from .viz.widgets import attention_step_widget, attention_widget, generation_widget, sampling_widget
    from .walk import forward
    model = benchmarked_model(args)
    trace = forward(model, model.tokenizer.encode(PROMPT))
    long_ids = model.tokenizer.encode(" ".join([PROMPT + " Paris."] * 30))[:LEARNER_TOKENS]
    long_trace = forward(model, long_ids)            # a paragraph a learner pastes
    n_layer, n_head = model.config.n_layer, model.config.n_head
    temperatures, top_ks = (0.5, 0.8, 1.2, 1.5), (0, 5, 20)

    cases = {   # name: (widget, one change of its controls: the i-th differs from the one before, goal ms)
        "sampling: temperature / top-k": (sampling_widget(trace.logits[-1], model.tokenizer),
                                          lambda w, i: w.set(temperature=temperatures[i % 4], top_k=top_ks[i % 3]),
                                          150),
        "attention: layer / head": (attention_widget(trace, model.tokenizer),
                                    lambda w, i: w.set(layer=(i + 1) % n_layer, head=(i + 1) % n_head), 100),
        f"attention, {len(long_ids)} tokens": (attention_widget(long_trace, model.tokenizer),
                                              lambda w, i: w.set(layer=(i + 1) % n_layer, head=(i + 1) % n_head),
                                              100),
        "attention step: query token": (attention_step_widget(trace, model),
                                        lambda w, i: w.set(head=(i + 1) % n_head, query=i % len(trace.ids)), 100),
        "generation: 'next token' click": (generation_widget(model, PROMPT), lambda w, i: w.next(), 150),
    }
    print(f"{model.config.name}, prompt {PROMPT!r}: milliseconds from a control change to the new PNG "
          f"(plot or in-place update, render), median and fastest of {args.repeats} changes.")
    header = f"{'widget: control':32} {'median ms':>9} {'min ms':>7} {'goal ms':>7}"
    print(header)
    print("-" * len(header))
    for name, (widget, change, goal) in cases.items():
        seconds = []
        for i in range(args.repeats):
            if name.startswith("generation") and widget.controls["next"].disabled:
                widget.reset()                              # stopped at EOS: start again, untimed
            tic = time.perf_counter()
            change(widget, i)
            seconds.append(time.perf_counter() - tic)
        print(f"{name:32} {1000 * statistics.median(seconds):9.0f} {1000 * min(seconds):7.0f} {goal:7}")
    print(f"peak memory of this process (model, two recorded traces, the widgets' figures): {peak_rss_mb():.0f} MB")


def bench_decode(args: argparse.Namespace) -> None:
    """What one decoding step waits on, per number format: bytes, bandwidth, matrix products, operations.

    Is the step memory-bound here, and if not, where does its time go (decode_profile): the compiled step that
    generation runs, then the same step as torch's operations."""
    model = benchmarked_model(args)
    for name in args.formats:
        variant = FORMATS[name](model)
        for compiled in (True, False):
            p = decode_profile(variant, args.context, args.repeats, compiled=compiled)
            how = "compiled step" if p.compiled else "torch operations"
            print(f"{model.config.name} {name}, {how}, one decoding step at context {args.context}, medians of "
                  f"{args.repeats} runs: {p.weight_bytes / 1e6:.0f} MB of weights read; plain-sum bandwidth "
                  f"{p.bandwidth / 1e9:.3g} GB/s, so {1000 * p.roofline_seconds:.3g} ms to read them; step "
                  f"{1000 * p.step_seconds:.3g} ms ({p.roofline_seconds / p.step_seconds:.0%} of the roofline), of "
                  f"which matrix products {1000 * p.matmul_seconds:.3g} ms ({p.matmul_bandwidth / 1e9:.3g} GB/s); "
                  f"{p.n_ops} torch operations, {p.n_matmuls} of them matrix products. Memory-bound (step <= "
                  f"{MEMORY_BOUND_SLACK} x reading time): {'yes' if p.memory_bound else 'no'}; at this overhead, "
                  f"memory-bound from about {p.memory_bound_bytes / 1e6:.3g} MB of weights per token.")
            if compiled and not p.compiled:
                break                             # numba missing: the step is torch's operations either way


def bench_kernels(args: argparse.Namespace) -> None:
    """One decoding step's matrix-vector products per kernel (fp32, bf16, int8, int4), on the model's own matrices."""
    model = benchmarked_model(args)
    rows = linear_kernel_times(model, rounds=args.repeats)
    print(f"{model.config.name}: microseconds per pass through each workload's matrices (x: [1, d_in]), every layer "
          f"in turn so the weights come from memory, kernels interleaved, median of {args.repeats} rounds. "
          "x fp32: the fp32 kernel's time / this one's (above 1: faster).")
    width = max(len(r["kernel"]) for r in rows)
    for workload in dict.fromkeys(r["workload"] for r in rows):
        print(workload)
        for r in (r for r in rows if r["workload"] == workload):
            print(f"  {r['kernel']:{width}} {r['microseconds']:10.0f} us {r['speedup_vs_fp32']:6.2f}x fp32")


def build_parser() -> argparse.ArgumentParser:
    """The command line: one subparser per benchmark, each pointing at its function through `run`."""
    common = argparse.ArgumentParser(add_help=False)     # options every subcommand takes
    common.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    common.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(REGISTRY))
    parser = argparse.ArgumentParser(prog="python -m llmwalk.bench", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def command(run: Callable[[argparse.Namespace], None], repeats: int, of: str) -> argparse.ArgumentParser:
        """The subcommand named after `run` (bench_<name>), its help `run`'s docstring, --repeats N of `of`."""
        name = run.__name__.removeprefix("bench_")
        cmd = sub.add_parser(name, parents=[common], help=run.__doc__.splitlines()[0])
        cmd.add_argument("--repeats", type=int, default=repeats, help=of)
        cmd.set_defaults(run=run)
        return cmd

    gen = command(bench_generate, 3, "interleaved runs of the cached contenders")
    gen.add_argument("--prompt-lengths", type=int, nargs="+", default=[16, 128, 512], metavar="N")
    gen.add_argument("--new-tokens", type=int, default=64)

    pre = command(bench_prefill, 5, "interleaved runs per prompt length")
    pre.add_argument("--prompt-lengths", type=int, nargs="+", default=[16, 128, 512, 1024], metavar="N")

    quant = command(bench_quantization, 3, "interleaved runs of every format")
    quant.add_argument("--prompt-length", type=int, default=16, metavar="N")
    quant.add_argument("--new-tokens", type=int, default=32)

    spec = command(bench_speculative, 1, "interleaved runs of speculative and plain generation")
    spec.add_argument("--drafts", nargs="+", default=["lookup", "int8", "int4", "exit6", "exit15", "exit24"],
                      help="lookup, int8, int4 (the model quantized, head included), exitN (the first N layers)")
    spec.add_argument("--prompts", nargs="+", default=list(SPECULATIVE_PROMPTS), choices=list(SPECULATIVE_PROMPTS))
    spec.add_argument("--ks", type=int, nargs="+", default=[1, 3, 5], metavar="K", help="tokens drafted per round")
    spec.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0], metavar="T")
    spec.add_argument("--new-tokens", type=int, default=32)
    spec.add_argument("--agreement-layers", type=int, nargs="+", default=[6, 12, 18, 24, 28], metavar="N")

    command(bench_widgets, 10, "control changes per widget")

    dec = command(bench_decode, 15, "runs per timing (medians)")
    dec.add_argument("--context", type=int, default=64, metavar="N")
    dec.add_argument("--formats", nargs="+", default=["llmwalk fp32"], choices=list(FORMATS), metavar="FORMAT",
                     help=f"number formats, each profiled in turn: {', '.join(map(repr, FORMATS))}")

    command(bench_kernels, 5, "rounds of every kernel (medians)")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    print(cpu_line())
    args.run(args)


if __name__ == "__main__":
    main()
