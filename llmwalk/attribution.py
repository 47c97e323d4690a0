"""Section 四, causal experiments: direct logit attribution — one logit split into what each part wrote.

The residual stream after the last layer is a sum: the embedding, plus what every attention head and every FFN
added. The LM head reads it through the final RMSNorm, x ↦ x / rms(x) ⊙ w, and one row of W_U. Everything but the
division by rms(x) is linear, so with that one scale *frozen at the value it had in the real run*, the logit of a
token is exactly a sum of parts, one per writer:

    logit = Σ_parts (1 / rms(x)) · (part · (w ⊙ W_U[token]))

A part says how much that writer pushed the logit *directly*, through the stream straight to the head. It does not
say what the writer caused by being read by later layers (ablation and patching measure that total effect).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from .checks import is_int
from .walk import Trace

if TYPE_CHECKING:
    from .models import Model


@dataclass(frozen=True)
class Attribution:
    """One token's logit at one position, split into the embedding's, each head's and each FFN's direct part."""

    token: int
    position: int                   # 0-based, counted from the start
    logit: float                    # what the run's LM head computed
    scale: float                    # the final RMSNorm's 1 / rms(x) at this position, taken from the run
    direction: Tensor               # [d_model] w ⊙ W_U[token]: what the head reads each part along
    embedding_out: Tensor           # [d_model] what the embedding put into the stream
    head_out: Tensor                # [n_layer, n_head, d_model] what each head wrote (its z through its W_O rows)
    ffn_out: Tensor                 # [n_layer, d_model] what each FFN wrote
    embedding: float                # the embedding's part of the logit
    heads: Tensor                   # [n_layer, n_head] each head's part
    ffns: Tensor                    # [n_layer] each FFN's part

    @property
    def attention(self) -> Tensor:
        """Each layer's attention, all heads together.  # [n_layer]"""
        return self.heads.sum(-1)

    @property
    def total(self) -> float:
        """The sum of every part: the logit, up to float rounding."""
        return self.embedding + float(self.heads.sum()) + float(self.ffns.sum())


def head_outputs(z: Tensor, w_o: Tensor) -> Tensor:
    """What each head writes into the stream: its mix of values times its own d_head rows of W_O. Summed over the
    heads, this is attention's output (merge_heads(z) @ W_O).  # ([n_head, d_head], [n_head * d_head, d_model]) -> [n_head, d_model]
    """
    n_head, d_head = z.shape
    return torch.einsum("hd,hdm->hm", z, w_o.reshape(n_head, d_head, -1))


def inverse_rms(x: Tensor, eps: float) -> Tensor:
    """RMSNorm's one non-linear factor, 1 / sqrt(mean(x²) + eps), in float32.  # [..., d] -> [..., 1]"""
    return torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)


def direct_parts(writes: Tensor, stream: Tensor, norm_weight: Tensor, unembed: Tensor, eps: float) -> Tensor:
    """Each write's direct part of one logit: the final RMSNorm with the scale of the whole `stream` (the run's,
    frozen), then one row of the LM head. Their sum is the logit when the writes add up to the stream.

    # ([n, d], [d], [d], [d]) -> [n]
    """
    return inverse_rms(stream, eps) * ((writes.float() * norm_weight.float()) @ unembed.float())


def logit_attribution(model: "Model", trace: Trace, token: int, position: int = -1) -> Attribution:
    """Split `token`'s logit at `position` of `trace` (lw.forward(model, ids), recorded) into direct parts.

    Needs an RMSNorm model (SmolLM2, Gemma-3): GPT-2's LayerNorm also subtracts a mean and adds a bias, not split
    here. Gemma-3's norm after each attention has a scale of its own: it is frozen at the run's value too.
    """
    config, w = model.config, model.weights
    if not isinstance(trace, Trace):
        raise TypeError(f"trace must be a Trace, got {type(trace).__name__}: e.g. trace = lw.forward(model, ids)")
    if config.norm != "rmsnorm":
        raise ValueError(f"logit_attribution splits the logit through an RMSNorm; {config.name} uses {config.norm} "
                         "(which also subtracts the mean and adds a bias): use SmolLM2 or Gemma-3")
    layers = trace._recorded("the layers' intermediates for logit_attribution")
    if len(layers) != config.n_layer or trace.x0.shape[-1] != config.d_model:
        raise ValueError(f"this trace has {len(layers)} layers of width {trace.x0.shape[-1]}, {config.name} has "
                         f"{config.n_layer} of width {config.d_model}: was it made by another model?")
    if not is_int(token) or not 0 <= token < config.vocab_size:
        raise ValueError(f"token must be a token id in [0, {config.vocab_size}), got {token!r}: "
                         "e.g. model.tokenizer.token_id(' Paris')")
    n = len(trace.ids)
    if not is_int(position) or not -n <= position < n:
        raise ValueError(f"position must be an int in [-{n}, {n}) for this {n}-token trace, got {position!r}")
    position %= n
    row = position if len(trace.logits) == n else 0        # last_only: one row, the last position's
    if len(trace.logits) != n and position != n - 1:
        raise ValueError(f"this trace has logits for its last position only (last_only=True), not for position "
                         f"{position}: run lw.forward(model, ids) without last_only")
    if not all(isinstance(m, Tensor) for m in [w.output] + [b.attn_output.weight for b in w.blocks]):
        raise ValueError("the heads' parts slice W_O by head: dequantize the model first "
                         "(lw.dequantize_model)")

    heads, ffns = [], []
    for block, out in zip(w.blocks, layers):
        written = head_outputs(out.attn.z[:, position].float(), block.attn_output.weight.float())   # [n_head, d]
        if block.post_attention_norm is not None:          # Gemma-3: attention's output is normalized again
            written = written * inverse_rms(out.attn.out[position], config.norm_eps) \
                * block.post_attention_norm.weight.float()
        heads.append(written)
        ffns.append(out.ffn_out[position].float())
    head_out, ffn_out = torch.stack(heads), torch.stack(ffns)
    embedding_out = trace.x0[position].float()
    resid = layers[-1].resid_post[position].float()
    rebuilt = embedding_out + head_out.sum((0, 1)) + ffn_out.sum(0)
    if not torch.allclose(rebuilt, resid, rtol=1e-3, atol=1e-3 * float(resid.abs().max())):
        raise ValueError("the embedding, the heads and the FFNs of this trace do not add up to its last residual "
                         "stream: was it run with hooks that replace attn_out or the stream itself? Attribute a "
                         "trace whose stream is the sum of what its parts wrote")
    writes = torch.cat([embedding_out[None], head_out.flatten(0, 1), ffn_out])      # [1 + n_layer * (n_head + 1), d]
    parts = direct_parts(writes, resid, w.output_norm.weight, w.output[token], config.norm_eps)
    n_heads = head_out.shape[0] * head_out.shape[1]
    return Attribution(token, position, float(trace.logits[row, token]), float(inverse_rms(resid, config.norm_eps)),
                       w.output_norm.weight.float() * w.output[token].float(), embedding_out, head_out, ffn_out,
                       float(parts[0]), parts[1:1 + n_heads].view(head_out.shape[:2]), parts[1 + n_heads:])
