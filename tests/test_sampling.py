import math

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from llmwalk.sampling import (
    entropy,
    kept,
    rank_of,
    Sampler,
    apply_temperature,
    greedy,
    min_p_filter,
    probs_after,
    sample,
    surgery,
    top_k_filter,
    top_p_filter,
)

VOCABS = [1, 2, 7, 50, 1000]
KINDS = ["normal0.1", "normal1", "normal10", "ties", "with_-inf"]
CASES_PER_COMBO = 12  # x 25 combos = 300 random cases per warper


def make_logits(kind: str, batch: int, vocab: int, g: torch.Generator) -> torch.Tensor:
    if kind.startswith("normal"):
        return torch.randn(batch, vocab, generator=g) * float(kind[len("normal"):])
    if kind == "ties":  # few distinct values: exact ties everywhere, including at every boundary
        return torch.randint(-3, 3, (batch, vocab), generator=g).float()
    x = torch.randn(batch, vocab, generator=g) * 3
    x[torch.rand(batch, vocab, generator=g) < 0.3] = float("-inf")
    x[:, 0] = torch.randn(batch, generator=g)  # every row keeps at least one finite logit
    return x


def cases(kind: str, vocab: int):
    """Seeded random logits batches with random k / p / min_p, edge values included."""
    g = torch.Generator().manual_seed(KINDS.index(kind) * 10_000 + vocab)
    for i in range(CASES_PER_COMBO):
        x = make_logits(kind, int(torch.randint(1, 5, (), generator=g)), vocab, g)
        u = float(torch.rand((), generator=g))
        k = [1, vocab, vocab + 5, 2, 1 + int(u * vocab)][i % 5]
        p = [1.0, 1e-9, 0.5, 0.9, max(u, 1e-3)][i % 5]
        min_p = [0.0, 1.0, 0.05, 0.5, u][i % 5]
        t = [1.0, 0.7, 1.5, 0.3, 0.1 + 2 * u][i % 5]
        yield x, k, p, min_p, t


def assert_same(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert torch.equal(ours.isinf(), theirs.isinf())
    assert torch.equal(ours[ours.isfinite()], theirs[theirs.isfinite()])


combos = pytest.mark.parametrize("kind,vocab", [(k, v) for k in KINDS for v in VOCABS])


@combos
def test_filters_match_transformers_warpers(kind, vocab):
    for x, k, p, min_p, t in cases(kind, vocab):
        assert_same(apply_temperature(x, t), TemperatureLogitsWarper(t)(None, x))
        assert_same(top_k_filter(x, k), TopKLogitsWarper(k)(None, x))
        assert_same(min_p_filter(x, min_p), MinPLogitsWarper(min_p)(None, x))
        if p < 1:
            assert_same(top_p_filter(x, p), TopPLogitsWarper(p)(None, x))
        else:
            # generate() skips the warper at p == 1; the warper itself would also cut tokens whose
            # probability underflows to exactly 0, and those are the only tokens allowed to differ.
            assert torch.equal(top_p_filter(x, p), x)
            theirs = TopPLogitsWarper(p)(None, x)
            live = x.softmax(-1) > 0
            assert torch.equal(theirs[live], x[live])
        # A 1-D vector is filtered exactly like the same row inside a batch.
        assert_same(top_p_filter(x[0], p), top_p_filter(x, p)[0])
        assert_same(top_k_filter(x[0], k), top_k_filter(x, k)[0])


def test_top_p_textbook_form_matches_transformers_on_many_rows():
    """top_p_filter keeps a token while the mass ranked above it is < p; transformers cuts the ascending tail whose
    mass is <= 1 - p. The same set in exact arithmetic: checked bit for bit where float sums could part them — wide
    vocabularies, p anywhere in (0, 1), and rows where the crossing token's cumulative mass sits within round-off of p."""
    g = torch.Generator().manual_seed(7)
    for _ in range(300):
        x = torch.randn(8, 1000, generator=g) * float(torch.empty(()).uniform_(0.3, 5, generator=g))
        p = float(torch.rand((), generator=g)) * 0.999 + 1e-3
        assert_same(top_p_filter(x, p), TopPLogitsWarper(p)(None, x))
    # p exactly at a cumulative mass: 4 tied tokens of 1/4 and p = 1/2, 1/4, 3/4
    x = torch.zeros(4)
    for p in (0.25, 0.5, 0.75):
        assert_same(top_p_filter(x, p), TopPLogitsWarper(p)(None, x[None])[0])


@combos
def test_probs_after_matches_generate_pipeline(kind, vocab):
    for x, k, p, min_p, t in cases(kind, vocab):
        warpers = LogitsProcessorList([TemperatureLogitsWarper(t), TopKLogitsWarper(k), MinPLogitsWarper(min_p)])
        if p < 1:  # generate()'s order: temperature, top-k, top-p, min-p
            warpers.insert(2, TopPLogitsWarper(p))
        expected = warpers(None, x).softmax(-1)
        assert torch.equal(probs_after(x, t, top_k=k, top_p=p, min_p=min_p), expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_logits_are_sampled_in_float32(dtype):
    x = next(cases("normal1", 1000))[0].to(dtype)
    warpers = LogitsProcessorList([TemperatureLogitsWarper(0.7), TopKLogitsWarper(50), TopPLogitsWarper(0.9)])
    probs = Sampler(0.7, top_k=50, top_p=0.9).probs(x)
    assert probs.dtype == torch.float32
    assert torch.equal(probs, warpers(None, x.float()).softmax(-1))


def test_greedy_sampler_uses_no_random_numbers():
    x = torch.tensor([1.0, 3.0, 2.0])
    g = torch.Generator().manual_seed(0)
    state = g.get_state()
    assert Sampler().is_greedy and not Sampler(0.5).is_greedy
    assert int(Sampler().draw(x, g)) == 1 and int(Sampler().choose(Sampler().probs(x), g)) == 1
    assert torch.equal(g.get_state(), state)
    Sampler(1.0).draw(x, g)                      # a draw does use the generator
    assert not torch.equal(g.get_state(), state)


def test_sampler_is_frozen_and_checked_when_made():
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\], got 1.5"):
        Sampler(0.7, top_p=1.5)
    with pytest.raises(ValueError, match="temperature must be a finite number >= 0, got '0.7'"):
        Sampler("0.7")
    with pytest.raises(AttributeError):
        Sampler().temperature = 1.0


def test_top_k_keeps_all_ties_and_top_p_splits_them():
    x = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0])
    assert top_k_filter(x, 2).isfinite().tolist() == [True, True, True, True, False]
    assert top_k_filter(x, 99).isfinite().all()
    # p == 1 keeps everything, as in generate(), even a token whose probability underflows to 0.
    assert top_p_filter(torch.tensor([0.0, 200.0]), 1.0).isfinite().all()
    # Each tied token has p ~ 0.24: reaching 0.5 needs 3 of the 4, and the later indices win the tie.
    assert top_p_filter(x, 0.5).isfinite().tolist() == [False, True, True, True, False]


def test_removed_entries_are_minus_inf():
    x = torch.tensor([3.0, 2.0, 1.0, 0.0])
    assert top_k_filter(x, 2).tolist() == [3.0, 2.0, float("-inf"), float("-inf")]


def test_greedy_is_argmax():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 50, generator=g)
    assert torch.equal(greedy(x), x.argmax(-1))
    assert greedy(x[0]).shape == () and greedy(x).dtype == torch.int64


def test_temperature_zero_is_greedy_and_one_hot():
    x = torch.randn(8, 50, generator=torch.Generator().manual_seed(1))
    assert torch.equal(sample(x, temperature=0, top_k=3, top_p=0.5), greedy(x))
    assert torch.equal(probs_after(x, temperature=0), torch.nn.functional.one_hot(greedy(x), 50).float())


def test_sample_shapes_and_seeds():
    x = torch.zeros(200, 10)  # uniform: any two seeds disagree somewhere among 200 draws
    a = sample(x, generator=torch.Generator().manual_seed(0))
    b = sample(x, generator=torch.Generator().manual_seed(0))
    c = sample(x, generator=torch.Generator().manual_seed(1))
    assert a.shape == (200,) and a.dtype == torch.int64
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert sample(x[0], generator=torch.Generator().manual_seed(0)).shape == ()


def test_sample_frequencies_match_probs_after():
    x = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -1.0, -3.0])
    kw = dict(temperature=0.8, top_k=5, top_p=0.9)
    expected = probs_after(x, **kw)
    assert 0 < int((expected == 0).sum()) < 5  # the filters cut something, and something is left
    n = 20_000
    ids = sample(x.expand(n, -1), **kw, generator=torch.Generator().manual_seed(0))
    freq = torch.bincount(ids, minlength=7) / n
    assert (freq[expected == 0] == 0).all()
    assert (freq - expected).abs().max() < 0.015


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(temperature=-1.0), ">= 0"),
        (dict(temperature=math.nan), ">= 0"),
        (dict(temperature=math.inf), ">= 0"),
        (dict(top_p=0.0), "(0, 1]"),
        (dict(top_p=-0.1), "(0, 1]"),
        (dict(top_p=1.5), "(0, 1]"),
        (dict(top_p=math.nan), "(0, 1]"),
        (dict(top_p="0.5"), "(0, 1]"),
        (dict(top_k=0), ">= 1"),
        (dict(top_k=-3), ">= 1"),
        (dict(top_k=2.5), ">= 1"),
        (dict(top_k=True), ">= 1"),
        (dict(top_k="5"), ">= 1"),
        (dict(min_p=-0.1), "[0, 1]"),
        (dict(min_p=1.1), "[0, 1]"),
    ],
)
def test_bad_parameters_raise(kwargs, needle):
    (name, value), = kwargs.items()
    for make in (lambda: probs_after(torch.zeros(5), **kwargs), lambda: Sampler(**kwargs)):
        with pytest.raises(ValueError) as err:
            make()
        msg = str(err.value)
        assert name in msg and needle in msg and repr(value) in msg
    with pytest.raises(ValueError, match=name):
        sample(torch.zeros(5), **kwargs)


@pytest.mark.parametrize(
    "logits,needle",
    [
        (torch.tensor([0.0, math.nan]), "NaN"),
        (torch.tensor([0.0, math.inf]), "+inf"),
        (torch.tensor([1, 2]), "floating-point"),
        (torch.zeros(0), "non-empty"),
    ],
)
@pytest.mark.parametrize(
    "fn",
    [greedy, sample, probs_after, surgery, lambda x: apply_temperature(x, 1.0), lambda x: top_k_filter(x, 1),
     lambda x: top_p_filter(x, 0.5), lambda x: min_p_filter(x, 0.1)],
)
def test_bad_logits_raise(fn, logits, needle):
    with pytest.raises(ValueError, match="logits") as err:
        fn(logits)
    assert needle in str(err.value)


def test_temperature_zero_rejected_where_there_is_no_distribution():
    for call in (lambda: apply_temperature(torch.zeros(3), 0), lambda: surgery(torch.zeros(3), temperature=0)):
        with pytest.raises(ValueError, match="greedy"):
            call()


NAMES = ["logits", "scaled", "softmax", "top_k", "top_p"]


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("top_k,top_p", [(None, None), (10, None), (None, 0.8), (5, 0.7), (1, 0.1), (100, 1.0)])
def test_surgery(seed, top_k, top_p):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(60, generator=g) * 3
    if seed % 4 == 0:
        x[:5] = 1.0  # ties
    t = 0.3 + 2 * float(torch.rand((), generator=g))
    steps = surgery(x, temperature=t, top_k=top_k, top_p=top_p)

    assert [s.name for s in steps] == NAMES
    logits, scaled, soft, cut_k, cut_p = steps
    assert torch.equal(logits.logits, x) and torch.equal(scaled.logits, x / t) and torch.equal(soft.logits, x / t)
    for s in steps:
        assert s.probs.sum().item() == pytest.approx(1, abs=1e-5)
        assert s.kept == int(s.logits.isfinite().sum())
        assert torch.equal(s.probs, s.logits.softmax(-1))
        nonzero = s.probs[s.probs > 0]
        assert s.entropy == pytest.approx(float(-(nonzero * nonzero.log()).sum()), abs=1e-5)

    masses = [s.removed_mass for s in steps]
    assert masses[:3] == [0.0, 0.0, 0.0]
    assert masses == sorted(masses)
    base = (x / t).softmax(-1)
    assert masses[-1] == pytest.approx(1 - float(base[cut_p.logits.isfinite()].sum()), abs=1e-5)

    k_expected = 60 if top_k is None else int((x / t >= (x / t).topk(min(top_k, 60)).values[-1]).sum())
    assert cut_k.kept == k_expected
    assert cut_p.kept == int(top_p_filter(cut_k.logits, top_p or 1.0).isfinite().sum())
    # Cutting the least likely tokens and renormalizing never raises entropy.
    assert cut_k.entropy <= soft.entropy + 1e-5 and cut_p.entropy <= cut_k.entropy + 1e-5
    assert torch.equal(cut_p.probs, probs_after(x, t, top_k=top_k, top_p=top_p))


def test_tiny_temperature_that_overflows_names_greedy():
    with pytest.raises(ValueError, match="temperature=0"):
        sample(torch.tensor([1.0, 2.0, 3.0]), temperature=1e-300, generator=torch.Generator().manual_seed(0))


# ---------------------------------------------------------------- measurements on a distribution

def test_entropy_equals_torch_categorical():
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(0)) * 3
    for t in (0.5, 1.0, 2.0):
        ref = float(torch.distributions.Categorical(logits=logits.double() / t).entropy())
        assert entropy(probs_after(logits, t)) == pytest.approx(ref, rel=1e-6)
    assert entropy(torch.tensor([1.0, 0.0, 0.0])) == pytest.approx(0.0, abs=1e-9)          # one sure token
    assert entropy(torch.full((8,), 1 / 8)) == pytest.approx(torch.log(torch.tensor(8.0)).item())


def test_rank_of_equals_a_sort_by_hand():
    probs = torch.tensor([0.1, 0.4, 0.05, 0.3, 0.15])
    order = sorted(range(5), key=lambda i: -float(probs[i]))            # [1, 3, 4, 0, 2]
    assert [int(rank_of(probs, i)) for i in range(5)] == [order.index(i) + 1 for i in range(5)]
    rows = torch.stack([probs, probs.flip(0)])                          # one rank per row
    assert rank_of(rows, 1).tolist() == [1, 2]
    assert int(rank_of(torch.tensor([0.3, 0.3, 0.4]), 1)) == 2          # a tie shares the better rank


def test_kept_counts_the_tokens_left_after_each_cut():
    logits = torch.log(torch.tensor([0.5, 0.25, 0.15, 0.1]))
    assert kept(logits) == 4
    assert kept(logits, top_k=2) == 2
    assert kept(logits, top_p=0.7) == 2                          # 0.5 + 0.25 reaches 0.7
    assert kept(logits, min_p=0.25) == 3                         # ≥ 0.25 × 0.5
