"""Section 九: one walk through the model. `forward` returns a trace holding every intermediate (journey.py times
the walk of one prompt stage by stage)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import torch
from torch import Tensor

from . import fast, fast_decode
from .checks import is_int
from .embedding import position_embedding, rope_angles, token_embedding
from .head import lm_head
from .kv_cache import KVCache
from .layers import READABLE, BlockOut, Hook, block_forward, causal_mask, no_hook, norm
from .weights import Config

if TYPE_CHECKING:
    from .models import Model


@dataclass
class Trace:
    """Everything one forward pass computed, position by position."""

    ids: Tensor                     # [T]
    positions: Tensor               # [T]
    tok_emb: Tensor                 # [T, d_model]
    pos_emb: Tensor | None          # [T, d_model] (GPT-2's learned positions; None with RoPE)
    x0: Tensor                      # [T, d_model] what enters layer 0
    layers: list[BlockOut]          # one per layer (empty when record=False)
    final: Tensor                   # [T, d_model] after the final norm
    logits: Tensor                  # [T, vocab] ([1, vocab] with last_only)
    unchanged: tuple[str, ...] = ()  # hook points whose hook returned the activation it was given, unchanged

    def _recorded(self, what: str) -> list[BlockOut]:
        if not self.layers:
            raise ValueError(f"trace.{what} needs the per-layer intermediates, and this trace was run with "
                             "record=False: run lw.forward(model, ids) (record=True) to keep them")
        return self.layers

    @cached_property
    def resid(self) -> Tensor:
        """Residual stream before layer 0 and after every layer.  # [n_layer + 1, T, d_model]"""
        return torch.stack([self.x0] + [b.resid_post for b in self._recorded("resid")])

    @cached_property
    def attn(self) -> Tensor:
        """Attention weights of every layer and head.  # [n_layer, n_head, T, S]"""
        return torch.stack([b.attn.weights for b in self._recorded("attn")])

    @cached_property
    def ffn_hidden(self) -> Tensor:
        """FFN activations (after the nonlinearity/gate).  # [n_layer, T, d_ff]"""
        return torch.stack([b.ffn_hidden for b in self._recorded("ffn_hidden")])

    @property
    def probs(self) -> Tensor:
        """Next-token distribution at every position.  # [T, vocab]"""
        return torch.softmax(self.logits.float(), dim=-1)


def check_ids(ids: Sequence[int] | Tensor, vocab_size: int, context_length: int, already: int = 0) -> Tensor:
    """Validate token ids and return them as an int64 tensor.  # [T]"""
    kind = type(ids).__name__
    if (type(ids) is list and 0 < len(ids) <= 8 and all(type(i) is int and 0 <= i < vocab_size for i in ids)
            and already + len(ids) <= context_length):
        return torch.tensor(ids, dtype=torch.long)     # a generation round's few new ids: checked in Python, quicker
    try:
        ids = None if isinstance(ids, (str, bytes, bytearray)) else torch.as_tensor(ids)
    except (TypeError, ValueError, RuntimeError):
        if isinstance(ids, (list, tuple)) and all(is_int(i) for i in ids):
            # a list of ints torch could not hold (int64 overflows, e.g. 2**70): a range error, not a type error
            raise ValueError(_outside(next(i for i in ids if not 0 <= i < vocab_size), vocab_size)) from None
        ids = None
    if ids is None or ids.dtype == torch.bool:
        raise TypeError(f"token ids must be a list of ints or an int tensor, got {kind}: "
                        "encode text first, e.g. model.tokenizer.encode('Hello')")
    if ids.numel() == 0:
        raise ValueError("empty token list: encode some text first, e.g. model.tokenizer.encode('Hello')")
    if ids.is_floating_point() or ids.is_complex():     # torch.as_tensor(..., dtype=long) would truncate 1.7 to 1
        raise TypeError(f"token ids must be integers, got {ids.dtype} values such as {ids.flatten()[0].item()!r}: "
                        "convert them with .long() or int() if they really are ids")
    if ids.dim() > 1:
        raise ValueError(f"token ids must be one sequence [T], got shape {tuple(ids.shape)}: llmwalk runs one "
                         "prompt at a time; pass one row, e.g. ids[0]")
    ids = ids.long().reshape(-1)      # a single id (0-d) is a sequence of one
    bad = ids[(ids < 0) | (ids >= vocab_size)]
    if bad.numel():
        raise ValueError(_outside(int(bad[0]), vocab_size))
    if already + ids.numel() > context_length:
        raise ValueError(f"sequence of {already + ids.numel()} tokens is longer than the context length "
                         f"{context_length}: shorten the prompt")
    return ids


def _outside(token_id: int, vocab_size: int) -> str:
    return (f"token id {token_id} is outside the vocabulary [0, {vocab_size}): "
            "were these ids made by another model's tokenizer?")


RECORD_BUDGET = 2 * 2**30   # bytes a recorded trace may take by default: a laptop keeps working


def record_bytes(config: Config, t: int, s: int | None = None, dtype: torch.dtype = torch.float32) -> int:
    """Bytes that forward(record=True) keeps for t new tokens attending to s positions (s = t without a cache).

    Per layer (BlockOut): the T×S attention weights of every head (the part that grows with the square of the
    length), q, k, v and each head's mix, six [T, d_model] vectors and the FFN's [T, d_ff] activations.
    """
    s = t if s is None else s
    h, kv, dh, d = config.n_head, config.n_kv_head, config.d_head, config.d_model
    per_layer = h * t * s + 2 * h * t * dh + 2 * kv * s * dh + 6 * t * d + t * config.d_ff
    return config.n_layer * per_layer * torch.finfo(dtype).bits // 8


def pass_bytes(config: Config, t: int, s: int | None = None, dtype: torch.dtype = torch.float32, *,
               record: bool = True, last_only: bool = False) -> int:
    """Bytes a forward pass keeps: its logits ([t, vocab], [1, vocab] with last_only; for Gemma's 262,144-token
    vocabulary they outweigh everything else) and, when recorded, record_bytes."""
    logits = (1 if last_only else t) * config.vocab_size * torch.finfo(dtype).bits // 8
    return logits + (record_bytes(config, t, s, dtype) if record else 0)


def _check_budget(config: Config, t: int, s: int, dtype: torch.dtype, budget: float | None, *,
                  record: bool, last_only: bool) -> None:
    """Refuse a pass that would keep more than `budget` bytes (pass_bytes), before computing anything."""
    if budget is None:
        return
    if isinstance(budget, bool) or not isinstance(budget, (int, float)) or budget != budget:
        raise TypeError(f"max_record_bytes must be a number of bytes or None (no limit), got {budget!r}: "
                        "e.g. max_record_bytes=4 * 2**30")
    need = pass_bytes(config, t, s, dtype, record=record, last_only=last_only)
    if need <= budget:
        return
    fits = next((n for n in range(t - 1, 0, -1)
                 if pass_bytes(config, n, n, dtype, record=record, last_only=last_only) <= budget), None) \
        if s == t else None
    last = "" if last_only else " (with last_only=True, only the last position's)"
    fixes = [fix for fix, helps in [(f"pass record=False to keep only the logits{last}", record),
                                    ("pass last_only=True to keep only the last position's logits",
                                     not record and not last_only),
                                    (f"use a prompt of at most {fits} token{'s' * (fits != 1)}", fits)] if helps]
    rows = "the last position" if last_only else f"{t} positions"
    what = (f"recording every layer's intermediates for {t} tokens (the {t}×{s} attention weights of "
            f"{config.n_layer} layers × {config.n_head} heads) and their logits" if record
            else f"the logits of {rows} × {config.vocab_size} tokens")
    raise ValueError(f"{what} would keep {_size(need)}, more than max_record_bytes={_size(budget)}: "
                     f"{''.join(f + ', ' for f in fixes)}{'or ' * bool(fixes)}raise max_record_bytes (None: no limit) "
                     "if the machine has the memory")


def _size(n: float) -> str:
    return f"{n / 2**30:.1f} GB" if abs(n) >= 2**30 / 10 else f"{n / 2**20:.1f} MB"


def check_head(model: "Model", head: Tensor | None) -> None:
    """A replacement LM head must be the model's own table in another memory order (generation.decoding_head)."""
    if head is None:
        return
    if not isinstance(head, Tensor) or head.shape != model.weights.output.shape:
        got = tuple(head.shape) if isinstance(head, Tensor) else type(head).__name__
        raise ValueError(f"head is {got}, expected a tensor of shape {tuple(model.weights.output.shape)}: "
                         "make it with decoding_head(model) for this model")


def _check_cache(config: Config, cache: KVCache | None) -> None:
    """A cache holds one model's keys: as many layers, key heads and head size as this model's."""
    if cache is None:
        return
    if not isinstance(cache, KVCache):
        raise TypeError(f"cache must be a KVCache, got {type(cache).__name__}: "
                        "make one with lw.KVCache.empty(model.config, capacity)")
    keys = cache.layers[0].keys if cache.layers else None
    heads = (keys.shape[0], keys.shape[2]) if keys is not None else (config.n_kv_head, config.d_head)
    if len(cache.layers) != config.n_layer or heads != (config.n_kv_head, config.d_head):
        raise ValueError(f"this KV cache was made for another model ({len(cache.layers)} layers, {heads[0]} key "
                         f"heads of size {heads[1]}; {config.name} has {config.n_layer}, {config.n_kv_head} and "
                         f"{config.d_head}): make one with lw.KVCache.empty(model.config, capacity)")


@torch.inference_mode()
def forward(model: "Model", ids: Sequence[int] | Tensor, cache: KVCache | None = None,
            record: bool = True, last_only: bool = False, head: Tensor | None = None, *,
            hooks: Mapping[str, Callable[[Tensor], Tensor]] | None = None,
            max_record_bytes: int | None = RECORD_BUDGET) -> Trace:
    """Run token ids through the whole model.  # [T] -> Trace (logits [T, vocab])

    With a `cache`, `ids` are the new positions only: they attend to the cached ones, and the cache grows.
    record=False keeps no per-layer intermediates (for fast generation) and so runs the blocks with fast.FAST,
    which never stores the attention weights, or, for one new token after a cache with no hooks, the compiled step
    of fast_decode.py; last_only computes logits for the last position only. `head`
    replaces weights.output in the LM head: the same [vocab, d_model] numbers stored in another memory order
    (generation.decoding_head).
    `hooks` maps a hook point "blocks.{i}.{point}" (see layers.block_forward) or "final_norm" (what the LM head
    reads) to a function that returns the activation to use instead: the model then runs on (and the trace records)
    what the hook returned. A pass that would keep more than `max_record_bytes` (pass_bytes: the logits, and the
    intermediates when recorded) is refused before it starts. trace.unchanged names the hooks that returned what
    they were given.
    """
    config, w = model.config, model.weights
    _check_cache(config, cache)
    check_head(model, head)
    start = cache.length if cache is not None else 0
    ids = check_ids(ids, config.vocab_size, config.context_length, start)
    t = ids.numel()
    _check_budget(config, t, start + t, w.token_embd.dtype, max_record_bytes, record=record, last_only=last_only)
    unchanged: list[str] = []
    hooked, final_hook = parse_hooks(hooks, config.n_layer, unchanged)
    positions = torch.arange(start, start + t)
    if not record and fast_decode.can_step(model, t, cache, head, hooks):       # one token after the prompt
        x0, final, logits = (torch.from_numpy(a)[None] for a in fast_decode.step(model, int(ids[0]), cache, head))
        return Trace(ids, positions, x0, None, x0, [], final, logits)

    tok = token_embedding(ids, w.token_embd, config.embed_scale)
    pos = position_embedding(positions, w.position_embd) if config.position == "learned" else None
    x = x0 = tok + pos if pos is not None else tok
    # RoPE angles depend only on position and the layer's base: computed once per distinct base.
    ropes = {theta: rope_angles(positions, config.d_head, theta)
             for theta in {config.theta(i) for i in range(config.n_layer)}} if config.position == "rope" else {}
    masks = fast.masks(config, t, start) if not record else \
        {win: causal_mask(t, start + t, win) for win in {config.window(i) for i in range(config.n_layer)}}
    layers = []
    for i, block in enumerate(w.blocks):
        out = block_forward(x, block, config, masks[config.window(i)], ropes.get(config.theta(i)),
                            cache.layers[i] if cache is not None else None, hooked[i],
                            stages=READABLE if record else fast.FAST)
        x = out.resid_post
        if record:
            layers.append(out)
    final = final_hook(norm(x[-1:] if last_only else x, w.output_norm, config))
    logits = (lm_head if record else fast.lm_head)(final, w.output if head is None else head)
    return Trace(ids, positions, tok, pos, x0, layers, final, logits, tuple(unchanged))


HOOK_POINTS = ("resid_pre", "attn.z", "attn_out", "ffn_out", "resid_post")   # in every layer, "blocks.{i}.{point}"
FINAL_NORM = "final_norm"                                                  # after the final norm, once per pass


def parse_hooks(hooks: Mapping[str, Callable[[Tensor], Tensor]] | None, n_layer: int,
                unchanged: list[str]) -> tuple[list[Hook], Callable[[Tensor], Tensor]]:
    """From {"blocks.{i}.{point}" or "final_norm": fn}: one (point, activation) -> activation hook per layer
    (layers.no_hook where unhooked) and the final norm's activation -> activation.

    The names of hooks that return their activation unchanged are appended to `unchanged`.
    """
    if hooks is not None and not isinstance(hooks, Mapping):
        raise TypeError(f"hooks must be a dict {{'blocks.{{i}}.{{point}}': function}}, got {type(hooks).__name__}: "
                        "e.g. hooks=iv.ablate_head(23, 4)")
    per_layer: list[dict] = [{} for _ in range(n_layer)]
    final = {}
    for name, fn in (hooks or {}).items():
        parts = name.split(".", 2) if isinstance(name, str) else []
        if name != FINAL_NORM and (len(parts) != 3 or parts[0] != "blocks" or not parts[1].isdigit()
                                   or int(parts[1]) >= n_layer or parts[2] not in HOOK_POINTS):
            raise ValueError(f"unknown hook point {name!r}: use 'blocks.{{i}}.{{point}}' with 0 <= i < {n_layer} "
                             f"and point one of {', '.join(HOOK_POINTS)}, or {FINAL_NORM!r}")
        if not callable(fn):
            raise TypeError(f"hook {name!r} is a {type(fn).__name__}, not a function: pass a function that takes "
                            "the activation and returns the one to use instead, e.g. lambda a: a * 0")
        where, point = (final, name) if name == FINAL_NORM else (per_layer[int(parts[1])], parts[2])
        where[point] = _checked(name, fn, unchanged)
    layer_hooks = [(lambda point, a, h=h: h[point](a) if point in h else a) if h else no_hook for h in per_layer]
    return layer_hooks, final.get(FINAL_NORM, lambda a: a)


def _checked(name: str, fn: Callable[[Tensor], Tensor], unchanged: list[str]) -> Callable[[Tensor], Tensor]:
    """fn, given a copy of the activation (an in-place change must not rewrite what the trace recorded before
    the hook), and its answer checked: a tensor of the same shape and dtype, noted in `unchanged` if equal."""
    def hook(a: Tensor) -> Tensor:
        out = fn(a.clone())
        if not isinstance(out, Tensor) or out.shape != a.shape or out.dtype != a.dtype:
            got = f"{tuple(out.shape)} {out.dtype}" if isinstance(out, Tensor) else type(out).__name__
            raise ValueError(f"hook {name!r} returned {got}, expected a tensor like its input, {tuple(a.shape)} "
                             f"{a.dtype}: return the activation to use instead (modified, or a new one of that shape)")
        if torch.equal(out, a):
            unchanged.append(name)
        return out
    return hook
