"""The autoregressive loop on the real SmolLM2: cache vs recomputation, transformers' generate, seeds, EOS, errors."""
import importlib
import time

import pytest
import torch

import llmwalk as lw
from llmwalk.generate import Generation, decoding_head, generate, generate_stream
from llmwalk.kv_cache import kv_cache_bytes

gen_module = importlib.import_module("llmwalk.generate")   # lw.generate is the function of the same name

# (text, chat): the article's question through the chat template, and plain English continuations.
PROMPTS = [("法国的首都是什么", True), ("The history of the printing press", False),
           ("Once upon a time, in a small village by the sea,", False)]
N = 32


pytestmark = pytest.mark.usefixtures("one_thread")   # see conftest.py


@pytest.fixture(scope="module")
def greedy_runs(smollm2) -> dict[str, tuple[Generation, Generation]]:
    """(with cache, without cache) greedy generations of N tokens per prompt, EOS not stopping them."""
    return {text: tuple(generate(smollm2, text, N, chat=chat, stop_at_eos=False, kv_cache=kv) for kv in (True, False))
            for text, chat in PROMPTS}


def hf_greedy(hf, ids: list[int], n: int) -> list[int]:
    """transformers' greedy generate: new ids, stopping after EOS like ours."""
    x = torch.tensor([ids])
    with torch.no_grad():
        out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=False,
                          pad_token_id=hf.config.eos_token_id)
    return out[0, len(ids):].tolist()


# ---------------------------------------------------------------- greedy

@pytest.mark.parametrize("text", [p for p, _ in PROMPTS])
def test_greedy_with_cache_equals_without(greedy_runs, text):
    cached, recomputed = greedy_runs[text]
    assert len(cached.new_ids) == N
    assert cached.new_ids == recomputed.new_ids
    assert cached.prompt_ids == recomputed.prompt_ids


@pytest.mark.parametrize("text, chat", PROMPTS + [("What is the capital of France?", True)])
def test_greedy_equals_transformers_generate(smollm2, hf_smollm2, text, chat):
    ours = generate(smollm2, text, N, chat=chat)
    assert ours.new_ids == hf_greedy(hf_smollm2, ours.prompt_ids, N)


def test_decoding_head_same_tokens_and_weights_untouched(smollm2, greedy_runs):
    head = decoding_head(smollm2)
    assert torch.equal(head, smollm2.weights.output) and head.stride() == (1, smollm2.config.vocab_size)
    assert smollm2.weights.output is smollm2.weights.token_embd and smollm2.weights.output.is_contiguous()
    text, chat = PROMPTS[1]
    assert generate(smollm2, text, N, chat=chat, stop_at_eos=False, head=head).new_ids == greedy_runs[text][0].new_ids


def test_greedy_steps_describe_the_choice(smollm2, greedy_runs):
    g = greedy_runs[PROMPTS[0][0]][0]
    tok = smollm2.tokenizer
    assert g.ids == g.prompt_ids + g.new_ids
    assert [s.token_id for s in g.steps] == g.new_ids and [s.index for s in g.steps] == list(range(1, N + 1))
    assert [s.token for s in g.steps] == tok.pieces(g.new_ids)
    assert any("\\x" in s.token for s in g.steps)        # Chinese characters split across tokens show their bytes
    assert g.text == tok.decode(g.new_ids) and g.stopped == "max_new_tokens"
    for s in g.steps:
        assert s.prob == 1.0                             # greedy: the one-hot distribution it was drawn from
        assert len(s.top) == 5 and s.top[0][0] == s.token_id and s.top[0][1] == s.token
        probs = [p for _, _, p in s.top]
        assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1 + 1e-6
    assert g.time_to_first_token > 0 and g.tokens_per_second > 0


# ---------------------------------------------------------------- sampling

def test_same_seed_same_tokens_with_and_without_cache(smollm2):
    kw = dict(max_new_tokens=24, temperature=0.8, top_p=0.95, seed=1234, stop_at_eos=False)
    cached = generate(smollm2, "Once upon a time", **kw)
    assert cached.new_ids == generate(smollm2, "Once upon a time", kv_cache=False, **kw).new_ids
    assert cached.new_ids == generate(smollm2, "Once upon a time", **kw).new_ids
    again = generate(smollm2, "Once upon a time", generator=torch.Generator().manual_seed(1234),
                     **{k: v for k, v in kw.items() if k != "seed"})
    assert again.new_ids == cached.new_ids
    assert all(0 < s.prob <= 1 for s in cached.steps)


def test_different_seeds_differ(smollm2):
    a, b = (generate(smollm2, "Once upon a time", 16, temperature=1.0, seed=s, stop_at_eos=False) for s in (1, 2))
    assert a.new_ids != b.new_ids


def test_top_k_1_equals_greedy(smollm2, greedy_runs):
    text, chat = PROMPTS[1]
    g = generate(smollm2, text, N, temperature=1.0, top_k=1, seed=0, chat=chat, stop_at_eos=False)
    assert g.new_ids == greedy_runs[text][0].new_ids
    assert all(s.prob == 1.0 for s in g.steps)


# ---------------------------------------------------------------- the KV cache

def test_cache_after_generation(smollm2, greedy_runs):
    g = greedy_runs[PROMPTS[1][0]][0]
    cache = g.cache
    # The last token is chosen but never fed back, so its keys and values are not in the cache.
    assert cache.length == len(g.prompt_ids) + N - 1
    assert cache.nbytes() == kv_cache_bytes(smollm2.config, cache.length)
    fresh = lw.forward(smollm2, g.ids[:cache.length]).layers[0].attn
    torch.testing.assert_close(cache.layers[0].keys[:, :cache.length], fresh.k)
    torch.testing.assert_close(cache.layers[0].values[:, :cache.length], fresh.v)
    assert greedy_runs[PROMPTS[1][0]][1].cache is None


def test_input_len_whole_prefix_without_cache_one_with(greedy_runs):
    cached, recomputed = greedy_runs[PROMPTS[1][0]]
    p = len(cached.prompt_ids)
    assert [s.input_len for s in recomputed.steps] == [p + i for i in range(N)]
    assert [s.input_len for s in cached.steps] == [p] + [1] * (N - 1)
    assert [s.context_len for s in cached.steps] == [s.context_len for s in recomputed.steps]
    assert [s.context_len for s in cached.steps] == [p + i for i in range(N)]


# ---------------------------------------------------------------- stopping and streaming

def test_stops_at_eos(smollm2):
    g = generate(smollm2, "What is the capital of France?", 64, chat=True)
    assert g.stopped == "eos" and len(g.new_ids) < 64
    assert g.new_ids[-1] in smollm2.tokenizer.eos_token_ids and g.steps[-1].token == "<|im_end|>"
    assert "Paris" in g.text and "<|im_end|>" not in g.text
    assert g.text == smollm2.tokenizer.decode(g.new_ids[:-1])


@pytest.mark.parametrize("kv_cache", [True, False])
def test_stream_yields_the_steps_of_generate(smollm2, kv_cache):
    kw = dict(max_new_tokens=6, temperature=0.7, seed=3, kv_cache=kv_cache, stop_at_eos=False)
    streamed = list(generate_stream(smollm2, "The capital of France is", **kw))
    assert streamed == generate(smollm2, "The capital of France is", **kw).steps
    assert len(streamed) == 6


# ---------------------------------------------------------------- errors, raised before any forward pass

@pytest.fixture
def no_forward(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("forward ran before the arguments were checked")
    monkeypatch.setattr(gen_module, "forward", forbidden)


@pytest.mark.parametrize("fn", [generate, generate_stream])
def test_too_long_is_refused_before_any_work(smollm2, no_forward, fn):
    ids = [42] * (smollm2.config.context_length - 3)
    tic = time.perf_counter()
    with pytest.raises(ValueError, match=r"8189 tokens \+ max_new_tokens=10 .* 8192.*max_new_tokens <= 3"):
        fn(smollm2, ids, max_new_tokens=10)
    assert time.perf_counter() - tic < 1


@pytest.mark.parametrize("kwargs, match", [
    (dict(temperature=0.7), "seed="),
    (dict(temperature=0.7, top_p=1.5, seed=0), "top_p"),
    (dict(top_k=0), "top_k"),
    (dict(temperature=-1.0), "temperature"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(temperature=0.7, seed=0, generator=torch.Generator()), "not both"),
])
def test_bad_arguments(smollm2, no_forward, kwargs, match):
    with pytest.raises(ValueError, match=match):
        generate_stream(smollm2, "Hello", **kwargs)      # raised at the call, not at the first next()


@pytest.mark.parametrize("prompt", ["", [], torch.tensor([], dtype=torch.long)])
def test_empty_prompt(smollm2, no_forward, prompt):
    with pytest.raises(ValueError, match="empty"):
        generate(smollm2, prompt)
