"""Speculative decoding's accept/reject rule, opened: the rule by hand, and a statistical check on SmolLM2's own
distributions that the speculative output follows the target's, which rejects the classic wrong rules.

The check is Pearson's chi-square at a false-alarm rate of α = 10⁻³ (a right rule fails it with probability 10⁻³);
every draw comes from a fixed seed, so the test is deterministic.
"""
import pytest
import torch

import llmwalk as lw
from llmwalk import speculative
from llmwalk.sampling import Sampler
from llmwalk.speculative import chi_square_pvalue, residual, speculative_accept, speculative_sample, verify

ALPHA, N = 1e-3, 20_000
PROMPT = "My favourite food is"          # a spread-out next token, guessed half right by the first 25 layers

pytestmark = pytest.mark.usefixtures("one_thread")   # see conftest.py


def test_the_rule_by_hand():
    p, q = torch.tensor([0.5, 0.3, 0.2, 0.0]), torch.tensor([0.2, 0.6, 0.1, 0.1])
    rest = torch.tensor([0.3, 0.0, 0.1, 0.0]) / 0.4               # max(0, p − q) = [0.3, 0, 0.1, 0], normalised
    assert torch.allclose(residual(p, q), rest)
    assert speculative_accept(p, q, 1, 0.49)[0] and not speculative_accept(p, q, 1, 0.51)[0]   # p/q = 0.5
    assert speculative_accept(p, q, 0, 0.999)[0]                    # p ≥ q: always kept
    assert not speculative_accept(p, q, 3, 0.0)[0]                  # p = 0: never kept
    assert torch.equal(residual(p, p), p)                           # no residual mass: p itself (never used)


@pytest.fixture(scope="module")
def step(smollm2):
    """The target's p and the first 25 layers' q for the token after PROMPT at T = 0.8, top-k 10, on the tokens
    either can pick (the others have probability 0 in both: dropping them changes no draw's distribution)."""
    ids = smollm2.tokenizer.encode(PROMPT)
    sampler = Sampler(0.8, top_k=10)
    p = sampler.probs(lw.forward(smollm2, ids, record=False).logits[-1])
    q = sampler.probs(lw.forward(speculative.early_exit_model(smollm2, 25), ids, record=False).logits[-1])
    support = (p > 0) | (q > 0)
    return p[support], q[support]


def first_tokens(p, q, accept=speculative_accept, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.bincount(torch.tensor([speculative_sample(p, q, g, accept=accept) for _ in range(N)]),
                          minlength=len(p))


def test_the_draft_is_a_real_test(step):
    p, q = step
    assert 0.2 < float(speculative.acceptance_rate(p, q)) < 0.8     # neither always accepted nor always rejected
    assert len(p) > 10                                               # the two top-10 sets differ


def test_speculative_first_token_follows_the_target(step):
    p, q = step
    assert chi_square_pvalue(first_tokens(p, q), p) > ALPHA
    plain = torch.bincount(torch.multinomial(p, N, replacement=True, generator=torch.Generator().manual_seed(1)),
                           minlength=len(p))
    assert chi_square_pvalue(plain, p) > ALPHA                       # plain sampling, the same test
    assert chi_square_pvalue(plain, q) < ALPHA                       # and the test can tell p from q


WRONG_RULES = {
    "always accept": lambda p, q, x, u: (True, residual(p, q)),
    "resample from p": lambda p, q, x, u: (u < min(1.0, float(p[x] / q[x])), p),
    "ratio inverted": lambda p, q, x, u: (u < min(1.0, float(q[x] / p[x])), residual(p, q)),
    "accept when u > ratio": lambda p, q, x, u: (u > min(1.0, float(p[x] / q[x])), residual(p, q)),
    "residual max(0, q − p)": lambda p, q, x, u: (u < min(1.0, float(p[x] / q[x])), residual(q, p)),
}


@pytest.mark.parametrize("rule", WRONG_RULES)
def test_the_same_check_rejects_a_wrong_rule(step, rule):
    p, q = step
    assert chi_square_pvalue(first_tokens(p, q, WRONG_RULES[rule]), p) < ALPHA


def test_verify_judges_with_the_one_rule(monkeypatch):
    """verify (what speculative_generate runs) decides through speculative_accept: a wrong rule put there shows."""
    g = torch.Generator().manual_seed(2)
    p, q = torch.softmax(torch.randn(2, 6, generator=g), -1), torch.softmax(torch.randn(1, 6, generator=g), -1)
    drafts = torch.multinomial(q[0], 5000, replacement=True, generator=g).tolist()

    def first(gen):
        outcomes = [(x, *verify(p, q, [x], gen)) for x in drafts]        # k = 1: (x, accepted 0 or 1, token)
        return torch.bincount(torch.tensor([x if a else t for x, a, t in outcomes]), minlength=6)
    assert chi_square_pvalue(first(torch.Generator().manual_seed(3)), p[0]) > ALPHA
    monkeypatch.setattr(speculative, "speculative_accept", WRONG_RULES["always accept"])
    assert chi_square_pvalue(first(torch.Generator().manual_seed(3)), p[0]) < ALPHA


def test_chi_square_pvalue_is_pearsons():
    """Against scipy-free arithmetic: 3 categories, df = 2, where the survival function is exp(−x/2)."""
    counts, probs = torch.tensor([30.0, 50.0, 20.0]), torch.tensor([0.25, 0.5, 0.25])
    stat = (30 - 25) ** 2 / 25 + 0 + (20 - 25) ** 2 / 25
    assert chi_square_pvalue(counts, probs) == pytest.approx(float(torch.tensor(-stat / 2).exp()))
    assert chi_square_pvalue(torch.tensor([99.0, 1.0, 0.0]), torch.tensor([0.5, 0.5, 0.0])) < 1e-6
    assert chi_square_pvalue(torch.tensor([5.0, 5.0, 1.0]), torch.tensor([0.5, 0.5, 0.0])) == 0.0


def test_expected_tokens_per_round():
    assert speculative.expected_tokens_per_round(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert speculative.expected_tokens_per_round(1.0, 4) == 5 and speculative.expected_tokens_per_round(0.0, 4) == 1
