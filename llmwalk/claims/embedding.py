"""Section 三's claims, measured on a real model's embedding table and its forward pass.

GPT-2's weights need the network, so GPT-2's numbers come from its published architecture (`cost.gpt2_config`);
everything else is measured on the model passed in (SmolLM2 offline, or GPT-2 itself when online).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import torch
from torch import Tensor

from ..cost import gpt2_config
from ..embedding import apply_rope, rope_angles, token_embedding
from ..layers import attention, causal_mask, norm
from ..report import Claim
from ..walk import forward
from .tokenization import DIFFERS, HOLDS, ROUGHLY

if TYPE_CHECKING:
    from ..models import Model

SECTION = "三"
ORDER_PAIR = ("人咬狗", "狗咬人")                  # the article's example: man bites dog / dog bites man
RELATED = ((" Paris", " France"), (" king", " queen"), (" dog", " cat"))
NEAR = 20                                       # "near": among the 20 closest rows of the whole table


def cosine_to_all(table: Tensor, row: int) -> Tensor:
    """Cosine similarity between one row of the embedding table and every row.  # [vocab, d] -> [vocab]"""
    table = table.float()
    return (table @ table[row]) / (table.norm(dim=-1) * table[row].norm()).clamp_min(1e-12)


def neighbours(model: "Model", word: str, k: int = 8) -> list[tuple[str, float]]:
    """The k rows of the token embedding table closest (by cosine) to `word`'s row, the word itself left out."""
    i = model.tokenizer.token_id(word)
    sims = cosine_to_all(model.weights.token_embd, i)
    sims[i] = -2.0
    top = sims.topk(k)
    return [(model.tokenizer.pieces([j])[0], float(s)) for s, j in zip(top.values, top.indices.tolist())]


def neighbour_rank(model: "Model", word: str, other: str) -> int:
    """Where `other` ranks among `word`'s neighbours in the embedding table (1 = the closest row)."""
    i, j = model.tokenizer.token_id(word), model.tokenizer.token_id(other)
    sims = cosine_to_all(model.weights.token_embd, i)
    sims[i] = -2.0
    return int((sims > sims[j]).sum()) + 1


def same_rows(a: Tensor, b: Tensor) -> bool:
    """Whether b holds exactly a's rows, in some order.  # [T, d], [T, d]"""
    return a.shape == b.shape and sorted(map(tuple, a.tolist())) == sorted(map(tuple, b.tolist()))


def order_check(model: "Model", text_a: str, text_b: str) -> dict:
    """Two orders of the same tokens (人咬狗 / 狗咬人): what the token vectors, attention and the model make of them.

    Returns: the ids; whether the token vectors are the same rows; the largest difference between layer 0's
    attention output for a token in one sentence and the same token in the other, relative to the largest
    output — without position and without mask, with the causal mask only, and in the real model (mask and
    positions); the cosine between
    the last layer's vectors of the same token in the two sentences (smallest and mean over tokens).
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

    def gap(mask, rope):
        with torch.inference_mode():
            a, b = layer0(ids_a, mask, rope), layer0(ids_b, mask, rope)
        return float((a[order_a] - b[order_b]).abs().max() / a.abs().max())

    full, causal = torch.ones(t, t, dtype=torch.bool), causal_mask(t)
    positions = rope_angles(torch.arange(t), config.d_head, config.theta(0)) if config.position == "rope" else "learned"
    last_a, last_b = trace_a.resid[-1][order_a], trace_b.resid[-1][order_b]
    cos = torch.nn.functional.cosine_similarity(last_a, last_b, dim=-1)
    return {"ids_a": ids_a.tolist(), "ids_b": ids_b.tolist(),
            "same_token_vectors": same_rows(trace_a.tok_emb, trace_b.tok_emb),
            "gap_no_mask_no_position": gap(full, None),
            "gap_causal_mask_only": gap(causal, None),
            "gap_mask_and_position": gap(causal, positions),
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


def below(x: float, tol: float) -> str:
    """A number that is rounding noise when below `tol`: shown as '< tol', so it reads the same on every machine."""
    return f"< {tol:g}" if abs(x) < tol else f"{x:.3g}"


def _names(models) -> str:
    return "; ".join(f"{m.config.name}: [{m.weights.token_embd.shape[0]}, {m.weights.token_embd.shape[1]}]"
                     for m in models)


def claims(model: "Model", others: Sequence["Model"] = ()) -> list[Claim]:
    """Every claim of section 三, measured on `model` (SmolLM2 offline); `others` add their table sizes."""
    rows = []
    gpt2 = model.config if model.config.family == "gpt2" else gpt2_config()
    source = "measured" if model.config.family == "gpt2" else "published config; its weights are online only"
    rows.append(Claim(SECTION, "each token becomes a 768-dimensional float vector (GPT-2)",
                      f"GPT-2 small: d_model = {gpt2.d_model}, table [{gpt2.vocab_size}, {gpt2.d_model}] ({source}); "
                      f"measured: {_names([model, *others])}, {str(model.weights.token_embd.dtype).removeprefix('torch.')}",
                      HOLDS if gpt2.d_model == 768 else DIFFERS))

    ranks = {(a, b): neighbour_rank(model, a, b) for a, b in RELATED}
    near = neighbours(model, RELATED[0][0], 3)
    vocab = model.weights.token_embd.shape[0]
    rows.append(Claim(SECTION, "the embedding table is learned in training (similar tokens, similar vectors)",
                      f"{model.config.name}: " + ", ".join(f"{b!r} is neighbour #{r} of {a!r}" for (a, b), r in ranks.items())
                      + f" among {vocab} rows (a random table: ~{vocab // 2}); closest to {RELATED[0][0]!r}: "
                      + ", ".join(repr(p) for p, _ in near),
                      HOLDS if max(ranks.values()) <= NEAR else DIFFERS))

    o = order_check(model, *ORDER_PAIR)
    pieces = model.tokenizer.pieces(o["ids_a"])
    rows.append(Claim(SECTION, "token embeddings carry no position: 人咬狗 and 狗咬人 give the same vectors",
                      f"{model.config.name}: {len(pieces)} tokens each; the same rows of the table in another order: "
                      f"{o['same_token_vectors']}", HOLDS if o["same_token_vectors"] else DIFFERS))

    equivariant = o["gap_no_mask_no_position"] < 1e-5
    mask_tells = o["gap_causal_mask_only"] > 1e-3
    rows.append(Claim(SECTION, "…so to attention 人咬狗 and 狗咬人 are the same data",
                      f"layer-0 attention output, each token vs itself in the other order (max |Δ| / max |out|) — "
                      f"no mask, no position: {below(o['gap_no_mask_no_position'], 1e-5)}; causal mask only: "
                      f"{o['gap_causal_mask_only']:.3g}",
                      (ROUGHLY if mask_tells else HOLDS) if equivariant else DIFFERS))

    if model.config.position == "learned":
        trace = o["traces"][0]
        added = trace.pos_emb is not None and torch.allclose(trace.x0, trace.tok_emb + trace.pos_emb)
        how = f"x0 = token + position vector: {added}; position table {list(model.weights.position_embd.shape)}"
        verdict = HOLDS if added else DIFFERS
    else:
        trace = o["traces"][0]
        rope = rope_relative_check(model.config.d_head, model.config.rope_theta)
        how = (f"GPT-2 adds a learned table [{gpt2.context_length}, {gpt2.d_model}] (published config); "
               f"{model.config.name} adds nothing (layer-0 input = token vector: {torch.equal(trace.x0, trace.tok_emb)}) "
               f"and rotates q, k instead (RoPE: random q·k at (3, 1), (10, 8), (100, 98), (1000, 998): "
               f"{rope['scores'][0]:.4g} each, spread {below(rope['spread'], 1e-3)})")
        verdict = ROUGHLY
    rows.append(Claim(SECTION, "final input = token embedding + position embedding; then the model knows who comes first",
                      f"{how}; last layer, same token in 人咬狗 vs 狗咬人: cosine min {o['last_layer_cosine_min']:.3f}",
                      verdict if o["last_layer_cosine_min"] < 0.99 else DIFFERS))
    return rows
