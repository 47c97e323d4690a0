"""llmwalk.analysis: the measurements the notebooks and the claims share, each against an independent reference.

(More of them are checked against transformers where a claim uses them: tests/test_claims_*.py.)"""
import pytest
import torch
import torch.nn.functional as F

from llmwalk import analysis


def test_entropy_equals_torch_categorical():
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 3
    for t in (0.5, 1.0, 2.0):
        ref = float(torch.distributions.Categorical(logits=logits.double() / t).entropy())
        assert analysis.entropy(logits, t) == pytest.approx(ref, rel=1e-6)
    assert analysis.entropy(torch.tensor([0.0, -1e9, -1e9])) == pytest.approx(0.0, abs=1e-9)   # one sure token
    assert analysis.entropy(torch.zeros(8)) == pytest.approx(torch.log(torch.tensor(8.0)).item())


def test_rank_of_equals_a_sort_by_hand():
    probs = torch.tensor([0.1, 0.4, 0.05, 0.3, 0.15])
    order = sorted(range(5), key=lambda i: -float(probs[i]))            # [1, 3, 4, 0, 2]
    assert [analysis.rank_of(probs, i) for i in range(5)] == [order.index(i) + 1 for i in range(5)]


def test_find_loop_by_hand():
    ids = [7, 8, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1]                          # a 3-token loop from index 2, 10 tokens long
    loop = analysis.find_loop(ids)
    assert (loop.start, loop.period, loop.ids) == (2, 3, (1, 2, 3)) and loop.repeats == pytest.approx(10 / 3)
    assert analysis.find_loop([1, 2, 3, 4, 5, 6]) is None
    assert analysis.find_loop([5, 5, 5, 5]).period == 1                  # the shortest period wins
    assert analysis.find_loop([1, 2, 1, 2, 1], min_repeats=3) is None     # 2.5 periods only


def test_distinct_n_by_hand():
    assert analysis.distinct_n([[1, 2, 3, 4]], 2) == 1.0
    assert analysis.distinct_n([[1, 2, 3], [1, 2, 3]], 2) == 0.5          # two identical copies: 2 of 4 bigrams
    assert analysis.distinct_n([[1, 1, 1, 2]], 2) == pytest.approx(2 / 3)


def test_kept_counts_the_tokens_left_after_each_cut():
    logits = torch.log(torch.tensor([0.5, 0.25, 0.15, 0.1]))
    assert analysis.kept(logits) == 4
    assert analysis.kept(logits, top_k=2) == 2
    assert analysis.kept(logits, top_p=0.7) == 2                          # 0.5 + 0.25 reaches 0.7
    assert analysis.kept(logits, min_p=0.25) == 3                         # ≥ 0.25 × 0.5


def test_cosine_to_all_equals_torch():
    table = torch.randn(50, 8, generator=torch.Generator().manual_seed(1))
    ref = F.cosine_similarity(table, table[7][None], dim=-1)
    assert torch.allclose(analysis.cosine_to_all(table, 7), ref, atol=1e-6)


def test_same_rows_ignores_order_only():
    a = torch.arange(12.0).reshape(4, 3)
    assert analysis.same_rows(a, a[[2, 0, 3, 1]]) and not analysis.same_rows(a, a[[0, 0, 1, 2]])


def test_rms_by_hand():
    assert analysis.rms(torch.tensor([[3.0, 4.0]])).item() == pytest.approx((12.5) ** 0.5)


def test_lens_path_last_entry_is_the_models_own_answer(smollm2):
    import llmwalk as lw
    trace = lw.forward(smollm2, smollm2.tokenizer.encode("The capital of France is"))
    paris = smollm2.tokenizer.token_id(" Paris")
    path = analysis.lens_path(smollm2, trace, paris)
    probs = trace.logits[-1].softmax(-1)
    assert len(path["rank"]) == smollm2.config.n_layer + 1                 # the embedding, then after every layer
    assert path["rank"][-1] == analysis.rank_of(probs, paris) == 1
    assert path["prob"][-1] == pytest.approx(float(probs[paris]), rel=1e-4)
    assert all(r == 1 for r in path["rank"][path["top1_from"]:]) and path["rank"][path["top1_from"] - 1] != 1


def test_kv_cache_check_counts_what_the_formulas_count(smollm2):
    """torch's FLOP counter on one cached round and on the whole sequence recomputed: cost.py's matrix products
    (a fused attention kernel the counter cannot see would come out short here)."""
    from llmwalk.cost import decode_step_flops, flops_by_stage, matmul_flops
    from llmwalk.kv_cache import kv_cache_bytes
    config, ids = smollm2.config, smollm2.tokenizer.encode("The capital of France is Paris. The capital of Italy is")
    r = analysis.kv_cache_check(smollm2, ids)
    assert r["flops_cached"] == pytest.approx(matmul_flops(decode_step_flops(config, len(ids))), rel=1e-3)
    assert r["flops_cached"] == analysis.decode_step_measured(smollm2, ids)
    assert r["flops_recomputed"] == pytest.approx(matmul_flops(flops_by_stage(config, len(ids), last_only=True)),
                                                  rel=1e-3)
    assert r["same_token"] and r["max_logit_diff"] < 1e-3
    assert r["cache_bytes"] == kv_cache_bytes(config, len(ids))
