"""Section 八's claims, measured: what one inference costs, and the three ways the article gives to make it cheaper.

GPT-2's numbers come from its published architecture (`cost.gpt2_config`: its weights need the network) unless
the model passed in is GPT-2 small itself; everything else is measured on the model passed in (SmolLM2 offline):
FLOPs counted by torch while `forward` runs, the structure read from a real trace, quantization errors on the
shipped text, speculative decoding's target passes. No wall-clock number appears here (those are in the notebook):
every value is the same on every run.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Callable, Sequence

import torch
from torch import Tensor

from .. import cost
from ..generate import Generation, generate
from ..kv_cache import KVCache
from ..quantize import (Comparison, compare_to_fp32, dequantize_model, eval_text, layer_weight_errors,
                        model_weight_bytes, quantize_activations, quantize_model)
from ..report import Claim, Table, table
from ..speculative import (BENCH_PROMPTS, Draft, PromptLookupDraft, SpeculativeResult, draft_by_name,
                           speculative_generate)
from ..walk import forward
from ..weights import Config, to_dtype
from .tokenization import DIFFERS, HOLDS, ROUGHLY

if TYPE_CHECKING:
    from ..models import Model

SECTION = "八"
PROMPT_LEN, NEW_TOKENS = 9, 50          # "输入 9 个 Token" … "生成50个 Token"
PROMPT = "Question: what is the capital of France?"   # 9 tokens for SmolLM2 (and for GPT-2)
ARTICLE_PARAMS = 120e6                  # 约 1.2 亿参数
ARTICLE_RULE = 3                        # 一次前向传播 ≈ 参数量 × 3
ARTICLE_FLOPS_PER_TOKEN = 360e6         # ≈ 3.6 亿次浮点运算
ARTICLE_ANSWER_FLOPS = 18e9             # 50 × 3.6 亿 ≈ 180 亿
ARTICLE_LLAMA_RATIO = 56                # LLaMA 7B 一次前向是 GPT-2 的 56 倍
ARTICLE_STRUCTURE = {"embedding look-ups": 9, "norms per layer": 2, "attention per layer": 1, "FFN per layer": 1,
                     "final norm": 0, "LM head": (768, 50257), "softmax + sampling per token": 1}
EVAL_TOKENS = 256                       # accuracy is measured on the shipped text's first 256 tokens
CLOSE, ROUGH = 0.10, 2.0                # a number "holds" within 10 %, is "roughly" right within a factor of 2
SMALL_KL, SMALL_TOP1 = 0.05, 0.90       # "little accuracy loss": KL below 0.05 nats and the same top token 90 % of the time
SPEC_K, SPEC_TOKENS = 4, 32             # speculative decoding: tokens drafted per round, tokens generated
SAME = 1e-3                             # "the same logits": float32 round-off stays far below this
SAME_WEIGHT = 1e-5                      # "the same weights": float32 round-off of d·q + m stays far below this
LAYER_NORMS = ("attn_norm", "ffn_norm", "post_attention_norm", "post_ffw_norm")   # a Block's norms over d_model


# ---------------------------------------------------------------- helpers the notebook uses too

def gpt2_small(model: "Model | None" = None) -> Config:
    """GPT-2 small's config: the model's own when it is GPT-2 small (online), else the published architecture."""
    if model is not None and model.config.family == "gpt2" and model.config.d_model == 768:
        return model.config
    return cost.gpt2_config()


def ratio_verdict(measured: float, said: float) -> str:
    """✓ within 10 % of what the article says, ≈ within a factor of 2, ✗ beyond."""
    r = max(measured, said) / min(measured, said)
    return HOLDS if r <= 1 + CLOSE else ROUGHLY if r <= ROUGH else DIFFERS


def prompt_ids(model: "Model", n: int | None = None) -> list[int]:
    """The article-sized prompt (PROMPT, 9 tokens) when n is None, else the first n tokens of the shipped text."""
    return model.tokenizer.encode(PROMPT) if n is None else model.tokenizer.encode(eval_text())[:n]


def counted(fn: Callable[[], Tensor]) -> tuple[int, Tensor]:
    """(FLOPs torch counts while fn runs, what fn returns): matrix products only, as cost.measured_flops."""
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as counter:
        out = fn()
    return counter.get_total_flops(), out


def decode_step_measured(model: "Model", context: int = PROMPT_LEN) -> int:
    """FLOPs torch counts for the token at position `context` (1-based), the ones before it in the KV cache."""
    ids = prompt_ids(model, None if context == PROMPT_LEN else context)
    cache = KVCache.empty(model.config, context)
    forward(model, ids[:-1], cache, record=False, last_only=True)
    return counted(lambda: forward(model, ids[-1:], cache, record=False, last_only=True).logits)[0]


def structure(model: "Model | Config", prompt_len: int = PROMPT_LEN) -> dict[str, object]:
    """What one pass over a prompt runs, item by item as the article lists them.

    A Model is traced (one forward pass over `prompt_len` tokens, counting what it computed); a Config (GPT-2 small
    without its weights) is read from its switches.
    """
    if isinstance(model, Config):
        c = model
        return {"layers": c.n_layer, "embedding look-ups": cost.embedding_lookups(c, prompt_len),
                "norms per layer": 4 if c.sandwich_norm else 2, "norm": c.norm, "attention per layer": 1,
                "FFN per layer": 1, "final norm": 1, "LM head": (c.d_model, c.vocab_size),
                "softmax + sampling per token": 1}
    trace = forward(model, prompt_ids(model, None if prompt_len == PROMPT_LEN else prompt_len))
    w = model.weights
    norms = {sum(getattr(b, name) is not None for name in LAYER_NORMS) for b in w.blocks}
    rows = trace.tok_emb.shape[0] + (0 if trace.pos_emb is None else trace.pos_emb.shape[0])
    return {"layers": len(trace.layers), "embedding look-ups": rows,
            "norms per layer": norms.pop() if len(norms) == 1 else sorted(norms), "norm": model.config.norm,
            "attention per layer": 1, "FFN per layer": 1,       # every BlockOut holds one attention and one FFN
            "final norm": int(w.output_norm is not None), "LM head": (trace.final.shape[-1], trace.logits.shape[-1]),
            "softmax + sampling per token": 1}       # generate draws one token from the last position's softmax


def structure_table(model: "Model", prompt_len: int = PROMPT_LEN) -> Table:
    """The article's per-token list next to GPT-2 small's architecture and the model's traced pass."""
    gpt2, mine = structure(gpt2_small(model), prompt_len), structure(model, prompt_len)
    said = {"layers": "多层 (several)", "norm": "LayerNorm", **ARTICLE_STRUCTURE}
    show = lambda v: f"{v[0]} → {v[1]}" if isinstance(v, tuple) else str(v)             # noqa: E731
    return table([(k, show(said[k]), show(gpt2[k]), show(mine[k])) for k in gpt2],
                 ("item", "the article", "GPT-2 small (architecture)", f"{model.config.name} (traced)"))


def structure_verdict(gpt2: dict) -> str:
    """✓ if GPT-2 runs exactly the article's list; ≈ if every layer and the head match but items are missing; else ✗."""
    same = {k: gpt2[k] == v for k, v in ARTICLE_STRUCTURE.items()}
    if all(same.values()):
        return HOLDS
    core = ("norms per layer", "attention per layer", "FFN per layer", "LM head", "softmax + sampling per token")
    return ROUGHLY if all(same[k] for k in core) else DIFFERS


def kv_cache_check(model: "Model", context: int = PROMPT_LEN + NEW_TOKENS) -> dict:
    """The last token of a `context`-token sequence, with the others' keys and values cached vs all recomputed.

    Returns the FLOPs torch counts each way, the largest logit difference, whether the next token is the same,
    and the bytes the cache holds.
    """
    ids = prompt_ids(model, context)
    cache = KVCache.empty(model.config, context)
    forward(model, ids[:-1], cache, record=False, last_only=True)
    cached, a = counted(lambda: forward(model, ids[-1:], cache, record=False, last_only=True).logits[-1])
    full, b = counted(lambda: forward(model, ids, record=False, last_only=True).logits[-1])
    return {"context": context, "flops_cached": cached, "flops_recomputed": full,
            "max_logit_diff": float((a - b).abs().max()), "same_token": int(a.argmax()) == int(b.argmax()),
            "cache_bytes": cache.nbytes()}


# ---------------------------------------------------------------- quantization

FORMATS = ("bf16", "int8", "int4 g32 symmetric", "int4 g32 asymmetric", "int8 weights + int8 activations")


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


def eval_prefix(model: "Model", n_tokens: int = EVAL_TOKENS) -> str:
    """The first n_tokens tokens of the shipped text, as text (for compare_to_fp32)."""
    return model.tokenizer.decode(prompt_ids(model, n_tokens))


def accuracy(model: "Model", names: Sequence[str] = FORMATS, n_tokens: int = EVAL_TOKENS) -> dict[str, Comparison]:
    """compare_to_fp32 for each format, on the shipped text's first n_tokens tokens (weight_bytes: the format's)."""
    text, out = eval_prefix(model, n_tokens), {}
    for name in names:
        changed, nbytes = variant(model, name)
        out[name] = replace(compare_to_fp32(model, changed, text), weight_bytes=nbytes)
    return out


def kl_text(kl: float) -> str:
    """A KL divergence for print: 4 significant digits, or '< 1e-6' where only float round-off is left."""
    return "< 1e-6" if kl < 1e-6 else f"{kl:.4g}"


def accuracy_table(comparisons: dict[str, Comparison]) -> Table:
    """One row per format: weight memory, KL to fp32, top-1 agreement, perplexity."""
    first = next(iter(comparisons.values()))
    rows = [("fp32 (as loaded)", f"{first.fp32_weight_bytes / 1e6:.4g}", "0", "100.0 %", f"{first.perplexity_fp32:.4g}")]
    rows += [(name, f"{c.weight_bytes / 1e6:.4g}", kl_text(c.kl_mean), f"{100 * c.top1_agreement:.1f} %",
              f"{c.perplexity:.4g}") for name, c in comparisons.items()]
    return table(rows, ("format", "weights MB", "KL(fp32 ‖ format), mean", "same top-1 token", "perplexity"),
                 f"the shipped text's first {first.n_tokens} tokens")


def small_loss(c: Comparison) -> bool:
    return c.kl_mean < SMALL_KL and c.top1_agreement >= SMALL_TOP1


def q4_1_grid_error(model: "Model") -> float:
    """Largest |w − int4 g32 asymmetric(w)| over every layer matrix: ~0 when the weights already sit on Q4_1's grid."""
    errors = layer_weight_errors(model, quantize_model(model, 4, 32, symmetric=False))
    return max(r["max_abs_error"] for r in errors)


# ---------------------------------------------------------------- speculative decoding

def speculative_run(model: "Model", prompt: str = "repeat", draft: Draft | None = None, k: int = SPEC_K,
                    max_new_tokens: int = SPEC_TOKENS) -> tuple[SpeculativeResult, Generation]:
    """Greedy speculative decoding of one of speculative.BENCH_PROMPTS (draft: prompt lookup unless given), and
    plain greedy decoding of it."""
    text, chat = BENCH_PROMPTS[prompt]
    chat = chat and bool(getattr(model.tokenizer, "chat_template", None))    # base models (GPT-2) have no template
    spec = speculative_generate(model, draft or PromptLookupDraft(), text, k, max_new_tokens=max_new_tokens, chat=chat)
    return spec, generate(model, text, max_new_tokens=max_new_tokens, chat=chat)


def speculative_runs(model: "Model") -> dict[str, tuple[SpeculativeResult, Generation]]:
    """The claim's three runs: prompt lookup on 'repeat' and on 'no copy', and the model's int8 copy drafting 'no copy'."""
    return {"repeat": speculative_run(model, "repeat"), "no copy": speculative_run(model, "no copy"),
            "int8 draft": speculative_run(model, "no copy", draft_by_name(model, "int8"))}


def passes_per_token(spec: SpeculativeResult) -> float:
    """Target forward passes per generated token (1 + 1/n for plain decoding with a prefill)."""
    return spec.target_forward_passes / len(spec.new_ids)


# ---------------------------------------------------------------- the claims

def _m(x: float) -> str:
    return f"{x / 1e6:.4g} M" if x < 1e9 else _b(x)


def _sci(x: float) -> str:
    return f"{x:.2g}".replace("e-0", "e-")


def _b(x: float) -> str:
    return f"{x / 1e9:.4g} B"


def _architecture_claim(gpt2: Config, model: "Model") -> Claim:
    c, n = gpt2, cost.n_params(gpt2)
    shape = (c.n_layer, c.d_model, c.n_head) == (12, 768, 12)
    verdict = ratio_verdict(n, ARTICLE_PARAMS) if shape else DIFFERS
    m = model.config
    return Claim(SECTION, "GPT-2: 12 layers, 768 dimensions, 12 heads, about 120 million (1.2 亿) parameters",
                 f"GPT-2 small: {c.n_layer} layers, d_model {c.d_model}, {c.n_head} heads; {n:,} parameters counted "
                 f"from the architecture (the released checkpoint's count), {100 * (n / ARTICLE_PARAMS - 1):.1f} % "
                 f"above 120 M. For comparison {m.name}: {m.n_layer} layers, {m.d_model}, {m.n_head} heads, "
                 f"{_m(cost.n_params(m))}", verdict)


def _rule_claim(gpt2: Config, model: "Model", measured: int) -> Claim:
    real = sum(cost.decode_step_flops(gpt2, PROMPT_LEN).values())
    n, nm = cost.n_params(gpt2), cost.n_params(model.config)
    return Claim(SECTION, "One forward pass ≈ parameters × 3 (rule of thumb) ≈ 1.2 亿 × 3 ≈ 360 M FLOPs",
                 f"one token through GPT-2 small (the {PROMPT_LEN}th, earlier ones cached): {_m(real)} FLOPs = "
                 f"{real / n:.3g} × parameters; × 3 would give {_m(ARTICLE_RULE * n)}, "
                 f"{ARTICLE_RULE * n / real:.3g}× too many. {model.config.name}, counted by torch as it runs: "
                 f"{_m(measured)} = {measured / nm:.3g} × its parameters. A weight does one multiply-add (2 FLOPs) "
                 f"per token: ≈ 2 × parameters", ratio_verdict(real, ARTICLE_FLOPS_PER_TOKEN))


def _answer_claim(gpt2: Config) -> Claim:
    est = cost.article_estimate(gpt2, PROMPT_LEN, NEW_TOKENS)
    real, none = est["flops_answer_kv_cache"], est["flops_answer_no_cache"]
    return Claim(SECTION, f"Generating {NEW_TOKENS} tokens ≈ 50 × 3.6 亿 ≈ 180 亿 (18 B) FLOPs",
                 f"GPT-2 small, {PROMPT_LEN}-token prompt, {NEW_TOKENS} new tokens: {_b(real)} FLOPs with a KV "
                 f"cache (the article's rule: {_b(est['article_flops_answer'])} with 124.4 M parameters); "
                 f"{_b(none)} without a cache, rerunning the prefix every round ({none / ARTICLE_ANSWER_FLOPS:.3g}× "
                 f"the article's figure)", ratio_verdict(real, ARTICLE_ANSWER_FLOPS))


def _structure_claim(gpt2: Config, model: "Model") -> Claim:
    g, s = structure(gpt2), structure(model)
    return Claim(SECTION, "Per token: 9 embedding look-ups; per layer 2 LayerNorms + 1 attention + 1 FFN; 1 LM head "
                 "(768 → 50257); 1 softmax + sampling",
                 f"GPT-2 small ({g['layers']} layers): {g['embedding look-ups']} rows for a {PROMPT_LEN}-token prompt "
                 f"(token + learned position; then 2 per new token); per layer {g['norms per layer']} LayerNorms, "
                 f"1 attention, 1 MLP; plus a final LayerNorm ({g['final norm']}) the list leaves out; LM head "
                 f"{g['LM head'][0]} → {g['LM head'][1]} (the token table reused); 1 softmax + sampling per new token. "
                 f"{model.config.name}, traced: {s['embedding look-ups']} rows (no position table: RoPE), "
                 f"{s['norms per layer']} {s['norm']}s + attention + FFN in each of {s['layers']} layers, a final "
                 f"norm, head {s['LM head'][0]} → {s['LM head'][1]}", structure_verdict(g))


def _llama_claim(gpt2: Config) -> Claim:
    llama = cost.llama7b_config()
    by_params = cost.n_params(llama) / cost.n_params(gpt2)
    by_flops = (sum(cost.decode_step_flops(llama, PROMPT_LEN).values())
                / sum(cost.decode_step_flops(gpt2, PROMPT_LEN).values()))
    return Claim(SECTION, f"LLaMA 7B's forward pass is {ARTICLE_LLAMA_RATIO}× GPT-2's",
                 f"LLaMA-7B ({llama.n_layer} layers, d_model {llama.d_model}, d_ff {llama.d_ff}, vocab "
                 f"{llama.vocab_size:,}): {_b(cost.n_params(llama))} parameters = {by_params:.4g}× GPT-2 small's; "
                 f"FLOPs per token at context {PROMPT_LEN}: {by_flops:.4g}×", ratio_verdict(by_flops, ARTICLE_LLAMA_RATIO))


def _kv_claim(gpt2: Config, model: "Model", kv: dict) -> Claim:
    est = cost.article_estimate(gpt2, PROMPT_LEN, NEW_TOKENS)
    ratio = kv["flops_recomputed"] / kv["flops_cached"]
    same = kv["same_token"] and kv["max_logit_diff"] < SAME
    return Claim(SECTION, "KV cache: keep the keys and values already computed instead of recomputing them",
                 f"{model.config.name}, token {kv['context']} ({PROMPT_LEN} + {NEW_TOKENS}), counted by torch: "
                 f"{_m(kv['flops_cached'])} FLOPs with the cache, {_m(kv['flops_recomputed'])} recomputing all "
                 f"({ratio:.3g}× more); same logits (max difference < {SAME:g}) and next token: "
                 f"{'yes' if same else 'no'}. The cache holds {kv['cache_bytes'] / kv['context'] / 1e3:.4g} kB per "
                 f"token (fp32). GPT-2's {NEW_TOKENS}-token answer: "
                 f"{est['flops_answer_no_cache'] / est['flops_answer_kv_cache']:.3g}× fewer FLOPs with it",
                 HOLDS if same and ratio > 1 else DIFFERS)


def _int8_claim(model: "Model", c: Comparison) -> Claim:
    return Claim(SECTION, "Quantization: FP32 → INT8 cuts memory and compute, with little accuracy loss",
                 f"{model.config.name}, int8 weights (one scale per output column; token table kept fp32): "
                 f"{c.fp32_weight_bytes / 1e6:.4g} → {c.weight_bytes / 1e6:.4g} MB; on the shipped text's first "
                 f"{c.n_tokens} tokens KL {kl_text(c.kl_mean)}, same top token {100 * c.top1_agreement:.1f} %, "
                 f"perplexity {c.perplexity_fp32:.4g} → {c.perplexity:.4g}",
                 HOLDS if small_loss(c) and c.weight_bytes < c.fp32_weight_bytes else DIFFERS)


def _int4_claim(model: "Model", sym: Comparison, grid_error: float) -> Claim:
    verdict = HOLDS if small_loss(sym) else ROUGHLY if sym.kl_mean < ROUGH * SMALL_KL else DIFFERS
    return Claim(SECTION, "…and FP32 → INT4, with little accuracy loss",
                 f"int4, groups of 32, symmetric: {sym.fp32_weight_bytes / 1e6:.4g} → {sym.weight_bytes / 1e6:.4g} MB; "
                 f"KL {kl_text(sym.kl_mean)}, same top token {100 * sym.top1_agreement:.1f} %, perplexity "
                 f"{sym.perplexity_fp32:.4g} → {sym.perplexity:.4g}: a visible loss on a {_m(cost.n_params(model.config))} "
                 f"model. The released file is itself 4-bit (GGUF Q4_1: groups of 32, scale + minimum); asymmetric "
                 f"int4 g32 reproduces its weights ({'every one within' if grid_error < SAME_WEIGHT else 'not: up to'} "
                 f"{_sci(SAME_WEIGHT if grid_error < SAME_WEIGHT else grid_error)}), but the weights it was made from "
                 f"are not shipped, so Q4_1's own loss can't be measured here", verdict)


def _speculative_claim(model: "Model", runs: dict[str, tuple[SpeculativeResult, Generation]]) -> Claim:
    (rep, rep_plain), (new, new_plain), (i8, i8_plain) = runs["repeat"], runs["no copy"], runs["int8 draft"]
    same = rep.new_ids == rep_plain.new_ids and new.new_ids == new_plain.new_ids and i8.new_ids == i8_plain.new_ids
    fast = passes_per_token(rep) < 0.5 and passes_per_token(i8) < 0.5
    return Claim(SECTION, "Speculative decoding: a small model drafts a few tokens, the big one checks them in "
                 "parallel: faster",
                 f"{model.config.name}, greedy, k = {SPEC_K}. Drafts copied from the context (prompt lookup): asked to "
                 f"repeat a sentence, {len(rep.new_ids)} tokens in {rep.target_forward_passes} target passes "
                 f"({passes_per_token(rep):.3g} per token), {100 * rep.acceptance_rate:.0f} % of drafted tokens "
                 f"accepted; with nothing to copy, {len(new.new_ids)} tokens in {new.target_forward_passes} passes "
                 f"({100 * new.acceptance_rate:.0f} % accepted). The model's own int8 copy (a quarter of the bytes) "
                 f"as the small drafting model, nothing to copy: {len(i8.new_ids)} tokens in "
                 f"{i8.target_forward_passes} passes ({passes_per_token(i8):.3g} per token), "
                 f"{100 * i8.acceptance_rate:.0f} % accepted. Text identical to plain greedy decoding: "
                 f"{'yes' if same else 'no'}. Wall time: see notebook 08 and `python -m llmwalk.bench speculative`",
                 HOLDS if same and fast else ROUGHLY if same else DIFFERS)


def claims(model: "Model", comparisons: dict[str, Comparison] | None = None,
           runs: dict[str, tuple[SpeculativeResult, Generation]] | None = None) -> list[Claim]:
    """Section 八, measured on `model` (SmolLM2) and on GPT-2 small's and LLaMA-7B's architectures.

    comparisons: accuracy(model, ...) with at least 'int8' and 'int4 g32 symmetric';
    runs: speculative_runs(model) — notebook 08 passes its own.
    """
    gpt2 = gpt2_small(model)
    if comparisons is None:
        comparisons = accuracy(model, ("int8", "int4 g32 symmetric"))
    if runs is None:
        runs = speculative_runs(model)
    return [_architecture_claim(gpt2, model),
            _rule_claim(gpt2, model, decode_step_measured(model)),
            _answer_claim(gpt2),
            _structure_claim(gpt2, model),
            _llama_claim(gpt2),
            _kv_claim(gpt2, model, kv_cache_check(model)),
            _int8_claim(model, comparisons["int8"]),
            _int4_claim(model, comparisons["int4 g32 symmetric"], q4_1_grid_error(model)),
            _speculative_claim(model, runs)]
