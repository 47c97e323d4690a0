"""Section 八, speculative decoding: the accept/reject rule keeps the target's distribution; greedy is its own."""
import dataclasses
import math

import matplotlib
import pytest
import torch

import llmwalk as lw
import llmwalk.viz as viz
from llmwalk.generation import generate
from llmwalk.head import logit_lens
from llmwalk.accuracy import compare_to_reference, eval_text, fp32_reference
from llmwalk.quantize import quantize_model
from llmwalk.speculative import (Draft, EarlyExitDraft, ModelDraft, PromptLookupDraft, draw_token, early_exit_model,
                                 lookup, speculative_generate, verify)

# (text, chat): an answer that copies its prompt (ending in EOS, which prompt lookup proposes together with the
# chat template's tokens after it), and a continuation with nothing to copy.
PROMPTS = {"repeat": ("Repeat this sentence exactly: The cat sat on the mat by the door.", True),
           "no copy": ("The history of the printing press", False)}
N = 16


pytestmark = pytest.mark.usefixtures("one_thread")   # see conftest.py


# ---------------------------------------------------------------- the rule, on small distributions

def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-square test that counts were drawn from probs (df = categories − 1)."""
    expected = probs * counts.sum()
    stat = ((counts - expected) ** 2 / expected).sum()
    return float(torch.special.gammaincc(torch.tensor((len(probs) - 1) / 2), stat / 2))


def output_counts(outcomes: list[tuple[int, int]], drafts: list[list[int]], vocab: int, k: int) -> list[torch.Tensor]:
    """For each output position j, counts of the token placed there by the rounds that reached it.  # -> k+1 × [V]"""
    counts = [torch.zeros(vocab) for _ in range(k + 1)]
    for (accepted, extra), drafted in zip(outcomes, drafts):
        for j, token in enumerate(drafted[:accepted] + [extra]):
            counts[j][token] += 1
    return counts


def random_rows(rows: int, vocab: int, g: torch.Generator, sharp: float = 1.5) -> torch.Tensor:
    return torch.softmax(sharp * torch.randn(rows, vocab, generator=g), dim=-1)


VOCAB, K, TRIALS = 6, 3, 20_000


@pytest.mark.parametrize("kind", ["model draft", "deterministic draft", "draft equals target", "disjoint draft"])
def test_verify_outputs_follow_the_target_distribution(kind):
    g = torch.Generator().manual_seed(1)
    p = random_rows(K + 1, VOCAB, g)
    p[:, 0] = 0                                            # a token the target never emits (top-k cut it)
    p /= p.sum(-1, keepdim=True)
    q = {"model draft": random_rows(K, VOCAB, g), "deterministic draft": None, "draft equals target": p[:K],
         "disjoint draft": torch.eye(VOCAB)[[0, 0, 0]]}[kind]
    drafts = (torch.multinomial(q, TRIALS, replacement=True, generator=g).T.tolist() if q is not None
              else [[2, 4, 1]] * TRIALS)
    outcomes = [verify(p, q, d, g) for d in drafts]
    for j, counts in enumerate(output_counts(outcomes, drafts, VOCAB, K)):
        if counts.sum() == 0:                              # nothing gets past a draft the target never accepts
            assert kind == "disjoint draft" and j > 0
            continue
        assert counts[0] == 0
        assert chi2_pvalue(counts[1:], p[j, 1:]) > 1e-3, (j, counts / counts.sum(), p[j])
    # The first token is accepted with probability sum_x min(p(x), q(x)) = 1 − total variation distance.
    q0 = q[0] if q is not None else torch.eye(VOCAB)[2]
    accepted_first = sum(a > 0 for a, _ in outcomes) / TRIALS
    assert accepted_first == pytest.approx(float(torch.minimum(p[0], q0).sum()), abs=0.015)


def test_the_chi_square_check_rejects_unverified_drafts():
    """Power of the check above: the drafted tokens themselves, not verified, are caught."""
    g = torch.Generator().manual_seed(1)
    p, q = random_rows(1, VOCAB, g)[0], random_rows(1, VOCAB, g)[0]
    counts = torch.bincount(torch.multinomial(q, TRIALS, replacement=True, generator=g), minlength=VOCAB).float()
    assert chi2_pvalue(counts, p) < 1e-6


def test_greedy_verify_keeps_the_matching_prefix_without_random_numbers():
    target = [5, 1, 1, 3]                                  # the target's argmax after each position
    p = torch.eye(VOCAB)[target]
    state = torch.random.get_rng_state()
    assert verify(p, None, [5, 1, 1]) == (3, 3)            # all accepted, then the bonus token
    assert verify(p, None, [5, 2, 1]) == (1, 1)            # rejected at 2: the target's own token instead
    assert verify(p, torch.eye(VOCAB)[[0, 1, 1]], [0, 1, 1]) == (0, 5)
    assert verify(p[:1], None, []) == (0, 5)               # nothing drafted: one plain greedy step
    assert torch.equal(torch.random.get_rng_state(), state)


def test_verify_rejects_mismatched_shapes():
    p = torch.full((3, VOCAB), 1 / VOCAB)
    with pytest.raises(ValueError, match="share the target's vocabulary"):
        verify(p, torch.full((2, VOCAB + 1), 1 / (VOCAB + 1)), [0, 1])
    with pytest.raises(ValueError, match="2 drafted tokens need target rows"):
        verify(p[:2], None, [0, 1])


def test_draw_is_deterministic_on_a_single_token():
    assert draw_token(torch.tensor([0.0, 0.0, 0.7, 0.0])) == 2
    g = torch.Generator().manual_seed(0)
    assert {draw_token(torch.tensor([0.0, 2.0, 2.0]), g) for _ in range(50)} == {1, 2}      # unnormalized weights are fine


# ---------------------------------------------------------------- prompt lookup

@pytest.mark.parametrize("context, ngram, k, expected", [
    ([1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 1, 2, 3], 3, 2, [7, 8]),    # the latest earlier occurrence wins
    ([1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 1, 2, 3], 3, 9, [7, 8, 1, 2, 3]),   # runs up to the end of the context
    ([5, 6, 7, 4, 7], 3, 2, [4, 7]),                              # no 3- or 2-gram match: falls back to 1-gram [7]
    ([5, 6, 7, 8], 3, 2, []),                                     # the last token never occurred before
    ([4, 4, 4], 2, 3, [4]),                                       # overlapping match
    ([7], 3, 2, []),
])
def test_lookup(context, ngram, k, expected):
    assert lookup(context, ngram, k) == expected
    assert PromptLookupDraft(ngram).propose(context, k, None, None).ids == expected


def test_prompt_lookup_rejects_a_bad_ngram():
    with pytest.raises(ValueError, match="ngram must be an int >= 1"):
        PromptLookupDraft(0)


# ---------------------------------------------------------------- caches and models

def test_early_exit_model_is_the_logit_lens(smollm2):
    ids = smollm2.tokenizer.encode("The capital of France is")
    exit6 = early_exit_model(smollm2, 6)
    assert exit6.config.n_layer == 6 and len(exit6.weights.blocks) == 6
    assert exit6.weights.blocks[5] is smollm2.weights.blocks[5]               # shared, not copied
    assert exit6.config.n_params == lw.count_params(exit6.weights) < smollm2.config.n_params
    lens = logit_lens(lw.forward(smollm2, ids).resid[6], smollm2.weights, smollm2.config)
    torch.testing.assert_close(lw.forward(exit6, ids).logits, lens)
    with pytest.raises(ValueError, match=r"n_layers must be an int in \[1, 30\]"):
        early_exit_model(smollm2, 31)


@pytest.fixture(scope="module")
def int8(smollm2):
    return quantize_model(smollm2, 8)


def test_early_exit_rarely_agrees_with_the_full_model(smollm2, hf_smollm2, int8):
    """Why early exit drafts badly: the middle layers' top token is seldom the last layer's; int8's nearly always
    is. The reference: transformers' own logit lens (its hidden state after layer n, its final norm and head)."""
    text = eval_text()[:500]
    ids = torch.tensor([smollm2.tokenizer.encode(text)])
    reference = fp32_reference(smollm2, text)          # the full model scored once, for each draft below
    int8_agreement = compare_to_reference(reference, int8).top1_agreement
    with torch.no_grad():
        out = hf_smollm2(ids, output_hidden_states=True)
        final = out.logits[0].argmax(-1)
        for n in (6, 24):
            lens = hf_smollm2.lm_head(hf_smollm2.model.norm(out.hidden_states[n]))[0].argmax(-1)
            theirs = float((lens == final).float().mean())
            ours = compare_to_reference(reference, early_exit_model(smollm2, n)).top1_agreement
            assert ours == pytest.approx(theirs, abs=1.5 / ids.shape[1])        # a near-tie may flip one token
            assert ours < int8_agreement


# ---------------------------------------------------------------- speculative generation on SmolLM2

@pytest.fixture(scope="module")
def plain(smollm2) -> dict[str, list[int]]:
    """The target's own greedy tokens for each prompt."""
    return {name: generate(smollm2, text, N, chat=chat).new_ids for name, (text, chat) in PROMPTS.items()}


@pytest.fixture(scope="module")
def drafts(smollm2, int8) -> dict[str, Draft]:
    return {"lookup": PromptLookupDraft(), "int8": ModelDraft(int8), "exit4": EarlyExitDraft(smollm2, 4)}


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("draft", ["lookup", "int8", "exit4"])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_speculative_equals_plain_greedy(smollm2, plain, drafts, prompt, draft, k):
    text, chat = PROMPTS[prompt]
    result = speculative_generate(smollm2, drafts[draft], text, k=k, max_new_tokens=N, chat=chat)
    assert result.new_ids == plain[prompt]
    if draft == "lookup" and prompt == "repeat":
        assert result.acceptance_rate > 0.5 and result.target_forward_passes < len(result.new_ids)


def test_greedy_int4_draft(smollm2, plain):
    """int4 runs through the slow dequantize path: a few tokens only."""
    text, chat = PROMPTS["repeat"]
    result = speculative_generate(smollm2, ModelDraft(quantize_model(smollm2, 4, 32)), text, k=3, max_new_tokens=8,
                                  chat=chat)
    assert result.new_ids == plain["repeat"][:8]


def test_rounds_account_for_every_token(smollm2, drafts, plain):
    text, chat = PROMPTS["repeat"]
    for draft in ("lookup", "int8"):
        result = speculative_generate(smollm2, drafts[draft], text, k=5, max_new_tokens=N, chat=chat)
        made = [t for r in result.rounds for t in r.new_ids]
        assert result.stopped == "eos" and result.new_ids[-1] in smollm2.eos_ids
        # Cut after EOS: both drafts went on past it (lookup copies the chat template that follows it in the prompt).
        assert made[:len(result.new_ids)] == result.new_ids and len(made) > len(result.new_ids)
        assert result.text == smollm2.tokenizer.decode(plain["repeat"][:-1]) == text.split(": ")[1]
        assert result.target_forward_passes == len(result.rounds) + 1    # + the prefill
        assert result.draft_forward_passes == (0 if draft == "lookup" else sum(len(r.proposed) for r in result.rounds))
        for r in result.rounds:
            assert r.proposed == smollm2.tokenizer.pieces(r.proposed_ids)
            assert r.extra == smollm2.tokenizer.pieces([r.extra_id])[0]
            assert r.bonus == (len(r.proposed_ids) > 0 and r.accepted == len(r.proposed_ids))
    drawn = [t.get_text() for t in viz.speculative_timeline(result.rounds).findobj(matplotlib.text.Text)]
    assert drawn.count("✓") == sum(r.accepted for r in result.rounds)


def test_draft_identical_to_target_is_always_accepted(smollm2, plain):
    text, chat = PROMPTS["no copy"]
    result = speculative_generate(smollm2, ModelDraft(smollm2), text, k=3, max_new_tokens=12, chat=chat)
    assert result.new_ids == plain["no copy"][:12]
    assert result.acceptance_rate == 1.0 and all(r.bonus for r in result.rounds)
    assert len(result.rounds) == math.ceil(12 / 4) and result.target_forward_passes == 4


def test_max_new_tokens_is_exact_when_every_draft_is_accepted(smollm2):
    result = speculative_generate(smollm2, ModelDraft(smollm2), PROMPTS["no copy"][0], k=5, max_new_tokens=8)
    assert len(result.new_ids) == 8 and [len(r.proposed_ids) for r in result.rounds] == [5, 1]


@pytest.mark.parametrize("draft", ["lookup", "exit4"])
def test_sampling_is_reproducible_with_a_seed(smollm2, drafts, draft):
    text, chat = PROMPTS["no copy"]
    run = dict(k=3, max_new_tokens=8, temperature=1.0, top_k=50, chat=chat, stop_at_eos=False)
    first, again = (speculative_generate(smollm2, drafts[draft], text, seed=2, **run) for _ in range(2))
    assert first.new_ids == again.new_ids and first.rounds == again.rounds
    assert any(r.proposed and not r.bonus for r in first.rounds)           # a rejection drew from the residual
    other = speculative_generate(smollm2, drafts[draft], text, generator=torch.Generator().manual_seed(3), **run)
    assert other.new_ids != first.new_ids


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_greedy_speculative_on_a_low_precision_model(smollm2, dtype):
    """The caches take the model's dtype: a bf16/fp16 target with a bf16/fp16 draft gives its own greedy tokens."""
    target = dataclasses.replace(smollm2, weights=lw.to_dtype(smollm2.weights, dtype))
    text, chat = PROMPTS["repeat"]
    plain_ids = generate(target, text, 10, chat=chat).new_ids
    for draft in (PromptLookupDraft(), EarlyExitDraft(target, 4)):
        assert speculative_generate(target, draft, text, k=3, max_new_tokens=10, chat=chat).new_ids == plain_ids


def test_errors(smollm2):
    with pytest.raises(TypeError, match="positional"):                 # k and the rest are keyword-only
        speculative_generate(smollm2, PromptLookupDraft(), "Hi", 3)
    with pytest.raises(ValueError, match="k \\(tokens drafted per round\\) must be an int >= 1"):
        speculative_generate(smollm2, PromptLookupDraft(), "Hi", k=0)
    with pytest.raises(ValueError, match="pass seed="):                 # generate's own checks
        speculative_generate(smollm2, PromptLookupDraft(), "Hi", temperature=0.7)
    other = dataclasses.replace(smollm2, config=dataclasses.replace(smollm2.config, vocab_size=50257))
    with pytest.raises(ValueError, match="must share the target's tokenizer"):
        speculative_generate(smollm2, ModelDraft(other), "Hi")
