"""The claims of sections 二 and 三: one row per claim, values equal to independent computations, verdicts that
follow from the numbers."""

import pytest
import torch
import torch.nn.functional as F

import llmwalk as lw
from llmwalk import embedding as lw_embedding
from llmwalk.claims import embedding, tokenization
from llmwalk.report import Verdict
from markers import needs_gemma


# ---------------------------------------------------------------- 二 tokenization

@pytest.fixture(scope="module")
def tok_rows():
    return tokenization.claims()


def test_one_row_per_claim_of_section_2(tok_rows):
    # ids of the question, 9 tokens, 巴黎, 首都, 人工智, ChatGPT, English finer, fewer tokens, GPT-4 Turbo
    assert len(tok_rows) == 9
    assert all(isinstance(c, lw.Claim) and c.section == "二" for c in tok_rows)
    assert [c.verdict for c in tok_rows].count(Verdict.UNCHECKABLE) == 1
    assert "GPT-4 Turbo" in tok_rows[-1].article


@pytest.mark.parametrize("row, text", [(0, "法国的首都是什么"), (2, "巴黎"), (3, "首都"), (4, "人工智"), (5, "ChatGPT")])
def test_ids_rows_show_the_real_gpt2_ids(tok_rows, row, text):
    gpt2 = lw.gpt2_tokenizer()
    said = tokenization.ARTICLE_IDS[text]
    real = gpt2.encode(text)
    claim = tok_rows[row]
    assert claim.article.startswith(f"{text} → {said}")
    assert claim.numbers == {"gpt2_ids": real, "article_ids": said}
    assert f"in GPT-2 the article's ids are '{tokenization.visible(gpt2, said)}'" in claim.measured
    assert real != said and len(real) != len(said)
    assert claim.verdict is Verdict.DIFFERS                   # another count: the claim's point fails


def test_article_ids_decode_to_unrelated_english():
    gpt2 = lw.gpt2_tokenizer()
    assert gpt2.decode([1374, 11223, 1585, 3425, 30, 40674]) == " How jerist pan?Else"
    assert gpt2.decode([1585]) == "rist" and gpt2.decode([3425]) == " pan"
    assert tokenization.visible(gpt2, [203, 1372, 1273, 164, 58]) == r"\x0f|␣beh|St|\xe8|["


def test_ids_verdict_follows_the_comparison(monkeypatch):
    gpt2 = lw.gpt2_tokenizer()
    monkeypatch.setitem(tokenization.ARTICLE_IDS, "巴黎", gpt2.encode("巴黎"))             # as if the article were right
    assert tokenization._ids_claim("巴黎", gpt2, {}).verdict is Verdict.HOLDS
    monkeypatch.setitem(tokenization.ARTICLE_IDS, "巴黎", [1, 2, 3, 4, 5])                 # right count, wrong ids
    assert tokenization._ids_claim("巴黎", gpt2, {}).verdict is Verdict.ROUGHLY


def test_nine_tokens_row(tok_rows):
    gpt2 = lw.gpt2_tokenizer()
    n = len(gpt2.encode("法国的首都是什么？"))
    mark = len(gpt2.encode("？"))
    assert tok_rows[1].numbers == {"tokens": n, "question_mark_tokens": mark} and tok_rows[1].said == 9
    assert n != 9 and tok_rows[1].verdict is Verdict.DIFFERS      # tiktoken's count is not the article's


def test_english_finer_row(tok_rows):
    gpt2 = lw.gpt2_tokenizer()
    en, zh = len(gpt2.encode("What is the capital of France?")), len(gpt2.encode("法国的首都是什么？"))
    assert tok_rows[6].numbers == {"english": en, "chinese": zh}
    assert en < zh and tok_rows[6].verdict is Verdict.DIFFERS     # GPT-2 cuts the Chinese finer


def test_fewer_tokens_row_matches_hand_count(tok_rows):
    """GPT-2 small's forward FLOPs to predict the next token, counted by hand: matrices, attention scores and mix,
    the LM head on the last position only, as the rest of the series counts (norms aside)."""
    def flops(t, d=768, layers=12, vocab=50257):
        per_layer = 2 * t * (4 * d * d + 2 * d * 4 * d) + 2 * 2 * t * t * d
        return layers * per_layer + 2 * d * vocab
    counts = tok_rows[7].numbers
    for cost, t in ((counts["short"], 7), (counts["long"], 18)):
        assert cost["tokens"] == t
        assert cost["flops"] == pytest.approx(flops(t), rel=0.01)     # norms: the 1 % left
        assert cost["kv_cache_bytes"] == 2 * 12 * 12 * 64 * t * 4     # k and v, layers, heads, d_head, fp32
    assert tok_rows[7].verdict is Verdict.ROUGHLY                    # "faster" is counted, not timed


def test_other_tokenizers_are_reported(smollm2):
    rows = tokenization.claims({"SmolLM2": smollm2.tokenizer})
    n = len(smollm2.tokenizer.encode("法国的首都是什么？"))
    assert f"SmolLM2: {n}" in rows[1].measured
    assert rows[1].verdict == tokenization.claims()[1].verdict       # GPT-2 decides


@needs_gemma
def test_gemma_counts_leave_out_bos(gemma):
    tok = gemma.tokenizer
    assert tok.encode("巴黎")[0] == gemma.config.bos_token_id
    assert tok.text_ids("巴黎") == tok.encode("巴黎")[1:] and len(tok.encode("巴黎")) == 2
    rows = tokenization.claims({"Gemma-3": tok})
    assert "Gemma-3: 1)" in rows[2].measured                                  # 巴黎 is one Gemma-3 token
    en, zh = len(tok.encode(tokenization.ENGLISH)) - 1, len(tok.encode(tokenization.QUESTION_MARKED)) - 1
    assert f"Gemma-3: {en} vs {zh}" in rows[6].measured


def test_text_ids_drops_only_a_leading_bos(smollm2):
    assert smollm2.tokenizer.text_ids("Paris") == smollm2.tokenizer.encode("Paris")
    table = tokenization.token_cost_table(["ab"], {"GPT-2": lw.gpt2_tokenizer()})
    assert table.rows == (("ab", "2", f"{len(lw.gpt2_tokenizer().encode('ab'))} (0.50)"),)


# ---------------------------------------------------------------- 三 embedding

@pytest.fixture(scope="module")
def emb_rows(smollm2):
    return embedding.claims(smollm2)


def test_one_row_per_claim_of_section_3(emb_rows):
    # 768-d vectors, learned table, no position in token vectors, same data to attention, + position embedding
    assert len(emb_rows) == 5
    assert all(isinstance(c, lw.Claim) and c.section == "三" for c in emb_rows)


def test_vector_size_row(emb_rows, smollm2):
    assert emb_rows[0].numbers == {"d_model": 768}                   # GPT-2 small's published architecture
    assert f"smollm2-135m: {list(smollm2.weights.token_embd.shape)}" in emb_rows[0].measured
    assert emb_rows[0].verdict is Verdict.HOLDS


def test_neighbours_equal_torch_cosine(smollm2, emb_rows):
    table = smollm2.weights.token_embd
    tok = smollm2.tokenizer
    for word, other in embedding.RELATED:
        i, j = tok.encode(word)[0], tok.encode(other)[0]
        sims = F.cosine_similarity(table, table[i][None], dim=-1)
        sims[i] = -2
        rank = int((sims > sims[j]).sum()) + 1
        assert emb_rows[1].numbers["ranks"][(word, other)] == rank
        assert rank <= embedding.NEAR
    top = F.cosine_similarity(table, table[tok.encode(" Paris")[0]][None], dim=-1).topk(4).indices.tolist()[1:]
    assert [p for p, _ in lw_embedding.neighbours(smollm2, " Paris", 3)] == tok.pieces(top)
    assert emb_rows[1].verdict is Verdict.HOLDS


def test_order_check_matches_forward(smollm2):
    o = embedding.order_check(smollm2, "人咬狗", "狗咬人")
    ta, tb = lw.forward(smollm2, smollm2.tokenizer.encode("人咬狗")), lw.forward(smollm2, smollm2.tokenizer.encode("狗咬人"))
    assert sorted(ta.ids.tolist()) == sorted(tb.ids.tolist()) and o["same_token_vectors"]
    pa, pb = ta.ids.argsort(stable=True), tb.ids.argsort(stable=True)
    # layer 0 with mask and positions is exactly what the real forward pass computes
    a, b = ta.layers[0].attn.out, tb.layers[0].attn.out
    assert o["gap_mask_and_position"] == pytest.approx(float((a[pa] - b[pb]).abs().max() / a.abs().max()), rel=1e-4)
    cos = F.cosine_similarity(ta.resid[-1][pa], tb.resid[-1][pb], dim=-1)
    assert o["last_layer_cosine_min"] == pytest.approx(float(cos.min()), abs=1e-5)
    # without mask and position, attention is blind to order; the causal mask alone already is not
    assert o["gap_no_mask_no_position"] < 1e-5 < 1e-3 < o["gap_causal_mask_only"]


def test_position_rows(emb_rows, smollm2):
    o = embedding.order_check(smollm2, "人咬狗", "狗咬人")
    assert emb_rows[2].verdict is Verdict.HOLDS
    assert emb_rows[3].verdict is Verdict.ROUGHLY                          # the causal mask tells orders apart
    assert emb_rows[3].numbers["gap_causal_mask_only"] == pytest.approx(o["gap_causal_mask_only"], rel=1e-4)
    assert emb_rows[4].numbers["last_layer_cosine_min"] == pytest.approx(o["last_layer_cosine_min"], abs=1e-5)
    assert emb_rows[4].verdict is Verdict.ROUGHLY                          # GPT-2 adds, SmolLM2 rotates


def test_rope_depends_on_relative_position_only():
    r = embedding.rope_relative_check(64, 10000.0)
    assert r["spread"] < 1e-3
    assert abs(r["other_score"] - r["scores"][0]) > 0.01
    assert abs(r["unrotated"] - r["scores"][0]) > 0.01            # position 3 vs 1 is not position 0 vs 0


def test_claims_are_side_effect_free(smollm2):
    before = smollm2.weights.token_embd.clone()
    embedding.claims(smollm2)
    tokenization.claims({"SmolLM2": smollm2.tokenizer})
    assert torch.equal(before, smollm2.weights.token_embd)


@pytest.fixture(scope="module")
def random_gpt2(tmp_path_factory):
    """A tiny GPT-2 with random weights and GPT-2's real vocabulary: learned positions, nothing learned."""
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("gpt2") / "tiny"
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=50257, n_positions=64)).save_pretrained(path)
    return lw.load_model(path)


def test_verdicts_follow_a_random_gpt2(random_gpt2):
    rows = embedding.claims(random_gpt2)
    assert len(rows) == 5
    # a 64-wide GPT-2 is not GPT-2 small: the claim about GPT-2 small is answered by its published architecture
    assert rows[0].numbers == {"d_model": 768} and "published config" in rows[0].measured
    assert rows[1].verdict is Verdict.DIFFERS              # a random table puts ' France' nowhere near ' Paris'
    assert rows[2].verdict is Verdict.HOLDS                # token vectors carry no position, learned or not
    assert rows[4].numbers["position_added"] is True         # x0 = token vector + position vector, checked
    assert "[64, 64]" in rows[4].measured and rows[4].verdict is Verdict.HOLDS


def test_cosine_to_all_equals_torch():
    table = torch.randn(50, 8, generator=torch.Generator().manual_seed(1))
    ref = torch.stack([F.cosine_similarity(table[7], row, dim=0) for row in table])   # one pair at a time
    assert torch.allclose(lw_embedding.cosine_to_all(table, 7), ref, atol=1e-6)


def test_neighbour_rank_is_the_place_in_the_sorted_neighbours(smollm2):
    near = [p for p, _ in lw_embedding.neighbours(smollm2, " Paris", 5)]
    assert [lw_embedding.neighbour_rank(smollm2, " Paris", p) for p in near] == [1, 2, 3, 4, 5]


def test_same_rows_ignores_order_only():
    a = torch.arange(12.0).reshape(4, 3)
    assert embedding.same_rows(a, a[[2, 0, 3, 1]]) and not embedding.same_rows(a, a[[0, 0, 1, 2]])
