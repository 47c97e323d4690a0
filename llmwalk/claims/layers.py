"""Section 四's claims, measured on one forward pass of a real model (the layer stack, the mask, the norms).

GPT-2's FFN width comes from its published architecture (`cost.gpt2_config`) unless the model passed in is GPT-2;
everything else is measured on the model passed in (SmolLM2 offline).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import prompts
from ..cost import gpt2_small
from ..embedding import rope_angles
from ..head import lens_path
from ..i18n import quoted, t
from . import below, yes
from ..interventions import combine, next_token_probs, patch, subject_position
from ..layers import attention, causal_mask, ffn, norm
from ..report import Claim, Verdict
from ..walk import Trace, forward
from ..weights import tensors

if TYPE_CHECKING:
    from ..models import Model

SECTION = "四"
PROMPT, ANSWER = prompts.PROMPT, prompts.ANSWER
OTHER, OTHER_ANSWER = "The capital of Germany is", " Berlin"   # one token differs
SAME = 1e-4          # "the same numbers": float32 round-off stays far below this
SMALL_STEP = 0.9     # a layer "adds to" the stream when its output keeps this cosine with its input


# ---------------------------------------------------------------- measurements

def _layer_inputs(model: "Model", trace: Trace, i: int):
    """The mask and rotary angles layer i used in `trace` (no KV cache), from the stage functions walk.forward uses."""
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


def most_alike_layers(model: "Model") -> tuple[int, int, float]:
    """The two layers whose query matrices point most alike: (i, j, cosine of the two flattened matrices), i < j.
    (A distance relative to one matrix's norm would pick the pair whose sizes differ most, not the most alike.)"""
    w = torch.nn.functional.normalize(torch.stack([b.attn_q.weight.float().flatten()
                                                   for b in model.weights.blocks]), dim=-1)   # [L, d*d]
    cos = (w @ w.T).fill_diagonal_(-float("inf"))
    i, j = divmod(int(cos.argmax()), len(w))
    return min(i, j), max(i, j), float(cos[i, j])


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
    cos = F.cosine_similarity(r[:-1], r[1:], dim=-1).median(-1).values     # [L]
    first = F.cosine_similarity(r[0], r[-1], dim=-1).median()
    growth = rms(r[1]).median() / rms(r[0]).median()
    return {"cos": cos.tolist(), "median_cos": float(cos.median()), "x0_vs_last": float(first),
            "layer0_growth": float(growth)}



# ---------------------------------------------------------------- verdicts and claims

def structure_verdict(gap: float, config) -> Verdict:
    """The point: the pre-norm recipe reproduces the model (or misses only extra sandwich norms); the detail: the
    norm is a LayerNorm."""
    return Verdict.of(gap < SAME or config.sandwich_norm, gap < SAME and config.norm == "layernorm")


ALIKE = 0.5     # two layers' matrices "share" parameters when their cosine is above this (1: the same direction)


def sharing_verdict(n_shapes: int, most_alike: float) -> Verdict:
    """The point: every layer has the same tensor shapes and no two layers' query matrices point alike (cosine of
    the most alike pair below ALIKE)."""
    return Verdict.of(n_shapes == 1 and most_alike < ALIKE)


def mask_verdict(future: float, moved: float) -> Verdict:
    """The point: no attention weight reaches a later token and earlier positions ignore what follows them."""
    return Verdict.of(future == 0 and moved < SAME)


def refinement_verdict(path: dict, n_layer: int) -> Verdict:
    """The point: the model ends on the answer (top-1 after the last layer); the detail "refined at every layer":
    it is already in the top 10 by the middle of the stack."""
    return Verdict.of(path["rank"][-1] == 1, path["top10_from"] is not None and path["top10_from"] <= n_layer // 2)


def norm_verdict(spread: dict, config) -> Verdict:
    """The point: the norm shrinks the across-layer spread of vector sizes at least tenfold; the detail: the norm
    is a LayerNorm (as in row 1: an RMSNorm rescales without centring)."""
    return Verdict.of(spread["after_ratio"] * 10 < spread["before_ratio"], config.norm == "layernorm")


def residual_verdict(steps: dict) -> Verdict:
    """The point: each layer adds to its input and keeps its direction (median cosine ≥ 0.9); the detail "nothing
    is lost": the embedding's direction survives to the end (cosine > 0.5)."""
    return Verdict.of(steps["median_cos"] >= SMALL_STEP, steps["x0_vs_last"] > 0.5)


def knowledge_verdict(everywhere, at_subject) -> Verdict:
    """The point, FFNs call up the fact: with the outputs of the FFNs after layer 0 taken from the other prompt
    (Germany's) wherever the prompts differ (the subject token and every token after it), the model gives that
    prompt's answer (P(Berlin) > P(Paris)). Layer 0's FFN is left out: it says which word the token is, not what is
    known about it (on SmolLM2, swapped alone, it flips the answer by itself). The detail, a look-up at the subject
    token: those FFNs swapped at that token alone do it too.
    # probs [P(answer), P(other answer)] each"""
    return Verdict.of(bool(everywhere[1] > everywhere[0]), bool(at_subject[1] > at_subject[0]))


def swapped_ffns(model: "Model", ids, other, tokens, layers, positions) -> list[float]:
    """P(tokens) after `ids` with the FFN outputs of `layers` at `positions` taken from the run on `other`.
    # -> [len(tokens)]"""
    source = forward(model, other)
    hooks = combine(*[patch(source, i, pos, "ffn_out") for i in layers for pos in positions])
    return next_token_probs(model, ids, tokens, hooks).tolist()


def _bound(x: float) -> str:
    """A difference that is float round-off, written so that it reads the same on every machine."""
    return below(x, f"{SAME:.0e}", zero=True)


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
    norm_name = config.norm_name
    extra = t("claims.layers.structure.sandwich") if config.sandwich_norm else ""
    rows.append(Claim(SECTION, t("claims.layers.structure.article"),
                      t("claims.layers.structure.measured", model=config.name, n_layer=L, gap=_bound(gap),
                        norm=norm_name, extra=extra), structure_verdict(gap, config),
                      numbers={"max_gap": gap, "norm": config.norm, "sandwich_norm": config.sandwich_norm},
                      key="layers.structure"))

    shapes = {block_shapes(b) for b in model.weights.blocks}
    i, j, cos = most_alike_layers(model)
    per_layer = sum(w.numel() for _, w in tensors(model.weights.blocks[0]))
    rows.append(Claim(SECTION, t("claims.layers.sharing.article"),
                      t("claims.layers.sharing.measured", n_layer=L, same=yes(len(shapes) == 1),
                        per_layer=f"{per_layer:,}", i=i, j=j, cos=f"{cos:.2g}"),
                      sharing_verdict(len(shapes), cos),
                      numbers={"shapes": len(shapes), "most_alike": (i, j, cos)}, key="layers.sharing"))

    future, moved = future_check(model, trace)
    rows.append(Claim(SECTION, t("claims.layers.mask.article"),
                      t("claims.layers.mask.measured", n_layer=L, n_head=config.n_head, future=_bound(future),
                        moved=_bound(moved)),
                      mask_verdict(future, moved),
                      numbers={"future_weight": future, "moved": moved}, key="layers.mask"))

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
                      numbers={"d_model": gpt2.d_model, "d_ff": gpt2.d_ff}, key="layers.ffn"))

    token = model.tokenizer.token_id(answer)
    path = lens_path(model, trace, token)
    r, p = path["rank"], path["prob"]
    mid = L // 2                                   # r[i + 1]: after layer i (r[0] is the embedding)
    rows.append(Claim(SECTION, t("claims.layers.refinement.article"),
                      t("claims.layers.refinement.measured", prompt=quoted(prompt), answer=quoted(answer),
                        rank_first=f"{r[1]:,}", rank_mid=f"{r[mid + 1]:,}", mid=mid,
                        top10=lens_point(path["top10_from"]), top1=lens_point(path["top1_from"]), last=L - 1,
                        p=f"{p[-1]:.2f}"), refinement_verdict(path, L), numbers=path, key="layers.refinement"))

    s = norm_spread(trace)
    rows.append(Claim(SECTION, t("claims.layers.norm.article"),
                      t("claims.layers.norm.measured", before_min=f"{s['before'][0]:.3g}",
                        before_max=f"{s['before'][1]:.3g}", before_ratio=f"{s['before_ratio']:.0f}",
                        after_min=f"{s['after'][0]:.3g}", after_max=f"{s['after'][1]:.3g}",
                        after_ratio=f"{s['after_ratio']:.1f}", norm=norm_name),
                      norm_verdict(s, config), numbers={**s, "norm": config.norm}, key="layers.norm"))

    st = residual_steps(trace)
    rows.append(Claim(SECTION, t("claims.layers.residual.article"),
                      t("claims.layers.residual.measured", cosine=f"{st['median_cos']:.3f}",
                        growth=f"{st['layer0_growth']:.0f}", x0_vs_last=f"{st['x0_vs_last']:.3f}"),
                      residual_verdict(st), numbers=st, key="layers.residual"))

    ids, other = model.tokenizer.encode(prompt), model.tokenizer.encode(OTHER)
    tokens = [token, model.tokenizer.token_id(OTHER_ANSWER)]
    subject = subject_position(ids, other)           # before it the two runs are the same: nothing to swap there
    swap = lambda layers, positions: swapped_ffns(model, ids, other, tokens, layers, positions)   # noqa: E731
    layer0, at_subject = swap([0], [subject]), swap(range(1, L), [subject])
    everywhere = swap(range(1, L), range(subject, len(ids)))
    two = lambda p: t("claims.layers.knowledge.pair", answer=f"{p[0]:.2f}", other=f"{p[1]:.2f}")   # noqa: E731
    plain = [float(trace.probs[-1, token]), float(trace.probs[-1, tokens[1]])]
    rows.append(Claim(SECTION, t("claims.layers.knowledge.article"),
                      t("claims.layers.knowledge.measured", prompt=quoted(prompt), other=quoted(OTHER), last=L - 1,
                        answer=quoted(answer), other_answer=quoted(OTHER_ANSWER), everywhere=two(everywhere),
                        at_subject=two(at_subject), layer0=two(layer0),
                        plain=t("claims.layers.knowledge.pair", answer=f"{plain[0]:.2f}", other=f"{plain[1]:.3f}")),
                      knowledge_verdict(everywhere, at_subject),
                      numbers={"everywhere": everywhere, "at_subject": at_subject, "layer0": layer0, "plain": plain},
                      key="layers.knowledge"))
    return rows
