"""How far a changed model (quantized, bf16, cut to its first layers) is from the full fp32 one.

Every measure compares next-token distributions on a real text: KL divergence, how often the most likely token is
the same, and perplexity. They are properties of the weights, not of the kernel that multiplies them: measure them
on a model whose rounded weights are dequantized to fp32 (`quantize.dequantize_model`) and the numbers hold on
every CPU, to the digits a float sum keeps.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from importlib.resources import files
from typing import TYPE_CHECKING, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .checks import is_int
from .quantize import (LINEARS, dequantize_model, model_weight_bytes, quantize_activations, quantize_model,
                       to_float)
from .walk import Trace, forward
from .weights import to_dtype

if TYPE_CHECKING:
    from .models import Model

EVAL_TEXT = "data/eval_text.txt"
EVAL_TOKENS = 256    # accuracy is measured on the shipped text's first 256 tokens
FORMATS = ("bf16", "int8", "int4 g32 symmetric", "int4 g32 asymmetric", "int8 weights + int8 activations")


def eval_text() -> str:
    """The evaluation text shipped with llmwalk (an original ~800-word explanation of how Paris became a capital)."""
    return files("llmwalk").joinpath(EVAL_TEXT).read_text(encoding="utf-8")


def eval_ids(model: "Model", n: int = EVAL_TOKENS) -> list[int]:
    """The first n token ids of the shipped text, the text repeated when it is shorter than n tokens.  # -> [n]"""
    if not is_int(n) or n < 1:
        raise ValueError(f"n must be an int >= 1 (a number of tokens), got {n!r}")
    one = model.tokenizer.encode(eval_text())
    return (one * (n // len(one) + 1))[:n]


def log_probs(model: "Model", ids: Sequence[int]) -> Tensor:
    """Next-token log-probabilities at every position.  # [T] -> [T, vocab]"""
    return F.log_softmax(forward(model, list(ids), record=False).logits.float(), dim=-1)


def token_nll(log_p: Tensor, ids: Sequence[int]) -> Tensor:
    """−log p(actual next token) at every position but the last: entry i is −log p(ids[i + 1] | ids[:i + 1]).
    # [T, vocab] -> [T - 1]"""
    return -log_p[:-1].gather(1, torch.tensor(list(ids[1:]))[:, None])[:, 0]


def kl_divergence(log_p: Tensor, log_q: Tensor) -> Tensor:
    """KL(p ‖ q) = Σ p · (log p − log q) per position, in nats: 0 when the distributions agree.  # [T, V] x2 -> [T]"""
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def top1_agreement(log_p: Tensor, log_q: Tensor) -> Tensor:
    """Whether both pick the same most likely next token, per position.  # [T, V] x2 -> [T] bool"""
    return log_p.argmax(-1) == log_q.argmax(-1)


def _chunks(ids: Sequence[int], size: int) -> list[list[int]]:
    """Consecutive pieces of at most `size` tokens; each is scored on its own (no context carried over)."""
    return [list(ids[i:i + size]) for i in range(0, len(ids), size)]


def _eval_chunks(model: "Model", text: str | None, chunk: int) -> list[list[int]]:
    """The text's tokens (the shipped text when None) in chunks; a ValueError when nothing would be predicted."""
    if not is_int(chunk) or chunk < 2:
        raise ValueError(f"chunk must be an int >= 2 (a chunk of one token predicts nothing), got {chunk!r}")
    if text is not None and not text:
        raise ValueError("text is empty: pass a text of two tokens or more, or text=None for the shipped eval_text()")
    ids = model.tokenizer.encode(eval_text() if text is None else text)
    if len(ids) < 2:
        raise ValueError(f"text {text!r} is only {len(ids)} token long: a score needs a next token to predict, "
                         "pass a longer text")
    return _chunks(ids, chunk)


def perplexity(model: "Model", text: str | None = None, chunk: int = 512) -> float:
    """exp(mean −log p(next token)) over the text, in chunks of at most `chunk` tokens."""
    parts = _eval_chunks(model, text, chunk)
    return float(torch.cat([token_nll(log_probs(model, p), p) for p in parts]).mean().exp())


@dataclass(frozen=True)
class Comparison:
    """How far a changed model is from the fp32 one, on one text."""

    weight_bytes: int
    fp32_weight_bytes: int
    weight_error: list[dict]    # per layer: max and mean |w − w_fp32| over its matrices
    kl_mean: float              # KL(p_fp32 ‖ p) of the next-token distributions, mean over positions
    kl_max: float
    top1_agreement: float       # fraction of positions where both pick the same most likely next token
    perplexity_fp32: float
    perplexity: float
    n_tokens: int


def layer_weight_errors(model: "Model", other: "Model") -> list[dict]:
    """Per layer, max and mean |w − w_fp32| over all its matrices (quantized weights dequantized)."""
    rows = []
    for i, (a, b) in enumerate(zip(model.weights.blocks, other.weights.blocks)):
        errs = torch.cat([(to_float(getattr(b, n).weight).float() - getattr(a, n).weight).abs().flatten()
                          for n in LINEARS if getattr(a, n) is not None])
        rows.append({"layer": i, "max_abs_error": float(errs.max()), "mean_abs_error": float(errs.mean())})
    return rows


@dataclass(frozen=True)
class Reference:
    """The fp32 model's next-token log-probabilities on a text, chunk by chunk: scored once, then compared with
    any number of changed models (compare_to_reference)."""

    model: "Model"
    chunks: list[tuple[list[int], Tensor]]      # (ids, log-probabilities [len(ids), vocab]) per chunk


def fp32_reference(model: "Model", text: str | None = None, chunk: int = 512) -> Reference:
    """`model`'s log-probabilities on the text (the shipped one when None), in chunks of at most `chunk` tokens."""
    return Reference(model, [(part, log_probs(model, part)) for part in _eval_chunks(model, text, chunk)])


def compare_to_fp32(model: "Model", changed: "Model", text: str | None = None, chunk: int = 512) -> Comparison:
    """Memory, weight error, KL, top-1 agreement and perplexity of `changed` against the fp32 `model`."""
    return compare_to_reference(fp32_reference(model, text, chunk), changed)


def compare_to_reference(reference: Reference, changed: "Model") -> Comparison:
    """compare_to_fp32 against a reference already scored: `changed` runs once per chunk, the fp32 model not at all."""
    kl, agree, nll_ref, nll = [], [], [], []
    for part, ref in reference.chunks:
        out = log_probs(changed, part)
        kl.append(kl_divergence(ref, out))
        agree.append(top1_agreement(ref, out))
        nll_ref.append(token_nll(ref, part))
        nll.append(token_nll(out, part))
    kl_all, model = torch.cat(kl), reference.model
    return Comparison(model_weight_bytes(changed), model_weight_bytes(model), layer_weight_errors(model, changed),
                      float(kl_all.mean()), float(kl_all.max()), float(torch.cat(agree).float().mean()),
                      float(torch.cat(nll_ref).mean().exp()), float(torch.cat(nll).mean().exp()), len(kl_all))


def activation_outliers(trace: Trace) -> list[dict]:
    """Per layer and per layer-matrix input, max |activation| against the median: the outliers that break int8.

    A per-tensor int8 scale is set by the largest value; when one channel is 100x the median, the typical
    values get only one or two of the 255 levels.
    """
    rows = []
    for i, layer in enumerate(trace.layers):
        for site in ("attn_in", "ffn_in", "ffn_hidden"):
            a = getattr(layer, site).abs()                     # [T, d]
            peak, median = a.max(), a.median()
            rows.append({"layer": i, "site": site, "max_abs": float(peak), "median_abs": float(median),
                         "ratio": float(peak / median), "channel": int(a.amax(0).argmax()),
                         "position": int(a.amax(1).argmax())})
    return rows


# ---------------------------------------------------------------- number formats, side by side

def variant(model: "Model", name: str) -> tuple["Model", int]:
    """The model in one number format (one of FORMATS), runnable by `forward`, and the bytes its weights take.

    The rounded weights are multiplied in fp32 (dequantized), so each row shows what the format's rounding
    alone costs: torch's integer kernels, which the speed section uses, also round activations to bf16.
    """
    if name not in FORMATS:
        raise ValueError(f"unknown format {name!r}: use one of {', '.join(map(repr, FORMATS))}")
    if name == "bf16":
        bf16 = replace(model, weights=to_dtype(model.weights, torch.bfloat16))
        return dequantize_model(bf16), model_weight_bytes(bf16)
    q = {"int8": lambda: quantize_model(model, 8),
         "int8 weights + int8 activations": lambda: quantize_model(model, 8),
         "int4 g32 symmetric": lambda: quantize_model(model, 4, 32),
         "int4 g32 asymmetric": lambda: quantize_model(model, 4, 32, symmetric=False)}[name]()
    rounded = dequantize_model(q)
    return (quantize_activations(rounded) if "activations" in name else rounded), model_weight_bytes(q)


def compare_formats(model: "Model", names: Sequence[str] = FORMATS, n_tokens: int = EVAL_TOKENS) -> dict[str, Comparison]:
    """compare_to_fp32 for each format, on the shipped text's first n_tokens tokens (weight_bytes: the format's)."""
    reference, out = fp32_reference(model, model.tokenizer.decode(eval_ids(model, n_tokens))), {}
    for name in names:
        changed, nbytes = variant(model, name)
        out[name] = replace(compare_to_reference(reference, changed), weight_bytes=nbytes)
    return out


def kl_text(kl: float) -> str:
    """A KL divergence for print: 2 significant digits, or '< 1e-6' where only float round-off is left."""
    return "< 1e-6" if kl < 1e-6 else f"{kl:.2g}"     # 2 digits: the 4th changes with the CPU's float sums


def q4_1_grid_error(model: "Model") -> float:
    """Largest |w − int4 g32 asymmetric(w)| over every layer matrix: ~0 when the weights already sit on Q4_1's grid."""
    errors = layer_weight_errors(model, quantize_model(model, 4, 32, symmetric=False))
    return max(r["max_abs_error"] for r in errors)
