"""Section 八's claims, measured: what one inference costs, and the three ways the article gives to make it cheaper.

GPT-2's numbers come from its published architecture (`cost.gpt2_config`: its weights need the network) unless
the model passed in is GPT-2 small itself; everything else is measured on the model passed in (SmolLM2 offline):
FLOPs counted by torch while `forward` runs, the structure read from a real trace, quantization errors on the
shipped text, speculative decoding's target passes. No wall-clock number appears here (those are in the notebook):
every value is the same on every run.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .. import cost
from ..accuracy import Comparison
from ..analysis import (accuracy, decode_step_measured, eval_ids, kl_text, kv_cache_check, passes_per_token,
                        q4_1_grid_error, rank_of)
from ..generation import Generation, generate
from ..bench import BENCH_PROMPTS
from ..report import Claim, Table, Verdict, table
from ..quantize import dequantize_model, quantize_model
from ..speculative import Draft, ModelDraft, PromptLookupDraft, SpeculativeResult, speculative_generate
from ..walk import forward
from ..weights import Config

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
SMALL_KL, SMALL_TOP1 = 0.05, 0.90       # "little accuracy loss": KL below 0.05 nats and the same top token 90 % of the time
SPEC_K, SPEC_TOKENS = 4, 32             # speculative decoding: tokens drafted per round, tokens generated
SAME = 1e-3                             # "the same logits": float32 round-off stays far below this
SAME_WEIGHT = 1e-5                      # "the same weights": float32 round-off of d·q + m stays far below this
LAYER_NORMS = ("attn_norm", "ffn_norm", "post_attention_norm", "post_ffw_norm")   # a Block's norms over d_model


# ---------------------------------------------------------------- helpers the notebook uses too

def prompt_ids(model: "Model", n: int | None = None) -> list[int]:
    """The article-sized prompt (PROMPT, 9 tokens) when n is None, else the first n tokens of the shipped text."""
    return model.tokenizer.encode(PROMPT) if n is None else eval_ids(model, n)


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
    gpt2, mine = structure(cost.gpt2_small(model), prompt_len), structure(model, prompt_len)
    said = {"layers": "多层 (several)", "norm": "LayerNorm", **ARTICLE_STRUCTURE}
    show = lambda v: f"{v[0]} → {v[1]}" if isinstance(v, tuple) else str(v)             # noqa: E731
    return table([(k, show(said[k]), show(gpt2[k]), show(mine[k])) for k in gpt2],
                 ("item", "the article", "GPT-2 small (architecture)", f"{model.config.name} (traced)"))


def structure_verdict(gpt2: dict) -> Verdict:
    """The point: every layer and the head run what the list says; the details: the look-ups and the final norm too."""
    same = {k: gpt2[k] == v for k, v in ARTICLE_STRUCTURE.items()}
    core = ("norms per layer", "attention per layer", "FFN per layer", "LM head", "softmax + sampling per token")
    return Verdict.of(all(same[k] for k in core), all(same.values()))


def small_loss(c: Comparison) -> bool:
    return c.kl_mean < SMALL_KL and c.top1_agreement >= SMALL_TOP1


# ---------------------------------------------------------------- speculative decoding

def speculative_run(model: "Model", prompt: str = "repeat", draft: Draft | None = None, k: int = SPEC_K,
                    max_new_tokens: int = SPEC_TOKENS) -> tuple[SpeculativeResult, Generation]:
    """Greedy speculative decoding of one of bench.BENCH_PROMPTS (draft: prompt lookup unless given), and
    plain greedy decoding of it."""
    text, chat = BENCH_PROMPTS[prompt]
    chat = chat and bool(getattr(model.tokenizer, "chat_template", None))    # base models (GPT-2) have no template
    spec = speculative_generate(model, draft or PromptLookupDraft(), text, k=k, max_new_tokens=max_new_tokens, chat=chat)
    return spec, generate(model, text, max_new_tokens=max_new_tokens, chat=chat)


def speculative_runs(model: "Model") -> dict[str, tuple[SpeculativeResult, Generation]]:
    """The claim's three runs: prompt lookup on 'repeat' and on 'no copy', and the model's int8 copy drafting 'no copy'.

    The int8 draft's weights are dequantized to fp32: its guesses are the int8 format's, the same on every CPU
    (torch's int8 kernel rounds differently on different CPUs, which changes a guess now and then)."""
    int8 = ModelDraft(dequantize_model(quantize_model(model, 8, embeddings=True)))
    return {"repeat": speculative_run(model, "repeat"), "no copy": speculative_run(model, "no copy"),
            "int8 draft": speculative_run(model, "no copy", int8)}


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
    verdict = Verdict.of_number(n, ARTICLE_PARAMS) if shape else Verdict.DIFFERS
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
                 f"per token: ≈ 2 × parameters", Verdict.of_number(real, ARTICLE_FLOPS_PER_TOKEN))


def _answer_claim(gpt2: Config) -> Claim:
    est = cost.article_estimate(gpt2, PROMPT_LEN, NEW_TOKENS)
    real, none = est["flops_answer_kv_cache"], est["flops_answer_no_cache"]
    return Claim(SECTION, f"Generating {NEW_TOKENS} tokens ≈ 50 × 3.6 亿 ≈ 180 亿 (18 B) FLOPs",
                 f"GPT-2 small, {PROMPT_LEN}-token prompt, {NEW_TOKENS} new tokens: {_b(real)} FLOPs with a KV "
                 f"cache (the article's rule: {_b(est['article_flops_answer'])} with 124.4 M parameters); "
                 f"{_b(none)} without a cache, rerunning the prefix every round ({none / ARTICLE_ANSWER_FLOPS:.3g}× "
                 f"the article's figure)", Verdict.of_number(real, ARTICLE_ANSWER_FLOPS))


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
                 f"FLOPs per token at context {PROMPT_LEN}: {by_flops:.4g}×", Verdict.of_number(by_flops, ARTICLE_LLAMA_RATIO))


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
                 Verdict.of(same and ratio > 1), numbers={**kv, "ratio": ratio})


def _int8_claim(model: "Model", c: Comparison) -> Claim:
    return Claim(SECTION, "Quantization: FP32 → INT8 cuts memory and compute, with little accuracy loss",
                 f"{model.config.name}, int8 weights (one scale per output column; token table kept fp32): "
                 f"{c.fp32_weight_bytes / 1e6:.4g} → {c.weight_bytes / 1e6:.4g} MB; on the shipped text's first "
                 f"{c.n_tokens} tokens KL {kl_text(c.kl_mean)}, same top token {100 * c.top1_agreement:.0f} %, "
                 f"perplexity {c.perplexity_fp32:.3g} → {c.perplexity:.3g}",
                 Verdict.of(small_loss(c) and c.weight_bytes < c.fp32_weight_bytes), numbers={"comparison": c})


ANSWER_PROMPT, ANSWER = "The capital of France is", " Paris"   # the series' running example


def _answer_rank(model: "Model") -> int:
    """Where the model ranks ' Paris' after 'The capital of France is' (1: its answer)."""
    logits = forward(model, model.tokenizer.encode(ANSWER_PROMPT), record=False, last_only=True).logits[-1]
    return rank_of(logits, model.tokenizer.token_id(ANSWER))


def _int4_claim(model: "Model", asym: Comparison, sym: Comparison, grid_error: float, answer_rank: int) -> Claim:
    """Judged on the format the article means: int4 in groups with a scale and a minimum (GGUF Q4_1, what deployed
    4-bit models use), measured on dequantized fp32 weights. When the loaded weights already sit on that grid (the
    shipped SmolLM2 is Q4_1), the fp32 original is not here: the point (a 4-bit model still does its job) is
    measured, the detail (how much it lost) is not."""
    on_grid = grid_error < SAME_WEIGHT
    if on_grid:
        verdict = Verdict.of(answer_rank == 1, False)
        how = (f"{model.config.name} as shipped is itself int4 (GGUF Q4_1: groups of 32, scale + minimum): re-rounding "
               f"it to int4 g32 asymmetric moves every weight by less than {_sci(SAME_WEIGHT)}, and this 4-bit model "
               f"answers the series' example ({ANSWER!r} rank {answer_rank} after {ANSWER_PROMPT!r}). Its fp32 "
               f"original is not shipped, so the loss of fp32 → int4 itself can't be measured here")
    else:
        verdict = Verdict.of(asym.top1_agreement >= SMALL_TOP1, small_loss(asym))
        how = (f"int4 g32 asymmetric (Q4_1's format): {asym.fp32_weight_bytes / 1e6:.4g} → "
               f"{asym.weight_bytes / 1e6:.4g} MB; KL {kl_text(asym.kl_mean)}, same top token "
               f"{100 * asym.top1_agreement:.0f} %, perplexity {asym.perplexity_fp32:.3g} → {asym.perplexity:.3g}")
    return Claim(SECTION, "…and FP32 → INT4, with little accuracy loss",
                 f"{how}. For contrast, re-rounding onto another grid (int4 g32 symmetric) stacks a second rounding "
                 f"on the first: KL {kl_text(sym.kl_mean)}, same top token {100 * sym.top1_agreement:.0f} %",
                 verdict, numbers={"grid_error": grid_error, "answer_rank": answer_rank, "asymmetric": asym,
                                   "symmetric": sym})


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
                 Verdict.of(same, fast),        # the point: the big model's text, unchanged; the detail: fewer passes
                 numbers={"same": same, "passes_per_token": {k: passes_per_token(s) for k, (s, _) in runs.items()}})


def claims(model: "Model", comparisons: dict[str, Comparison] | None = None,
           runs: dict[str, tuple[SpeculativeResult, Generation]] | None = None) -> list[Claim]:
    """Section 八, measured on `model` (SmolLM2) and on GPT-2 small's and LLaMA-7B's architectures.

    comparisons: accuracy(model, ...) with at least 'int8' and 'int4 g32 symmetric';
    runs: speculative_runs(model) — notebook 08 passes its own.
    """
    gpt2 = cost.gpt2_small(model)
    if comparisons is None:
        comparisons = accuracy(model, ("int8", "int4 g32 symmetric", "int4 g32 asymmetric"))
    if runs is None:
        runs = speculative_runs(model)
    return [_architecture_claim(gpt2, model),
            _rule_claim(gpt2, model, decode_step_measured(model, prompt_ids(model))),
            _answer_claim(gpt2),
            _structure_claim(gpt2, model),
            _llama_claim(gpt2),
            _kv_claim(gpt2, model, kv_cache_check(model, prompt_ids(model, PROMPT_LEN + NEW_TOKENS))),
            _int8_claim(model, comparisons["int8"]),
            _int4_claim(model, comparisons["int4 g32 asymmetric"], comparisons["int4 g32 symmetric"],
                        q4_1_grid_error(model), _answer_rank(model)),
            _speculative_claim(model, runs)]
