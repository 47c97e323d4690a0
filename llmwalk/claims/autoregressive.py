"""Section 七 measured: the rounds of the loop, where it stops, how many forward passes it makes, what they cost.

`claims(model, gemma=None)` returns one row per claim of the section. The forward passes are counted by
`recorded_passes`, which watches every call generate() makes to `forward`; the FLOPs come from cost.py, whose
matrix-product counts agree with torch's own FLOP counter (checked here on the last round).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator, Sequence

from .. import cost, prompts
from ..generation import Generation, Pass, cut_at_eos, decoding_head, generate, watching
from ..i18n import quoted, t
from . import listed, named, yes
from ..kv_cache import KVCache
from ..report import Claim, Verdict

if TYPE_CHECKING:
    from ..models import Model

SECTION = "七"
QUESTION = prompts.QUESTION                 # SmolLM2: through its chat template
GEMMA_PROMPT = prompts.GEMMA_QUESTION        # Gemma-3-270M: no chat template, it answers on the next line
ENGLISH = prompts.ENGLISH_QUESTION           # SmolLM2 answers this one in one sentence and stops
ARTICLE_ROUNDS = ("巴", "黎", "。", "[EOS]")
ROUNDS = 16                                  # rounds shown for the Chinese question
N = 50                                       # the article's "generating 50 tokens"


# ---------------------------------------------------------------- measurements

@contextmanager
def recorded_passes() -> Iterator[list[Pass]]:
    """Record every forward pass generate() makes while the block runs (through generation.watching).

        with recorded_passes() as passes:
            generate(model, "Hello", 5, kv_cache=False)
        [len(p.ids) for p in passes]        # the tokens each round ran through the model
    """
    passes: list[Pass] = []
    with watching(passes.append):
        yield passes


def first_rounds(model: "Model", g: Generation, n: int) -> Generation:
    """What generate(..., n) would have returned: the first n rounds of a longer run, up to an end token."""
    ids, text, stopped = cut_at_eos(model, [s.token_id for s in g.steps[:n]], model.eos_ids)
    return Generation(g.prompt_ids, ids, text, g.steps[:len(ids)], stopped)


def answer_text(g: Generation) -> str:
    """The generated tokens as one line of text, with [EOS] where generation stopped at an end token."""
    return g.text.replace("\n", "↵") + (" [EOS]" if g.stopped == "eos" else "")


def round_pieces(g: Generation) -> tuple[str, ...]:
    """The token of each round, [EOS] for an end token that stopped the loop."""
    return tuple("[EOS]" if k == len(g.steps) - 1 and g.stopped == "eos" else s.token for k, s in enumerate(g.steps))


def rounds_verdict(g: Generation) -> Verdict:
    """The point: 巴黎 comes out of the rounds; the detail: in the article's rounds exactly, 巴, 黎, 。, [EOS]."""
    first = round_pieces(g)[:len(ARTICLE_ROUNDS)]
    return Verdict.of("巴黎" in g.text or first == ARTICLE_ROUNDS, first == ARTICLE_ROUNDS)


def _rounds_claim(model: "Model", gemma: "Model | None", smol_zh: Generation) -> Claim:
    if gemma is not None:
        g = generate(gemma, GEMMA_PROMPT, ROUNDS, head=decoding_head(gemma))
        who = named("Gemma-3-270M", quoted(GEMMA_PROMPT))
    else:
        g = smol_zh
        who = t("claims.autoregressive.rounds.chat_who", model=model.config.name, question=QUESTION)
    hit = next((s for s in g.steps if "巴" in s.token), None)
    where = (t("claims.autoregressive.rounds.hit", token=quoted(hit.token), round=hit.index, p=f"{hit.top[0][2]:.3g}")
             if hit else t("claims.autoregressive.rounds.miss"))
    return Claim(SECTION, t("claims.autoregressive.rounds.article"),
                 t("claims.autoregressive.rounds.measured", who=who, n=len(g.steps), text=quoted(answer_text(g)), where=where),
                 rounds_verdict(g), numbers={"rounds": len(g.steps), "text": g.text, "pieces": round_pieces(g),
                                             "round_ba": hit and hit.index}, key="autoregressive.rounds")


def _eos_claim(model: "Model", english: Generation, smol_zh: Generation) -> Claim:
    eos = english.stopped == "eos"
    last = english.steps[-1]
    return Claim(SECTION, t("claims.autoregressive.eos.article"),
                 t("claims.autoregressive.eos.measured", model=model.config.name, question=quoted(ENGLISH),
                   text=quoted(english.text), token=quoted(last.token), id=last.token_id, round=last.index,
                   stopped=repr(english.stopped), n=len(smol_zh.steps),
                   chinese=t("claims.autoregressive.eos.end") if smol_zh.stopped == "eos"
                   else t("claims.autoregressive.eos.no_end")),
                 Verdict.of(eos and last.token_id in model.config.eos_token_ids),
                 numbers={"stopped": english.stopped, "last_id": last.token_id, "round": last.index,
                          "eos_ids": tuple(model.config.eos_token_ids)}, key="autoregressive.eos")


def _append_claim(model: "Model", english: Generation, passes: Sequence[Pass],
                  cached: Sequence[Pass]) -> Claim:
    appended = all(b.ids == a.ids + (s.token_id,) for a, b, s in zip(passes, passes[1:], english.steps))
    full = all(p.layers == model.config.n_layer for p in list(passes) + list(cached))
    lens = [len(p.ids) for p in passes]
    return Claim(SECTION, t("claims.autoregressive.append.article"),
                 t("claims.autoregressive.append.measured", appended=yes(appended), n_layer=model.config.n_layer,
                   full=yes(full), lengths=listed(lens[:4]), cached=listed(len(p.ids) for p in cached[:4])),
                 Verdict.of(appended and full and len(passes) == len(english.steps)),
                 numbers={"appended": appended, "full_stack": full, "lengths": lens, "rounds": len(english.steps)},
                 key="autoregressive.append")


def _passes_claim(model: "Model", passes: Sequence[Pass]) -> Claim:
    full = sum(p.layers == model.config.n_layer for p in passes)
    return Claim(SECTION, t("claims.autoregressive.passes.article", n=N),
                 t("claims.autoregressive.passes.measured", calls=len(passes), n=N, full=full,
                   n_layer=model.config.n_layer),
                 Verdict.of(len(passes) == N and full == N), numbers={"passes": len(passes), "full": full, "new_tokens": N},
                 key="autoregressive.passes")


FLAT = 1.1      # a round costs "about the same" as another when it is within 10 % of it


def linear_verdict(grow_cached: float, grow_rerun: float) -> Verdict:
    """The point, linear with a KV cache: the last round costs about what the first decode round does (FLAT); the
    detail, the article's own loop (rerunning the prefix) too. # growth = last round's FLOPs / first round's"""
    return Verdict.of(grow_cached < FLAT, grow_rerun < FLAT)


def _linear_claim(model: "Model", prompt_ids: Sequence[int], new_ids: Sequence[int]) -> Claim:
    config, p = model.config, len(prompt_ids)
    rerun, cached = cost.round_flops(config, p, N, kv_cache=False), cost.round_flops(config, p, N, kv_cache=True)
    grow_rerun, grow_cached = rerun[-1] / rerun[0], cached[-1] / cached[1]      # last round vs first (decode) round
    # torch's FLOP counter on round N, both ways: the count above is what forward really multiplies.
    last = list(prompt_ids) + list(new_ids[:N - 1])
    cache = KVCache.empty(config, len(last))
    cost.measured_flops(model, last[:-1], cache=cache, last_only=True)            # fill the cache (not compared)
    counted = (cost.measured_flops(model, last, last_only=True),
               cost.measured_flops(model, last[-1:], cache, last_only=True))
    formula = (cost.matmul_flops(cost.flops_by_stage(config, len(last), last_only=True)),
               cost.matmul_flops(cost.flops_by_stage(config, 1, cached=len(last) - 1, last_only=True)))
    flat_cached, flat_rerun = grow_cached < FLAT, grow_rerun < FLAT
    verdict = linear_verdict(grow_cached, grow_rerun)
    g = lambda x: f"{x / 1e9:.3g} GFLOPs"                                                     # noqa: E731
    shape = lambda flat: (t("claims.autoregressive.linear.flat") if flat else                # noqa: E731
                          t("claims.autoregressive.linear.grows"))
    return Claim(SECTION, t("claims.autoregressive.linear.article"),
                 t("claims.autoregressive.linear.measured", prompt=p, n=N, rerun_first=g(rerun[0]),
                   rerun_last=g(rerun[-1]), rerun_growth=f"{grow_rerun:.3g}", rerun_total=g(sum(rerun)),
                   rerun_shape=shape(flat_rerun), cached_prompt=g(cached[0]), cached_round=g(cached[1]),
                   cached_growth=f"{grow_cached:.3g}", cached_total=g(sum(cached)), cached_shape=shape(flat_cached),
                   agrees=yes(counted == formula)), verdict,
                 numbers={"rerun": rerun, "cached": cached, "counted": counted, "formula": formula},
                 key="autoregressive.linear")


def claims(model: "Model", gemma: "Model | None" = None) -> list[Claim]:
    """Section 七, measured on `model` (SmolLM2); the article's Chinese rounds on `gemma` when it is given."""
    head = decoding_head(model)
    with recorded_passes() as long_run:
        smol_zh = generate(model, QUESTION, N, chat=True, stop_at_eos=False, head=head)
    first = first_rounds(model, smol_zh, ROUNDS)
    with recorded_passes() as recomputed:
        english = generate(model, ENGLISH, ROUNDS, chat=True, kv_cache=False, head=head)
    with recorded_passes() as cached:
        generate(model, ENGLISH, 4, chat=True, head=head)
    return [_rounds_claim(model, gemma, first), _eos_claim(model, english, first),
            _append_claim(model, english, recomputed, cached), _passes_claim(model, long_run),
            _linear_claim(model, smol_zh.prompt_ids, smol_zh.new_ids)]
