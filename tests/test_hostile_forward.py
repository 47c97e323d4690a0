"""Bad arguments to forward, its hooks and the interventions: each refused with a ValueError or TypeError that
names the fix, before or instead of a raw torch error or a silent odd answer (reliability probe rows F3-F24, B12,
B14). Nothing here allocates much: every refusal comes before the pass, and the passes that run are a few tokens.
"""
import pytest
import torch

import llmwalk as lw
from llmwalk import interventions as iv
from llmwalk.cost import gpt2_config

IDS = [504, 3575, 282, 4649, 314]          # "The capital of France is"


@pytest.fixture(scope="module")
def source(smollm2):
    return lw.forward(smollm2, IDS)


def test_an_id_past_int64_is_out_of_the_vocabulary_not_a_wrong_type(smollm2):
    with pytest.raises(ValueError, match=r"token id 1180591620717411303424 is outside the vocabulary \[0, 49152\)"):
        lw.forward(smollm2, [5, 2**70])


@pytest.mark.parametrize("budget", ["x", True, float("nan"), [1]])
def test_a_budget_that_is_not_a_number_is_refused(smollm2, budget):
    with pytest.raises(TypeError, match="max_record_bytes must be a number of bytes or None"):
        lw.forward(smollm2, IDS, max_record_bytes=budget)


@pytest.mark.parametrize("budget", [0, -1, 500_000])
def test_a_budget_below_one_token_gives_the_usual_message(smollm2, budget):
    with pytest.raises(ValueError, match=r"more than max_record_bytes.*pass record=False.*raise max_record_bytes"):
        lw.forward(smollm2, IDS, max_record_bytes=budget)


def test_the_budget_counts_the_logits_of_recorded_and_unrecorded_passes(smollm2):
    c = smollm2.config
    logits = 64 * c.vocab_size * 4
    assert lw.walk.pass_bytes(c, 64) == lw.walk.record_bytes(c, 64) + logits
    assert lw.walk.pass_bytes(c, 64, record=False) == logits
    assert lw.walk.pass_bytes(c, 64, record=False, last_only=True) == c.vocab_size * 4
    with pytest.raises(ValueError, match="max_record_bytes"):        # the intermediates fit, with the logits not
        lw.forward(smollm2, [1] * 64, max_record_bytes=lw.walk.record_bytes(c, 64))
    with pytest.raises(ValueError, match=r"the logits of 64 positions × 49152 tokens .*last_only=True.*at most 63"):
        lw.forward(smollm2, [1] * 64, record=False, max_record_bytes=logits - 1)
    assert lw.forward(smollm2, [1] * 64, record=False, max_record_bytes=logits).logits.shape == (64, c.vocab_size)
    kept = lw.forward(smollm2, [1] * 64, record=False, last_only=True, max_record_bytes=logits - 1)
    assert kept.logits.shape == (1, c.vocab_size)


def test_gemma_sized_logits_past_the_default_budget_are_refused_without_record():
    """The probe's Gemma pass: 4096 unrecorded tokens keep 4 GiB of logits (262,144-token vocabulary)."""
    from dataclasses import replace
    gemma_like = replace(gpt2_config(), vocab_size=262_144)
    assert lw.walk.pass_bytes(gemma_like, 4096, record=False) == 4 * 2**30
    with pytest.raises(ValueError, match="last_only=True"):
        lw.walk._check_budget(gemma_like, 4096, 4096, torch.float32, lw.walk.RECORD_BUDGET, record=False,
                              last_only=False)


@pytest.mark.parametrize("head", [torch.zeros(3, 3), "x"])
def test_a_wrong_lm_head_is_refused_by_forward(smollm2, head):
    with pytest.raises(ValueError, match=r"expected a tensor of shape \(49152, 576\): make it with decoding_head"):
        lw.forward(smollm2, IDS, head=head)


def test_a_cache_of_another_model_or_type_is_refused(smollm2):
    with pytest.raises(TypeError, match=r"cache must be a KVCache, got str: make one with lw.KVCache.empty"):
        lw.forward(smollm2, IDS, cache="x")
    with pytest.raises(ValueError, match="made for another model .12 layers.*smollm2-135m has 30"):
        lw.forward(smollm2, IDS, cache=lw.KVCache.empty(gpt2_config(), 100))
    other = lw.KVCache([lw.kv_cache.LayerCache(16) for _ in range(smollm2.config.n_layer)])
    for layer in other.layers:                                    # filled by a model with 4 key heads of 32
        layer.update(torch.zeros(4, 1, 32), torch.zeros(4, 1, 32))
    with pytest.raises(ValueError, match="4 key heads of size 32"):
        lw.forward(smollm2, IDS, cache=other)


@pytest.mark.parametrize("hook,error,match", [
    (lambda a: None, ValueError, r"hook 'blocks.3.ffn_out' returned NoneType, expected a tensor like its input"),
    (lambda a: a[:2], ValueError, r"hook 'blocks.3.ffn_out' returned \(2, 576\) torch.float32, expected .*\(5, 576\)"),
    (lambda a: 3, ValueError, r"hook 'blocks.3.ffn_out' returned int"),
    (lambda a: a.double(), ValueError, r"returned \(5, 576\) torch.float64"),
    (5, TypeError, r"hook 'blocks.3.ffn_out' is a int, not a function")])
def test_a_bad_hook_is_named(smollm2, hook, error, match):
    with pytest.raises(error, match=match):
        lw.forward(smollm2, IDS, hooks={"blocks.3.ffn_out": hook})


def test_hooks_that_are_not_a_dict_are_refused(smollm2):
    with pytest.raises(TypeError, match=r"hooks must be a dict .*got list: e.g. hooks=iv.ablate_head"):
        lw.forward(smollm2, IDS, hooks=[1, 2])


@pytest.mark.parametrize("hooks,error,match", [([1, 2], TypeError, "hooks must be a dict"),
                                               ({"blocks.30.ffn_out": abs}, ValueError, "unknown hook point"),
                                               ({"blocks.0.ffn_out": 5}, TypeError, "not a function")])
def test_generate_stream_checks_its_hooks_before_the_first_step(smollm2, hooks, error, match):
    with pytest.raises(error, match=match):
        lw.generate_stream(smollm2, IDS, 2, hooks=hooks)             # no next(): nothing has run yet


@pytest.mark.parametrize("layer,head,error,match", [
    (0, -1, ValueError, "head must be >= 0, got -1"), (0, 1.5, TypeError, "head must be an int, got 1.5"),
    (-1, 0, ValueError, "layer must be >= 0"), (0, True, TypeError, "head must be an int")])
def test_head_indices_are_checked_when_the_ablation_is_made(layer, head, error, match):
    with pytest.raises(error, match=match):
        iv.ablate_head(layer, head)


def test_a_head_past_the_layer_s_heads_names_the_range(smollm2):
    with pytest.raises(ValueError, match=r"ablate_head\(0, 9\): layer 0 has 9 heads: use head 0..8"):
        lw.forward(smollm2, IDS, hooks=iv.ablate_head(0, 9))


@pytest.mark.parametrize("position,error,match", [
    (99, ValueError, r"position 99 is outside the source prompt's 5 tokens: use 0..4"),
    (-99, ValueError, "position must be >= 0"), (2.0, TypeError, "position must be an int")])
def test_a_patch_position_outside_the_source_is_refused(source, position, error, match):
    with pytest.raises(error, match=match):
        iv.patch(source, 3, position)


def test_a_patch_from_an_unrecorded_trace_asks_for_record_true(smollm2):
    with pytest.raises(ValueError, match=r"record=False: run lw.forward\(model, ids\) \(record=True\)"):
        iv.patch(lw.forward(smollm2, IDS, record=False), 3, 0)
    with pytest.raises(TypeError, match="source must be a trace"):
        iv.patch(IDS, 3, 0)


@pytest.mark.parametrize("tokens,error,match", [
    ([-1], ValueError, r"token id -1 is outside the vocabulary"), ([49152], ValueError, "token id 49152 is outside"),
    ([], ValueError, "empty"), (" Paris", TypeError, r"got str"), ([1.5], TypeError, "must be integers")])
def test_next_token_probs_refuses_tokens_it_cannot_answer_for(smollm2, tokens, error, match):
    with pytest.raises(error, match=rf"tokens \(the ids whose probabilities to return.*{match}"):
        iv.next_token_probs(smollm2, IDS, tokens)


def test_next_token_probs_answers_for_the_tokens_asked(smollm2):
    probs = torch.softmax(lw.forward(smollm2, IDS).logits[-1], -1)
    torch.testing.assert_close(iv.next_token_probs(smollm2, IDS, [7042, 0]), probs[[7042, 0]], atol=1e-6, rtol=1e-4)


def test_subject_position_and_combine_refuse_what_they_cannot_take():
    with pytest.raises(TypeError, match="compares token ids, got text: encode both prompts first"):
        iv.subject_position("abc", "abd")
    with pytest.raises(TypeError, match="combine takes the hook dicts .* got int"):
        iv.combine(iv.ablate_ffn(0), 5)
