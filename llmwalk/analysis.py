"""Measurements the notebooks and the article's claims make, one section per stage of the walk.

Each helper measures one thing on a real model (the nearest rows of the embedding table, a token's rank through
the logit lens, the entropy of a distribution, a loop in a generation, FLOPs counted by torch, a number format's
accuracy) and returns numbers, not prose: `llmwalk.claims` turns them into the article's verdicts, the notebooks
show them.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Iterator, Sequence

import torch
from torch import Tensor

from . import cost
from .accuracy import Comparison, compare_to_fp32, eval_text, layer_weight_errors
from .embedding import apply_rope, rope_angles, token_embedding
from .generation import Generation, Pass, cut_at_eos, decoding_head, generate, watching
from .head import logit_lens, softmax
from .kv_cache import KVCache
from .layers import attention, causal_mask, ffn, norm
from .quantize import dequantize_model, model_weight_bytes, quantize_activations, quantize_model
from .report import Table, table
from .sampling import probs_after
from .walk import Trace, forward
from .weights import tensors, to_dtype

if TYPE_CHECKING:
    from .journey import Journey
    from .models import Model
    from .speculative import SpeculativeResult

FORMATS = ("bf16", "int8", "int4 g32 symmetric", "int4 g32 asymmetric", "int8 weights + int8 activations")
EVAL_TOKENS = 256    # accuracy is measured on the shipped text's first 256 tokens


# ---------------------------------------------------------------- embedding (notebook 03)

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
    cos = torch.nn.functional.cosine_similarity(last_a, last_b, dim=-1)
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


# ---------------------------------------------------------------- layers (notebook 04)

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


# ---------------------------------------------------------------- LM head (notebook 05)

def rank_of(probs: torch.Tensor, token: int) -> int:
    """1 for the most likely token."""
    return int((probs > probs[token]).sum()) + 1


@torch.inference_mode()
def word_probs(model: "Model", ids: Sequence[int], words: Sequence[str]) -> tuple[torch.Tensor, dict[str, dict]]:
    """The next-token distribution after `ids`, and for each word the probability that the model writes exactly
    its pieces next: P(piece 1) · P(piece 2 | piece 1) · … (one factor when the word is one token).

    The prompt runs once into a KV cache; each word's pieces then run from there (the cache is rewound to the
    prompt between words). Returns (probs [vocab], {word: ids, pieces, one_token, chain, p, rank of the first piece}).
    """
    pieces = {w: model.tokenizer.text_ids(w) for w in words}
    cache = KVCache.empty(model.config, len(ids) + max(len(p) for p in pieces.values()))
    probs = softmax(forward(model, ids, cache=cache, record=False, last_only=True).logits[-1])
    out = {}
    for w, p in pieces.items():
        chain = [float(probs[p[0]])]
        if len(p) > 1:
            cache.truncate(len(ids))                                     # back to the end of the prompt
            later = softmax(forward(model, p[:-1], cache=cache, record=False).logits)   # [len(p) - 1, vocab]
            chain += later[torch.arange(len(p) - 1), torch.as_tensor(p[1:])].tolist()
        out[w] = {"ids": p, "pieces": model.tokenizer.pieces(p), "one_token": len(p) == 1, "chain": chain,
                  "p": float(torch.tensor(chain).prod()), "rank": rank_of(probs, p[0])}
    return probs, out


def top_tokens(model: "Model", probs: torch.Tensor, k: int = 1) -> list[tuple[str, float]]:
    """The k most likely next tokens as (piece, probability)."""
    v = probs.topk(k)
    return list(zip(model.tokenizer.pieces(v.indices.tolist()), v.values.tolist()))


@lru_cache(maxsize=16)
def _starting_with(tokenizer, text: str) -> tuple[int, ...]:
    return tuple(i for i, p in enumerate(tokenizer.pieces(range(tokenizer.vocab_size))) if p.startswith(text))


def tokens_starting_with(tokenizer, text: str) -> list[int]:
    """Ids of every vocabulary entry whose text starts with `text` (Gemma-3: 巴 → 巴, 巴黎, 巴西, 巴士, 巴巴).

    A scan of the whole vocabulary, remembered per (tokenizer, text)."""
    return list(_starting_with(tokenizer, text))


def next_char_prob(tokenizer, probs: torch.Tensor, char: str) -> float:
    """P(the next token starts with `char`): the article's P(巴) for a vocabulary that has whole characters
    and words (for byte-level vocabularies, where 巴 is two byte pieces, use word_probs' chain instead)."""
    return float(probs[tokens_starting_with(tokenizer, char)].sum())


# ---------------------------------------------------------------- sampling (notebook 06)

def next_token_logits(model: "Model", text: str, chat: bool = False) -> Tensor:
    """The model's logits for the token after `text`.  # -> [vocab]"""
    return forward(model, model.tokenizer.encode(text, chat=chat), record=False, last_only=True).logits[0]


def entropy(logits: Tensor, temperature: float = 1.0) -> float:
    """Entropy in nats of softmax(logits / T): 0 when one token is certain, ln(vocab) when all are equal."""
    return float(torch.special.entr(probs_after(logits, temperature).double()).sum())   # float64: the same sum on any thread count


def kept(logits: Tensor, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
         min_p: float | None = None) -> int:
    """How many tokens can still be drawn after the cuts (probability > 0)."""
    return int((probs_after(logits, temperature, top_k, top_p, min_p) > 0).sum())


@dataclass(frozen=True)
class Loop:
    """A sequence's repeating tail: from index `start` on, the same `period` tokens come back again and again."""

    start: int                  # index in the sequence of the first token of the repeating tail
    period: int                 # tokens per repetition
    repeats: float              # how many periods the tail spans (the last one may be unfinished)
    ids: tuple[int, ...]        # the first period of the tail


def find_loop(ids: Sequence[int], min_repeats: float = 3) -> Loop | None:
    """The longest tail of `ids` that repeats with a fixed period at least `min_repeats` times (None if none).

    For every period p the tail is extended backwards while ids[i] == ids[i + p]; the longest tail wins, and
    among equally long tails the shortest period (a loop of 5 tokens also "repeats" every 10).
    """
    ids, best = list(ids), None
    for p in range(1, len(ids) // 2 + 1):
        start = len(ids) - p
        while start > 0 and ids[start - 1] == ids[start - 1 + p]:
            start -= 1
        length = len(ids) - start
        if length / p >= min_repeats and (best is None or length > len(ids) - best.start):
            best = Loop(start, p, length / p, tuple(ids[start:start + p]))
    return best


def distinct_n(seqs: Sequence[Sequence[int]], n: int = 2) -> float:
    """Distinct n-grams / all n-grams, pooled over the sequences: 1 when nothing repeats, 1/k for k identical copies."""
    grams = [tuple(s[i:i + n]) for s in seqs for i in range(len(s) - n + 1)]
    return len(set(grams)) / len(grams) if grams else float("nan")


def token_logprobs(model: "Model", prompt_ids: Sequence[int], new_ids: Sequence[int]) -> Tensor:
    """log p of each new token under the plain model (T = 1, no cuts), from one forward pass.  # -> [len(new_ids)]"""
    logits = forward(model, list(prompt_ids) + list(new_ids), record=False).logits
    logp = logits[len(prompt_ids) - 1:-1].log_softmax(-1)
    return logp.gather(-1, torch.tensor(list(new_ids))[:, None]).squeeze(-1)


@dataclass(frozen=True)
class Run:
    """One sampled answer of the temperature study."""

    temperature: float
    seed: int
    text: str
    new_ids: tuple[int, ...]    # EOS included when the answer ended there
    stopped: str
    mean_logprob: float         # mean log p of the new tokens under the plain model (T = 1): how natural it reads


def temperature_study(model: "Model", prompt: str, *, temperatures: Sequence[float], seeds: Sequence[int],
                      max_new_tokens: int) -> list[Run]:
    """Answer a chat prompt at every temperature with every seed (no top-k/top-p: temperature alone)."""
    head, runs = decoding_head(model), []
    for t in temperatures:
        for seed in seeds:
            g = generate(model, prompt, max_new_tokens, temperature=t, seed=seed, chat=True, head=head)
            lp = float(token_logprobs(model, g.prompt_ids, g.new_ids).mean())
            runs.append(Run(t, seed, g.text, tuple(g.new_ids), g.stopped, lp))
    return runs


def study_summary(runs: Sequence[Run]) -> dict[float, dict[str, float]]:
    """Per temperature: distinct-2 over its answers (variety), mean log p (naturalness), identical answers."""
    out = {}
    for t in dict.fromkeys(r.temperature for r in runs):
        group = [r for r in runs if r.temperature == t]
        out[t] = {"distinct_2": distinct_n([r.new_ids for r in group], 2),
                  "mean_logprob": sum(r.mean_logprob for r in group) / len(group),
                  "all_identical": float(len({r.new_ids for r in group}) == 1)}
    return out


# ---------------------------------------------------------------- the loop (notebooks 01, 07, 09)

@contextmanager
def recorded_passes() -> Iterator[list[Pass]]:
    """Record every forward pass generate() makes while the block runs (through generation.watching).

        with recorded_passes() as passes:
            generate(model, "Hello", 5, kv_cache=False)
        [len(p.ids) for p in passes]        # the tokens each round ran through the model
    """
    passes: list[Pass] = []
    with watching(passes.append):
        yield passes


def first_rounds(model: "Model", g: Generation, n: int) -> Generation:
    """What generate(..., n) would have returned: the first n rounds of a longer run, up to an end token."""
    ids, text, stopped = cut_at_eos(model, [s.token_id for s in g.steps[:n]], model.eos_ids)
    return Generation(g.prompt_ids, ids, text, g.steps[:len(ids)], stopped)


def timings(j: "Journey") -> dict[str, float]:
    """Wall-clock seconds of a journey: the first token stage by stage, and the answer loop (KV cache, greedy).

    These change from run to run and machine to machine: show them in a cell nbval ignores.
    """
    steps = j.answer.steps
    return {"first_token": sum(j.seconds.values()),
            "answer_first_token": steps[0].seconds,
            "per_token": sum(s.seconds for s in steps[1:]) / max(len(steps) - 1, 1),
            "answer": sum(s.seconds for s in steps),
            "tokens": len(steps)}


def first_word_round(model: "Model", g: Generation, word: str) -> int | None:
    """The round in which `word` is complete in the answer (1 = the first token), None if it never is."""
    for k in range(1, len(g.new_ids) + 1):
        if word in model.tokenizer.decode(g.new_ids[:k]):
            return k
    return None


# ---------------------------------------------------------------- cost (notebook 08)

def eval_ids(model: "Model", n_tokens: int = EVAL_TOKENS) -> list[int]:
    """The first n_tokens tokens of the shipped evaluation text."""
    return model.tokenizer.encode(eval_text())[:n_tokens]


def decode_step_measured(model: "Model", ids: Sequence[int]) -> int:
    """FLOPs torch counts for the last of `ids`, the ones before it in the KV cache (one round of generation)."""
    ids = list(ids)
    cache = KVCache.empty(model.config, len(ids))
    forward(model, ids[:-1], cache, record=False, last_only=True)
    return cost.measured_flops(model, ids[-1:], cache, last_only=True)


def kv_cache_check(model: "Model", ids: Sequence[int]) -> dict:
    """The last of `ids`, with the others' keys and values cached vs all recomputed.

    Returns the FLOPs torch counts each way, the largest logit difference, whether the next token is the same,
    and the bytes the cache holds.
    """
    ids, context = list(ids), len(ids)
    cache = KVCache.empty(model.config, context)
    forward(model, ids[:-1], cache, record=False, last_only=True)
    # record=True: the readable path, whose products torch's counter sees (cost.measured_flops)
    cached, a = cost.counted(lambda: forward(model, ids[-1:], cache, last_only=True).logits[-1])
    full, b = cost.counted(lambda: forward(model, ids, last_only=True).logits[-1])
    return {"context": context, "flops_cached": cached, "flops_recomputed": full,
            "max_logit_diff": float((a - b).abs().max()), "same_token": int(a.argmax()) == int(b.argmax()),
            "cache_bytes": cache.nbytes()}


def variant(model: "Model", name: str) -> tuple["Model", int]:
    """The model in one number format (one of FORMATS), runnable by `forward`, and the bytes its weights take.

    The rounded weights are multiplied in fp32 (dequantized), so each row shows what the format's rounding
    alone costs: torch's integer kernels, which the speed section uses, also round activations to bf16.
    """
    if name == "bf16":
        bf16 = replace(model, weights=to_dtype(model.weights, torch.bfloat16))
        return dequantize_model(bf16), model_weight_bytes(bf16)
    q = {"int8": lambda: quantize_model(model, 8),
         "int8 weights + int8 activations": lambda: quantize_model(model, 8),
         "int4 g32 symmetric": lambda: quantize_model(model, 4, 32),
         "int4 g32 asymmetric": lambda: quantize_model(model, 4, 32, symmetric=False)}[name]()
    rounded = dequantize_model(q)
    return (quantize_activations(rounded) if "activations" in name else rounded), model_weight_bytes(q)


def accuracy(model: "Model", names: Sequence[str] = FORMATS, n_tokens: int = EVAL_TOKENS) -> dict[str, Comparison]:
    """compare_to_fp32 for each format, on the shipped text's first n_tokens tokens (weight_bytes: the format's)."""
    text, out = model.tokenizer.decode(eval_ids(model, n_tokens)), {}
    for name in names:
        changed, nbytes = variant(model, name)
        out[name] = replace(compare_to_fp32(model, changed, text), weight_bytes=nbytes)
    return out


def kl_text(kl: float) -> str:
    """A KL divergence for print: 2 significant digits, or '< 1e-6' where only float round-off is left."""
    return "< 1e-6" if kl < 1e-6 else f"{kl:.2g}"     # 2 digits: the 4th changes with the CPU's float sums


def accuracy_table(comparisons: dict[str, Comparison]) -> Table:
    """One row per format: weight memory, KL to fp32, top-1 agreement, perplexity."""
    first = next(iter(comparisons.values()))
    rows = [("fp32 (as loaded)", f"{first.fp32_weight_bytes / 1e6:.4g}", "0", "100.0 %", f"{first.perplexity_fp32:.4g}")]
    rows += [(name, f"{c.weight_bytes / 1e6:.4g}", kl_text(c.kl_mean), f"{100 * c.top1_agreement:.1f} %",
              f"{c.perplexity:.4g}") for name, c in comparisons.items()]
    return table(rows, ("format", "weights MB", "KL(fp32 ‖ format), mean", "same top-1 token", "perplexity"),
                 f"the shipped text's first {first.n_tokens} tokens")


def q4_1_grid_error(model: "Model") -> float:
    """Largest |w − int4 g32 asymmetric(w)| over every layer matrix: ~0 when the weights already sit on Q4_1's grid."""
    errors = layer_weight_errors(model, quantize_model(model, 4, 32, symmetric=False))
    return max(r["max_abs_error"] for r in errors)


def passes_per_token(spec: SpeculativeResult) -> float:
    """Target forward passes per generated token (1 + 1/n for plain decoding with a prefill)."""
    return spec.target_forward_passes / len(spec.new_ids)
