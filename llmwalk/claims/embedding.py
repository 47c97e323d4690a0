"""Section 三's claims, measured on a real model's embedding table and its forward pass.

GPT-2's weights need the network, so GPT-2's numbers come from its published architecture (`cost.gpt2_config`);
everything else is measured on the model passed in (SmolLM2 offline, or GPT-2 itself when online).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch

from ..analysis import neighbour_rank, neighbours, order_check, rope_relative_check
from ..cost import gpt2_small
from ..i18n import t
from . import listed, named, yes
from ..report import Claim, Verdict

if TYPE_CHECKING:
    from ..models import Model

SECTION = "三"
ORDER_PAIR = ("人咬狗", "狗咬人")                  # the article's example: man bites dog / dog bites man
RELATED = ((" Paris", " France"), (" king", " queen"), (" dog", " cat"))
NEAR = 20                                       # "near": among the 20 closest rows of the whole table


def below(x: float, tol: float) -> str:
    """A number that is rounding noise when below `tol`: shown as '< tol', so it reads the same on every machine."""
    return f"< {tol:g}" if abs(x) < tol else f"{x:.3g}"


def _names(models) -> str:
    return t("claims.common.sep").join(named(m.config.name, list(m.weights.token_embd.shape)) for m in models)


def claims(model: "Model", others: Sequence["Model"] = ()) -> list[Claim]:
    """Every claim of section 三, measured on `model` (SmolLM2 offline); `others` add their table sizes."""
    rows = []
    gpt2 = gpt2_small(model)
    source = t("claims.common.by_measurement") if gpt2 is model.config else t("claims.common.published_offline")
    rows.append(Claim(SECTION, t("claims.embedding.width.article"),
                      t("claims.embedding.width.measured", d_model=gpt2.d_model, vocab=gpt2.vocab_size, source=source,
                        tables=_names([model, *others]),
                        dtype=str(model.weights.token_embd.dtype).removeprefix("torch.")),
                      Verdict.of(gpt2.d_model == 768), numbers={"d_model": gpt2.d_model}, said=768,
                      key="embedding.width"))

    ranks = {(a, b): neighbour_rank(model, a, b) for a, b in RELATED}
    near = neighbours(model, RELATED[0][0], 3)
    vocab = model.weights.token_embd.shape[0]
    rows.append(Claim(SECTION, t("claims.embedding.learned.article"),
                      t("claims.embedding.learned.measured", model=model.config.name,
                        ranks=listed(t("claims.embedding.learned.rank", a=repr(a), b=repr(b), rank=r)
                                     for (a, b), r in ranks.items()),
                        vocab=vocab, random=vocab // 2, word=repr(RELATED[0][0]),
                        near=listed(repr(p) for p, _ in near)),
                      Verdict.of(max(ranks.values()) <= NEAR), numbers={"ranks": ranks}, key="embedding.learned"))

    o = order_check(model, *ORDER_PAIR)
    pieces = model.tokenizer.pieces(o["ids_a"])
    rows.append(Claim(SECTION, t("claims.embedding.no_position.article"),
                      t("claims.embedding.no_position.measured", model=model.config.name, n=len(pieces),
                        same=yes(o["same_token_vectors"])),
                      Verdict.of(o["same_token_vectors"]), numbers={"same_token_vectors": o["same_token_vectors"]},
                      key="embedding.no_position"))

    equivariant = o["gap_no_mask_no_position"] < 1e-5
    mask_tells = o["gap_causal_mask_only"] > 1e-3
    rows.append(Claim(SECTION, t("claims.embedding.same_data.article"),
                      t("claims.embedding.same_data.measured", free=below(o["gap_no_mask_no_position"], 1e-5),
                        masked=f"{o['gap_causal_mask_only']:.3g}"),
                      # the point: without positions attention cannot tell the orders apart; a detail the article
                      # misses: the causal mask alone already tells them apart
                      Verdict.of(equivariant, not mask_tells),
                      numbers={k: o[k] for k in ("gap_no_mask_no_position", "gap_causal_mask_only")},
                      key="embedding.same_data"))

    trace = o["traces"][0]
    if model.config.position == "learned":
        added = trace.pos_emb is not None and torch.allclose(trace.x0, trace.tok_emb + trace.pos_emb)
        how = t("claims.embedding.position.learned", added=yes(added), shape=list(model.weights.position_embd.shape))
        rotated = False
    else:
        rope = rope_relative_check(model.config.d_head, model.config.rope_theta)
        how = t("claims.embedding.position.rope", context=gpt2.context_length, d_model=gpt2.d_model,
                model=model.config.name, plain=yes(torch.equal(trace.x0, trace.tok_emb)),
                score=f"{rope['scores'][0]:.4g}", spread=below(rope["spread"], 1e-3))
        # position does reach the model, but by rotation (scores depend on the offset only), not by addition
        added, rotated = False, rope["spread"] < 1e-3
    # the point: position reaches the model and tells the orders apart; the detail: by adding a position vector
    rows.append(Claim(SECTION, t("claims.embedding.position.article"),
                      t("claims.embedding.position.measured", how=how, cosine=f"{o['last_layer_cosine_min']:.3f}"),
                      Verdict.of((added or rotated) and o["last_layer_cosine_min"] < 0.99, added),
                      numbers={"position_added": added, "position_rotated": rotated,
                               "last_layer_cosine_min": o["last_layer_cosine_min"]}, key="embedding.position"))
    return rows
