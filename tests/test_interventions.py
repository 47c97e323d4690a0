"""Interventions through forward's hooks: each against the plain forward pass or a hand computation."""
import warnings

import pytest
import torch

import oracle
import llmwalk as lw
from llmwalk import interventions as iv
from llmwalk.layers import linear, merge_heads

FRANCE, GERMANY = "The capital of France is", "The capital of Germany is"


@pytest.fixture(scope="module")
def france(smollm2):
    return smollm2.tokenizer.encode(FRANCE)


def test_no_intervention_equals_plain_forward(smollm2, france):
    plain = lw.forward(smollm2, france)
    identity = {f"blocks.{i}.{p}": (lambda a: a) for i in (0, 7, 29) for p in lw.walk.HOOK_POINTS}
    hooked = lw.forward(smollm2, france, hooks=identity)
    assert torch.equal(hooked.logits, plain.logits)
    assert torch.equal(lw.forward(smollm2, france, hooks={}).logits, plain.logits)


def test_patching_a_prompt_into_itself_changes_nothing_and_says_so(smollm2, france):
    plain = lw.forward(smollm2, france)
    for layer, pos, point in [(0, 3, "resid"), (12, 4, "resid"), (30, 4, "resid"), (5, 3, "ffn_out")]:
        with pytest.warns(iv.NoEffectWarning, match=rf"patch\(source, {layer}, {pos}, '{point}'\) changed nothing"):
            patched = lw.forward(smollm2, france, hooks=iv.patch(plain, layer, pos, point))
        assert torch.equal(patched.logits, plain.logits)
        assert len(patched.unchanged) == 1


def test_a_patch_where_the_prompts_agree_is_silent_but_named_in_the_trace(smollm2, france):
    """Patching a shared prefix position changes nothing, as it should (patching_grid's first columns, notebook
    05's loop): no warning, and trace.unchanged names the hook point; the differing position is not named."""
    source = lw.forward(smollm2, smollm2.tokenizer.encode(GERMANY))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = lw.forward(smollm2, france, hooks=iv.patch(source, 12, 1))
        moved = lw.forward(smollm2, france, hooks=iv.patch(source, 12, 3))
    assert same.unchanged == ("blocks.12.resid_pre",)
    assert moved.unchanged == ()


def test_an_ablation_that_changes_nothing_warns(smollm2, france):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lw.forward(smollm2, france, hooks=iv.ablate_head(0, 0))           # a real change: no warning
    twice = iv.combine(iv.ablate_head(0, 0), iv.ablate_head(0, 0))        # the second finds the head already 0
    with pytest.warns(iv.NoEffectWarning, match=r"ablate_head\(0, 0, 'zero'\) changed nothing"):
        lw.forward(smollm2, france, hooks=twice)
    with pytest.warns(iv.NoEffectWarning, match=r"ablate_ffn\(3, 'mean'\) changed nothing.*single position"):
        lw.forward(smollm2, france[:1], hooks=iv.ablate_ffn(3, "mean"))   # one position is its own mean


def test_user_hooks_that_change_nothing_are_named_and_in_place_changes_spare_the_trace(smollm2, france):
    t = lw.forward(smollm2, france, hooks={"blocks.2.ffn_out": lambda a: a, "blocks.4.attn_out": lambda a: a * 2,
                                           "blocks.0.resid_pre": lambda a: a.add_(1)})
    assert t.unchanged == ("blocks.2.ffn_out",)
    plain = lw.forward(smollm2, france)
    assert torch.equal(t.x0, plain.x0) and torch.equal(t.tok_emb, plain.tok_emb)   # add_ hit a copy...
    expected = lw.norm(plain.x0 + 1, smollm2.weights.blocks[0].attn_norm, smollm2.config)
    torch.testing.assert_close(t.layers[0].attn_in, expected)                      # ...which the model ran on


def test_mean_ablation_is_refused_with_the_kv_cache_and_follows_forward_without_it(smollm2, france):
    mean = iv.ablate_ffn(0, "mean")
    for hooks in (mean, iv.combine(iv.ablate_ffn(0), mean), iv.ablate_head(2, 1, "mean"),
                  iv.ablate_attention(3, "mean")):
        with pytest.raises(ValueError, match="mean ablation needs the whole sequence: pass kv_cache=False"):
            lw.generate(smollm2, france, 3, hooks=hooks, stop_at_eos=False)
    # Without the cache every round reruns the whole sequence, each round's mean taken over all of it.
    out = lw.generate(smollm2, france, 3, hooks=mean, kv_cache=False, stop_at_eos=False)
    ids = list(france)
    for _ in range(3):
        ids.append(int(lw.forward(smollm2, ids, hooks=mean).logits[-1].argmax()))
    assert out.new_ids == ids[len(france):]
    assert out.new_ids != lw.generate(smollm2, france, 3, stop_at_eos=False).new_ids    # the ablation did act


def test_zero_ablation_gives_the_same_tokens_with_and_without_the_kv_cache(smollm2, france):
    hooks = iv.combine(iv.ablate_ffn(0), iv.ablate_head(23, 4))
    cached = lw.generate(smollm2, france, 6, hooks=hooks, stop_at_eos=False)
    assert cached.new_ids == lw.generate(smollm2, france, 6, hooks=hooks, kv_cache=False, stop_at_eos=False).new_ids
    assert cached.new_ids != lw.generate(smollm2, france, 6, stop_at_eos=False).new_ids


def test_a_patch_under_generate_is_refused_naming_the_later_passes(smollm2, france):
    source = lw.forward(smollm2, smollm2.tokenizer.encode(GERMANY))
    for kv_cache in (True, False):
        with pytest.raises(ValueError, match="only generate's first pass has that many: later passes run 1 token"):
            lw.generate(smollm2, france, 3, hooks=iv.combine(iv.ablate_ffn(0), iv.patch(source, 3, 0)),
                        kv_cache=kv_cache)
    cache = lw.KVCache.empty(smollm2.config, 8)
    lw.forward(smollm2, france, cache, record=False)
    with pytest.raises(ValueError, match="has 5 tokens and this pass runs 1.*KV cache runs only its new positions"):
        lw.forward(smollm2, [11], cache, hooks=iv.patch(source, 3, 0))


def test_hooks_on_the_fast_path_equal_the_readable_path(smollm2, france):
    """next_token_probs and effects run record=False: fast.attention's attn.z hook for a prompt (attend_all), and
    for a decode step with the cache (attend_one). Both must match the readable (record=True) attention with the same
    hook."""
    tok = smollm2.tokenizer
    source = lw.forward(smollm2, tok.encode(GERMANY))
    tokens = [tok.token_id(" Paris"), tok.token_id(" Berlin")]
    plain = iv.next_token_probs(smollm2, france, tokens)
    for hooks in (iv.ablate_head(23, 4), iv.ablate_head(23, 4, "mean"), iv.patch(source, 5, 3)):
        readable = torch.softmax(lw.forward(smollm2, france, hooks=hooks).logits[-1], -1)[tokens]
        fast = iv.next_token_probs(smollm2, france, tokens, hooks)
        torch.testing.assert_close(fast, readable, atol=1e-5, rtol=1e-4)
        assert not torch.allclose(fast, plain, atol=1e-2)                  # the hook acted on the fast path
    hooks = iv.ablate_head(23, 4)
    cache = lw.KVCache.empty(smollm2.config, len(france))
    lw.forward(smollm2, france[:-1], cache, record=False, hooks=hooks)
    decoded = lw.forward(smollm2, france[-1:], cache, record=False, hooks=hooks).logits[-1]
    readable = lw.forward(smollm2, france, hooks=hooks).logits[-1]
    torch.testing.assert_close(decoded, readable, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(decoded, lw.forward(smollm2, france).logits[-1], atol=1e-1)


def test_patching_another_prompt_changes_the_answer_where_it_should(smollm2, france):
    tok = smollm2.tokenizer
    germany = tok.encode(GERMANY)
    source = lw.forward(smollm2, germany)
    paris, berlin = tok.token_id(" Paris"), tok.token_id(" Berlin")
    # Patching what enters layer 0 at " France" is feeding " Germany"'s embedding: exactly the Germany prompt.
    swapped = iv.next_token_probs(smollm2, france, [paris, berlin], iv.patch(source, 0, 3))
    torch.testing.assert_close(swapped, torch.softmax(source.logits[-1], -1)[[paris, berlin]], atol=1e-5, rtol=1e-4)
    # The last position's full residual after the last layer decides everything.
    last = iv.next_token_probs(smollm2, france, [berlin], iv.patch(source, 30, 4))
    torch.testing.assert_close(last, torch.softmax(source.logits[-1], -1)[[berlin]], atol=1e-5, rtol=1e-4)


def test_zero_ablating_a_head_equals_zeroing_it_before_W_O(smollm2, france):
    layer, head = 23, 4
    plain = lw.forward(smollm2, france)
    b = plain.layers[layer]
    z = b.attn.z.clone()
    z[head] = 0
    block = smollm2.weights.blocks[layer]
    by_hand_mid = plain.resid[layer] + linear(merge_heads(z), block.attn_output)      # x + W_O · (heads, one zeroed)
    hooked = lw.forward(smollm2, france, hooks=iv.ablate_head(layer, head))
    torch.testing.assert_close(hooked.layers[layer].resid_mid, by_hand_mid, atol=1e-4, rtol=1e-5)
    assert not torch.allclose(hooked.layers[layer].resid_mid, b.resid_mid, atol=1e-3)
    assert torch.equal(hooked.resid[layer], plain.resid[layer])      # earlier layers untouched


def test_ablating_every_attention_and_ffn_leaves_the_embedding_read_by_the_head(smollm2, france):
    L, w = smollm2.config.n_layer, smollm2.weights
    hooks = iv.combine(*[iv.ablate_attention(i) for i in range(L)], *[iv.ablate_ffn(i) for i in range(L)])
    t = lw.forward(smollm2, france, hooks=hooks)
    expected = lw.lm_head(lw.norm(t.x0, w.output_norm, smollm2.config), w.output)
    torch.testing.assert_close(t.logits, expected, atol=1e-5, rtol=1e-5)


def test_mean_ablation_replaces_by_the_mean_over_positions(smollm2, france):
    layer = 4
    plain = lw.forward(smollm2, france)
    t = lw.forward(smollm2, france, hooks=iv.ablate_ffn(layer, "mean"))
    out = t.layers[layer].ffn_out
    assert torch.allclose(out, out[:1].expand_as(out))                # every position gets the same vector
    expected = lw.ffn(t.layers[layer].ffn_in, smollm2.weights.blocks[layer], smollm2.config)[0].mean(0)
    torch.testing.assert_close(out[0], expected, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(t.logits, plain.logits)


def test_bad_interventions_are_refused(smollm2, france):
    source = lw.forward(smollm2, smollm2.tokenizer.encode("The capital of the United Kingdom is"))
    with pytest.raises(ValueError, match="same token count"):
        lw.forward(smollm2, france, hooks=iv.patch(source, 3, 1))
    with pytest.raises(ValueError, match="unknown hook point"):
        lw.forward(smollm2, france, hooks={"blocks.30.ffn_out": lambda a: a})
    with pytest.raises(ValueError, match="'zero' or 'mean'"):
        lw.forward(smollm2, france, hooks=iv.ablate_ffn(0, "half"))
    with pytest.raises(ValueError, match="exactly one token"):
        iv.subject_position(france, source.ids)


def test_ffn_swap_matches_transformers_with_a_forward_hook(smollm2, hf_smollm2, france):
    """The FFN-knowledge claim's numbers, recomputed on transformers' model with torch forward hooks on its MLPs."""
    from llmwalk.claims import layers as section4
    tok = smollm2.tokenizer
    germany = tok.encode(section4.OTHER)
    tokens = [tok.token_id(section4.ANSWER), tok.token_id(section4.OTHER_ANSWER)]

    def swapped(layers):                  # at the subject, " France", position 3
        return torch.tensor(oracle.ffn_swap_probs(hf_smollm2, france, germany, tokens, layers, [3]))

    L = smollm2.config.n_layer
    for layers in (range(L), range(1, L)):
        ours = iv.swap_ffn_outputs(smollm2, france, germany, tokens, layers)
        torch.testing.assert_close(ours, swapped(layers), atol=2e-3, rtol=0)
    row = section4.claims(smollm2)[-1]
    assert row.article.startswith("FFN calls up knowledge")
    assert row.verdict == section4.knowledge_verdict(row.numbers["everywhere"], row.numbers["at_subject"])


def test_knowledge_verdict_follows_the_numbers():
    from llmwalk.claims.layers import knowledge_verdict
    from llmwalk.report import Verdict
    assert knowledge_verdict([0.01, 0.8], [0.1, 0.6]) == Verdict.HOLDS
    assert knowledge_verdict([0.01, 0.8], [0.6, 0.1]) == Verdict.ROUGHLY
    assert knowledge_verdict([0.7, 0.1], [0.7, 0.1]) == Verdict.DIFFERS


def test_effects_start_with_the_plain_run_named_in_the_reader_s_language(smollm2, france):
    tok = smollm2.tokenizer
    tokens = [tok.token_id(" Paris"), tok.token_id(" Berlin")]
    plain = torch.softmax(lw.forward(smollm2, france).logits[-1], -1)[tokens]
    lw.set_language("zh")
    try:
        rows = iv.effects(smollm2, france, tokens, {"layer 23 attention zeroed": iv.ablate_attention(23)})
    finally:
        lw.set_language("en")
    (first, p), (_, ablated) = rows.items()
    assert first == "不做任何干预"                      # the plot's first row label: no English "none" left
    torch.testing.assert_close(p, plain, atol=1e-6, rtol=1e-5)
    assert not torch.allclose(ablated, plain, atol=1e-3)


def test_patching_grid_runs_the_shared_prefix_once_and_every_cell_is_that_patch(smollm2, france):
    tok = smollm2.tokenizer
    source = lw.forward(smollm2, tok.encode("The capital of Germany is"))
    berlin = tok.token_id(" Berlin")
    grid = iv.patching_grid(smollm2, france, source, berlin)
    assert grid.shape == (smollm2.config.n_layer + 1, len(france))
    for layer, pos in [(0, 0), (12, 2), (5, 3), (24, 4), (30, 4)]:         # prefix cells, then patched ones
        hooked = lw.forward(smollm2, france, hooks=iv.patch(source, layer, pos)).logits[-1]
        torch.testing.assert_close(grid[layer, pos], torch.softmax(hooked, -1)[berlin], atol=1e-5, rtol=1e-4)
