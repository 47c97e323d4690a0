"""Section 七: from probabilities to text — the autoregressive loop, with or without a KV cache.

One round: run the model, turn the last position's logits into one token (sampling.py), append it, repeat.
Without a cache every round reruns the whole prefix (第1轮, 第2轮, ... each one longer); with a cache the
prompt is run once (prefill) and every later round feeds only the token chosen last.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from .checks import is_int
from .kv_cache import KVCache
from .sampling import Sampler, greedy
from .weights import Config
from .walk import check_head, check_ids, forward, parse_hooks

if TYPE_CHECKING:
    from .models import Model


@dataclass(frozen=True)
class Step:
    """One round of the loop: what went into the model and which token came out.

    `prob` is the chosen token's probability under the distribution it was drawn from (after temperature,
    top-k, top-p and min-p: Sampler.probs; 1.0 for greedy). `top` is the raw model's view: the top_n
    tokens of the unfiltered softmax at temperature 1. `seconds` is a measurement, not part of the step's
    identity, so it is left out of ==.
    """

    index: int                              # round number, from 1 (第1轮)
    input_len: int                          # tokens run through the model this round
    context_len: int                        # tokens the new position attends to (the whole prefix)
    token_id: int
    token: str                              # the token's text; \xNN for bytes that are part of a character
    prob: float
    top: tuple[tuple[int, str, float], ...]  # (token_id, token, prob), most likely first
    seconds: float = field(compare=False)


@dataclass(frozen=True)
class Answer:
    """What a generation wrote: the tokens and their text (generate's Generation, speculative_generate's result)."""

    prompt_ids: list[int]
    new_ids: list[int]                      # the EOS token, when generation stopped there, included
    text: str                               # the new tokens decoded, without the EOS that stopped them

    @property
    def ids(self) -> list[int]:
        """Prompt and new tokens."""
        return self.prompt_ids + self.new_ids


@dataclass(frozen=True)
class Generation(Answer):
    """The result of `generate`: the tokens, their text, and one Step per round."""

    steps: list[Step]
    stopped: str                            # "eos" | "max_new_tokens"
    cache: KVCache | None = field(default=None, repr=False, compare=False)  # kv_cache=True: keys/values kept

    @property
    def time_to_first_token(self) -> float:
        """Seconds of round 1 (the whole prompt goes through the model)."""
        return self.steps[0].seconds

    @property
    def tokens_per_second(self) -> float:
        """Decode speed: tokens after the first per second of their rounds (nan with a single token)."""
        decode = self.steps[1:]
        return len(decode) / sum(s.seconds for s in decode) if decode else float("nan")


def decoding_head(model: "Model") -> Tensor:
    """weights.output, same shape and numbers, stored column by column: a faster LM head.  # [vocab, d_model]

    Every new token multiplies one hidden vector by the whole head (49152 x 576 numbers for SmolLM2), a
    matrix-vector product limited by how fast memory is read. CPU BLAS runs x @ W faster when W is a row-major
    [d_model, vocab] matrix (the [d_in, d_out] layout of every other llmwalk linear) than x @ output.T on the
    row-major [vocab, d_model] table: measured ~4 ms vs ~6.8 ms per token. output.T.contiguous() is that
    matrix; the final .T views it as [vocab, d_model] again, so lm_head's x @ head.T reads it in its fast order.
    The copy costs vocab * d_model * 4 bytes (113 MB) and ~0.1 s: make it once per model and pass it to
    generate(head=...). The loaded weights are untouched (weights.output is still weights.token_embd).
    """
    return model.weights.output.T.contiguous().T


def cut_at_eos(model: "Model", new_ids: Sequence[int], eos_ids: frozenset[int]) -> tuple[list[int], str, str]:
    """The new tokens up to the first end token (kept), their text (without it), and why generation stopped.

    Returns (new_ids, text, stopped), stopped "eos" or "max_new_tokens". An empty eos_ids cuts nothing.
    """
    end = next((i + 1 for i, t in enumerate(new_ids) if t in eos_ids), None)
    if end is None:
        return list(new_ids), model.tokenizer.decode(list(new_ids)), "max_new_tokens"
    return list(new_ids[:end]), model.tokenizer.decode(list(new_ids[:end - 1])), "eos"


@dataclass(frozen=True)
class Pass:
    """One forward pass of the loop: the token ids that went in, and how many layers changed the stream on them."""

    ids: tuple[int, ...]
    layers: int


PassHook = Callable[[Pass], None]
_watchers: ContextVar[tuple[PassHook, ...]] = ContextVar("llmwalk_pass_watchers", default=())


@contextmanager
def watching(on_pass: PassHook) -> Iterator[None]:
    """Call on_pass(Pass) after every forward pass of every loop that runs while the block does.

    The loop's own hook point (TransformerLens's `with model.hooks(...)` pattern): every pass of generate and
    generate_stream is reported here, nothing is patched. Nested blocks all see the passes.
    """
    token = _watchers.set(_watchers.get() + (on_pass,))
    try:
        yield
    finally:
        _watchers.reset(token)


def _argmax(logits: Tensor) -> int:
    """sampling.greedy's token for one row of fp32 logits, read by numpy where every logit is finite: torch's argmax and
    finiteness check over a 49,152-token row take ~150 µs on a 2-core CPU, a few % of a compiled decoding step;
    numpy's take a tenth of that. Anything else goes through greedy, and its checks.  # [vocab] -> id"""
    if logits.dtype == torch.float32 and logits.dim() == 1 and logits.is_contiguous():
        row = logits.numpy()
        if np.isfinite(row).all():
            return int(row.argmax())
    return int(greedy(logits))


@dataclass(frozen=True)
class Loop:
    """Checked settings of one generation, and the loop that runs it (made by `prepare`).

    One round is `next_logits` (the model on what is not cached yet) then `choose` (the Sampler picks a token):
    `steps` runs them in turn; a step-through widget calls them one click at a time.
    """

    model: "Model"
    prompt_ids: list[int]
    max_new_tokens: int
    sampler: Sampler
    generator: torch.Generator | None
    cache: KVCache | None
    eos_ids: frozenset[int]                 # empty when stop_at_eos=False
    top_n: int
    head: Tensor | None
    hooks: Mapping[str, Callable[[Tensor], Tensor]] | None = None   # forward's hook points, on every pass

    def steps(self) -> Iterator[Step]:
        """Run the rounds, yielding each Step as soon as its token is chosen."""
        ids = list(self.prompt_ids)
        for index in range(1, self.max_new_tokens + 1):
            tic = time.perf_counter()
            new, logits = self.next_logits(ids)
            step = self.choose(index, ids, new, logits, tic)
            ids.append(step.token_id)
            yield step
            if step.token_id in self.eos_ids:
                return

    def next_logits(self, ids: Sequence[int]) -> tuple[int, Tensor]:
        """Run the model on `ids` (the sequence so far): (tokens it ran on, the next token's logits).  # -> [vocab]

        Without a cache every round reruns the whole prefix. With one, only the positions not cached yet: the
        whole prompt in round 1 (prefill), then the single token chosen in the previous round.
        """
        new = list(ids) if self.cache is None else list(ids[self.cache.length:])
        with _reported(new, self.hooks, self.model.config.n_layer) as hooks:
            trace = forward(self.model, new, self.cache, record=False, last_only=True, head=self.head, hooks=hooks)
        return len(new), trace.logits[0].float()       # a bf16/fp16 model's logits sampled in fp32

    def run(self) -> Generation:
        """All the rounds, then the answer cut at its end token.  # -> Generation"""
        steps = list(self.steps())
        new_ids, text, stopped = cut_at_eos(self.model, [s.token_id for s in steps], self.eos_ids)
        return Generation(self.prompt_ids, new_ids, text, steps, stopped, self.cache)

    def choose(self, index: int, ids: Sequence[int], input_len: int, logits: Tensor, tic: float) -> Step:
        """Round `index`'s token from its logits ([vocab]) after `ids`: the Sampler draws it (filtered once: the
        distribution drawn from gives the chosen token's prob). `tic` is when the round started."""
        if self.sampler.is_greedy:          # the argmax, with probability 1: no one-hot distribution to build
            token_id, prob = _argmax(logits), 1.0
        else:
            probs = self.sampler.probs(logits)
            token_id = int(self.sampler.choose(probs, self.generator))
            prob = float(probs[token_id])
        return Step(index, input_len, len(ids), token_id, self._piece(token_id), prob, self._top(logits),
                    time.perf_counter() - tic)

    def _top(self, logits: Tensor) -> tuple[tuple[int, str, float], ...]:
        """The top_n tokens of the raw softmax at temperature 1.  # [vocab] -> top_n triples"""
        probs, ids = torch.softmax(logits, dim=-1).topk(self.top_n)
        return tuple((i, self._piece(i), p) for p, i in zip(probs.tolist(), ids.tolist()))

    def _piece(self, token_id: int) -> str:
        return self.model.tokenizer.pieces([token_id])[0]


@contextmanager
def _reported(ids: list[int], hooks: Mapping[str, Callable[[Tensor], Tensor]] | None,
              n_layer: int) -> Iterator[Mapping[str, Callable[[Tensor], Tensor]] | None]:
    """The hooks a pass runs with, and, when someone is `watching`, a Pass reported to them after the pass: the
    caller's hooks, wrapped in ones that count the layers that changed the residual stream."""
    watchers, ran = _watchers.get(), []
    if not watchers:
        yield hooks
        return
    counted = dict(hooks or {})
    for i in range(n_layer):
        pre, post = f"blocks.{i}.resid_pre", f"blocks.{i}.resid_post"
        counted[pre], counted[post] = _counting(ran, counted.get(pre), counted.get(post))
    yield counted
    for watch in watchers:
        watch(Pass(tuple(ids), sum(ran)))


def _counting(ran: list, then_pre: Callable[[Tensor], Tensor] | None,
              then_post: Callable[[Tensor], Tensor] | None) -> tuple[Callable, Callable]:
    """resid_pre and resid_post hooks of one layer that note it ran when it changed the residual stream (a layer
    skipped, or one that adds nothing, is not counted), around the caller's own hooks there, if any."""
    seen = []

    def pre(x: Tensor) -> Tensor:
        seen[:] = [x if then_pre is None else then_pre(x)]
        return seen[0]

    def post(x: Tensor) -> Tensor:
        ran.append(not torch.equal(x, seen[0]))
        return x if then_post is None else then_post(x)
    return pre, post


def _check_hooks(model: "Model", hooks: Mapping[str, Callable[[Tensor], Tensor]] | None, kv_cache: bool) -> None:
    """Check the hooks' names and functions now (not at the first pass), and refuse interventions whose result would
    depend on kv_cache, or that only fit the first round's pass.

    After the first round, a pass with the cache runs one new position and one without it the whole, longer
    sequence. A mean over positions (hook.sequence == "whole") is then that one position itself, a no-op; a patch
    (hook.sequence == n, the source prompt's length) finds no pass of n tokens to line up with.
    """
    parse_hooks(hooks, model.config.n_layer, [])
    for name, fn in (hooks or {}).items():
        need = getattr(fn, "sequence", None)
        if need == "whole" and kv_cache:
            raise ValueError(f"hook {name!r}: mean ablation needs the whole sequence: pass kv_cache=False (with the "
                             "cache each round after the first runs 1 new position, and its mean is itself)")
        if isinstance(need, int):
            raise ValueError(f"hook {name!r} patches from a source prompt of {need} tokens, and only generate's first "
                             "pass has that many: later passes run 1 token with the KV cache (the whole, longer "
                             "sequence without it). Patch a single pass instead: lw.forward(model, ids, hooks=...) "
                             "or iv.next_token_probs")


def _prompt_ids(model: "Model", prompt, chat: bool) -> list[int]:
    """The prompt as checked token ids: text is encoded (through the chat template with chat=True).  # -> [T]"""
    config, tokenizer = model.config, model.tokenizer
    if isinstance(prompt, (bytes, bytearray)):
        raise TypeError("prompt must be text (str) or token ids, got bytes: decode them first, "
                        "e.g. prompt.decode('utf-8')")
    if prompt is None:
        raise TypeError("prompt must be text (str) or token ids, got None: pass the text to continue, e.g. 'Hello'")
    if chat and not isinstance(prompt, str):
        raise ValueError("chat=True applies the chat template to text: pass the prompt as a string")
    ids = tokenizer.encode(prompt, chat=chat) if isinstance(prompt, str) else prompt
    return check_ids(ids, config.vocab_size, config.context_length).tolist()


def prepare(model: "Model", prompt: str | Sequence[int] | Tensor, max_new_tokens: int = 32, *,
            temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
            min_p: float | None = None, seed: int | None = None, generator: torch.Generator | None = None,
            kv_cache: bool = True, chat: bool = False, stop_at_eos: bool = True, top_n: int = 5,
            head: Tensor | None = None, hooks: Mapping[str, Callable[[Tensor], Tensor]] | None = None) -> Loop:
    """The Loop that `generate` runs (and `generate_stream` steps through), every argument checked and the prompt
    encoded before any forward pass. The arguments are generate's."""
    sampler = Sampler(temperature, top_k, top_p, min_p)
    generator = check_settings(model, max_new_tokens=max_new_tokens, sampler=sampler, seed=seed, generator=generator,
                               kv_cache=kv_cache, top_n=top_n, head=head, hooks=hooks)
    ids = _prompt_ids(model, prompt, chat)
    _check_room(model.config, len(ids), max_new_tokens)
    cache = KVCache.empty(model.config, len(ids) + max_new_tokens) if kv_cache else None
    return Loop(model, ids, max_new_tokens, sampler, generator, cache, model.eos_ids if stop_at_eos else frozenset(),
                top_n, head, hooks)


def check_settings(model: "Model", *, max_new_tokens: int, sampler: Sampler, seed: int | None,
                   generator: torch.Generator | None, kv_cache: bool, top_n: int, head: Tensor | None,
                   hooks: Mapping[str, Callable[[Tensor], Tensor]] | None) -> torch.Generator | None:
    """Refuse a setting generation cannot run with, naming the fix; returns the generator to draw with."""
    config = model.config
    if model.tokenizer is None:
        raise ValueError(f"{config.name} was loaded without a tokenizer: generate needs one to show its tokens")
    if not is_int(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if not is_int(top_n) or not 0 <= top_n <= config.vocab_size:      # topk would fail after the forward pass
        raise ValueError(f"top_n must be an int in 0..{config.vocab_size} (the vocabulary), got {top_n!r}")
    check_head(model, head)
    _check_hooks(model, hooks, kv_cache)
    if seed is not None and generator is not None:
        raise ValueError("pass seed= or generator=, not both")
    if seed is not None and not is_int(seed):
        raise TypeError(f"seed must be an int, got {seed!r}: e.g. seed=0")
    if seed is not None and not 0 <= seed < 2**64:
        raise ValueError(f"seed must be in [0, 2**64), got {seed}: e.g. seed=0")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}: "
                        "e.g. torch.Generator().manual_seed(0), or pass seed=0")
    if seed is not None:
        generator = torch.Generator().manual_seed(seed)
    if not sampler.is_greedy and generator is None:
        raise ValueError(f"temperature={sampler.temperature} samples at random: pass seed= (an int) or generator= "
                         "so the result can be reproduced, or use temperature=0 for greedy decoding")
    return generator


def _check_room(config: Config, n_prompt: int, max_new_tokens: int) -> None:
    """The prompt and the new tokens must fit in the context."""
    room = config.context_length - n_prompt
    if max_new_tokens > room:
        fixes = [f"shorten the prompt to at most {config.context_length - max_new_tokens} tokens"] \
            if max_new_tokens < config.context_length else []
        fixes += [f"set max_new_tokens <= {room}"] if room >= 1 else []
        raise ValueError(f"prompt of {n_prompt} tokens + max_new_tokens={max_new_tokens} = {n_prompt + max_new_tokens} "
                         f"tokens is longer than {config.name}'s context length of {config.context_length}: "
                         + (" or ".join(fixes) or "shorten the prompt and lower max_new_tokens"))


def generate_stream(model: "Model", prompt: str | Sequence[int] | Tensor, max_new_tokens: int = 32,
                    **settings) -> Iterator[Step]:
    """`generate`, one Step at a time as each token is chosen: the same arguments, checked now (not at the first
    next())."""
    return prepare(model, prompt, max_new_tokens, **settings).steps()


def generate(model: "Model", prompt: str | Sequence[int] | Tensor, max_new_tokens: int = 32,
             **settings) -> Generation:
    """Continue `prompt` (text, or token ids) by up to max_new_tokens tokens.  # [T] -> Generation

    The settings, keyword arguments (prepare checks them all before any forward pass):
    temperature=0 is greedy; above 0 the token is drawn after top_k / top_p / min_p filtering, and a seed (or
    a torch.Generator, generator=) is required so that runs are reproducible. chat=True wraps text in the chat
    template. Stops after an EOS token (kept in new_ids, not in text) unless stop_at_eos=False. kv_cache=False reruns
    the whole prefix every round, as the article's first loop does; the tokens are the same either way. top_n: how
    many of the raw model's top tokens each Step keeps (5).
    head=decoding_head(model), made once and reused, speeds up every token (same numbers, faster memory order).
    `hooks` (forward's hook points, "blocks.{i}.{point}") apply on every round's pass; `watching` sees each pass.
    Interventions that would not mean the same with and without the cache are refused: a mean ablation needs
    kv_cache=False, and a patch (lined up with one source prompt) fits only one pass: use forward for it.
    """
    return prepare(model, prompt, max_new_tokens, **settings).run()
