"""Section 四's claims, measured on one forward pass of a real model (the layer stack, the mask, the norms).

GPT-2's FFN width comes from its published architecture (`cost.gpt2_config`) unless the model passed in is GPT-2;
everything else is measured on the model passed in (SmolLM2 offline).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..analysis import (article_layers_gap, block_shapes, closest_layers, future_check, lens_path, norm_spread,
                        residual_steps)
from ..cost import gpt2_small
from ..interventions import swap_ffn_outputs
from ..report import Claim, Verdict
from ..walk import Trace, forward
from ..weights import tensors

if TYPE_CHECKING:
    from ..models import Model

SECTION = "四"
PROMPT, ANSWER = "The capital of France is", " Paris"
OTHER, OTHER_ANSWER = "The capital of Germany is", " Berlin"   # one token differs
SAME = 1e-4          # "the same numbers": float32 round-off stays far below this
SMALL_STEP = 0.9     # a layer "adds to" the stream when its output keeps this cosine with its input


def structure_verdict(gap: float, config) -> Verdict:
    """The point: the pre-norm recipe reproduces the model (or misses only extra sandwich norms); the detail: the
    norm is a LayerNorm."""
    return Verdict.of(gap < SAME or config.sandwich_norm, gap < SAME and config.norm == "layernorm")


def sharing_verdict(n_shapes: int, closest: float) -> Verdict:
    """The point: every layer has the same tensor shapes and no two layers have (nearly) the same weights."""
    return Verdict.of(n_shapes == 1 and closest > 0.01)


def mask_verdict(future: float, moved: float) -> Verdict:
    """The point: no attention weight reaches a later token and earlier positions ignore what follows them."""
    return Verdict.of(future == 0 and moved < SAME)


def refinement_verdict(path: dict, n_layer: int) -> Verdict:
    """The point: the model ends on the answer (top-1 after the last layer); the detail "refined at every layer":
    it is already in the top 10 by the middle of the stack."""
    return Verdict.of(path["rank"][-1] == 1, path["top10_from"] is not None and path["top10_from"] <= n_layer // 2)


def norm_verdict(spread: dict) -> Verdict:
    """The point: the norm shrinks the across-layer spread of vector sizes at least tenfold."""
    return Verdict.of(spread["after_ratio"] * 10 < spread["before_ratio"])


def residual_verdict(steps: dict) -> Verdict:
    """The point: each layer adds to its input and keeps its direction (median cosine ≥ 0.9); the detail "nothing
    is lost": the embedding's direction survives to the end (cosine > 0.5)."""
    return Verdict.of(steps["median_cos"] >= SMALL_STEP, steps["x0_vs_last"] > 0.5)


def knowledge_verdict(all_ffns, later_ffns) -> Verdict:
    """The point: swapping in the FFN outputs another prompt's subject got (Germany's) makes the model answer that
    prompt's answer (P(Berlin) > P(Paris)); the detail, FFNs "call up" the fact: the FFNs after layer 0 do it too
    (layer 0's FFN reads little more than the token itself).  # probs [P(answer), P(other answer)] each"""
    return Verdict.of(bool(all_ffns[1] > all_ffns[0]), bool(later_ffns[1] > later_ffns[0]))


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
                      f"the norm is {norm_name}{extra}", structure_verdict(gap, config), numbers={"max_gap": gap}))

    shapes = {block_shapes(b) for b in model.weights.blocks}
    i, j, rel = closest_layers(model)
    per_layer = sum(t.numel() for _, t in tensors(model.weights.blocks[0]))
    rows.append(Claim(SECTION, "the layers share the structure, not the parameters",
                      f"{L} layers with identical tensor shapes: {len(shapes) == 1} ({per_layer:,} parameters each); "
                      f"the two most alike query matrices (layers {i} and {j}) differ by {rel:.3g} of their norm",
                      sharing_verdict(len(shapes), rel),
                      numbers={"shapes": len(shapes), "closest": (i, j, rel)}))

    future, moved = future_check(model, trace)
    rows.append(Claim(SECTION, "causal mask: each token sees itself and earlier tokens only",
                      f"attention weight on a later token, over {L} layers × {config.n_head} heads: max {_bound(future)}; "
                      f"removing the last token changes the earlier positions' vectors by {_bound(moved)}",
                      mask_verdict(future, moved),
                      numbers={"future_weight": future, "moved": moved}))

    gpt2 = gpt2_small(model)
    source = "measured" if gpt2 is config else "published config"
    block = model.weights.blocks[0]
    gated = block.ffn_gate is not None
    up = tuple(block.ffn_up.weight.shape)
    rows.append(Claim(SECTION, "GPT-2's FFN is 768 → 3072 → 768",
                      f"GPT-2 small: {gpt2.d_model} → {gpt2.d_ff} → {gpt2.d_model} ({source}); "
                      f"{config.name}: {up[0]} → {up[1]} → {up[0]} measured from ffn_up {list(up)}"
                      + (f", gated ({config.ffn}: gate, up and down, 3 matrices)" if gated else ""),
                      Verdict.of((gpt2.d_model, gpt2.d_ff) == (768, 3072)),
                      numbers={"d_model": gpt2.d_model, "d_ff": gpt2.d_ff}))

    token = model.tokenizer.token_id(answer)
    path = lens_path(model, trace, token)
    r, p = path["rank"], path["prob"]
    rows.append(Claim(SECTION, "later layers hold richer vectors than layer 1: refined at every layer",
                      f"logit lens on {prompt!r}: {answer!r} has rank {r[1]:,} after layer 1, {r[L // 2]:,} after layer "
                      f"{L // 2}, enters the top 10 after layer {path['top10_from']} and is top-1 only from layer "
                      f"{path['top1_from']} of {L} (p = {p[-1]:.4f})", refinement_verdict(path, L), numbers=path))

    s = norm_spread(trace)
    rows.append(Claim(SECTION, "LayerNorm pulls each vector back to a standard range",
                      f"median token's RMS entering the norm: {s['before'][0]:.3g} … {s['before'][1]:.4g} across layers "
                      f"(×{s['before_ratio']:.0f}); leaving it: {s['after'][0]:.3g} … {s['after'][1]:.3g} "
                      f"(×{s['after_ratio']:.1f}, the learned scale included)",
                      norm_verdict(s), numbers=s))

    st = residual_steps(trace)
    rows.append(Claim(SECTION, "the residual connection adds the original back: no information is lost",
                      f"each layer's output keeps a median cosine of {st['median_cos']:.3f} with its input; but layer 0 "
                      f"writes ×{st['layer0_growth']:.0f} the embedding's size, and the embedding's direction is gone "
                      f"by the end (cosine x0 vs last layer: {st['x0_vs_last']:.3f})", residual_verdict(st), numbers=st))

    ids, other = model.tokenizer.encode(prompt), model.tokenizer.encode(OTHER)
    tokens = [token, model.tokenizer.token_id(OTHER_ANSWER)]
    swap_all = swap_ffn_outputs(model, ids, other, tokens, range(L)).tolist()
    swap_later = swap_ffn_outputs(model, ids, other, tokens, range(1, L)).tolist()
    rows.append(Claim(SECTION, "FFN calls up knowledge (FFN 调用知识, the article's summary)",
                      f"at the token where {prompt!r} and {OTHER!r} differ, the {L} FFNs' outputs taken from the second: "
                      f"P({answer!r}) = {swap_all[0]:.2f}, P({OTHER_ANSWER!r}) = {swap_all[1]:.2f}; layers 1–{L - 1}'s "
                      f"FFNs only: {swap_later[0]:.2f} vs {swap_later[1]:.2f} (no swap: {float(trace.probs[-1, token]):.2f}"
                      f" vs {float(trace.probs[-1, tokens[1]]):.3f})", knowledge_verdict(swap_all, swap_later),
                      numbers={"all_ffns": swap_all, "later_ffns": swap_later}))
    return rows
