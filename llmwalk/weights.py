"""The model as data: a config of the numbers the article talks about, and frozen weight containers.

Tensor names follow the GGUF checkpoint names (token_embd, attn_q, ffn_gate, ...), the same for all three
families. Linear weights are stored as [d_in, d_out] so that a layer is `x @ w` (the maths of the article,
and GPT-2's own Conv1D layout); the LM head `output` is [vocab, d_model] because it is (or is tied to) the
token embedding table.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, fields, replace
from typing import Iterator, Literal, get_args

import torch
from torch import Tensor

NormKind = Literal["layernorm", "rmsnorm"]
PositionKind = Literal["learned", "rope"]
FfnKind = Literal["gelu", "swiglu", "geglu"]       # GPT-2's MLP | Llama's gated SiLU | Gemma's gated GELU


@dataclass(frozen=True)
class Config:
    """Architecture of one model: the switches that tell GPT-2, Llama (SmolLM2) and Gemma-3 apart."""

    name: str
    family: str                 # the checkpoint's architecture: "gpt2", "llama", "mistral", "qwen2", "gemma3"
    n_layer: int
    n_head: int
    n_kv_head: int              # < n_head: grouped-query attention (GQA)
    d_model: int
    d_head: int
    d_ff: int
    vocab_size: int
    context_length: int
    norm: NormKind
    norm_eps: float
    position: PositionKind
    ffn: FfnKind
    tied_embeddings: bool
    rope_theta: float = 10000.0
    rope_theta_local: float | None = None       # Gemma-3: sliding-window layers use another base
    sliding_window: int | None = None
    global_layers: tuple[int, ...] = ()         # layers with full attention when there is a window; the rest slide
    embed_scale: float = 1.0                    # Gemma-3 multiplies embeddings by sqrt(d_model)
    qk_norm: bool = False                       # Gemma-3: RMSNorm on each head's q and k
    sandwich_norm: bool = False                 # Gemma-3: extra norm after attention and after FFN
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    n_params: int = 0                           # counted from the weights when loaded

    def __post_init__(self):
        for name, kind in (("norm", NormKind), ("position", PositionKind), ("ffn", FfnKind)):
            allowed = get_args(kind)
            if getattr(self, name) not in allowed:
                raise ValueError(f"Config.{name} is {getattr(self, name)!r}; allowed: {', '.join(map(repr, allowed))}")
        for name in ("n_layer", "n_head", "n_kv_head", "d_model", "d_head", "d_ff", "vocab_size", "context_length"):
            if not isinstance(getattr(self, name), numbers.Integral) or getattr(self, name) < 1:
                raise ValueError(f"Config.{name} must be a positive int, got {getattr(self, name)!r}")
        for name in ("norm_eps", "rope_theta") + (("rope_theta_local",) if self.rope_theta_local is not None else ()):
            value = getattr(self, name)      # a string here would pass until torch refused it mid-forward
            if not isinstance(value, numbers.Real) or isinstance(value, bool) or not 0 < value < float("inf"):
                raise TypeError(f"Config.{name} of {self.name!r} must be a positive finite number, got {value!r}: "
                                "fix it in the model's config (e.g. rms_norm_eps: 1e-06, not \"1e-06\")")
        if self.n_head % self.n_kv_head:
            raise ValueError(f"Config.n_head={self.n_head} must be a multiple of n_kv_head={self.n_kv_head} "
                             "(each key/value head serves a whole group of query heads)")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"Config.sliding_window must be None or >= 1, got {self.sliding_window}")
        if any(not 0 <= i < self.n_layer for i in self.global_layers):
            raise ValueError(f"Config.global_layers {self.global_layers} must be layer indices in [0, {self.n_layer})")

    @property
    def norm_name(self) -> str:
        """The norm as papers write it: "LayerNorm" (GPT-2) or "RMSNorm" (Llama, Gemma)."""
        return {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}[self.norm]

    @property
    def scale(self) -> float:
        """Factor applied to q·k before softmax: 1/sqrt(d_head) in every supported model."""
        return self.d_head ** -0.5

    def window(self, layer: int) -> int | None:
        """How many past positions layer `layer` may see (None: all of them)."""
        if self.sliding_window is None or layer in self.global_layers:
            return None
        return self.sliding_window

    def theta(self, layer: int) -> float:
        """RoPE base frequency of layer `layer`."""
        if self.rope_theta_local is not None and self.window(layer) is not None:
            return self.rope_theta_local
        return self.rope_theta


@dataclass(frozen=True)
class Norm:
    """LayerNorm (weight and bias) or RMSNorm (weight only); weight is the multiplicative scale."""

    weight: Tensor              # [d]
    bias: Tensor | None = None  # [d]


@dataclass(frozen=True)
class Linear:
    """y = x @ weight + bias."""

    weight: Tensor              # [d_in, d_out]
    bias: Tensor | None = None  # [d_out]


@dataclass(frozen=True)
class Block:
    """One transformer layer."""

    attn_norm: Norm
    attn_q: Linear              # [d_model, n_head * d_head]
    attn_k: Linear              # [d_model, n_kv_head * d_head]
    attn_v: Linear              # [d_model, n_kv_head * d_head]
    attn_output: Linear         # [n_head * d_head, d_model]
    ffn_norm: Norm
    ffn_up: Linear              # [d_model, d_ff]
    ffn_down: Linear            # [d_ff, d_model]
    ffn_gate: Linear | None = None              # gated FFN (SwiGLU / GeGLU) only
    attn_q_norm: Norm | None = None             # Gemma-3 QK-norm, [d_head]
    attn_k_norm: Norm | None = None
    post_attention_norm: Norm | None = None     # Gemma-3 sandwich norms
    post_ffw_norm: Norm | None = None


@dataclass(frozen=True)
class Weights:
    """All parameters of a model."""

    token_embd: Tensor                  # [vocab, d_model]
    blocks: tuple[Block, ...]
    output_norm: Norm
    output: Tensor                      # [vocab, d_model]; the same object as token_embd when tied
    position_embd: Tensor | None = None  # [context_length, d_model], GPT-2 only


def check_weights(config: Config, weights: Weights) -> None:
    """Raise a ValueError when the weights do not have the parts and shapes the config describes.

    The forward pass branches on which tensors exist (a q/k norm, a gate, position vectors), while cost and claims
    read the config's switches: loading checks that the two tell the same story.
    """
    c, w = config, weights
    problems = []

    def expect(what: str, tensor, shape) -> None:
        got = None if tensor is None else tuple(tensor.shape)
        if got != shape:
            problems.append(f"{what} is {'missing' if got is None else list(got)}, expected "
                            f"{'none' if shape is None else list(shape)}")

    d, q_dim, kv_dim = c.d_model, c.n_head * c.d_head, c.n_kv_head * c.d_head
    norm_bias = (d,) if c.norm == "layernorm" else None
    expect("token_embd", w.token_embd, (c.vocab_size, d))
    expect("output", w.output, (c.vocab_size, d))
    expect("position_embd", w.position_embd, (c.context_length, d) if c.position == "learned" else None)
    expect("output_norm.weight", w.output_norm.weight, (d,))
    expect("output_norm.bias", w.output_norm.bias, norm_bias)
    if c.tied_embeddings != (w.output is w.token_embd):
        problems.append(f"tied_embeddings={c.tied_embeddings} but the LM head is "
                        f"{'' if w.output is w.token_embd else 'not '}the embedding table")
    if len(w.blocks) != c.n_layer:
        problems.append(f"{len(w.blocks)} blocks for n_layer={c.n_layer}")
    for i, b in enumerate(w.blocks):
        for name, lin, shape in (("attn_q", b.attn_q, (d, q_dim)), ("attn_k", b.attn_k, (d, kv_dim)),
                                 ("attn_v", b.attn_v, (d, kv_dim)), ("attn_output", b.attn_output, (q_dim, d)),
                                 ("ffn_up", b.ffn_up, (d, c.d_ff)), ("ffn_down", b.ffn_down, (c.d_ff, d)),
                                 ("ffn_gate", b.ffn_gate, (d, c.d_ff) if c.ffn != "gelu" else None)):
            expect(f"blocks.{i}.{name}.weight", None if lin is None else lin.weight, shape)
            if lin is not None and lin.bias is not None:
                expect(f"blocks.{i}.{name}.bias", lin.bias, (shape[1],))
        norms = [("attn_norm", b.attn_norm, d, True), ("ffn_norm", b.ffn_norm, d, True),
                 ("attn_q_norm", b.attn_q_norm, c.d_head, c.qk_norm),
                 ("attn_k_norm", b.attn_k_norm, c.d_head, c.qk_norm),
                 ("post_attention_norm", b.post_attention_norm, d, c.sandwich_norm),
                 ("post_ffw_norm", b.post_ffw_norm, d, c.sandwich_norm)]
        for name, n, size, present in norms:
            expect(f"blocks.{i}.{name}.weight", None if n is None else n.weight, (size,) if present else None)
    if problems:
        raise ValueError(f"the weights of {c.name} do not match its config: {'; '.join(problems[:5])}"
                         + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""))


def tensors(obj) -> Iterator[tuple[str, Tensor]]:
    """Yield (dotted name, tensor) for every tensor in a weights container, depth first."""
    if isinstance(obj, Tensor):
        yield "", obj
    elif isinstance(obj, tuple):
        for i, item in enumerate(obj):
            for name, t in tensors(item):
                yield f"{i}.{name}".rstrip("."), t
    elif obj is not None:
        for f in fields(obj):
            if f.metadata.get("view"):          # a reference into tensors held elsewhere (QuantizedTensor.fused)
                continue
            for name, t in tensors(getattr(obj, f.name)):
                yield f"{f.name}.{name}".rstrip("."), t


def count_params(weights: Weights) -> int:
    """Number of parameters, counting a tied tensor once."""
    seen: dict[int, int] = {}
    for _, t in tensors(weights):
        seen[id(t)] = t.numel()
    return sum(seen.values())


def map_tensors(obj, fn):
    """Return a copy of a weights container with fn applied to every tensor (tied tensors stay tied)."""
    memo: dict[int, Tensor] = {}

    def go(o):
        if isinstance(o, Tensor):
            if id(o) not in memo:
                memo[id(o)] = fn(o)
            return memo[id(o)]
        if isinstance(o, tuple):
            return tuple(go(x) for x in o)
        if o is None:
            return None
        # a view into other tensors (QuantizedTensor.fused) is dropped: it would still point at the unmapped ones
        return replace(o, **{f.name: None if f.metadata.get("view") else go(getattr(o, f.name)) for f in fields(o)})

    return go(obj)


def to_dtype(weights: Weights, dtype: torch.dtype) -> Weights:
    """The same weights in another float dtype (e.g. torch.bfloat16)."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"to_dtype needs a float dtype (torch.float32, torch.bfloat16, torch.float16), got {dtype!r}: "
                        "for integer weights use lw.quantize_model(model, bits=8)")
    return map_tensors(weights, lambda t: t.to(dtype))
