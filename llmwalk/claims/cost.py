"""Section 八's claims, measured: what one inference costs, and the three ways the article gives to make it cheaper.

GPT-2's numbers come from its published architecture (`cost.gpt2_config`: its weights need the network) unless
the model passed in is GPT-2 small itself; everything else is measured on the model passed in (SmolLM2 offline):
FLOPs counted by torch while `forward` runs, the structure read from a real trace, quantization errors on the
shipped text, speculative decoding's target passes. No wall-clock number appears here (those are in the notebook):
every value is the same on every run.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .. import cost, prompts
from ..accuracy import Comparison, compare_formats, eval_ids, kl_text, q4_1_grid_error
from ..generation import Generation, generate
from ..i18n import quoted, t
from . import billions, yes
from ..report import Claim, Table, Verdict, table
from ..sampling import rank_of
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
    """The article-sized prompt (PROMPT, 9 tokens) when n is None, else the shipped text's first n tokens
    (accuracy.eval_ids)."""
    return model.tokenizer.encode(PROMPT) if n is None else eval_ids(model, n)


def structure(model: "Model | Config", prompt_len: int = PROMPT_LEN) -> dict[str, object]:
    """What one pass over a prompt runs, item by item as the article lists them.

    A Model is traced (one forward pass over `prompt_len` tokens, counting what it computed); a Config (GPT-2 small
    without its weights) is read from its switches.
    """
    if isinstance(model, Config):
        c = model
        return {"layers": c.n_layer, "embedding look-ups": cost.embedding_lookups(c, prompt_len),
                "norms per layer": 4 if c.sandwich_norm else 2, "norm": c.norm_name, "attention per layer": 1,
                "FFN per layer": 1, "final norm": 1, "LM head": (c.d_model, c.vocab_size),
                "softmax + sampling per token": 1}
    trace = forward(model, prompt_ids(model, None if prompt_len == PROMPT_LEN else prompt_len))
    w = model.weights
    norms = {sum(getattr(b, name) is not None for name in LAYER_NORMS) for b in w.blocks}
    rows = trace.tok_emb.shape[0] + (0 if trace.pos_emb is None else trace.pos_emb.shape[0])
    return {"layers": len(trace.layers), "embedding look-ups": rows,
            "norms per layer": norms.pop() if len(norms) == 1 else sorted(norms), "norm": model.config.norm_name,
            "attention per layer": 1, "FFN per layer": 1,       # every BlockOut holds one attention and one FFN
            "final norm": int(w.output_norm is not None), "LM head": (trace.final.shape[-1], trace.logits.shape[-1]),
            "softmax + sampling per token": 1}       # generate draws one token from the last position's softmax


def structure_table(model: "Model", prompt_len: int = PROMPT_LEN) -> Table:
    """The article's per-token list next to GPT-2 small's architecture and the model's traced pass."""
    gpt2, mine = structure(cost.gpt2_small(model), prompt_len), structure(model, prompt_len)
    said = {"layers": t("claims.cost.structure_table.several"), "norm": "LayerNorm", **ARTICLE_STRUCTURE}
    show = lambda v: f"{v[0]} → {v[1]}" if isinstance(v, tuple) else str(v)             # noqa: E731
    items = structure_items()
    return table([(items[k], show(said[k]), show(gpt2[k]), show(mine[k])) for k in gpt2],
                 (t("claims.cost.structure_table.item"), t("claims.cost.structure_table.article"),
                  t("claims.cost.structure_table.gpt2"), t("claims.cost.structure_table.traced", model=model.config.name)))


def structure_items() -> dict[str, str]:
    """structure()'s keys, as the table names them in the current language."""
    return {"layers": t("claims.cost.structure_table.layers"), "embedding look-ups": t("claims.cost.structure_table.lookups"),
            "norms per layer": t("claims.cost.structure_table.norms"), "norm": t("claims.cost.structure_table.norm"),
            "attention per layer": t("claims.cost.structure_table.attention"),
            "FFN per layer": t("claims.cost.structure_table.ffn"), "final norm": t("claims.cost.structure_table.final"),
            "LM head": t("claims.cost.structure_table.head"),
            "softmax + sampling per token": t("claims.cost.structure_table.sampling")}


def structure_verdict(gpt2: dict) -> Verdict:
    """The point: every layer and the head run what the list says; the details: the look-ups and the final norm too."""
    same = {k: gpt2[k] == v for k, v in ARTICLE_STRUCTURE.items()}
    core = ("norms per layer", "attention per layer", "FFN per layer", "LM head", "softmax + sampling per token")
    return Verdict.of(all(same[k] for k in core), all(same.values()))


def small_loss(c: Comparison) -> bool:
    return c.kl_mean < SMALL_KL and c.top1_agreement >= SMALL_TOP1


# ---------------------------------------------------------------- speculative decoding

def speculative_run(model: "Model", prompt: str = "repeat", draft: Draft | None = None, k: int = SPEC_K,
                    max_new_tokens: int = SPEC_TOKENS, *, plain: Generation | None = None
                    ) -> tuple[SpeculativeResult, Generation]:
    """Greedy speculative decoding of one of prompts.SPECULATIVE_PROMPTS (draft: prompt lookup unless given), and
    plain greedy decoding of it (`plain`: that decoding, already made by another run of the same prompt)."""
    text, chat = prompts.SPECULATIVE_PROMPTS[prompt]
    chat = chat and bool(getattr(model.tokenizer, "chat_template", None))    # base models (GPT-2) have no template
    spec = speculative_generate(model, draft or PromptLookupDraft(), text, k=k, max_new_tokens=max_new_tokens, chat=chat)
    return spec, plain or generate(model, text, max_new_tokens=max_new_tokens, chat=chat)


def speculative_runs(model: "Model") -> dict[str, tuple[SpeculativeResult, Generation]]:
    """The claim's three runs: prompt lookup on 'repeat' and on 'no copy', and the model's int8 copy drafting 'no copy'
    (the two 'no copy' runs share one plain greedy decoding).

    The int8 draft's weights are dequantized to fp32: its guesses are the int8 format's, the same on every CPU
    (torch's int8 kernel rounds differently on different CPUs, which changes a guess now and then)."""
    int8 = ModelDraft(dequantize_model(quantize_model(model, 8, embeddings=True)))
    no_copy = speculative_run(model, "no copy")
    return {"repeat": speculative_run(model, "repeat"), "no copy": no_copy,
            "int8 draft": speculative_run(model, "no copy", int8, plain=no_copy[1])}


def passes_per_token(spec: SpeculativeResult) -> float:
    """Target forward passes per generated token (1 + 1/n for plain decoding with a prefill)."""
    return spec.target_forward_passes / len(spec.new_ids)


# ---------------------------------------------------------------- the claims

def _m(x: float) -> str:
    return f"{x / 1e6:.4g} M" if x < 1e9 else billions(x)


def _sci(x: float) -> str:
    return f"{x:.2g}".replace("e-0", "e-")


def _architecture_claim(gpt2: Config, model: "Model") -> Claim:
    c, n = gpt2, cost.n_params(gpt2)
    shape = (c.n_layer, c.d_model, c.n_head) == (12, 768, 12)
    verdict = Verdict.of_number(n, ARTICLE_PARAMS) if shape else Verdict.DIFFERS
    m = model.config
    return Claim(SECTION, t("claims.cost.architecture.article"),
                 t("claims.cost.architecture.measured", n_layer=c.n_layer, d_model=c.d_model, n_head=c.n_head,
                   params=f"{n:,}", above=f"{100 * (n / ARTICLE_PARAMS - 1):.1f}", model=m.name, m_layer=m.n_layer,
                   m_d_model=m.d_model, m_head=m.n_head, m_params=_m(cost.n_params(m))),
                 verdict, numbers={"params": n, "shape": (c.n_layer, c.d_model, c.n_head)}, said=ARTICLE_PARAMS,
                 key="cost.architecture")


def _rule_claim(gpt2: Config, model: "Model", measured: int) -> Claim:
    real = sum(cost.decode_step_flops(gpt2, PROMPT_LEN).values())
    n, nm = cost.n_params(gpt2), cost.n_params(model.config)
    return Claim(SECTION, t("claims.cost.rule.article"),
                 t("claims.cost.rule.measured", n=PROMPT_LEN, flops=_m(real), per_param=f"{real / n:.3g}",
                   rule=_m(ARTICLE_RULE * n), too_many=f"{ARTICLE_RULE * n / real:.3g}", model=model.config.name,
                   measured=_m(measured), m_per_param=f"{measured / nm:.3g}"),
                 Verdict.of_number(real, ARTICLE_FLOPS_PER_TOKEN), numbers={"flops": real, "measured": measured},
                 said=ARTICLE_FLOPS_PER_TOKEN, key="cost.rule")


def _answer_claim(gpt2: Config) -> Claim:
    est = cost.article_estimate(gpt2, PROMPT_LEN, NEW_TOKENS)
    real, none = est["flops_answer_kv_cache"], est["flops_answer_no_cache"]
    return Claim(SECTION, t("claims.cost.answer.article", n=NEW_TOKENS),
                 t("claims.cost.answer.measured", prompt=PROMPT_LEN, n=NEW_TOKENS, cached=billions(real),
                   rule=billions(est["article_flops_answer"]), params=f"{cost.n_params(gpt2) / 1e6:.1f}", rerun=billions(none),
                   ratio=f"{none / ARTICLE_ANSWER_FLOPS:.3g}"),
                 Verdict.of_number(real, ARTICLE_ANSWER_FLOPS), numbers={"kv_cache": real, "no_cache": none},
                 said=ARTICLE_ANSWER_FLOPS, key="cost.answer")


def _structure_claim(gpt2: Config, model: "Model") -> Claim:
    g, s = structure(gpt2), structure(model)
    return Claim(SECTION, t("claims.cost.structure.article"),
                 t("claims.cost.structure.measured", n_layer=g["layers"], rows=g["embedding look-ups"],
                   prompt=PROMPT_LEN, norms=g["norms per layer"], final=g["final norm"], head_in=g["LM head"][0],
                   head_out=g["LM head"][1], model=model.config.name, m_rows=s["embedding look-ups"],
                   m_norms=s["norms per layer"], m_norm=s["norm"], m_layer=s["layers"], m_head_in=s["LM head"][0],
                   m_head_out=s["LM head"][1]),
                 structure_verdict(g), numbers={"gpt2": g, "model": s}, key="cost.structure")


def _llama_claim(gpt2: Config) -> Claim:
    llama = cost.llama7b_config()
    by_params = cost.n_params(llama) / cost.n_params(gpt2)
    by_flops = (sum(cost.decode_step_flops(llama, PROMPT_LEN).values())
                / sum(cost.decode_step_flops(gpt2, PROMPT_LEN).values()))
    return Claim(SECTION, t("claims.cost.llama.article", ratio=ARTICLE_LLAMA_RATIO),
                 t("claims.cost.llama.measured", n_layer=llama.n_layer, d_model=llama.d_model, d_ff=llama.d_ff,
                   vocab=f"{llama.vocab_size:,}", params=billions(cost.n_params(llama)), by_params=f"{by_params:.4g}",
                   prompt=PROMPT_LEN, by_flops=f"{by_flops:.4g}"),
                 Verdict.of_number(by_flops, ARTICLE_LLAMA_RATIO), numbers={"by_params": by_params, "by_flops": by_flops},
                 said=ARTICLE_LLAMA_RATIO, key="cost.llama")


def _kv_claim(gpt2: Config, model: "Model", kv: dict) -> Claim:
    est = cost.article_estimate(gpt2, PROMPT_LEN, NEW_TOKENS)
    ratio = kv["flops_recomputed"] / kv["flops_cached"]
    same = kv["same_token"] and kv["max_logit_diff"] < SAME
    return Claim(SECTION, t("claims.cost.kv.article"),
                 t("claims.cost.kv.measured", model=model.config.name, context=kv["context"], prompt=PROMPT_LEN,
                   n=NEW_TOKENS, cached=_m(kv["flops_cached"]), recomputed=_m(kv["flops_recomputed"]),
                   ratio=f"{ratio:.3g}", tolerance=f"{SAME:g}", same=yes(same),
                   kb=f"{kv['cache_bytes'] / kv['context'] / 1e3:.4g}",
                   answer_ratio=f"{est['flops_answer_no_cache'] / est['flops_answer_kv_cache']:.3g}"),
                 Verdict.of(same and ratio > 1), numbers={**kv, "ratio": ratio}, key="cost.kv")


def _int8_claim(model: "Model", c: Comparison) -> Claim:
    """The point: int8 weights take fewer bytes and lose little accuracy. The detail "cuts compute": weight-only
    int8 keeps every matrix's shape, so a token takes the same multiply-adds (FLOPs); what falls is the bytes read."""
    flops = sum(cost.decode_step_flops(model.config, PROMPT_LEN).values())     # the same shapes in every format
    return Claim(SECTION, t("claims.cost.int8.article"),
                 t("claims.cost.int8.measured", model=model.config.name, mb_fp32=f"{c.fp32_weight_bytes / 1e6:.4g}",
                   mb=f"{c.weight_bytes / 1e6:.4g}", n=c.n_tokens, kl=kl_text(c.kl_mean),
                   top1=f"{100 * c.top1_agreement:.0f}", ppl_fp32=f"{c.perplexity_fp32:.3g}", ppl=f"{c.perplexity:.3g}",
                   flops=_m(flops)),
                 Verdict.of(small_loss(c) and c.weight_bytes < c.fp32_weight_bytes, False),
                 numbers={"comparison": c, "kl": c.kl_mean, "top1": c.top1_agreement, "bytes": c.weight_bytes,
                          "fp32_bytes": c.fp32_weight_bytes, "flops_per_token": flops}, key="cost.int8")


ANSWER_PROMPT, ANSWER = prompts.PROMPT, prompts.ANSWER   # the series' running example


def _answer_rank(model: "Model") -> int:
    """Where the model ranks ' Paris' after 'The capital of France is' (1: its answer)."""
    logits = forward(model, model.tokenizer.encode(ANSWER_PROMPT), record=False, last_only=True).logits[-1]
    return int(rank_of(logits, model.tokenizer.token_id(ANSWER)))


def _int4_claim(model: "Model", asym: Comparison, sym: Comparison, grid_error: float, answer_rank: int) -> Claim:
    """Judged on the format the article means: int4 in groups with a scale and a minimum (GGUF Q4_1, what deployed
    4-bit models use), measured on dequantized fp32 weights. When the loaded weights already sit on that grid (the
    shipped SmolLM2 is Q4_1), the fp32 original is not here: the point (a 4-bit model still does its job) is
    measured, the detail (how much it lost) is not."""
    on_grid = grid_error < SAME_WEIGHT
    if on_grid:
        verdict = Verdict.of(answer_rank == 1, False)
        how = t("claims.cost.int4.on_grid", model=model.config.name, tolerance=_sci(SAME_WEIGHT),
                answer=quoted(ANSWER), rank=answer_rank, prompt=quoted(ANSWER_PROMPT))
    else:
        verdict = Verdict.of(asym.top1_agreement >= SMALL_TOP1, small_loss(asym))
        how = t("claims.cost.int4.from_fp32", mb_fp32=f"{asym.fp32_weight_bytes / 1e6:.4g}",
                mb=f"{asym.weight_bytes / 1e6:.4g}", kl=kl_text(asym.kl_mean), top1=f"{100 * asym.top1_agreement:.0f}",
                ppl_fp32=f"{asym.perplexity_fp32:.3g}", ppl=f"{asym.perplexity:.3g}")
    return Claim(SECTION, t("claims.cost.int4.article"),
                 t("claims.cost.int4.measured", how=how, kl=kl_text(sym.kl_mean),
                   top1=f"{100 * sym.top1_agreement:.0f}"),
                 verdict, numbers={"grid_error": grid_error, "answer_rank": answer_rank, "asymmetric": asym,
                                   "symmetric": sym}, key="cost.int4")


def _speculative_claim(model: "Model", runs: dict[str, tuple[SpeculativeResult, Generation]]) -> Claim:
    (rep, rep_plain), (new, new_plain), (i8, i8_plain) = runs["repeat"], runs["no copy"], runs["int8 draft"]
    same = rep.new_ids == rep_plain.new_ids and new.new_ids == new_plain.new_ids and i8.new_ids == i8_plain.new_ids
    fewer = passes_per_token(rep) < 0.5 and passes_per_token(i8) < 0.5
    return Claim(SECTION, t("claims.cost.speculative.article"),
                 t("claims.cost.speculative.measured", model=model.config.name, k=SPEC_K,
                   rep_tokens=len(rep.new_ids), rep_passes=rep.target_forward_passes,
                   rep_per_token=f"{passes_per_token(rep):.3g}", rep_accepted=f"{100 * rep.acceptance_rate:.0f}",
                   new_tokens=len(new.new_ids), new_passes=new.target_forward_passes,
                   new_accepted=f"{100 * new.acceptance_rate:.0f}", i8_tokens=len(i8.new_ids),
                   i8_passes=i8.target_forward_passes, i8_per_token=f"{passes_per_token(i8):.3g}",
                   i8_accepted=f"{100 * i8.acceptance_rate:.0f}", same=yes(same)),
                 # the point, what holds on every machine: the big model's own text from fewer of its passes. "Faster"
                 # is wall time, which depends on the machine (the deep dive measures it): not shown here, so ≈
                 Verdict.of(same and fewer, False),
                 numbers={"same": same, "passes_per_token": {k: passes_per_token(s) for k, (s, _) in runs.items()}},
                 key="cost.speculative")


def claims(model: "Model", comparisons: dict[str, Comparison] | None = None,
           runs: dict[str, tuple[SpeculativeResult, Generation]] | None = None) -> list[Claim]:
    """Section 八, measured on `model` (SmolLM2) and on GPT-2 small's and LLaMA-7B's architectures.

    comparisons: compare_formats(model, ...) with at least 'int8' and 'int4 g32 symmetric';
    runs: speculative_runs(model) — notebook 08 passes its own.
    """
    gpt2 = cost.gpt2_small(model)
    if comparisons is None:
        comparisons = compare_formats(model, ("int8", "int4 g32 symmetric", "int4 g32 asymmetric"))
    if runs is None:
        runs = speculative_runs(model)
    return [_architecture_claim(gpt2, model),
            _rule_claim(gpt2, model, cost.decode_step_measured(model, prompt_ids(model))),
            _answer_claim(gpt2),
            _structure_claim(gpt2, model),
            _llama_claim(gpt2),
            _kv_claim(gpt2, model, cost.kv_cache_check(model, prompt_ids(model, PROMPT_LEN + NEW_TOKENS))),
            _int8_claim(model, comparisons["int8"]),
            _int4_claim(model, comparisons["int4 g32 asymmetric"], comparisons["int4 g32 symmetric"],
                        q4_1_grid_error(model), _answer_rank(model)),
            _speculative_claim(model, runs)]
