"""Section 四's claims, measured on one forward pass of a real model (the layer stack, the mask, the norms).

GPT-2's FFN width comes from its published architecture (`cost.gpt2_config`) unless the model passed in is GPT-2;
everything else is measured on the model passed in (SmolLM2 offline).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ..cost import gpt2_config
from ..embedding import rope_angles
from ..head import logit_lens
from ..layers import attention, causal_mask, ffn, norm
from ..report import Claim
from ..walk import Trace, forward
from ..weights import tensors
from .tokenization import DIFFERS, HOLDS, ROUGHLY

if TYPE_CHECKING:
    from ..models import Model

SECTION = "四"
PROMPT, ANSWER = "The capital of France is", " Paris"
SAME = 1e-4          # "the same numbers": float32 round-off stays far below this
SMALL_STEP = 0.9     # a layer "adds to" the stream when its output keeps this cosine with its input


def _layer_inputs(model: "Model", trace: Trace, i: int):
    """The mask and rotary angles layer i used in `trace` (no KV cache)."""
    t = len(trace.ids)
    mask = causal_mask(t, window=model.config.window(i))
    rope = rope_angles(trace.positions, model.config.d_head, model.config.theta(i)) if model.config.position == "rope" else None
    return mask, rope


@torch.inference_mode()
def article_layer(model: "Model", trace: Trace, i: int) -> tuple[Tensor, Tensor]:
    """Layer i recomputed as the article writes it: Norm → Attention → +residual, Norm → FFN → +residual.

    Takes what entered layer i in `trace`; returns (residual after attention, residual after the FFN).  # [T, d] each
    """
    block, config = model.weights.blocks[i], model.config
    mask, rope = _layer_inputs(model, trace, i)
    x = trace.resid[i]
    mid = x + attention(norm(x, block.attn_norm, config), block, config, mask, rope).out
    out = mid + ffn(norm(mid, block.ffn_norm, config), block, config)[0]
    return mid, out


def article_layers_gap(model: "Model", trace: Trace) -> float:
    """Largest |difference| between the trace's residual stream and the article's recipe, over every layer."""
    return max(float((article_layer(model, trace, i)[1] - trace.resid[i + 1]).abs().max())
               for i in range(model.config.n_layer))


def block_shapes(block) -> tuple:
    """Shapes of every tensor of one layer, in field order."""
    return tuple((name, tuple(t.shape)) for name, t in tensors(block))


def closest_layers(model: "Model") -> tuple[int, int, float]:
    """The two layers whose query matrices are most alike: (i, j, relative difference ‖Wi − Wj‖ / ‖Wi‖)."""
    w = torch.stack([b.attn_q.weight.float().flatten() for b in model.weights.blocks])   # [L, d*d]
    dist = torch.cdist(w[None], w[None])[0] / w.norm(dim=-1, keepdim=True)
    dist.fill_diagonal_(float("inf"))
    k = int(dist.argmin())
    i, j = divmod(k, len(w))
    return min(i, j), max(i, j), float(dist[i, j])


@torch.inference_mode()
def future_check(model: "Model", trace: Trace) -> tuple[float, float]:
    """(largest attention weight on a future key, largest change of earlier positions when the last token is removed).

    Both are 0 when no position can see what comes after it.
    """
    w = trace.attn                                                    # [L, H, T, T]
    future = ~causal_mask(w.shape[-1])
    prefix = forward(model, trace.ids[:-1])
    moved = float((prefix.resid - trace.resid[:, :-1]).abs().max())
    return float(w[..., future].max()), moved


@torch.inference_mode()
def lens_path(model: "Model", trace: Trace, token: int, position: int = -1) -> dict:
    """Rank and probability of `token` read after every layer through the logit lens, at one position.

    Index 0 is the embedding, index i the residual stream after layer i (the last one is the model's answer).
    """
    logits = logit_lens(trace.resid[:, position], model.weights, model.config).float()   # [L + 1, vocab]
    rank = (logits > logits[:, token:token + 1]).sum(-1) + 1
    prob = logits.softmax(-1)[:, token]
    top1 = [i for i in range(len(rank)) if all(r == 1 for r in rank[i:].tolist())]
    top10 = [i for i in range(len(rank)) if all(r <= 10 for r in rank[i:].tolist())]
    return {"rank": rank.tolist(), "prob": prob.tolist(), "top_ids": logits.argmax(-1).tolist(),
            "top1_from": top1[0] if top1 else None, "top10_from": top10[0] if top10 else None}


def rms(x: Tensor) -> Tensor:
    """Root mean square of each vector.  # [..., d] -> [...]"""
    return x.float().pow(2).mean(-1).sqrt()


def norm_spread(trace: Trace) -> dict:
    """How much the median token's RMS varies across layers, entering the attention norm and leaving it."""
    before = rms(trace.resid[:-1]).median(-1).values                         # [L]
    after = rms(torch.stack([b.attn_in for b in trace.layers])).median(-1).values
    return {"before": (float(before.min()), float(before.max())), "after": (float(after.min()), float(after.max())),
            "before_ratio": float(before.max() / before.min()), "after_ratio": float(after.max() / after.min())}


def residual_steps(trace: Trace) -> dict:
    """Cosine between each token's vector entering and leaving every layer (median over tokens), and x0 vs the end."""
    r = trace.resid.float()
    cos = torch.nn.functional.cosine_similarity(r[:-1], r[1:], dim=-1).median(-1).values     # [L]
    first = torch.nn.functional.cosine_similarity(r[0], r[-1], dim=-1).median()
    growth = rms(r[1]).median() / rms(r[0]).median()
    return {"cos": cos.tolist(), "median_cos": float(cos.median()), "x0_vs_last": float(first),
            "layer0_growth": float(growth)}


def structure_verdict(gap: float, config) -> str:
    """✓ when the article's recipe reproduces the model with LayerNorm; ≈ with RMSNorm, or when extra (sandwich)
    norms are what the recipe misses; ✗ otherwise."""
    if gap < SAME:
        return HOLDS if config.norm == "layernorm" else ROUGHLY
    return ROUGHLY if config.sandwich_norm else DIFFERS


def sharing_verdict(n_shapes: int, closest: float) -> str:
    """✓ when every layer has the same tensor shapes and no two layers have (nearly) the same weights."""
    return HOLDS if n_shapes == 1 and closest > 0.01 else DIFFERS


def mask_verdict(future: float, moved: float) -> str:
    """✓ when no attention weight reaches a later token and earlier positions ignore what follows them."""
    return HOLDS if future == 0 and moved < SAME else DIFFERS


def refinement_verdict(path: dict, n_layer: int) -> str:
    """✓ when the answer is top-1 at the end and already in the top 10 by the middle of the stack;
    ≈ when it gets there only in the second half; ✗ when the model does not end on it."""
    if path["rank"][-1] != 1:
        return DIFFERS
    return HOLDS if path["top10_from"] <= n_layer // 2 else ROUGHLY


def norm_verdict(spread: dict) -> str:
    """✓ when the norm shrinks the across-layer spread of vector sizes at least tenfold."""
    return HOLDS if spread["after_ratio"] * 10 < spread["before_ratio"] else DIFFERS


def residual_verdict(steps: dict) -> str:
    """✓ when each layer keeps its input's direction (cosine ≥ 0.9) and the embedding's direction survives to the
    end (cosine > 0.5); ≈ when only the first holds; ✗ when layers overwrite the stream."""
    if steps["median_cos"] < SMALL_STEP:
        return DIFFERS
    return HOLDS if steps["x0_vs_last"] > 0.5 else ROUGHLY


def _bound(x: float) -> str:
    """A difference that is float round-off, written so that it reads the same on every machine."""
    return "0" if x == 0 else (f"< {SAME:.0e}" if x < SAME else f"{x:.3g}")


def claims(model: "Model", trace: Trace | None = None, prompt: str = PROMPT, answer: str = ANSWER) -> list[Claim]:
    """Every claim of section 四, measured on `model` (and its `trace` of `prompt`, computed when not given)."""
    config = model.config
    trace = forward(model, model.tokenizer.encode(prompt)) if trace is None else trace
    L, rows = config.n_layer, []

    gap = article_layers_gap(model, trace)
    norm_name = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}[config.norm]
    extra = " plus a norm after attention and after the FFN (sandwich)" if config.sandwich_norm else ""
    rows.append(Claim(SECTION, "every layer: LayerNorm → Attention → residual, LayerNorm → FFN → residual (pre-norm)",
                      f"{config.name}: all {L} layers recomputed by that recipe, max |Δ| vs the model = {_bound(gap)}; "
                      f"the norm is {norm_name}{extra}", structure_verdict(gap, config)))

    shapes = {block_shapes(b) for b in model.weights.blocks}
    i, j, rel = closest_layers(model)
    per_layer = sum(t.numel() for _, t in tensors(model.weights.blocks[0]))
    rows.append(Claim(SECTION, "the layers share the structure, not the parameters",
                      f"{L} layers with identical tensor shapes: {len(shapes) == 1} ({per_layer:,} parameters each); "
                      f"the two most alike query matrices (layers {i} and {j}) differ by {rel:.3g} of their norm",
                      sharing_verdict(len(shapes), rel)))

    future, moved = future_check(model, trace)
    rows.append(Claim(SECTION, "causal mask: each token sees itself and earlier tokens only",
                      f"attention weight on a later token, over {L} layers × {config.n_head} heads: max {_bound(future)}; "
                      f"removing the last token changes the earlier positions' vectors by {_bound(moved)}",
                      mask_verdict(future, moved)))

    gpt2 = config if config.family == "gpt2" else gpt2_config()
    source = "measured" if config.family == "gpt2" else "published config"
    block = model.weights.blocks[0]
    gated = block.ffn_gate is not None
    up = tuple(block.ffn_up.weight.shape)
    rows.append(Claim(SECTION, "GPT-2's FFN is 768 → 3072 → 768",
                      f"GPT-2 small: {gpt2.d_model} → {gpt2.d_ff} → {gpt2.d_model} ({source}); "
                      f"{config.name}: {up[0]} → {up[1]} → {up[0]} measured from ffn_up {list(up)}"
                      + (f", gated ({config.ffn}: gate, up and down, 3 matrices)" if gated else ""),
                      HOLDS if (gpt2.d_model, gpt2.d_ff) == (768, 3072) else DIFFERS))

    token = model.tokenizer.token_id(answer)
    path = lens_path(model, trace, token)
    r, p = path["rank"], path["prob"]
    rows.append(Claim(SECTION, "later layers hold richer vectors than layer 1: refined at every layer",
                      f"logit lens on {prompt!r}: {answer!r} has rank {r[1]:,} after layer 1, {r[L // 2]:,} after layer "
                      f"{L // 2}, enters the top 10 after layer {path['top10_from']} and is top-1 only from layer "
                      f"{path['top1_from']} of {L} (p = {p[-1]:.4f})", refinement_verdict(path, L)))

    s = norm_spread(trace)
    rows.append(Claim(SECTION, "LayerNorm pulls each vector back to a standard range",
                      f"median token's RMS entering the norm: {s['before'][0]:.3g} … {s['before'][1]:.4g} across layers "
                      f"(×{s['before_ratio']:.0f}); leaving it: {s['after'][0]:.3g} … {s['after'][1]:.3g} "
                      f"(×{s['after_ratio']:.1f}, the learned scale included)",
                      norm_verdict(s)))

    st = residual_steps(trace)
    rows.append(Claim(SECTION, "the residual connection adds the original back: no information is lost",
                      f"each layer's output keeps a median cosine of {st['median_cos']:.3f} with its input; but layer 0 "
                      f"writes ×{st['layer0_growth']:.0f} the embedding's size, and the embedding's direction is gone "
                      f"by the end (cosine x0 vs last layer: {st['x0_vs_last']:.3f})", residual_verdict(st)))
    return rows
