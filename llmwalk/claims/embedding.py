"""Section 三's claims, measured on a real model's embedding table and its forward pass.

GPT-2's weights need the network, so GPT-2's numbers come from its published architecture (`cost.gpt2_config`);
everything else is measured on the model passed in (SmolLM2 offline, or GPT-2 itself when online).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..cost import gpt2_small
from ..embedding import apply_rope, neighbour_rank, neighbours, rope_angles, token_embedding
from ..i18n import quoted, t
from . import below, listed, named, yes
from ..layers import attention, causal_mask, norm
from ..report import Claim, Verdict
from ..walk import forward

if TYPE_CHECKING:
    from ..models import Model

SECTION = "三"
ORDER_PAIR = ("人咬狗", "狗咬人")                  # the article's example: man bites dog / dog bites man
RELATED = ((" Paris", " France"), (" king", " queen"), (" dog", " cat"))
NEAR = 20                                       # "near": among the 20 closest rows of the whole table


# ---------------------------------------------------------------- measurements

def same_rows(a: Tensor, b: Tensor) -> bool:
    """Whether b holds exactly a's rows, in some order.  # [T, d], [T, d]"""
    return a.shape == b.shape and sorted(map(tuple, a.tolist())) == sorted(map(tuple, b.tolist()))


def order_check(model: "Model", text_a: str, text_b: str) -> dict:
    """Two orders of the same tokens (人咬狗 / 狗咬人): what the token vectors, attention and the model make of them.

    Returns: the ids; whether the token vectors are the same rows; the largest difference between layer 0's
    attention output for a token in one sentence and the same token in the other, relative to the largest
    output, in four set-ups — neither mask nor positions, positions only (no mask), the causal mask only, and the
    real model (mask and positions) — and the same difference token by token ("token_gaps", in text_a's order);
    the cosine between the last layer's vectors of the same token in the two sentences (smallest and mean over
    tokens).
    """
    config, w = model.config, model.weights
    ids_a = torch.tensor(model.tokenizer.encode(text_a))
    ids_b = torch.tensor(model.tokenizer.encode(text_b))
    if not torch.equal(ids_a.sort().values, ids_b.sort().values):
        raise ValueError(f"{text_a!r} and {text_b!r} are not the same tokens in another order for {model.tokenizer.name}")
    order_a, order_b = ids_a.argsort(stable=True), ids_b.argsort(stable=True)   # token k of a <-> token k of b
    trace_a, trace_b = forward(model, ids_a), forward(model, ids_b)
    t = len(ids_a)

    def layer0(ids, mask, rope):
        x = token_embedding(ids, w.token_embd, config.embed_scale)
        if w.position_embd is not None and rope == "learned":
            x = x + w.position_embd[: len(ids)]
        return attention(norm(x, w.blocks[0].attn_norm, config), w.blocks[0], config, mask,
                         rope if isinstance(rope, tuple) else None).out

    def token_gaps(mask, rope):    # [T]: each token of text_a against itself in text_b
        with torch.inference_mode():
            a, b = layer0(ids_a, mask, rope), layer0(ids_b, mask, rope)
        per_token = (a[order_a] - b[order_b]).abs().amax(-1) / a.abs().max()    # in sorted-id order
        return per_token[order_a.argsort()].tolist()                            # back to text_a's order

    full, causal = torch.ones(t, t, dtype=torch.bool), causal_mask(t)
    positions = rope_angles(torch.arange(t), config.d_head, config.theta(0)) if config.position == "rope" else "learned"
    setups = {"no_mask_no_position": (full, None), "position_only": (full, positions),
              "causal_mask_only": (causal, None), "mask_and_position": (causal, positions)}
    gaps = {name: token_gaps(*setup) for name, setup in setups.items()}
    last_a, last_b = trace_a.resid[-1][order_a], trace_b.resid[-1][order_b]
    cos = F.cosine_similarity(last_a, last_b, dim=-1)
    return {"ids_a": ids_a.tolist(), "ids_b": ids_b.tolist(),
            "same_token_vectors": same_rows(trace_a.tok_emb, trace_b.tok_emb),
            **{f"gap_{name}": max(g) for name, g in gaps.items()}, "token_gaps": gaps,
            "last_layer_cosine_min": float(cos.min()), "last_layer_cosine_mean": float(cos.mean()),
            "traces": (trace_a, trace_b)}


def rope_relative_check(d_head: int = 64, theta: float = 10000.0, seed: int = 0,
                        pairs: Sequence[tuple[int, int]] = ((3, 1), (10, 8), (100, 98), (1000, 998))) -> dict:
    """RoPE on random q and k: the score q(m)·k(n) for several (m, n) with the same m − n, and one with another gap.

    Returns the scores, their largest spread (≈ 0: only m − n matters) and the score at another distance.
    """
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, 1, d_head, generator=g), torch.randn(1, 1, d_head, generator=g)

    def score(m, n):
        qm = apply_rope(q, *rope_angles(torch.tensor([m]), d_head, theta))
        kn = apply_rope(k, *rope_angles(torch.tensor([n]), d_head, theta))
        return float((qm * kn).sum())

    scores = [score(m, n) for m, n in pairs]
    m0, n0 = pairs[0]
    return {"pairs": list(pairs), "scores": scores, "spread": max(scores) - min(scores),
            "other_gap": (m0, n0 + 1), "other_score": score(m0, n0 + 1), "unrotated": float((q * k).sum())}



# ---------------------------------------------------------------- the claims

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
                        ranks=listed(t("claims.embedding.learned.rank", a=quoted(a), b=quoted(b), rank=r)
                                     for (a, b), r in ranks.items()),
                        vocab=vocab, random=vocab // 2, word=quoted(RELATED[0][0]),
                        near=listed(quoted(p) for p, _ in near)),
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
                      t("claims.embedding.same_data.measured", free=below(o["gap_no_mask_no_position"], "1e-05"),
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
                score=f"{rope['scores'][0]:.4g}", spread=below(rope["spread"], "0.001"))
        # position does reach the model, but by rotation (scores depend on the offset only), not by addition
        added, rotated = False, rope["spread"] < 1e-3
    # the point: position reaches the model and tells the orders apart; the detail: by adding a position vector
    rows.append(Claim(SECTION, t("claims.embedding.position.article"),
                      t("claims.embedding.position.measured", how=how, cosine=f"{o['last_layer_cosine_min']:.3f}"),
                      Verdict.of((added or rotated) and o["last_layer_cosine_min"] < 0.99, added),
                      numbers={"position_added": added, "position_rotated": rotated,
                               "last_layer_cosine_min": o["last_layer_cosine_min"]}, key="embedding.position"))
    return rows
