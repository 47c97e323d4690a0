"""Section 七: from probabilities to text — the autoregressive loop, with or without a KV cache.

One round: run the model, turn the last position's logits into one token (sampling.py), append it, repeat.
Without a cache every round reruns the whole prefix (第1轮, 第2轮, ... each one longer); with a cache the
prompt is run once (prefill) and every later round feeds only the token chosen last.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator, Sequence

import torch
from torch import Tensor

from .kv_cache import KVCache
from .sampling import probs_after, sample
from .walk import check_ids, forward

if TYPE_CHECKING:
    from .models import Model


@dataclass(frozen=True)
class Step:
    """One round of the loop: what went into the model and which token came out.

    `prob` is the chosen token's probability under the distribution it was drawn from (after temperature,
    top-k, top-p and min-p: sampling.probs_after; 1.0 for greedy). `top` is the raw model's view: the top_n
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
class Generation:
    """The result of `generate`: the tokens, their text, and one Step per round."""

    prompt_ids: list[int]
    new_ids: list[int]                      # the EOS token, when generation stopped there, included
    text: str                               # the new tokens decoded, without the EOS that stopped them
    steps: list[Step]
    stopped: str                            # "eos" | "max_new_tokens"
    cache: KVCache | None = field(default=None, repr=False, compare=False)  # kv_cache=True: keys/values kept

    @property
    def ids(self) -> list[int]:
        """Prompt and new tokens."""
        return self.prompt_ids + self.new_ids

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


@dataclass(frozen=True)
class _Loop:
    """Validated settings of one generation, and the loop that runs it."""

    model: "Model"
    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float
    top_k: int | None
    top_p: float | None
    min_p: float | None
    generator: torch.Generator | None
    cache: KVCache | None
    eos_ids: frozenset[int]                 # empty when stop_at_eos=False
    top_n: int
    head: Tensor | None

    def steps(self) -> Iterator[Step]:
        """Run the rounds, yielding each Step as soon as its token is chosen."""
        ids = list(self.prompt_ids)
        for index in range(1, self.max_new_tokens + 1):
            tic = time.perf_counter()
            # Without a cache every round reruns the whole prefix. With one, only the positions not cached yet:
            # the whole prompt in round 1 (prefill), then the single token chosen in the previous round.
            new = ids if self.cache is None else ids[self.cache.length:]
            trace = forward(self.model, new, self.cache, record=False, last_only=True, head=self.head)
            logits = trace.logits[0]                                                               # [vocab]
            token_id = int(sample(logits, self.temperature, self.top_k, self.top_p, self.min_p, self.generator))
            prob = float(probs_after(logits, self.temperature, self.top_k, self.top_p, self.min_p)[token_id])
            step = Step(index, len(new), len(ids), token_id, self._piece(token_id), prob, self._top(logits),
                        time.perf_counter() - tic)
            ids.append(token_id)
            yield step
            if token_id in self.eos_ids:
                return

    def _top(self, logits: Tensor) -> tuple[tuple[int, str, float], ...]:
        """The top_n tokens of the raw softmax at temperature 1.  # [vocab] -> top_n triples"""
        probs, ids = torch.softmax(logits, dim=-1).topk(self.top_n)
        return tuple((int(i), self._piece(int(i)), float(p)) for p, i in zip(probs, ids))

    def _piece(self, token_id: int) -> str:
        return self.model.tokenizer.pieces([token_id])[0]


def prepare(model: "Model", prompt: str | Sequence[int] | Tensor, max_new_tokens: int, temperature: float,
            top_k: int | None, top_p: float | None, min_p: float | None, seed: int | None,
            generator: torch.Generator | None, kv_cache: bool, chat: bool, stop_at_eos: bool, top_n: int,
            head: Tensor | None) -> _Loop:
    """Check every argument and encode the prompt, before any forward pass."""
    config, tokenizer = model.config, model.tokenizer
    if tokenizer is None:
        raise ValueError(f"{config.name} was loaded without a tokenizer: generate needs one to show its tokens")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1, got {max_new_tokens!r}")
    if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 0:
        raise ValueError(f"top_n must be an int >= 0, got {top_n!r}")
    probs_after(torch.zeros(1), temperature, top_k, top_p, min_p)   # raises sampling's ValueError if one is bad
    if head is not None and head.shape != model.weights.output.shape:
        raise ValueError(f"head has shape {tuple(head.shape)}, expected {tuple(model.weights.output.shape)}: "
                         "make it with decoding_head(model) for this model")
    if seed is not None and generator is not None:
        raise ValueError("pass seed= or generator=, not both")
    if seed is not None:
        generator = torch.Generator().manual_seed(seed)
    if temperature > 0 and generator is None:
        raise ValueError(f"temperature={temperature} samples at random: pass seed= (an int) or generator= so "
                         "the result can be reproduced, or use temperature=0 for greedy decoding")
    if isinstance(prompt, str):
        ids = tokenizer.encode(prompt, chat=chat)
    elif chat:
        raise ValueError("chat=True applies the chat template to text: pass the prompt as a string")
    else:
        ids = prompt
    ids = check_ids(ids, config.vocab_size, config.context_length).tolist()
    total = len(ids) + max_new_tokens
    if total > config.context_length:
        fix = f"shorten the prompt to at most {config.context_length - max_new_tokens} tokens"
        if len(ids) < config.context_length:
            fix += f" or set max_new_tokens <= {config.context_length - len(ids)}"
        raise ValueError(f"prompt of {len(ids)} tokens + max_new_tokens={max_new_tokens} = {total} tokens is longer "
                         f"than {config.name}'s context length of {config.context_length}: {fix}")
    cache = KVCache.empty(config, total) if kv_cache else None
    eos_ids = (frozenset(config.eos_token_ids) | frozenset(tokenizer.eos_token_ids)) if stop_at_eos else frozenset()
    return _Loop(model, ids, max_new_tokens, temperature, top_k, top_p, min_p, generator, cache, eos_ids, top_n,
                 head)


def generate_stream(model: "Model", prompt: str | Sequence[int] | Tensor, max_new_tokens: int = 32,
                    temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
                    min_p: float | None = None, seed: int | None = None, generator: torch.Generator | None = None,
                    kv_cache: bool = True, chat: bool = False, stop_at_eos: bool = True, top_n: int = 5,
                    head: Tensor | None = None) -> Iterator[Step]:
    """`generate`, one Step at a time as each token is chosen (arguments are checked now, not at the first next())."""
    return prepare(model, prompt, max_new_tokens, temperature, top_k, top_p, min_p, seed, generator, kv_cache,
                  chat, stop_at_eos, top_n, head).steps()


def generate(model: "Model", prompt: str | Sequence[int] | Tensor, max_new_tokens: int = 32,
             temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
             min_p: float | None = None, seed: int | None = None, generator: torch.Generator | None = None,
             kv_cache: bool = True, chat: bool = False, stop_at_eos: bool = True, top_n: int = 5,
             head: Tensor | None = None) -> Generation:
    """Continue `prompt` (text, or token ids) by up to max_new_tokens tokens.  # [T] -> Generation

    temperature=0 is greedy; above 0 the token is drawn after top_k / top_p / min_p filtering, and a seed (or
    a torch.Generator) is required so that runs are reproducible. chat=True wraps text in the chat template.
    Stops after an EOS token (kept in new_ids, not in text) unless stop_at_eos=False. kv_cache=False reruns
    the whole prefix every round, as the article's first loop does; the tokens are the same either way.
    head=decoding_head(model), made once and reused, speeds up every token (same numbers, faster memory order).
    """
    loop = prepare(model, prompt, max_new_tokens, temperature, top_k, top_p, min_p, seed, generator, kv_cache,
                  chat, stop_at_eos, top_n, head)
    steps = list(loop.steps())
    new_ids = [s.token_id for s in steps]
    stopped = "eos" if new_ids[-1] in loop.eos_ids else "max_new_tokens"
    text = model.tokenizer.decode(new_ids[:-1] if stopped == "eos" else new_ids)
    return Generation(loop.prompt_ids, new_ids, text, steps, stopped, loop.cache)
