"""`python -m llmwalk.bench` smoke tests: each subcommand runs on a tiny random Llama (SmolLM2's vocabulary and
tokenizer, 2 layers of width 64) against transformers on the same weights, and prints its tables with the machine
line. Structure only: the timings of a shared test machine say nothing."""
import dataclasses
import re
import sys
import time

import pytest
import torch

import llmwalk as lw
from llmwalk import bench


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, smollm2):
    """(llmwalk model, transformers model): the same random weights, SmolLM2's tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    hf = LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      hidden_size=64, intermediate_size=128, vocab_size=smollm2.config.vocab_size,
                                      max_position_embeddings=1024, tie_word_embeddings=True)).eval()
    path = tmp_path_factory.mktemp("tiny") / "llama"
    hf.save_pretrained(path)
    return dataclasses.replace(lw.load_model(path), tokenizer=smollm2.tokenizer), hf


@pytest.fixture
def run_bench(monkeypatch, capsys, tiny):
    """bench.main(argv) on the tiny model, llama.cpp made unimportable; returns the printed lines."""
    model, hf = tiny
    monkeypatch.setattr(bench, "load_model", lambda name, progress=True: model)
    monkeypatch.setattr(bench, "load_transformers", lambda name=None: hf)
    monkeypatch.setitem(sys.modules, "llama_cpp", None)                 # import llama_cpp -> ImportError

    def run(*argv: str) -> list[str]:
        bench.main(list(argv))
        return capsys.readouterr().out.splitlines()
    return run


def check_machine_line(line: str) -> None:
    assert re.fullmatch(rf"CPU: .+ \(\d+ logical cores\), torch {re.escape(torch.__version__)} CPU capability "
                        rf"{torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} torch threads\. "
                        r"Ratios vary by CPU: measure on yours\.", line), line


def test_bench_generate_table(run_bench):
    out = run_bench("generate", "--prompt-lengths", "8", "12", "--new-tokens", "3", "--repeats", "1", "--threads", "1")
    check_machine_line(out[0])
    assert bench.LLAMA_CPP_HINT in out and "pip install llama-cpp-python" in bench.LLAMA_CPP_HINT
    rows = [line for line in out if re.match(r"\s+\d+ \|", line)]
    assert [(int(r.split("|")[0]), r.split("|")[1][:25].strip()) for r in rows] == [
        (n, name) for n in (8, 12) for name in ("llmwalk cache +head", "llmwalk cache", "llmwalk cache, torch ops",
                                                "llmwalk int4 + head", "transformers (cache)",
                                                "llmwalk no cache +head")]
    for row in rows:
        ttft, tps, mb = map(float, row.split("|")[1][25:].split())     # three numbers (timings: not checked)
        assert (row.split("|")[2].count("x") == 3) == row.split("|")[1].startswith(" llmwalk cache")


class FakeLlama:
    """llama-cpp-python's Llama as llama_cpp_run uses it: reset(), then generate() yields a token every `seconds`
    (the prompt takes `seconds` too)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def reset(self) -> None:
        pass

    def generate(self, ids, temp, reset):
        while True:
            time.sleep(self.seconds)
            yield 0


def test_bench_generate_puts_the_gguf_format_beside_llama_cpp(run_bench, monkeypatch):
    """With llama.cpp installed: its row, and per prompt length one line with llmwalk's int4 + head decode speed
    over llama.cpp's and llama.cpp's time to first token over llmwalk's, both from the rows above it."""
    monkeypatch.setattr(bench, "load_llama_cpp", lambda name, context: FakeLlama(0.02))
    out = run_bench("generate", "--prompt-lengths", "8", "--new-tokens", "3", "--repeats", "1", "--threads", "1")
    assert bench.LLAMA_CPP_HINT not in out
    rows = {r.split("|")[1][:25].strip(): r.split("|")[1][25:].split() for r in out if re.match(r"\s+8 \| \S", r)}
    assert "llama.cpp (same GGUF)" in rows and "llmwalk int4 + head" in rows
    (ttft, tps, _), (ttft_cpp, tps_cpp, _) = (map(float, rows[k]) for k in ("llmwalk int4 + head",
                                                                           "llama.cpp (same GGUF)"))
    assert tps_cpp == pytest.approx(50, rel=0.3)                      # the fake's one token per 20 ms
    line = next(r for r in out if "vs llama.cpp on its own file" in r)
    decode, first = map(float, re.findall(r"([\d.]+)x", line))

    def within_rounding(ratio: float, top: float, bottom: float, half_step: float) -> bool:
        """ratio (printed to 2 decimals) is top / bottom, each printed to within ±half_step."""
        return (top - half_step) / (bottom + half_step) - 0.005 <= ratio <= (top + half_step) / (bottom - half_step) + 0.005
    assert within_rounding(decode, tps, tps_cpp, 0.05)                # tok/s to 1 decimal
    assert within_rounding(first, ttft_cpp, ttft, 0.0005)             # seconds to 3 decimals


def test_bench_quantization_table(run_bench):
    out = run_bench("quantization", "--prompt-length", "8", "--new-tokens", "3", "--repeats", "1", "--threads", "1")
    check_machine_line(out[0])
    assert bench.LLAMA_CPP_HINT in out
    table = out[out.index(next(line for line in out if line.startswith("weights"))) + 1:]
    names = [re.split(r"\s{2,}", line)[0] for line in table]
    assert names == ["llmwalk fp32", "int8 layers", "int8 layers + head", "int4 g32 asym layers",
                     "int4 g32 asym + head", "llmwalk fp32, torch ops", "int4 g32 asym + head, torch ops",
                     "transformers fp32"]
    assert table[0].split()[5] == "1.00x"                               # fp32 against itself
    cols = {name: line[33:].split() for name, line in zip(names, table)}
    mb = {name: float(c[0]) for name, c in cols.items() if name != "transformers fp32"}
    assert mb["int4 g32 asym layers"] < mb["int8 layers"] < mb["llmwalk fp32"] == mb["llmwalk fp32, torch ops"]
    read = {name: float(c[1]) for name, c in cols.items() if name in mb}
    assert read["llmwalk fp32"] == pytest.approx(mb["llmwalk fp32"], abs=0.1)      # fp32: every weight, as held
    # int4 g32 (nearly every weight, with its head): 0.5 byte a weight for the codes, and per 32 weights an fp32
    # scale and zero held (8 bytes), read in bf16 (4 bytes): 0.625 of 0.75 bytes a weight
    assert read["int4 g32 asym + head"] / mb["int4 g32 asym + head"] == pytest.approx(0.625 / 0.75, rel=0.01)
    gbps = float(re.search(r"bandwidth .*?: ([\d.]+) GB/s", "\n".join(out)).group(1))
    for name, (_, size, tps, _, limit, share) in ((n, c) for n, c in cols.items() if n in mb):
        # roofline = bandwidth / bytes read, and % roofline = tok/s / roofline (to the printed rounding)
        assert float(limit) == pytest.approx(gbps * 1e3 / float(size), rel=0.06)
        assert float(share.rstrip("%")) == pytest.approx(100 * float(tps) / float(limit), abs=1.5, rel=0.02)
    assert len(cols["transformers fp32"]) == 2                          # tok/s and ratio: no weights of ours, no roofline


def test_bench_widgets_table(run_bench):
    out = run_bench("widgets", "--repeats", "2")
    check_machine_line(out[0])
    rows = out[-6:-1]
    assert [re.split(r"\s{2,}", r)[0] for r in rows] == ["sampling: temperature / top-k", "attention: layer / head",
                                                         "attention, 150 tokens", "attention step: query token",
                                                         "generation: 'next token' click"]
    assert out[-1].startswith("peak memory")
    for row in rows:
        median, fastest, goal = map(float, row.split()[-3:])           # three numbers (timings: not checked)


def test_llama_cpp_missing_gives_the_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    assert bench.load_llama_cpp("smollm2-135m", 64) is None


def test_bench_speculative_table(run_bench):
    out = run_bench("speculative", "--drafts", "lookup", "exit1", "--prompts", "no copy", "--ks", "2",
                    "--temperatures", "0", "--new-tokens", "4", "--agreement-layers", "1", "--threads", "1")
    check_machine_line(out[0])
    header = next(i for i, line in enumerate(out) if line.startswith("prompt | "))
    columns = out[header].split(" | ")
    rows = [dict(zip(columns, line.split(" | "))) for line in out[header + 1:]]
    assert [(r["draft"], r["k"], r["prompt"]) for r in rows] == [("lookup", "2", "no copy"), ("exit1", "2", "no copy")]
    assert all(0 <= float(r["acceptance"]) <= 1 for r in rows)


def test_bench_prefill_table(run_bench):
    out = run_bench("prefill", "--prompt-lengths", "12", "8", "--repeats", "1", "--threads", "1")
    check_machine_line(out[0])
    rows = [line for line in out if re.match(r"\s+\d+ \|", line)]
    assert [int(r.split("|")[0]) for r in rows] == [8, 12]              # sorted by length
    for row in rows:
        ours, theirs = map(float, row.split("|")[1].split())           # two numbers (timings: not checked)
        assert re.fullmatch(r" +\d+\.\d\dx", row.split("|")[2])


def test_bench_prefill_ratio_is_theirs_over_ours(run_bench, monkeypatch):
    """With made-up times to first token (llmwalk 1 ms per prompt token, transformers 3 ms), the table prints
    them and their ratio; the median of the repeats is what is printed."""
    def fake(per_token):
        slow = iter([False, True, False] * 4)       # one repeat of each length is 10x slower: the median drops it
        return lambda *args: lambda: (per_token * len(args[1]) * (10 if next(slow) else 1), [])
    monkeypatch.setattr(bench, "llmwalk_run", fake(0.001))
    monkeypatch.setattr(bench, "transformers_run", fake(0.003))
    monkeypatch.setattr(bench, "eval_ids", lambda model, n: list(range(n)))
    out = run_bench("prefill", "--prompt-lengths", "12", "8", "--repeats", "3", "--threads", "1")
    rows = [line for line in out if re.match(r"\s+\d+ \|", line)]
    assert rows == ["     8 |     0.008          0.024 |  3.00x", "    12 |     0.012          0.036 |  3.00x"]


def test_bench_kernels_table(run_bench, monkeypatch, tiny):
    """With made-up times (the i-th kernel of KERNELS takes i + 1 ms per pass), every workload lists every kernel
    with its microseconds and the fp32 kernel's time over its own: the 2 layers' matrices by name, all of them
    together, the LM head."""
    from llmwalk import timings
    from llmwalk.quantize_kernels import KERNELS
    calls = iter(range(10**6))
    monkeypatch.setattr(timings, "_seconds_per_pass", lambda fns, xs, repeats: (next(calls) % len(KERNELS) + 1) / 1e3)
    out = run_bench("kernels", "--repeats", "3", "--threads", "1")
    check_machine_line(out[0])
    workloads = [line for line in out[2:] if not line.startswith("  ")]
    assert workloads == ["attn_q x2", "attn_k x2", "attn_v x2", "attn_output x2", "ffn_gate x2", "ffn_up x2",
                         "ffn_down x2", "all layer matrices (one decode step)", "lm_head"]
    rows = [line.split() for line in out[2:] if line.startswith("  ")]
    assert len(rows) == len(workloads) * len(KERNELS)
    for i, row in enumerate(rows):
        k = i % len(KERNELS)
        assert " ".join(row[:-4]) == list(KERNELS)[k]
        assert row[-4:] == [f"{1000 * (k + 1)}", "us", f"{1 / (k + 1):.2f}x", "fp32"]


class PrefixCachingLlama:
    """What llama-cpp-python's Llama.generate does with a prompt it has seen: the common prefix with the previous
    run's tokens stays in its KV cache and is not evaluated again (reset=True or not), unless reset() came first."""

    def __init__(self):
        self.n_tokens, self.previous, self.evaluated = 0, [], []

    def reset(self):
        self.n_tokens = 0

    def generate(self, tokens, temp, reset=True):
        tokens = list(tokens)
        prefix = 0
        if self.n_tokens > 0:
            while prefix < min(len(tokens) - 1, len(self.previous)) and tokens[prefix] == self.previous[prefix]:
                prefix += 1
        self.evaluated.append(len(tokens) - prefix)
        self.previous, self.n_tokens = tokens, len(tokens)
        while True:
            yield 0


def test_llama_cpp_runs_the_whole_prompt_every_time():
    """Interleaved repeats of one prompt: each llama.cpp run must prefill it again, or its time to first token
    would measure no prefill at all."""
    llm, ids = PrefixCachingLlama(), list(range(40))
    run = bench.llama_cpp_run(llm, ids, 3)
    ttft, seconds = run()
    run()
    assert llm.evaluated == [40, 40] and len(seconds) == 2
