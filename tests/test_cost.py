"""Section 八: parameter counts, FLOPs and memory, checked against reality and against hand arithmetic."""
import dataclasses

import pytest

import llmwalk as lw
from llmwalk.cost import (article_estimate, decode_step_flops, embedding_lookups, flops_by_stage,
                          generation_flops, gpt2_config, gpt2_small, llama7b_config, matmul_flops, measured_flops,
                          n_params, round_flops, weight_bytes)

# A GPT-2-shaped toy: 2 layers, d_model 4, 2 heads of 2, d_ff 8, vocab 10, 6 positions.
TINY = dataclasses.replace(gpt2_config(), name="tiny", n_layer=2, d_model=4, n_head=2, n_kv_head=2, d_head=2,
                           d_ff=8, vocab_size=10, context_length=6)


@pytest.mark.parametrize("size, expected", [("small", 124_439_808), ("medium", 354_823_168),
                                            ("large", 774_030_080), ("xl", 1_557_611_200)])
def test_gpt2_parameter_counts_match_the_released_checkpoints(size, expected):
    assert n_params(gpt2_config(size)) == expected


def test_llama7b_parameter_count():
    assert n_params(llama7b_config()) == 6_738_415_616


def test_smollm2_parameter_count_from_config_equals_its_weights(smollm2):
    assert n_params(smollm2.config) == smollm2.config.n_params == lw.count_params(smollm2.weights)


def test_tiny_counts_by_hand():
    # table 10·4 + positions 6·4 + 2 layers × (q,k,v,o 4·4 each + up 4·8 + down 8·4 + biases 4+4+4+4+8+4
    # + two LayerNorms 2·4 each) + final LayerNorm 2·4
    assert n_params(TINY) == 40 + 24 + 2 * (4 * 16 + 2 * 32 + 28 + 16) + 8 == 416
    # prefill of T=3: each matrix 2·L·T·d_in·d_out; scores and mixing 2·L·heads·d_head·T·S with S=T;
    # LayerNorm ≈ 8 FLOPs per element on 2·L·T + T vectors of 4; head 2·T·d·vocab
    stages = flops_by_stage(TINY, 3)
    assert stages == {
        "embedding": 0, "attn_q": 2 * 2 * 3 * 4 * 4, "attn_k": 192, "attn_v": 192,
        "attn_scores": 2 * 2 * 2 * 2 * 3 * 3, "attn_mix": 144, "attn_output": 192,
        "ffn_up": 2 * 2 * 3 * 4 * 8, "ffn_down": 384, "norms": 8 * (2 * 2 * 3 * 4 + 3 * 4), "lm_head": 2 * 3 * 4 * 10}
    # in the order a pass runs them (== above ignores order): scores and mixing between the V and output projections
    assert list(stages) == ["embedding", "attn_q", "attn_k", "attn_v", "attn_scores", "attn_mix", "attn_output",
                            "ffn_up", "ffn_down", "norms", "lm_head"]
    assert embedding_lookups(TINY, 3) == 6          # token row + learned position row per token


def test_tiny_decode_step_with_and_without_cache_by_hand():
    # context 5 with a cache: one position runs, its query sees 5 keys, head on one position
    with_cache = decode_step_flops(TINY, 5)
    assert with_cache["attn_q"] == 2 * 2 * 1 * 4 * 4
    assert with_cache["attn_scores"] == 2 * 2 * 2 * 2 * 1 * 5
    assert with_cache["lm_head"] == 2 * 1 * 4 * 10
    # without: all 5 positions again (5 × the matrices, 5×5 scores), head still on the last one only
    without = decode_step_flops(TINY, 5, kv_cache=False)
    assert without["attn_q"] == 5 * with_cache["attn_q"]
    assert without["attn_scores"] == 2 * 2 * 2 * 2 * 5 * 5
    assert without["lm_head"] == with_cache["lm_head"]
    # a 2-token prompt and 2 new tokens: prefill (head on the last position) + one step at context 3
    prefill = matmul_flops(flops_by_stage(TINY, 2, last_only=True)) + 8 * (2 * 2 * 2 * 4 + 4)
    assert generation_flops(TINY, 2, 2) == prefill + sum(decode_step_flops(TINY, 3).values())


def test_grouped_query_attention_shrinks_k_and_v_only():
    gqa = dataclasses.replace(TINY, family="llama", n_kv_head=1, ffn="swiglu", norm="rmsnorm")
    f = flops_by_stage(gqa, 3)
    assert f["attn_k"] == f["attn_v"] == 2 * 2 * 3 * 4 * 2      # 4 -> 1 head of 2
    assert f["attn_q"] == f["attn_output"] == 2 * 2 * 3 * 4 * 4
    assert f["ffn_gate"] == f["ffn_up"] == f["ffn_down"] == 2 * 2 * 3 * 4 * 8


@pytest.mark.parametrize("t", [1, 9, 33])
def test_analytic_flops_match_flop_counter_mode(smollm2, t):
    ids = smollm2.tokenizer.encode("The capital of France is Paris. " * 8)[:t]
    measured = measured_flops(smollm2, ids)
    stages = flops_by_stage(smollm2.config, t)
    assert matmul_flops(stages) == pytest.approx(measured, rel=1e-3)   # like with like: matrix products
    assert sum(stages.values()) == pytest.approx(measured, rel=0.05)   # norms (approximate) are tiny


def test_analytic_decode_step_matches_flop_counter_mode(smollm2):
    cache = lw.KVCache.empty(smollm2.config, 32)
    lw.forward(smollm2, list(range(100, 120)), cache=cache, record=False)
    measured = measured_flops(smollm2, [42], cache=cache, last_only=True)
    assert matmul_flops(decode_step_flops(smollm2.config, 21)) == pytest.approx(measured, rel=1e-3)


def test_the_articles_gpt2_numbers():
    est = article_estimate(gpt2_config(), prompt_len=9, new_tokens=50)
    released = 124_439_808                                               # GPT-2 small's checkpoint
    assert est["article_flops_per_token"] == 3 * released                # "≈ 3.6亿": 3 × parameters
    assert est["article_flops_answer"] == 50 * 3 * released              # "≈ 180亿": 50 × that
    # In reality a token costs one multiply-add (2 FLOPs) per weight of every matrix it meets: 12 layers of
    # q, k, v, o (768×768) and up, down (768×3072), then the 768×50257 head; i.e. ≈ 2 × parameters.
    matrices = 12 * (4 * 768 ** 2 + 2 * 768 * 3072) + 768 * 50257
    assert est["two_x_matmul_params"] == 2 * matrices
    # the 9th token with 8 cached, by hand: the matrices, q·k and Σ w·v over 9 keys in 12 heads of 64 in 12 layers,
    # 2 LayerNorms per layer + the final one at 8 FLOPs per element
    assert est["flops_per_token"] == 2 * matrices + 2 * (2 * 12 * 12 * 64 * 9) + 8 * (12 * 2 * 768 + 768)
    # one answer: each later round costs more than the one before without a cache, and the sum of the rounds
    # with one stays below the article's rule (2 × parameters per token, not 3)
    assert est["flops_answer_kv_cache"] < est["article_flops_answer"] < est["flops_answer_no_cache"]


def test_llama7b_against_gpt2():
    llama, gpt2 = article_estimate(llama7b_config()), article_estimate(gpt2_config())
    # The article's 56x; the released checkpoints' counts (LLaMA-7B 6,738,415,616, GPT-2 small 124,439,808)
    assert llama["params"] / gpt2["params"] == 6_738_415_616 / 124_439_808
    # a token's FLOPs are ≈ 2 × matrix parameters for both, so their ratio is close to the parameter ratio
    assert llama["flops_per_token"] / gpt2["flops_per_token"] == pytest.approx(
        llama["two_x_matmul_params"] / gpt2["two_x_matmul_params"], rel=0.01)


def test_weight_bytes_per_dtype():
    llama = llama7b_config()
    assert weight_bytes(llama, "fp32") == 4 * 6_738_415_616
    assert weight_bytes(llama, "bf16") == weight_bytes(llama, "fp16") == 2 * 6_738_415_616
    # int4 in groups of 32 with an fp16 scale each (GGUF Q4_0): 4.5 bits per matrix weight; the 65 norm
    # vectors (266,240 numbers) stay fp32
    norms = 32 * 2 * 4096 + 4096
    assert weight_bytes(llama, "int4", 32, quantize_embeddings=True) == (6_738_415_616 - norms) * 9 // 16 + 4 * norms
    # int8 per channel (an fp16 scale per output column: q, k, v, o, down have 4096, gate and up 11008),
    # the two 131M-entry tables and the norms kept fp32
    mats = 32 * (4 * 4096 ** 2 + 3 * 4096 * 11008)
    assert weight_bytes(llama, "int8") == mats + 32 * (5 * 4096 + 2 * 11008) * 2 + 4 * (6_738_415_616 - mats)


def test_gpt2_small_is_recognised_by_shape_not_by_family():
    class Loaded:                                                     # a model object: only .config is read
        def __init__(self, config):
            self.config = config
    small, medium = gpt2_config("small"), gpt2_config("medium")
    assert gpt2_small(Loaded(small)) is small
    assert gpt2_small(Loaded(medium)) == small and gpt2_small(Loaded(medium)) is not medium   # medium is not small
    assert gpt2_small() == small


def test_round_flops_rounds_and_total(smollm2):
    c = smollm2.config
    cached, rerun = round_flops(c, 9, 3, kv_cache=True), round_flops(c, 9, 3, kv_cache=False)
    # with a cache: the 9-token prompt at once, then one token at context 10 and 11
    assert cached == [sum(flops_by_stage(c, 9, last_only=True).values()),
                      sum(flops_by_stage(c, 1, cached=9, last_only=True).values()),
                      sum(flops_by_stage(c, 1, cached=10, last_only=True).values())]
    # without: the whole prefix every round, so the first rounds agree and later ones grow
    assert rerun[0] == cached[0] and rerun[1] > cached[1] and rerun[2] > rerun[1]
    assert generation_flops(c, 9, 3) == sum(cached) and generation_flops(c, 9, 0) == 0


def test_kv_cache_check_counts_what_the_formulas_count(smollm2):
    """torch's FLOP counter on one cached round and on the whole sequence recomputed: cost.py's matrix products
    (a fused attention kernel the counter cannot see would come out short here)."""
    from llmwalk.cost import decode_step_flops, decode_step_measured, flops_by_stage, kv_cache_check, matmul_flops
    from llmwalk.kv_cache import kv_cache_bytes
    config, ids = smollm2.config, smollm2.tokenizer.encode("The capital of France is Paris. The capital of Italy is")
    r = kv_cache_check(smollm2, ids)
    assert r["flops_cached"] == pytest.approx(matmul_flops(decode_step_flops(config, len(ids))), rel=1e-3)
    assert r["flops_cached"] == decode_step_measured(smollm2, ids)
    assert r["flops_recomputed"] == pytest.approx(matmul_flops(flops_by_stage(config, len(ids), last_only=True)),
                                                  rel=1e-3)
    assert r["same_token"] and r["max_logit_diff"] < 1e-3
    assert r["cache_bytes"] == kv_cache_bytes(config, len(ids))


def test_a_generations_flops_count_every_round(smollm2):
    """count_flops around generate: torch counts only its own operations, so the one-token rounds (compiled where
    numba runs) are counted as torch's operations — each round after the prefill its decode step's products, with
    attention in torch's fused kernel, which the counter does not see."""
    from llmwalk.cost import count_flops, decode_step_flops, matmul_flops
    ids, c = smollm2.tokenizer.encode("The capital of France is"), smollm2.config
    one, _ = count_flops(lambda: lw.generate(smollm2, ids, 1, stop_at_eos=False))        # the prefill only
    six, g = count_flops(lambda: lw.generate(smollm2, ids, 6, stop_at_eos=False))
    steps = [decode_step_flops(c, len(ids) + k) for k in range(1, 6)]
    expected = sum(matmul_flops(s) - s["attn_scores"] - s["attn_mix"] for s in steps)
    assert six - one == pytest.approx(expected, rel=1e-3) and len(g.new_ids) == 6
