"""Section 六 measured: greedy decoding and its loops, temperature, top-k, top-p, and what a library does by default.

`claims(model)` returns one row per claim of the section. The helpers it measures with (find_loop, distinct_n,
token_logprobs, temperature_study, ...) are the ones notebook 06 shows, so the table and the cells agree.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import torch
from torch import Tensor

from ..generate import decoding_head, generate
from ..report import Claim
from ..sampling import apply_temperature, probs_after
from ..walk import forward

if TYPE_CHECKING:
    from ..models import Model

SECTION = "六"
QUESTION = "法国的首都是什么"                  # the article's question, sent through the chat template
NARROW = "The capital of France is"           # one answer dominates
WIDE = "My favourite food is"                 # many answers are fine
LOOP_PROMPT = "I like cats. I like dogs. I like"
LOOP_TOKENS = 32
CHAT_PROMPT = "Write one sentence about the sea."
TEMPERATURES = (0.0, 0.2, 0.7, 1.0, 1.5)      # 0 is greedy
SEEDS = (0, 1)
STUDY_TOKENS = 16
TOP_K = 50
TOP_P = 0.9


# ---------------------------------------------------------------- one distribution

def next_token_logits(model: "Model", text: str, chat: bool = False) -> Tensor:
    """The model's logits for the token after `text`.  # -> [vocab]"""
    return forward(model, model.tokenizer.encode(text, chat=chat), record=False, last_only=True).logits[0]


def entropy(logits: Tensor, temperature: float = 1.0) -> float:
    """Entropy in nats of softmax(logits / T): 0 when one token is certain, ln(vocab) when all are equal."""
    return float(torch.special.entr(probs_after(logits, temperature).double()).sum())   # float64: the same sum on any thread count


def kept(logits: Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
         min_p: float | None = None) -> int:
    """How many tokens can still be drawn after the cuts (probability > 0)."""
    return int((probs_after(logits, temperature, top_k, top_p, min_p) > 0).sum())


# ---------------------------------------------------------------- loops and variety

@dataclass(frozen=True)
class Loop:
    """A sequence's repeating tail: from index `start` on, the same `period` tokens come back again and again."""

    start: int                  # index in the sequence of the first token of the repeating tail
    period: int                 # tokens per repetition
    repeats: float              # how many periods the tail spans (the last one may be unfinished)
    ids: tuple[int, ...]        # the first period of the tail


def find_loop(ids: Sequence[int], min_repeats: float = 3) -> Loop | None:
    """The longest tail of `ids` that repeats with a fixed period at least `min_repeats` times (None if none).

    For every period p the tail is extended backwards while ids[i] == ids[i + p]; the longest tail wins, and
    among equally long tails the shortest period (a loop of 5 tokens also "repeats" every 10).
    """
    ids, best = list(ids), None
    for p in range(1, len(ids) // 2 + 1):
        start = len(ids) - p
        while start > 0 and ids[start - 1] == ids[start - 1 + p]:
            start -= 1
        length = len(ids) - start
        if length / p >= min_repeats and (best is None or length > len(ids) - best.start):
            best = Loop(start, p, length / p, tuple(ids[start:start + p]))
    return best


def distinct_n(seqs: Sequence[Sequence[int]], n: int = 2) -> float:
    """Distinct n-grams / all n-grams, pooled over the sequences: 1 when nothing repeats, 1/k for k identical copies."""
    grams = [tuple(s[i:i + n]) for s in seqs for i in range(len(s) - n + 1)]
    return len(set(grams)) / len(grams) if grams else float("nan")


def token_logprobs(model: "Model", prompt_ids: Sequence[int], new_ids: Sequence[int]) -> Tensor:
    """log p of each new token under the plain model (T = 1, no cuts), from one forward pass.  # -> [len(new_ids)]"""
    logits = forward(model, list(prompt_ids) + list(new_ids), record=False).logits
    logp = logits[len(prompt_ids) - 1:-1].log_softmax(-1)
    return logp.gather(-1, torch.tensor(list(new_ids))[:, None]).squeeze(-1)


@dataclass(frozen=True)
class Run:
    """One sampled answer of the temperature study."""

    temperature: float
    seed: int
    text: str
    new_ids: tuple[int, ...]    # EOS included when the answer ended there
    stopped: str
    mean_logprob: float         # mean log p of the new tokens under the plain model (T = 1): how natural it reads


def temperature_study(model: "Model", prompt: str = CHAT_PROMPT, temperatures: Sequence[float] = TEMPERATURES,
                      seeds: Sequence[int] = SEEDS, max_new_tokens: int = STUDY_TOKENS) -> list[Run]:
    """Answer a chat prompt at every temperature with every seed (no top-k/top-p: temperature alone)."""
    head, runs = decoding_head(model), []
    for t in temperatures:
        for seed in seeds:
            g = generate(model, prompt, max_new_tokens, temperature=t, seed=seed, chat=True, head=head)
            lp = float(token_logprobs(model, g.prompt_ids, g.new_ids).mean())
            runs.append(Run(t, seed, g.text, tuple(g.new_ids), g.stopped, lp))
    return runs


def study_summary(runs: Sequence[Run]) -> dict[float, dict[str, float]]:
    """Per temperature: distinct-2 over its answers (variety), mean log p (naturalness), identical answers."""
    out = {}
    for t in dict.fromkeys(r.temperature for r in runs):
        group = [r for r in runs if r.temperature == t]
        out[t] = {"distinct_2": distinct_n([r.new_ids for r in group], 2),
                  "mean_logprob": sum(r.mean_logprob for r in group) / len(group),
                  "all_identical": float(len({r.new_ids for r in group}) == 1)}
    return out


def library_defaults() -> dict[str, object]:
    """The sampling settings transformers' generate() uses when neither the model nor the caller sets them."""
    from transformers import GenerationConfig
    if hasattr(GenerationConfig, "_get_default_generation_params"):      # transformers >= 5: unset fields are None
        d = GenerationConfig._get_default_generation_params()
    else:                                                               # transformers 4: defaults on the instance
        d = vars(GenerationConfig())
    return {k: d[k] for k in ("do_sample", "temperature", "top_k", "top_p")}


# ---------------------------------------------------------------- the claims

def _f(x: float) -> str:
    return f"{x:.3g}"


def _greedy_claims(model: "Model", runs: Sequence[Run]) -> list[Claim]:
    greedy = [r for r in runs if r.temperature == 0]
    same = len(greedy) > 1 and len({r.new_ids for r in greedy}) == 1
    g = generate(model, LOOP_PROMPT, LOOP_TOKENS, stop_at_eos=False, head=decoding_head(model))
    loop = find_loop(g.new_ids)
    pieces = "".join(model.tokenizer.pieces(list(loop.ids))) if loop else ""
    return [
        Claim(SECTION, "Greedy: pick the most likely token — deterministic",
              f"greedy answers to '{CHAT_PROMPT}' with seeds {', '.join(str(r.seed) for r in greedy)}: "
              + ("identical" if same else "different"),
              "✓ holds" if same else "✗ differs"),
        Claim(SECTION, "Greedy easily falls into a repetition loop",
              (f"'{LOOP_PROMPT}' + {LOOP_TOKENS} greedy tokens: from new token {loop.start + 1} on, the "
               f"{loop.period} tokens {pieces!r} repeat {loop.repeats:.3g} times") if loop
              else f"'{LOOP_PROMPT}' + {LOOP_TOKENS} greedy tokens: no loop",
              "✓ holds" if loop else "✗ differs"),
    ]


def _temperature_claims(narrow: Tensor, runs: Sequence[Run]) -> list[Claim]:
    ts = (0.5, 1.0, 2.0)
    h = [entropy(narrow, t) for t in ts]
    plain = bool(torch.equal(apply_temperature(narrow, 1.0).softmax(-1), narrow.softmax(-1)))
    ok = h[0] < h[1] < h[2] and plain
    s = study_summary(runs)
    warm = [t for t in s if t > 0]
    more_variety = all(s[a]["distinct_2"] <= s[b]["distinct_2"] for a, b in zip(warm, warm[1:]))
    less_natural = all(s[a]["mean_logprob"] >= s[b]["mean_logprob"] for a, b in zip(warm, warm[1:]))
    return [
        Claim(SECTION, "Temperature divides the logits before softmax: T > 1 flattens, T < 1 sharpens, T = 1 is "
                       "plain softmax",
              f"'{NARROW}': entropy {', '.join(f'{_f(x)} (T = {t:g})' for x, t in zip(h, ts))} nats; "
              f"T = 1 equals softmax exactly: {'yes' if plain else 'no'}",
              "✓ holds" if ok else "✗ differs"),
        Claim(SECTION, "Chat usually uses T ≈ 0.7–1.0; creative writing can go higher",
              f"{len(runs) // len(s)} answers per T to '{CHAT_PROMPT}': distinct-2 "
              + ", ".join(f"{_f(v['distinct_2'])}" for v in s.values())
              + "; mean log p " + ", ".join(f"{_f(v['mean_logprob'])}" for v in s.values())
              + f" (T = {', '.join(f'{t:g}' for t in s)}): "
              + ("more variety, less natural text as T rises (T > 0). Where the sweet spot lies is a choice, "
                 "not a measurement" if more_variety and less_natural else
                 "no steady trade-off between variety and naturalness as T rises"),
              "≈ roughly" if more_variety and less_natural else "✗ differs"),
    ]


def _cut_claims(narrow: Tensor, wide: Tensor) -> list[Claim]:
    k_ids = set(torch.topk(narrow, TOP_K).indices.tolist())
    k_kept = set(torch.nonzero(probs_after(narrow, top_k=TOP_K)).flatten().tolist())
    tail = [1 - float(x.softmax(-1).topk(TOP_K).values.sum()) for x in (narrow, wide)]
    sizes = [kept(x, top_p=TOP_P) for x in (narrow, wide)]
    minimal = all(_minimal_nucleus(x, TOP_P) for x in (narrow, wide))
    return [
        Claim(SECTION, "Top-K draws only among the K most likely tokens (no absurd word out of 50,000)",
              f"top-k = {TOP_K} keeps {len(k_kept)} tokens, {'exactly' if k_kept == k_ids else 'not'} the "
              f"{TOP_K} most likely; without it a T = 1 draw lands outside them with p = {_f(tail[0])} "
              f"('{NARROW}') or {_f(tail[1])} ('{WIDE}')",
              "✓ holds" if k_kept == k_ids else "✗ differs"),
        Claim(SECTION, "Top-P adds tokens from the top until their mass reaches P: few when the distribution is "
                       "narrow, many when it is wide",
              f"top-p = {TOP_P} keeps {sizes[0]} tokens for '{NARROW}', {sizes[1]} for '{WIDE}'; each is the "
              f"smallest top set reaching {TOP_P}: {'yes' if minimal else 'no'}",
              "✓ holds" if minimal and sizes[0] < sizes[1] else "✗ differs"),
    ]


def _minimal_nucleus(logits: Tensor, p: float) -> bool:
    """The kept set is the n most likely tokens, their mass reaches p, the n − 1 most likely stay below it."""
    n = kept(logits, top_p=p)
    probs = logits.double().softmax(-1).sort(descending=True).values
    mass = probs.cumsum(0)
    on_top = set(torch.nonzero(probs_after(logits, top_p=p)).flatten().tolist()) == \
        set(torch.topk(logits, n).indices.tolist())
    return on_top and mass[n - 1] >= p - 1e-6 and (n == 1 or mass[n - 2] < p + 1e-6)


def _default_claim() -> Claim:
    d = library_defaults()
    top_p_default = bool(d["do_sample"]) and d["top_p"] < 1
    return Claim(SECTION, "GPT models default to Top-P combined with temperature",
                 f"transformers' generate() defaults: do_sample={d['do_sample']}, temperature={d['temperature']}, "
                 f"top_k={d['top_k']}, top_p={d['top_p']} (greedy unless asked). OpenAI's own defaults are in "
                 "no installed package",
                 "≈ roughly" if top_p_default else "— not checkable here")


def claims(model: "Model", runs: Sequence[Run] | None = None) -> list[Claim]:
    """Section 六, measured on `model`. `runs`: a temperature_study(model) already made (notebook 06 passes its own)."""
    runs = temperature_study(model) if runs is None else runs
    narrow, wide = next_token_logits(model, NARROW), next_token_logits(model, WIDE)
    return (_greedy_claims(model, runs) + _temperature_claims(narrow, runs) + _cut_claims(narrow, wide)
            + [_default_claim()])
