"""Section 八, third optimization: speculative decoding — a cheap draft guesses k tokens, the model checks them.

One round: the draft proposes k tokens; the target runs [last token] + the k drafted tokens through `forward` with its
KV cache, one pass over k + 1 positions, which gives its next-token distribution after every drafted token. It keeps
the drafted tokens up to the first one it rejects and adds one token of its own: a resample where it rejected, a
bonus token when it accepted all k. A round costs one target pass and yields 1 to k + 1 tokens; both KV caches are
rolled back to the kept tokens (the buffers stay allocated: rolling back only moves a length).

The accept/reject rule (Leviathan et al. 2023; Chen et al. 2023) makes the output follow exactly the target's
distribution, whatever the draft: a bad draft costs time, never quality. At temperature 0 it reduces to "keep drafted
tokens while they equal the target's argmax", so the text is token for token the target's greedy text.

Drafts: PromptLookupDraft copies from the context (no model); ModelDraft runs any model with the target's
vocabulary (offline: SmolLM2 quantized to int8/int4); EarlyExitDraft runs the target's first N layers.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .checks import is_int
from .i18n import t
from .generation import Answer, cut_at_eos, prepare
from .kv_cache import KVCache
from .quantize import quantize_model
from .sampling import Sampler
from .walk import forward
from .weights import Config, count_params

if TYPE_CHECKING:
    from .models import Model


# ---------------------------------------------------------------- the rule

def draw_token(weights: Tensor, generator: torch.Generator | None = None) -> int:
    """One token id, with probability proportional to its weight.  # [vocab] -> int

    No random number is used when a single token is possible (greedy, a deterministic draft): temperature 0
    needs no generator, and the generator's stream is left as it was.
    """
    support = weights.nonzero()
    if len(support) == 1:
        return int(support[0])
    return int(torch.multinomial(weights, 1, generator=generator))


def residual(p: Tensor, q: Tensor) -> Tensor:
    """What a rejected guess is replaced by: max(0, p − q), normalised to sum to 1.  # [V], [V] -> [V]

    The tokens the draft proposes too rarely (p > q), in proportion to the missing mass. Where p = q everywhere
    the residual is empty (and never needed: every guess is then accepted); float rounding of two near-equal rows
    can leave it empty too, and then p itself is returned.
    """
    rest = (p - q).clamp(min=0)
    total = rest.sum()
    return rest / total if total > 0 else p


def speculative_accept(p: Tensor, q: Tensor, drafted: int, u: float) -> tuple[bool, Tensor]:
    """The accept/reject rule for one drafted token x, given a uniform number u in [0, 1).  # [V], [V], int, float -> (bool, [V])

    Accepted when u < min(1, p(x) / q(x)): always when the target likes x at least as much as the draft, else
    with probability p(x) / q(x). The second output is the residual a rejected x is replaced by (returned
    either way). The min(1, ·) only says a probability cannot exceed 1: with u < 1 the test is the same without it.
    """
    return u < min(1.0, float(p[drafted] / q[drafted])), residual(p, q)


def speculative_sample(p: Tensor, q: Tensor, generator: torch.Generator | None = None, *,
                       accept=speculative_accept) -> int:
    """One token the speculative way: draw x from the draft's q, keep it by the rule, else draw from the residual.

    Its distribution is p's: P(x) = q(x) · min(1, p(x)/q(x)) + P(reject) · residual(x) = min(q, p)(x) +
    (p − q)⁺(x) = p(x). `accept` (the rule, same signature as speculative_accept) is there to try a wrong one.
    # [V], [V] -> int
    """
    x = draw_token(q, generator)
    accepted, rest = accept(p, q, x, float(torch.rand((), generator=generator)))
    return x if accepted else draw_token(rest, generator)


def acceptance_rate(p: Tensor, q: Tensor) -> Tensor:
    """The probability that a guess drawn from q is accepted: Σ_x q(x) · min(1, p(x)/q(x)) = Σ_x min(p(x), q(x)).

    That is 1 − the total variation distance between the two distributions.  # [..., V], [..., V] -> [...]
    """
    return torch.minimum(p, q).sum(-1)


def expected_tokens_per_round(alpha: float, k: int) -> float:
    """Tokens a round yields on average when each guess is accepted with probability alpha, independently:
    1 + α + α² + … + α^k = (1 − α^(k+1)) / (1 − α) (Leviathan et al. 2023, eq. 1)."""
    return float(k + 1) if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def chi_square_pvalue(counts: Tensor, probs: Tensor, min_expected: float = 5.0) -> float:
    """Pearson's chi-square test that `counts` were drawn from `probs`: the chance of a deviation at least this
    large if they were (a small value rejects).  # [V], [V] -> float

    Tokens expected fewer than `min_expected` times are pooled into one category (the test needs a few per
    category); a count on a token of probability 0 is impossible under probs and gives 0.
    """
    counts, probs = counts.double(), probs.double()
    if (counts[probs == 0] > 0).any():
        return 0.0
    expected = probs * counts.sum()
    big = expected >= min_expected
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    obs, exp = obs[exp > 0], exp[exp > 0]
    stat = ((obs - exp) ** 2 / exp).sum()
    return float(torch.special.gammaincc(torch.tensor((len(exp) - 1) / 2, dtype=torch.double), stat / 2))


def verify(p_target: Tensor, p_draft: Tensor | None, drafted: Sequence[int],
           generator: torch.Generator | None = None) -> tuple[int, int]:
    """Keep a prefix of the drafted tokens, then pick one more.  # [k+1, V], [k, V] | None, [k] -> (accepted, token)

    Drafted token x_i is judged by speculative_accept with p_i the target's distribution and q_i the draft's
    (one-hot when p_draft is None: a deterministic draft). At the first rejection the token is drawn from the
    residual max(0, p_i − q_i), normalised; when all k are accepted, from p_k (the bonus token). Each output token
    then follows p exactly (speculative_sample).
    """
    k = len(drafted)
    bad = [x for x in drafted if not is_int(x) or not 0 <= x < p_target.shape[-1]]
    if bad:
        raise ValueError(f"drafted ids {bad} are not token ids of a {p_target.shape[-1]}-token vocabulary: draft with "
                         "a model (or lookup) that shares the target's tokenizer")
    guessed = F.one_hot(torch.tensor(list(drafted), dtype=torch.long), p_target.shape[-1]).float()
    q = p_draft if p_draft is not None else guessed          # a deterministic guess: all its mass on the token
    if p_target.shape[0] != k + 1 or q.shape[0] != k or q.shape[-1] != p_target.shape[-1]:
        raise ValueError(f"{k} drafted tokens need target rows [{k + 1}, vocab] and draft rows [{k}, vocab], got "
                         f"{list(p_target.shape)} and {list(q.shape)}: the draft must share the target's vocabulary")
    for i, x in enumerate(drafted):
        ratio = float(p_target[i, x] / q[i, x])
        # Draw a uniform number only when the outcome is uncertain, so that greedy decoding needs no generator
        # (u = 0 accepts a ratio >= 1 and rejects a ratio of 0, as any u would).
        u = float(torch.rand((), generator=generator)) if 0 < ratio < 1 else 0.0
        accepted, rest = speculative_accept(p_target[i], q[i], x, u)
        if not accepted:
            return i, draw_token(rest, generator)
    return k, draw_token(p_target[k], generator)


# ---------------------------------------------------------------- drafts

@dataclass(frozen=True)
class Proposal:
    """What a draft guessed: up to k token ids, the distributions they were drawn from, the passes it took."""

    ids: list[int]                  # [k'], k' <= k
    probs: Tensor | None            # [k', vocab]; None: chosen deterministically (one-hot)
    forward_passes: int = 0


class Draft:
    """Guesses the next tokens. speculative_generate calls reset before a generation, rollback after every round."""

    def reset(self, target: Config, capacity: int) -> None:
        """Start a new generation of up to `capacity` tokens (prompt included) for a target of this config."""

    def propose(self, context: list[int], k: int, sampler: Sampler, generator: torch.Generator | None) -> Proposal:
        """Up to k tokens that might follow `context`, drawn from sampler.probs if drawn at all.  # [L] -> [<= k]"""
        raise NotImplementedError

    def rollback(self, n: int) -> None:
        """The first n tokens of the context are final; anything the draft remembers after them is not."""


def lookup(context: Sequence[int], ngram: int, k: int) -> list[int]:
    """The k tokens that followed the last earlier occurrence of the context's trailing n-gram.  # [L] -> [<= k]

    Tries n = ngram, ngram − 1, ..., 1 (longer matches predict better); [] when even the last token never occurred.
    """
    context = list(context)
    for n in range(min(ngram, len(context) - 1), 0, -1):
        tail = context[-n:]
        for start in range(len(context) - n - 1, -1, -1):     # latest first; the tail itself is excluded
            if context[start:start + n] == tail:
                return context[start + n:start + n + k]
    return []


class PromptLookupDraft(Draft):
    """No model: copy what followed the last n-gram earlier in the context (prompt lookup decoding).

    Free to run, and right whenever the answer repeats its prompt (quote, rewrite, edit code); a deterministic guess,
    so the rule accepts token x with probability p_target(x).
    """

    def __init__(self, ngram: int = 3):
        if not is_int(ngram) or ngram < 1:
            raise ValueError(f"ngram must be an int >= 1, got {ngram!r}")
        self.ngram = ngram

    def propose(self, context: list[int], k: int, sampler: Sampler, generator: torch.Generator | None) -> Proposal:
        return Proposal(lookup(context, self.ngram, k), None)

    def __repr__(self) -> str:
        return f"PromptLookupDraft(ngram={self.ngram})"


class ModelDraft(Draft):
    """A smaller model with the target's vocabulary drafts token by token, with its own KV cache.

    Offline: the same SmolLM2 quantized (quantize_model(model, 8) or 4). Online: ModelDraft(lw.load_model("distilgpt2"))
    for lw.load_model("gpt2") works the same way (the hub is unreachable here, so that pair is not tested).
    """

    def __init__(self, model: "Model"):
        self.model = model
        self.cache: KVCache | None = None

    def reset(self, target: Config, capacity: int) -> None:
        if self.model.config.vocab_size != target.vocab_size:
            raise ValueError(f"draft {self.model.config.name} has {self.model.config.vocab_size} tokens, target "
                             f"{target.name} {target.vocab_size}: a draft must share the target's tokenizer")
        self.cache = KVCache.empty(self.model.config, capacity)

    def propose(self, context: list[int], k: int, sampler: Sampler, generator: torch.Generator | None) -> Proposal:
        ids, rows = [], []
        new = context[self.cache.length:]           # what the cache lacks: the kept tokens of the last round
        for _ in range(k):
            logits = forward(self.model, new, self.cache, record=False, last_only=True).logits[0]
            rows.append(sampler.probs(logits))
            ids.append(draw_token(rows[-1], generator))
            new = ids[-1:]
        return Proposal(ids, torch.stack(rows) if rows else None, k)

    def rollback(self, n: int) -> None:
        self.cache.truncate(min(n, self.cache.length))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.model.source})"


def early_exit_model(model: "Model", n_layers: int) -> "Model":
    """The model's first n_layers blocks, then its own final norm and LM head (the logit lens, as a model)."""
    if not is_int(n_layers) or not 1 <= n_layers <= model.config.n_layer:
        raise ValueError(f"n_layers must be an int in [1, {model.config.n_layer}], got {n_layers!r}")
    weights = replace(model.weights, blocks=model.weights.blocks[:n_layers])
    config = replace(model.config, name=f"{model.config.name}, first {n_layers} layers", n_layer=n_layers,
                     n_params=count_params(weights))
    return replace(model, config=config, weights=weights, source=f"{model.source}, first {n_layers} layers")


class EarlyExitDraft(ModelDraft):
    """The target's own first N layers draft (self-speculation): no second model to store, but the middle layers'
    top token is rarely the last layer's: accuracy.compare_to_fp32(model, early_exit_model(model, n)).top1_agreement."""

    def __init__(self, model: "Model", n_layers: int):
        super().__init__(early_exit_model(model, n_layers))


def draft_by_name(model: "Model", name: str) -> Draft:
    """'lookup' (prompt lookup, 3-grams), 'int8' / 'int4' (the model quantized, LM head too: a draft should be as
    fast as it can be), 'exitN' (its first N layers)."""
    if name == "lookup":
        return PromptLookupDraft()
    if name == "int8":
        return ModelDraft(quantize_model(model, 8, embeddings=True))
    if name == "int4":
        return ModelDraft(quantize_model(model, 4, group_size=32, embeddings=True))
    if name.startswith("exit") and name[4:].isdigit():
        return EarlyExitDraft(model, int(name[4:]))
    raise ValueError(f"unknown draft {name!r}: use lookup, int8, int4 or exitN (N layers, e.g. exit6)")


# ---------------------------------------------------------------- generation

@dataclass(frozen=True)
class Round:
    """One draft-then-verify round (the fields llmwalk.viz.speculative_timeline draws)."""

    proposed_ids: list[int]
    proposed: list[str]             # the drafted tokens' texts
    accepted: int                   # how many drafted tokens the target kept, from the first
    extra_id: int
    extra: str                      # the target's own token after them
    bonus: bool                     # guesses made and all accepted: extra drawn from the target's next distribution
    draft_forward_passes: int
    draft_seconds: float = field(compare=False)
    seconds: float = field(compare=False)

    @property
    def new_ids(self) -> list[int]:
        """The tokens this round added.  # [accepted + 1]"""
        return self.proposed_ids[:self.accepted] + [self.extra_id]


@dataclass(frozen=True)
class SpeculativeResult(Answer):
    """The result of speculative_generate: tokens and text as `generate` has them, and how the rounds went."""

    rounds: list[Round]             # as verified: a round that produced EOS may hold tokens cut from new_ids
    stopped: str                    # "eos" | "max_new_tokens"
    target_forward_passes: int      # one per round, plus the prefill of a prompt longer than one token
    seconds: float = field(compare=False)

    @property
    def draft_forward_passes(self) -> int:
        return sum(r.draft_forward_passes for r in self.rounds)

    @property
    def acceptance_rate(self) -> float:
        """Share of the drafted tokens the target kept (nan when nothing was drafted)."""
        proposed = sum(len(r.proposed_ids) for r in self.rounds)
        return sum(r.accepted for r in self.rounds) / proposed if proposed else float("nan")


def _round(target: "Model", draft: Draft, ids: list[int], cache: KVCache, k: int, sampler: Sampler,
           generator: torch.Generator | None) -> Round:
    """Draft k tokens after ids, verify them in one target pass, roll both caches back to the kept tokens."""
    tic = time.perf_counter()
    proposal = draft.propose(ids, k, sampler, generator)
    draft_seconds = time.perf_counter() - tic
    drafted = proposal.ids
    # The cache holds every token but the last: the pass runs it and the drafted ones, k + 1 positions.
    logits = forward(target, ids[cache.length:] + drafted, cache, record=False).logits[-len(drafted) - 1:]
    accepted, extra = verify(sampler.probs(logits), proposal.probs, drafted, generator)
    cache.truncate(len(ids) + accepted)
    draft.rollback(len(ids) + accepted)
    *proposed, piece = target.tokenizer.pieces(drafted + [extra])
    bonus = bool(drafted) and accepted == len(drafted)
    return Round(drafted, proposed, accepted, extra, piece, bonus, proposal.forward_passes, draft_seconds,
                 time.perf_counter() - tic)


def speculative_generate(target: "Model", draft: Draft, prompt: str | Sequence[int] | Tensor, *, k: int = 4,
                         max_new_tokens: int = 32, temperature: float = 0.0, top_k: int | None = None,
                         top_p: float | None = None, min_p: float | None = None, seed: int | None = None,
                         generator: torch.Generator | None = None, chat: bool = False,
                         stop_at_eos: bool = True) -> SpeculativeResult:
    """`generate`, with `draft` guessing up to k tokens per target pass.  # [T] -> SpeculativeResult

    Same arguments and checks as generate. The tokens follow the target's distribution (after temperature, top-k,
    top-p, min-p, applied to the draft's distribution too); at temperature 0 they are exactly generate's tokens.
    """
    tic = time.perf_counter()
    if not is_int(k) or k < 1:
        raise ValueError(f"k (tokens drafted per round) must be an int >= 1, got {k!r}")
    if not isinstance(draft, Draft):
        raise TypeError(f"draft must be a Draft, got {type(draft).__name__}: wrap a small model as ModelDraft(model), "
                        "or use PromptLookupDraft() / EarlyExitDraft(target, n_layers)")
    loop = prepare(target, prompt, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                   seed=seed, generator=generator, chat=chat, stop_at_eos=stop_at_eos, top_n=0)
    prompt_ids, cache, sampler = loop.prompt_ids, loop.cache, loop.sampler
    draft.reset(target.config, len(prompt_ids) + max_new_tokens)
    # Prefill all but the last prompt token (LM head on one row only): every round then feeds its last token.
    prefill = len(prompt_ids) > 1
    if prefill:
        forward(target, prompt_ids[:-1], cache, record=False, last_only=True)
    rounds: list[Round] = []
    new: list[int] = []
    while len(new) < max_new_tokens and not loop.eos_ids.intersection(new):
        # Never draft past max_new_tokens: the round's own token is the last one allowed.
        rounds.append(_round(target, draft, prompt_ids + new, cache, min(k, max_new_tokens - len(new) - 1),
                             sampler, loop.generator))
        new += rounds[-1].new_ids
    new, text, stopped = cut_at_eos(target, new, loop.eos_ids)    # a round may have gone on past an end token
    return SpeculativeResult(prompt_ids, new, text, rounds, stopped, len(rounds) + prefill,
                             time.perf_counter() - tic)


def run_label(name: str) -> str:
    """A run's name (a key of claims.cost.speculative_runs) as a table shows it, in the current language."""
    return {"repeat": t("speculative.run.repeat"), "no copy": t("speculative.run.no_copy"),
            "int8 draft": t("speculative.run.int8_draft")}[name]
