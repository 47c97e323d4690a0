"""Section 三's claims, measured on a real model's embedding table and its forward pass.

GPT-2's weights need the network, so GPT-2's numbers come from its published architecture (`cost.gpt2_config`);
everything else is measured on the model passed in (SmolLM2 offline, or GPT-2 itself when online).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch

from ..analysis import neighbour_rank, neighbours, order_check, rope_relative_check
from ..cost import gpt2_small
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
    return "; ".join(f"{m.config.name}: [{m.weights.token_embd.shape[0]}, {m.weights.token_embd.shape[1]}]"
                     for m in models)


def claims(model: "Model", others: Sequence["Model"] = ()) -> list[Claim]:
    """Every claim of section 三, measured on `model` (SmolLM2 offline); `others` add their table sizes."""
    rows = []
    gpt2 = gpt2_small(model)
    source = "measured" if gpt2 is model.config else "published config; its weights are online only"
    rows.append(Claim(SECTION, "each token becomes a 768-dimensional float vector (GPT-2)",
                      f"GPT-2 small: d_model = {gpt2.d_model}, table [{gpt2.vocab_size}, {gpt2.d_model}] ({source}); "
                      f"measured: {_names([model, *others])}, {str(model.weights.token_embd.dtype).removeprefix('torch.')}",
                      Verdict.of(gpt2.d_model == 768), numbers={"d_model": gpt2.d_model}, said=768))

    ranks = {(a, b): neighbour_rank(model, a, b) for a, b in RELATED}
    near = neighbours(model, RELATED[0][0], 3)
    vocab = model.weights.token_embd.shape[0]
    rows.append(Claim(SECTION, "the embedding table is learned in training (similar tokens, similar vectors)",
                      f"{model.config.name}: " + ", ".join(f"{b!r} is neighbour #{r} of {a!r}" for (a, b), r in ranks.items())
                      + f" among {vocab} rows (a random table: ~{vocab // 2}); closest to {RELATED[0][0]!r}: "
                      + ", ".join(repr(p) for p, _ in near),
                      Verdict.of(max(ranks.values()) <= NEAR), numbers={"ranks": ranks}))

    o = order_check(model, *ORDER_PAIR)
    pieces = model.tokenizer.pieces(o["ids_a"])
    rows.append(Claim(SECTION, "token embeddings carry no position: 人咬狗 and 狗咬人 give the same vectors",
                      f"{model.config.name}: {len(pieces)} tokens each; the same rows of the table in another order: "
                      f"{o['same_token_vectors']}", Verdict.of(o["same_token_vectors"])))

    equivariant = o["gap_no_mask_no_position"] < 1e-5
    mask_tells = o["gap_causal_mask_only"] > 1e-3
    rows.append(Claim(SECTION, "…so to attention 人咬狗 and 狗咬人 are the same data",
                      f"layer-0 attention output, each token vs itself in the other order (max |Δ| / max |out|) — "
                      f"no mask, no position: {below(o['gap_no_mask_no_position'], 1e-5)}; causal mask only: "
                      f"{o['gap_causal_mask_only']:.3g}",
                      # the point: without positions attention cannot tell the orders apart; a detail the article
                      # misses: the causal mask alone already tells them apart
                      Verdict.of(equivariant, not mask_tells),
                      numbers={k: o[k] for k in ("gap_no_mask_no_position", "gap_causal_mask_only")}))

    if model.config.position == "learned":
        trace = o["traces"][0]
        added = trace.pos_emb is not None and torch.allclose(trace.x0, trace.tok_emb + trace.pos_emb)
        how = f"x0 = token + position vector: {added}; position table {list(model.weights.position_embd.shape)}"
        point, detail = added, True
    else:
        trace = o["traces"][0]
        rope = rope_relative_check(model.config.d_head, model.config.rope_theta)
        how = (f"GPT-2 adds a learned table [{gpt2.context_length}, {gpt2.d_model}] (published config); "
               f"{model.config.name} adds nothing (layer-0 input = token vector: {torch.equal(trace.x0, trace.tok_emb)}) "
               f"and rotates q, k instead (RoPE: random q·k at (3, 1), (10, 8), (100, 98), (1000, 998): "
               f"{rope['scores'][0]:.4g} each, spread {below(rope['spread'], 1e-3)})")
        point, detail = True, False         # position does reach the model, but by rotation, not by addition
    rows.append(Claim(SECTION, "final input = token embedding + position embedding; then the model knows who comes first",
                      f"{how}; last layer, same token in 人咬狗 vs 狗咬人: cosine min {o['last_layer_cosine_min']:.3f}",
                      Verdict.of(point and o["last_layer_cosine_min"] < 0.99, detail),
                      numbers={"last_layer_cosine_min": o["last_layer_cosine_min"]}))
    return rows
