"""Section 六 measured: greedy decoding and its loops, temperature, top-k, top-p, and what a library does by default.

`claims(model)` returns one row per claim of the section. The helpers it measures with (find_loop, distinct_n,
temperature_study, ...) are the ones notebook 06 shows, so the table and the cells agree.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import torch
from torch import Tensor

from .. import prompts
from ..accuracy import log_probs, token_nll
from ..generation import decoding_head, generate
from ..i18n import quoted, t
from . import listed, yes
from ..report import Claim, Verdict
from ..sampling import apply_temperature, entropy, kept, probs_after
from ..walk import forward

if TYPE_CHECKING:
    from ..models import Model

SECTION = "六"
QUESTION = prompts.QUESTION                  # the article's question, sent through the chat template
NARROW = prompts.PROMPT                      # one answer dominates
WIDE = "My favourite food is"                 # many answers are fine
LOOP_PROMPT = "I like cats. I like dogs. I like"   # repetitive, base-model style: built to loop
PLAIN_PROMPTS = (NARROW, WIDE)                    # plain prompts: does greedy loop "easily", without the help?
LOOP_TOKENS = 32
CHAT_PROMPT = "Write one sentence about the sea."
TEMPERATURES = (0.0, 0.2, 0.7, 1.0, 1.5)      # 0 is greedy
SEEDS = (0, 1)
STUDY_TOKENS = 16
TOP_K = 50
TOP_P = 0.9


# ---------------------------------------------------------------- measurements

def next_token_logits(model: "Model", text: str, chat: bool = False) -> Tensor:
    """The model's logits for the token after `text`.  # -> [vocab]"""
    return forward(model, model.tokenizer.encode(text, chat=chat), record=False, last_only=True).logits[0]


@dataclass(frozen=True)
class Repetition:
    """A repeating tail of a token sequence (greedy decoding's loop): from index `start` on, the same `period` tokens come back again and again."""

    start: int                  # index in the sequence of the first token of the repeating tail
    period: int                 # tokens per repetition
    repeats: float              # how many periods the tail spans (the last one may be unfinished)
    ids: tuple[int, ...]        # the first period of the tail


def find_loop(ids: Sequence[int], min_repeats: float = 3) -> Repetition | None:
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
            best = Repetition(start, p, length / p, tuple(ids[start:start + p]))
    return best


def distinct_n(seqs: Sequence[Sequence[int]], n: int = 2) -> float:
    """Distinct n-grams / all n-grams, pooled over the sequences: 1 when nothing repeats, 1/k for k identical copies."""
    grams = [tuple(s[i:i + n]) for s in seqs for i in range(len(s) - n + 1)]
    return len(set(grams)) / len(grams) if grams else float("nan")


@dataclass(frozen=True)
class SampledAnswer:
    """One sampled answer of the temperature study."""

    temperature: float
    seed: int
    text: str
    new_ids: tuple[int, ...]    # EOS included when the answer ended there
    stopped: str
    mean_logprob: float         # mean log p of the new tokens under the plain model (T = 1): how natural it reads


def temperature_study(model: "Model", prompt: str, *, temperatures: Sequence[float], seeds: Sequence[int],
                      max_new_tokens: int) -> list[SampledAnswer]:
    """Answer a chat prompt at every temperature with every seed (no top-k/top-p: temperature alone)."""
    head, runs = decoding_head(model), []
    for temp in temperatures:
        for seed in seeds:
            g = generate(model, prompt, max_new_tokens, temperature=temp, seed=seed,
                         chat=model.tokenizer.chat_template is not None, head=head)   # GPT-2 has none
            # log p of each new token under the plain model, from one forward pass over prompt and answer
            lp = -float(token_nll(log_probs(model, g.ids), g.ids)[len(g.prompt_ids) - 1:].mean())
            runs.append(SampledAnswer(temp, seed, g.text, tuple(g.new_ids), g.stopped, lp))
    return runs


def study_summary(runs: Sequence[SampledAnswer]) -> dict[float, dict[str, float]]:
    """Per temperature: distinct-2 over its answers (variety), mean log p (naturalness), identical answers."""
    out = {}
    for temp in dict.fromkeys(r.temperature for r in runs):
        group = [r for r in runs if r.temperature == temp]
        out[temp] = {"distinct_2": distinct_n([r.new_ids for r in group], 2),
                     "mean_logprob": sum(r.mean_logprob for r in group) / len(group),
                     "all_identical": float(len({r.new_ids for r in group}) == 1)}
    return out



# ---------------------------------------------------------------- what a library does by default

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


def greedy_loop(model: "Model", prompt: str) -> tuple[Repetition | None, str]:
    """The loop greedy decoding falls into after `prompt` within LOOP_TOKENS tokens (None if none), and its text."""
    g = generate(model, prompt, LOOP_TOKENS, stop_at_eos=False, head=decoding_head(model))
    loop = find_loop(g.new_ids)
    return loop, "".join(model.tokenizer.pieces(list(loop.ids))) if loop else ""


def _greedy_claims(model: "Model", runs: Sequence[SampledAnswer]) -> list[Claim]:
    greedy = [r for r in runs if r.temperature == 0]
    same = len(greedy) > 1 and len({r.new_ids for r in greedy}) == 1
    loop, pieces = greedy_loop(model, LOOP_PROMPT)
    plain = {p: greedy_loop(model, p)[0] for p in PLAIN_PROMPTS}
    built = (t("claims.sampling.loop.measured", prompt=quoted(LOOP_PROMPT), n=LOOP_TOKENS, start=loop.start + 1,
               period=loop.period, pieces=quoted(pieces), repeats=f"{loop.repeats:.3g}") if loop
             else t("claims.sampling.loop.none", prompt=quoted(LOOP_PROMPT), n=LOOP_TOKENS))
    looped = [p for p, found in plain.items() if found]
    return [
        Claim(SECTION, t("claims.sampling.greedy.article"),
              t("claims.sampling.greedy.measured", prompt=quoted(CHAT_PROMPT), seeds=listed(r.seed for r in greedy),
                outcome=t("claims.sampling.greedy.identical") if same else t("claims.sampling.greedy.different")),
              Verdict.of(same), numbers={"identical": same}, key="sampling.greedy"),
        # the point: greedy falls into a loop it never leaves (on the prompt built for it); the detail, "easily":
        # plain prompts loop too
        Claim(SECTION, t("claims.sampling.loop.article"),
              t("claims.sampling.loop.plain", built=built, n=LOOP_TOKENS, prompts=listed(quoted(p) for p in plain),
                looped=listed(quoted(p) for p in looped) if looped else t("claims.sampling.loop.none_plain")),
              Verdict.of(loop is not None, bool(looped)), numbers={"loop": loop, "plain": plain},
              key="sampling.loop"),
    ]


def temperature_verdict(entropies: Sequence[float], plain: bool) -> Verdict:
    """The point: the entropy of the next-token distribution rises with T at every step (0.5 < 1 < 2), and T = 1 is
    softmax itself. # entropies at T = 0.5, 1, 2"""
    return Verdict.of(all(a < b for a, b in zip(entropies, entropies[1:])) and plain)


def _temperature_claims(narrow: Tensor, runs: Sequence[SampledAnswer]) -> list[Claim]:
    ts = (0.5, 1.0, 2.0)
    h = [entropy(probs_after(narrow, temp)) for temp in ts]
    plain = bool(torch.equal(apply_temperature(narrow, 1.0).softmax(-1), narrow.softmax(-1)))
    s = study_summary(runs)
    warm = [temp for temp in s if temp > 0]
    more_variety = all(s[a]["distinct_2"] <= s[b]["distinct_2"] for a, b in zip(warm, warm[1:]))
    less_natural = all(s[a]["mean_logprob"] >= s[b]["mean_logprob"] for a, b in zip(warm, warm[1:]))
    return [
        Claim(SECTION, t("claims.sampling.temperature.article"),
              t("claims.sampling.temperature.measured", prompt=quoted(NARROW),
                entropies=listed(t("claims.sampling.temperature.entropy", h=_f(x), t=f"{temp:g}") for x, temp in zip(h, ts)),
                plain=yes(plain)),
              temperature_verdict(h, plain), numbers={"entropy": dict(zip(ts, h)), "plain": plain}, key="sampling.temperature"),
        Claim(SECTION, t("claims.sampling.chat_range.article"),
              t("claims.sampling.chat_range.measured", n=len(runs) // len(s), prompt=quoted(CHAT_PROMPT),
                distinct=listed(_f(v["distinct_2"]) for v in s.values()),
                logprob=listed(f"{v['mean_logprob']:.2f}" for v in s.values()),   # 2 decimals: the same on every CPU
                temperatures=listed(f"{temp:g}" for temp in s),
                trend=t("claims.sampling.chat_range.trade_off") if more_variety and less_natural
                else t("claims.sampling.chat_range.no_trade_off")),
              # the point: variety rises and naturalness falls with T; the detail, the sweet spot 0.7–1.0, is a choice
              Verdict.of(more_variety and less_natural, False), numbers={"summary": s}, key="sampling.chat_range"),
    ]


def _cut_claims(narrow: Tensor, wide: Tensor) -> list[Claim]:
    k_ids = set(torch.topk(narrow, TOP_K).indices.tolist())
    k_kept = set(torch.nonzero(probs_after(narrow, top_k=TOP_K)).flatten().tolist())
    tail = [1 - float(x.double().softmax(-1).topk(TOP_K).values.sum()) for x in (narrow, wide)]   # float64: a small tail
    sizes = [kept(x, top_p=TOP_P) for x in (narrow, wide)]
    minimal = all(_minimal_nucleus(x, TOP_P) for x in (narrow, wide))
    return [
        Claim(SECTION, t("claims.sampling.top_k.article"),
              t("claims.sampling.top_k.measured", k=TOP_K, kept=len(k_kept), exact=yes(k_kept == k_ids),
                tail_narrow=_f(tail[0]), narrow=quoted(NARROW), tail_wide=_f(tail[1]), wide=quoted(WIDE)),
              Verdict.of(k_kept == k_ids), numbers={"kept": len(k_kept), "exact": k_kept == k_ids, "tail": tail},
              key="sampling.top_k"),
        Claim(SECTION, t("claims.sampling.top_p.article"),
              t("claims.sampling.top_p.measured", p=TOP_P, kept_narrow=sizes[0], narrow=quoted(NARROW), kept_wide=sizes[1],
                wide=quoted(WIDE), minimal=yes(minimal)),
              Verdict.of(minimal and sizes[0] < sizes[1]), numbers={"kept": sizes, "minimal": minimal},
              key="sampling.top_p"),
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
    return Claim(SECTION, t("claims.sampling.defaults.article"), t("claims.sampling.defaults.measured", **d),
                 # GPT's own defaults are not measurable offline; a library's default that samples with top-p
                 # supports the point, not the detail (which defaults "GPT models" use)
                 Verdict.of(True, False) if top_p_default else Verdict.UNCHECKABLE, numbers=d, key="sampling.defaults")


def claims(model: "Model", runs: Sequence[SampledAnswer] | None = None) -> list[Claim]:
    """Section 六, measured on `model`. `runs`: a temperature_study(model) already made (notebook 06 passes its own)."""
    if runs is None:
        runs = temperature_study(model, CHAT_PROMPT, temperatures=TEMPERATURES, seeds=SEEDS,
                                 max_new_tokens=STUDY_TOKENS)
    narrow, wide = next_token_logits(model, NARROW), next_token_logits(model, WIDE)
    return (_greedy_claims(model, runs) + _temperature_claims(narrow, runs) + _cut_claims(narrow, wide)
            + [_default_claim()])
