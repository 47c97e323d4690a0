"""Interventions through forward's hooks: each against the plain forward pass or a hand computation."""
import pytest
import torch

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


def test_patching_a_prompt_into_itself_changes_nothing(smollm2, france):
    plain = lw.forward(smollm2, france)
    for layer, pos, point in [(0, 3, "resid"), (12, 4, "resid"), (30, 4, "resid"), (5, 3, "ffn_out")]:
        patched = lw.forward(smollm2, france, hooks=iv.patch(plain, layer, pos, point))
        assert torch.equal(patched.logits, plain.logits)


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
    mlps = [layer.mlp for layer in hf_smollm2.model.layers]
    saved = {}
    handles = [m.register_forward_hook(lambda m, i, out, n=n: saved.__setitem__(n, out[0, 3].clone()))
               for n, m in enumerate(mlps)]
    with torch.no_grad():
        hf_smollm2(torch.tensor([germany]))
    for h in handles:
        h.remove()

    def swapped(layers):
        def put(n):
            def hook(m, i, out):
                out = out.clone()
                out[0, 3] = saved[n]
                return out
            return hook
        handles = [mlps[n].register_forward_hook(put(n)) for n in layers]
        with torch.no_grad():
            logits = hf_smollm2(torch.tensor([france])).logits[0, -1]
        for h in handles:
            h.remove()
        return torch.softmax(logits, -1)[tokens]

    L = smollm2.config.n_layer
    for layers in (range(L), range(1, L)):
        ours = iv.swap_ffn_outputs(smollm2, france, germany, tokens, layers)
        torch.testing.assert_close(ours, swapped(layers), atol=2e-3, rtol=0)
    row = section4.claims(smollm2)[-1]
    assert row.article.startswith("FFN calls up knowledge")
    assert row.verdict == section4.knowledge_verdict(row.numbers["all_ffns"], row.numbers["later_ffns"])


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
