"""Section 四's claims, measured on one forward pass of a real model (the layer stack, the mask, the norms).

GPT-2's FFN width comes from its published architecture (`cost.gpt2_config`) unless the model passed in is GPT-2;
everything else is measured on the model passed in (SmolLM2 offline).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..analysis import (article_layers_gap, block_shapes, closest_layers, future_check, lens_path, norm_spread,
                        residual_steps)
from ..cost import gpt2_small
from ..i18n import t
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


def _yes(x: bool) -> str:
    return t("claims.common.yes") if x else t("claims.common.no")


def lens_point(index: int | None) -> str:
    """A logit-lens index in the series' layer convention: index 0 is "emb", index i + 1 is "after layer i"."""
    if index is None:
        return t("claims.layers.never")
    return t("claims.layers.emb") if index == 0 else t("claims.layers.after_layer", i=index - 1)


def claims(model: "Model", trace: Trace | None = None, prompt: str = PROMPT, answer: str = ANSWER) -> list[Claim]:
    """Every claim of section 四, measured on `model` (and its `trace` of `prompt`, computed when not given)."""
    config = model.config
    trace = forward(model, model.tokenizer.encode(prompt)) if trace is None else trace
    L, rows = config.n_layer, []

    gap = article_layers_gap(model, trace)
    norm_name = {"layernorm": "LayerNorm", "rmsnorm": "RMSNorm"}[config.norm]
    extra = t("claims.layers.structure.sandwich") if config.sandwich_norm else ""
    rows.append(Claim(SECTION, t("claims.layers.structure.article"),
                      t("claims.layers.structure.measured", model=config.name, n_layer=L, gap=_bound(gap),
                        norm=norm_name, extra=extra), structure_verdict(gap, config), numbers={"max_gap": gap}))

    shapes = {block_shapes(b) for b in model.weights.blocks}
    i, j, rel = closest_layers(model)
    per_layer = sum(w.numel() for _, w in tensors(model.weights.blocks[0]))
    rows.append(Claim(SECTION, t("claims.layers.sharing.article"),
                      t("claims.layers.sharing.measured", n_layer=L, same=_yes(len(shapes) == 1),
                        per_layer=f"{per_layer:,}", i=i, j=j, rel=f"{rel:.3g}"),
                      sharing_verdict(len(shapes), rel),
                      numbers={"shapes": len(shapes), "closest": (i, j, rel)}))

    future, moved = future_check(model, trace)
    rows.append(Claim(SECTION, t("claims.layers.mask.article"),
                      t("claims.layers.mask.measured", n_layer=L, n_head=config.n_head, future=_bound(future),
                        moved=_bound(moved)),
                      mask_verdict(future, moved),
                      numbers={"future_weight": future, "moved": moved}))

    gpt2 = gpt2_small(model)
    source = t("claims.common.by_measurement") if gpt2 is config else t("claims.common.published")
    block = model.weights.blocks[0]
    gated = block.ffn_gate is not None
    up = tuple(block.ffn_up.weight.shape)
    rows.append(Claim(SECTION, t("claims.layers.ffn.article"),
                      t("claims.layers.ffn.measured", d_model=gpt2.d_model, d_ff=gpt2.d_ff, source=source,
                        model=config.name, up0=up[0], up1=up[1], shape=list(up),
                        gated=t("claims.layers.ffn.gated", ffn=config.ffn) if gated else ""),
                      Verdict.of((gpt2.d_model, gpt2.d_ff) == (768, 3072)),
                      numbers={"d_model": gpt2.d_model, "d_ff": gpt2.d_ff}))

    token = model.tokenizer.token_id(answer)
    path = lens_path(model, trace, token)
    r, p = path["rank"], path["prob"]
    mid = L // 2                                   # r[i + 1]: after layer i (r[0] is the embedding)
    rows.append(Claim(SECTION, t("claims.layers.refinement.article"),
                      t("claims.layers.refinement.measured", prompt=repr(prompt), answer=repr(answer),
                        rank_first=f"{r[1]:,}", rank_mid=f"{r[mid + 1]:,}", mid=mid,
                        top10=lens_point(path["top10_from"]), top1=lens_point(path["top1_from"]), last=L - 1,
                        p=f"{p[-1]:.2f}"), refinement_verdict(path, L), numbers=path))

    s = norm_spread(trace)
    rows.append(Claim(SECTION, t("claims.layers.norm.article"),
                      t("claims.layers.norm.measured", before_min=f"{s['before'][0]:.3g}",
                        before_max=f"{s['before'][1]:.3g}", before_ratio=f"{s['before_ratio']:.0f}",
                        after_min=f"{s['after'][0]:.3g}", after_max=f"{s['after'][1]:.3g}",
                        after_ratio=f"{s['after_ratio']:.1f}"),
                      norm_verdict(s), numbers=s))

    st = residual_steps(trace)
    rows.append(Claim(SECTION, t("claims.layers.residual.article"),
                      t("claims.layers.residual.measured", cosine=f"{st['median_cos']:.3f}",
                        growth=f"{st['layer0_growth']:.0f}", x0_vs_last=f"{st['x0_vs_last']:.3f}"),
                      residual_verdict(st), numbers=st))

    ids, other = model.tokenizer.encode(prompt), model.tokenizer.encode(OTHER)
    tokens = [token, model.tokenizer.token_id(OTHER_ANSWER)]
    swap_all = swap_ffn_outputs(model, ids, other, tokens, range(L)).tolist()
    swap_later = swap_ffn_outputs(model, ids, other, tokens, range(1, L)).tolist()
    rows.append(Claim(SECTION, t("claims.layers.knowledge.article"),
                      t("claims.layers.knowledge.measured", prompt=repr(prompt), other=repr(OTHER), n_layer=L,
                        answer=repr(answer), other_answer=repr(OTHER_ANSWER), p_answer=f"{swap_all[0]:.2f}",
                        p_other=f"{swap_all[1]:.2f}", last=L - 1, later_answer=f"{swap_later[0]:.2f}",
                        later_other=f"{swap_later[1]:.2f}", plain_answer=f"{float(trace.probs[-1, token]):.2f}",
                        plain_other=f"{float(trace.probs[-1, tokens[1]]):.3f}"),
                      knowledge_verdict(swap_all, swap_later),
                      numbers={"all_ffns": swap_all, "later_ffns": swap_later}))
    return rows
