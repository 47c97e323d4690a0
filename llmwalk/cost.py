"""Section 八: what one inference costs — parameters, FLOPs per stage and memory, counted from the config alone.

A FLOP here is one multiply or one add, so a multiply-add costs 2: an [m, k] @ [k, n] product is 2·m·k·n FLOPs.
Matrix products are counted exactly as llmwalk's `forward` executes them; norms are counted approximately
(a few FLOPs per element); softmax, activations, RoPE, bias and residual additions are not counted: they are
O(T·d) or O(T·S·n_head) and disappear next to the matrix products.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Sequence, TypeVar

from torch import Tensor

from . import fast_decode
from .checks import is_int
from .kv_cache import KVCache
from .walk import forward
from .weights import Config

if TYPE_CHECKING:
    from .models import Model

R = TypeVar("R")

BITS = {"fp32": 32, "fp16": 16, "bf16": 16, "int8": 8, "int4": 4}
NORM_FLOPS = {"rmsnorm": 4, "layernorm": 8}   # per element: square/subtract, sum, scale, multiply (approximate)
GPT2_SIZES = {"small": (12, 768, 12), "medium": (24, 1024, 16), "large": (36, 1280, 20), "xl": (48, 1600, 25)}


def _count(name: str, value, least: int = 0) -> None:
    """A ValueError unless `value` is an int >= least: a negative count gives a negative FLOP or byte count."""
    if not is_int(value) or value < least:
        raise ValueError(f"{name} must be an int >= {least} (a number of tokens), got {value!r}")


def _choice(name: str, value, table: dict) -> None:
    if value not in table:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, table))}, got {value!r}")


def gpt2_config(size: str = "small") -> Config:
    """The published GPT-2 architecture (no weights needed): small, medium, large or xl."""
    _choice("size", size, GPT2_SIZES)
    n_layer, d_model, n_head = GPT2_SIZES[size]
    return _with_n_params(Config(name=f"gpt2-{size}", family="gpt2", n_layer=n_layer, n_head=n_head, n_kv_head=n_head,
                  d_model=d_model, d_head=d_model // n_head, d_ff=4 * d_model, vocab_size=50257,
                  context_length=1024, norm="layernorm", norm_eps=1e-5, position="learned", ffn="gelu",
                  tied_embeddings=True))


def gpt2_small(model: "Model | None" = None) -> Config:
    """GPT-2 small's config: the model's own when the model is GPT-2 small (online), else the published architecture.

    Checked by shape, not by family: a gpt2-medium model is not GPT-2 small."""
    c = getattr(model, "config", None)
    if c is not None and c.family == "gpt2" and (c.n_layer, c.d_model, c.n_head) == GPT2_SIZES["small"]:
        return c
    return gpt2_config("small")


def llama7b_config() -> Config:
    """LLaMA-7B (Touvron et al. 2023): 32 layers, d_model 4096, 32 heads, d_ff 11008, vocab 32000, untied head."""
    return _with_n_params(Config(name="llama-7b", family="llama", n_layer=32, n_head=32, n_kv_head=32, d_model=4096, d_head=128,
                  d_ff=11008, vocab_size=32000, context_length=2048, norm="rmsnorm", norm_eps=1e-6,
                  position="rope", ffn="swiglu", tied_embeddings=False))


def _with_n_params(config: Config) -> Config:
    """The config with n_params filled in from the architecture."""
    return replace(config, n_params=n_params(config))


# ---------------------------------------------------------------- parameters

def block_matrices(config: Config) -> dict[str, tuple[int, int]]:
    """(d_in, d_out) of every weight matrix of one layer, by llmwalk's Block field name."""
    d, q, kv = config.d_model, config.n_head * config.d_head, config.n_kv_head * config.d_head
    ffn = {"ffn_up": (d, config.d_ff), "ffn_down": (config.d_ff, d)}
    if config.ffn != "gelu":                     # gated FFNs (SwiGLU, GeGLU) have a third matrix
        ffn = {"ffn_gate": (d, config.d_ff), **ffn}
    return {"attn_q": (d, q), "attn_k": (d, kv), "attn_v": (d, kv), "attn_output": (q, d), **ffn}


def _norm_params(config: Config, d: int) -> int:
    """A LayerNorm has a scale and a shift per element, an RMSNorm only a scale."""
    return d * (2 if config.norm == "layernorm" else 1)


def _block_params(config: Config) -> int:
    """Parameters of one layer: matrices, biases (GPT-2 only), norms."""
    mats = block_matrices(config).values()
    biases = sum(d_out for _, d_out in mats) if config.family == "gpt2" else 0
    norms = (4 if config.sandwich_norm else 2) * _norm_params(config, config.d_model)
    qk_norms = 2 * _norm_params(config, config.d_head) if config.qk_norm else 0
    return sum(i * o for i, o in mats) + biases + norms + qk_norms


def n_params(config: "Config | Model") -> int:
    """Parameter count from the architecture: token table, position table, layers, final norm, untied head."""
    config = getattr(config, "config", config)                 # a Model, as weight_bytes takes
    table = config.vocab_size * config.d_model
    positions = config.context_length * config.d_model if config.position == "learned" else 0
    head = 0 if config.tied_embeddings else table
    return (table + positions + config.n_layer * _block_params(config)
            + _norm_params(config, config.d_model) + head)


# ---------------------------------------------------------------- FLOPs

def embedding_lookups(config: Config, tokens: int) -> int:
    """Rows read from embedding tables (0 FLOPs: a lookup is a copy): one per token, two with learned positions."""
    _count("tokens", tokens)
    return tokens * (2 if config.position == "learned" else 1)


def flops_by_stage(config: Config, tokens: int, cached: int = 0, last_only: bool = False) -> dict[str, int]:
    """FLOPs of one `forward` over `tokens` new positions with `cached` positions in the KV cache, by stage, in
    the order the stages run (the bars of viz.flops_bars read top to bottom).

    Summed over all layers. Each query scores all S = cached + tokens keys: llmwalk computes the full
    [T, S] score matrix and masks the future afterwards (a causal kernel would skip about half of it at prefill).
    last_only: the LM head runs on the last position only (what generation needs).
    """
    _count("tokens", tokens, 1)
    _count("cached", cached)
    c, s, L = config, cached + tokens, config.n_layer
    heads = 2 * L * c.n_head * c.d_head * tokens * s             # q·k for every (query, key, head); again for Σ w·v
    out = 1 if last_only else tokens
    norm_elems = (L * (4 if c.sandwich_norm else 2) * tokens * c.d_model + out * c.d_model
                  + (L * (c.n_head + c.n_kv_head) * tokens * c.d_head if c.qk_norm else 0))
    stages = {"embedding": 0}
    for name, (d_in, d_out) in block_matrices(c).items():
        if name == "attn_output":                                # scores and mixing run before the output projection
            stages.update(attn_scores=heads, attn_mix=heads)
        stages[name] = 2 * L * tokens * d_in * d_out
    return {**stages, "norms": NORM_FLOPS[c.norm] * norm_elems, "lm_head": 2 * out * c.d_model * c.vocab_size}


def matmul_flops(stages: dict[str, int]) -> int:
    """The part of a stage table made of matrix products: what FlopCounterMode measures."""
    return sum(v for k, v in stages.items() if k != "norms")


def decode_step_flops(config: Config, context: int, kv_cache: bool = True) -> dict[str, int]:
    """FLOPs to get the next token's logits once the sequence holds `context` positions.

    With a KV cache only the newest position runs (the others' keys and values are kept); without one the
    whole prefix is recomputed.
    """
    _count("context", context, 1)
    if kv_cache:
        return flops_by_stage(config, 1, cached=context - 1, last_only=True)
    return flops_by_stage(config, context, last_only=True)


def round_flops(config: Config, prompt_len: int, new_tokens: int, kv_cache: bool = True) -> list[int]:
    """FLOPs of each round of generation, one round per new token. With a cache round 1 runs the whole prompt
    (prefill) and every later round one token; without one, round k runs the prompt and the k − 1 tokens so far."""
    _count("prompt_len", prompt_len, 1)
    _count("new_tokens", new_tokens)
    if kv_cache:
        return ([sum(flops_by_stage(config, prompt_len, last_only=True).values())] * (new_tokens >= 1)
                + [sum(decode_step_flops(config, prompt_len + k).values()) for k in range(1, new_tokens)])
    return [sum(decode_step_flops(config, prompt_len + k, kv_cache=False).values()) for k in range(new_tokens)]


def generation_flops(config: Config, prompt_len: int, new_tokens: int, kv_cache: bool = True) -> int:
    """Total FLOPs to generate `new_tokens` after a prompt: one pass per new token (the last needs none after it)."""
    return sum(round_flops(config, prompt_len, new_tokens, kv_cache))


def article_estimate(config: Config, prompt_len: int = 9, new_tokens: int = 50) -> dict[str, int]:
    """The article's rule (one forward ≈ 3 × parameters, an answer ≈ N × that) next to the real counts."""
    layers = config.n_layer * sum(i * o for i, o in block_matrices(config).values())
    return {"params": n_params(config),
            "article_flops_per_token": 3 * n_params(config),
            # a token meets every matrix weight (layers and head) in one multiply-add
            "two_x_matmul_params": 2 * (layers + config.vocab_size * config.d_model),
            "flops_per_token": sum(decode_step_flops(config, prompt_len).values()),   # cached, at context P
            "article_flops_answer": new_tokens * 3 * n_params(config),
            "flops_answer_kv_cache": generation_flops(config, prompt_len, new_tokens, kv_cache=True),
            "flops_answer_no_cache": generation_flops(config, prompt_len, new_tokens, kv_cache=False)}


def count_flops(fn: Callable[[], R]) -> tuple[int, R]:
    """(FLOPs torch counts while fn runs, what fn returns), by torch.utils.flop_counter.FlopCounterMode.

    FlopCounterMode counts matrix products only (mm, bmm, addmm, ...: 2 per multiply-add); norms, softmax,
    activations and additions are not counted. Compare it with `matmul_flops(flops_by_stage(...))`. It does
    not know torch's int8 kernel either: measure fp32 (or bf16) models. It sees only torch's operations, so a
    generation's one-token steps run as torch's operations here (fast_decode.off), not compiled.
    """
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as counter, fast_decode.off():
        out = fn()
    return counter.get_total_flops(), out


def measured_flops(model: "Model", ids: Sequence[int] | Tensor, cache: KVCache | None = None,
                   last_only: bool = False) -> int:
    """FLOPs torch counts while llmwalk's `forward` runs once (`count_flops`), on the readable path.

    record=True: the unrecorded fast path hands attention to torch's fused kernel, whose products
    FlopCounterMode does not count; the readable path computes the same numbers with plain matrix products.
    """
    return count_flops(lambda: forward(model, ids, cache=cache, record=True, last_only=last_only))[0]


def _prefilled(model: "Model", ids: Sequence[int]) -> KVCache:
    """A KV cache holding every position of `ids` but the last: one round of generation is left to run."""
    cache = KVCache.empty(model.config, len(ids))
    forward(model, list(ids)[:-1], cache, record=False, last_only=True)
    return cache


def decode_step_measured(model: "Model", ids: Sequence[int]) -> int:
    """FLOPs torch counts for the last of `ids`, the ones before it in the KV cache (one round of generation)."""
    return measured_flops(model, list(ids)[-1:], _prefilled(model, ids), last_only=True)


def kv_cache_check(model: "Model", ids: Sequence[int]) -> dict:
    """The last of `ids`, with the others' keys and values cached vs all recomputed.

    Returns the FLOPs torch counts each way, the largest logit difference, whether the next token is the same,
    and the bytes the cache holds.
    """
    ids = list(ids)
    cache = _prefilled(model, ids)
    # record=True: the readable path, whose products torch's counter sees (measured_flops)
    cached, a = count_flops(lambda: forward(model, ids[-1:], cache, last_only=True).logits[-1])
    full, b = count_flops(lambda: forward(model, ids, last_only=True).logits[-1])
    return {"context": len(ids), "flops_cached": cached, "flops_recomputed": full,
            "max_logit_diff": float((a - b).abs().max()), "same_token": int(a.argmax()) == int(b.argmax()),
            "cache_bytes": cache.nbytes()}


# ---------------------------------------------------------------- memory

def weight_bytes(config: "Config | Model", dtype: str = "fp32", group_size: int | None = None,
                 scale_bytes: int = 2, zero_bytes: int = 0, quantize_embeddings: bool = False) -> int:
    """Bytes to store the weights in fp32/bf16/fp16, or with int8/int4 matrices.

    int formats: each layer matrix [d_in, d_out] stores bits/8 per weight plus, per output column and group of
    `group_size` rows (one group when None), a scale (`scale_bytes`; GGUF uses fp16) and a zero point
    (`zero_bytes`: 0 when symmetric). Norms, biases and — unless quantize_embeddings — the token table and
    head stay fp32, as `quantize_model` keeps them.
    """
    config = getattr(config, "config", config)
    _choice("dtype", dtype, BITS)
    if BITS[dtype] >= 16:
        return n_params(config) * BITS[dtype] // 8
    mats = [m for m in block_matrices(config).values() for _ in range(config.n_layer)]
    if quantize_embeddings:
        mats += [(config.d_model, config.vocab_size)] * (1 if config.tied_embeddings else 2)
    quantized = sum(i * o * BITS[dtype] // 8 + (i // (group_size or i)) * o * (scale_bytes + zero_bytes)
                    for i, o in mats)
    return quantized + 4 * (n_params(config) - sum(i * o for i, o in mats))
