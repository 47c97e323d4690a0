"""The autoregressive loop on the real SmolLM2: cache vs recomputation, transformers' generate, seeds, EOS, dtypes,
the KV cache's own checks, and bad input."""
import copy
import math
import dataclasses

import pytest
import torch

import llmwalk as lw
import llmwalk.generation as gen_module
from llmwalk.generation import Generation, cut_at_eos, decoding_head, generate, generate_stream
from llmwalk.kv_cache import KVCache, kv_cache_bytes
from llmwalk.accuracy import eval_text
from llmwalk.sampling import Sampler
from markers import needs_gemma

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


@pytest.mark.parametrize("text", [p for p, _ in PROMPTS])
def test_greedy_equals_transformers_generate(smollm2, hf_smollm2, greedy_runs, text):
    ours = greedy_runs[text][0]                  # the run above: one generation per prompt, not two
    theirs = hf_greedy(hf_smollm2, ours.prompt_ids, N)
    # transformers stops after an EOS; ours, run with stop_at_eos=False, went on: the same tokens up to there
    assert theirs == ours.new_ids[:len(theirs)] and (len(theirs) == N or theirs[-1] in smollm2.eos_ids)



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


# ---------------------------------------------------------------- sampling

def test_time_to_first_token_and_decode_speed_from_the_rounds(greedy_runs):
    """Round 1 (the whole prompt) is the time to first token; the rounds after it give the decode speed."""
    g = next(iter(greedy_runs.values()))[0]
    timed = dataclasses.replace(g, steps=[dataclasses.replace(s, seconds=0.5 if s.index == 1 else 0.25)
                                          for s in g.steps])
    assert timed.time_to_first_token == 0.5
    assert timed.tokens_per_second == 4.0                          # one token per 0.25 s, the 0.5 s round left out
    assert math.isnan(dataclasses.replace(timed, steps=timed.steps[:1]).tokens_per_second)


def test_same_seed_same_tokens_with_and_without_cache(smollm2):
    kw = dict(max_new_tokens=16, temperature=0.8, top_p=0.95, seed=1234, stop_at_eos=False)
    cached = generate(smollm2, "Once upon a time", **kw)
    assert cached.new_ids == generate(smollm2, "Once upon a time", kv_cache=False, **kw).new_ids
    again = generate(smollm2, "Once upon a time", generator=torch.Generator().manual_seed(1234),
                     **{k: v for k, v in kw.items() if k != "seed"})
    assert again.new_ids == cached.new_ids
    assert all(0 < s.prob <= 1 for s in cached.steps)


def test_different_seeds_differ(smollm2):
    a, b = (generate(smollm2, "Once upon a time", 16, temperature=1.0, seed=s, stop_at_eos=False) for s in (1, 2))
    assert a.new_ids != b.new_ids


def test_each_token_is_filtered_once(smollm2, monkeypatch):
    calls = []
    real = Sampler.filter
    monkeypatch.setattr(Sampler, "filter", lambda self, logits: calls.append(1) or real(self, logits))
    g = generate(smollm2, "Once upon a time", 6, temperature=0.8, top_k=40, seed=0, stop_at_eos=False)
    assert len(calls) == len(g.steps) == 6


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

def test_eos_ids_join_the_config_and_the_tokenizer(smollm2):
    assert smollm2.eos_ids == set(smollm2.config.eos_token_ids) | set(smollm2.tokenizer.eos_token_ids)
    assert smollm2.tokenizer.encode("<|im_end|>") == [2] and 2 in smollm2.eos_ids


def test_cut_at_eos(smollm2):
    tok = smollm2.tokenizer
    ids = tok.encode(" Paris.") + [2] + tok.encode(" More")
    assert cut_at_eos(smollm2, ids, frozenset({2})) == (ids[:-len(tok.encode(" More"))], " Paris.", "eos")
    assert cut_at_eos(smollm2, ids, frozenset()) == (ids, tok.decode(ids), "max_new_tokens")


def test_stops_at_eos_as_transformers_does(smollm2, hf_smollm2):
    g = generate(smollm2, "What is the capital of France?", 64, chat=True)
    assert g.stopped == "eos" and len(g.new_ids) < 64
    assert g.new_ids == hf_greedy(hf_smollm2, g.prompt_ids, 64)
    assert g.new_ids[-1] in smollm2.eos_ids and g.steps[-1].token == "<|im_end|>"
    assert "Paris" in g.text and "<|im_end|>" not in g.text
    assert g.text == smollm2.tokenizer.decode(g.new_ids[:-1])


@pytest.mark.parametrize("kv_cache", [True, False])
def test_stream_runs_one_round_per_step_and_matches_transformers(smollm2, hf_smollm2, kv_cache):
    passes = []
    with gen_module.watching(passes.append):
        stream = generate_stream(smollm2, "The capital of France is", 6, kv_cache=kv_cache, stop_at_eos=False)
        assert passes == []                              # checked and encoded, nothing run yet
        steps = []
        for step in stream:
            steps.append(step)
            assert len(passes) == len(steps)             # each Step arrives as soon as its round is done
    prompt = smollm2.tokenizer.encode("The capital of France is")
    assert [s.token_id for s in steps] == hf_greedy(hf_smollm2, prompt, 6)
    # what each pass ran on, by hand: the whole prefix every round, or the prompt then the last token
    fed = [prompt + [s.token_id for s in steps[:k]] for k in range(6)]
    assert [list(p.ids) for p in passes] == (fed if not kv_cache else [prompt] + [f[-1:] for f in fed[1:]])
    assert {p.layers for p in passes} == {smollm2.config.n_layer}


def test_a_layer_that_adds_nothing_is_not_counted_as_run(smollm2):
    """Pass.layers counts the layers that changed the residual stream: zero what layer 4 adds (its attention
    output and FFN down projections), and every pass reports one layer fewer."""
    def silent(lin):
        return dataclasses.replace(lin, weight=torch.zeros_like(lin.weight))
    blocks = list(smollm2.weights.blocks)
    blocks[4] = dataclasses.replace(blocks[4], attn_output=silent(blocks[4].attn_output),
                                    ffn_down=silent(blocks[4].ffn_down))
    model = dataclasses.replace(smollm2, weights=dataclasses.replace(smollm2.weights, blocks=tuple(blocks)))
    passes = []
    with gen_module.watching(passes.append):
        generate(model, "The capital of France is", 3, stop_at_eos=False)
    assert [p.layers for p in passes] == [smollm2.config.n_layer - 1] * 3


def test_watching_ends_with_its_block_and_nests(smollm2):
    outer, inner = [], []
    with gen_module.watching(outer.append):
        with gen_module.watching(inner.append):
            generate(smollm2, "Hello", 2, stop_at_eos=False)
        generate(smollm2, "Hello", 1)
    generate(smollm2, "Hello", 1)
    assert (len(outer), len(inner)) == (3, 2)


def hf_last_layer_hook(hf, add: torch.Tensor):
    """transformers' last decoder layer with `add` added to its output (a steering vector), as a torch hook."""
    def hook(module, args, out):
        return (out[0] + add,) + tuple(out[1:]) if isinstance(out, tuple) else out + add
    return hf.model.layers[-1].register_forward_hook(hook)


@pytest.mark.parametrize("kv_cache", [True, False])
def test_hooks_steer_every_round_as_a_torch_hook_on_transformers(smollm2, hf_smollm2, kv_cache):
    """A steering vector added after the last layer on every pass: the tokens transformers writes with the same
    vector added by a forward hook on its last decoder layer (and not the unsteered tokens)."""
    last = smollm2.config.n_layer - 1
    add = 8 * smollm2.weights.token_embd[smollm2.tokenizer.token_id(" Paris")]      # [d_model]
    text = "My favourite thing to do on a Sunday is"
    steered = generate(smollm2, text, 8, stop_at_eos=False, kv_cache=kv_cache,
                       hooks={f"blocks.{last}.resid_post": lambda x: x + add})
    handle = hf_last_layer_hook(hf_smollm2, add)
    try:
        theirs = hf_greedy(hf_smollm2, steered.prompt_ids, 8)
    finally:
        handle.remove()
    assert steered.new_ids == theirs
    assert steered.new_ids != generate(smollm2, text, 8, stop_at_eos=False).new_ids


def hf_sampled(hf, ids: list[int], n: int, seed: int, temperature: float) -> list[int]:
    """transformers' sampling (temperature alone: its default top_k=50 switched off) from torch's global generator
    seeded with `seed`: the same random stream as our torch.Generator().manual_seed(seed)."""
    x = torch.tensor([ids])
    torch.manual_seed(seed)
    with torch.no_grad():
        out = hf.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=n, do_sample=True,
                          temperature=temperature, top_k=0, top_p=1.0, pad_token_id=hf.config.eos_token_id)
    return out[0, len(ids):].tolist()


def test_seeded_sampling_draws_what_transformers_draws(smollm2, hf_smollm2):
    ours = generate(smollm2, "Once upon a time", 12, temperature=0.8, seed=5, stop_at_eos=False)
    assert ours.new_ids == hf_sampled(hf_smollm2, ours.prompt_ids, 12, 5, 0.8)


@pytest.mark.parametrize("temperature, seed", [(0.0, 0), (0.8, 3)])
def test_generation_widget_clicks_write_what_transformers_writes(smollm2, hf_smollm2, temperature, seed):
    """The step-through widget's clicks are rounds of the loop: greedy as transformers' greedy generate, sampled
    as transformers' sampling from the same seed; the bars show the next round's logits, as the model computes them."""
    from llmwalk import viz
    w = viz.generation_widget(smollm2, "Once upon a time", temperature=temperature, seed=seed, n=5)
    for _ in range(4):
        w.next()
    reference = hf_greedy(hf_smollm2, w.prompt_ids, 4) if temperature == 0 else \
        hf_sampled(hf_smollm2, w.prompt_ids, 4, seed, temperature)
    assert w.ids[len(w.prompt_ids):] == reference
    assert [s.input_len for s in w.steps] == [len(w.prompt_ids), 1, 1, 1]    # the prompt, then the cache serves
    with torch.no_grad():
        theirs = hf_smollm2(torch.tensor([w.ids])).logits[0, -1]
    torch.testing.assert_close(w.logits, theirs, atol=1e-3, rtol=1e-3)
    first = w.ids
    w.reset()                                   # the drawn tokens' keys and values are forgotten: the same answer again
    for _ in range(4):
        w.next()
    assert w.ids == first
    torch.testing.assert_close(w.logits, theirs, atol=1e-3, rtol=1e-3)


def test_generation_widget_stops_when_its_cache_is_full(smollm2, monkeypatch):
    from llmwalk import viz
    monkeypatch.setattr(viz.widgets.GenerationWidget, "MAX_CLICKS", 2)
    w = viz.generation_widget(smollm2, "Once upon a time", temperature=0.0, n=5)
    for _ in range(3):
        w.next()
    assert len(w.steps) == 2 and w.controls["next"].disabled


# ---------------------------------------------------------------- errors, raised before any forward pass

@pytest.fixture
def no_forward(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("forward ran before the arguments were checked")
    monkeypatch.setattr(gen_module, "forward", forbidden)


@pytest.mark.parametrize("fn", [generate, generate_stream])
def test_too_long_is_refused_before_any_work(smollm2, no_forward, fn):
    ids = [42] * (smollm2.config.context_length - 3)
    with pytest.raises(ValueError, match=r"8189 tokens \+ max_new_tokens=10 .* 8192.*max_new_tokens <= 3"):
        fn(smollm2, ids, max_new_tokens=10)


def test_max_new_tokens_past_the_context_names_the_limit(smollm2, no_forward):
    with pytest.raises(ValueError) as err:
        generate(smollm2, "Hello", 10**6)
    msg = str(err.value)
    n = len(smollm2.tokenizer.encode("Hello"))
    assert f"set max_new_tokens <= {8192 - n}" in msg and "shorten" not in msg and "-" not in msg.split(":")[-1]


@pytest.mark.parametrize("kwargs, match", [
    (dict(temperature=0.7), "seed="),
    (dict(temperature=0.7, top_p=1.5, seed=0), "top_p"),
    (dict(top_k=0), "top_k"),
    (dict(temperature=-1.0), "temperature"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(temperature=0.7, seed=0, generator=torch.Generator()), "not both"),
    (dict(seed=2**70), r"seed must be in \[0, 2\*\*64\), got 1180591620717411303424: e.g. seed=0"),
])
def test_bad_arguments(smollm2, no_forward, kwargs, match):
    with pytest.raises(ValueError, match=match):
        generate_stream(smollm2, "Hello", **kwargs)      # raised at the call, not at the first next()


@pytest.mark.parametrize("prompt, kwargs, error, match", [
    ([1.7, 2.2], {}, TypeError, r"token ids must be integers, got torch.float32 values such as 1.7.*\.long\(\)"),
    ([[1, 2], [3, 4]], {}, ValueError, r"one sequence \[T\], got shape \(2, 2\).*ids\[0\]"),
    (b"Hello", {}, TypeError, r"got bytes: decode them first, e.g. prompt.decode\('utf-8'\)"),
    (None, {}, TypeError, "got None: pass the text"),
    ("Hello", dict(seed=1.5), TypeError, "seed must be an int, got 1.5: e.g. seed=0"),
    ("Hello", dict(temperature=0.7, generator=0), TypeError, "generator must be a torch.Generator"),
    ([1, 2], dict(chat=True), ValueError, "pass the prompt as a string"),
])
def test_bad_input_names_the_fix(smollm2, no_forward, prompt, kwargs, error, match):
    with pytest.raises(error, match=match):
        generate(smollm2, prompt, **kwargs)


def test_arguments_past_max_new_tokens_are_keyword_only(smollm2, no_forward):
    with pytest.raises(TypeError, match="positional"):
        generate(smollm2, "Hello", 5, 0.7)


@pytest.mark.parametrize("prompt", ["", [], torch.tensor([], dtype=torch.long)])
def test_empty_prompt(smollm2, no_forward, prompt):
    with pytest.raises(ValueError, match="empty"):
        generate(smollm2, prompt)


# ---------------------------------------------------------------- the KV cache's own checks

def test_a_full_cache_says_so(smollm2):
    cache = KVCache.empty(smollm2.config, 4)
    lw.forward(smollm2, [1, 2, 3], cache, record=False)
    with pytest.raises(ValueError, match="KV cache is full: capacity 4 positions, asked for 5"):
        lw.forward(smollm2, [4, 5], cache, record=False)


def test_truncate_then_continue_equals_no_cache(smollm2):
    ids = smollm2.tokenizer.encode("The cat sat on the mat by the door.")
    cache = KVCache.empty(smollm2.config, 16)
    lw.forward(smollm2, ids[:5], cache, record=False)
    lw.forward(smollm2, [42, 43, 44], cache, record=False)      # tokens to forget (rejected drafts)
    cache.truncate(5)
    assert cache.length == 5 and all(layer.length == 5 for layer in cache.layers)
    resumed = lw.forward(smollm2, ids[5:], cache, record=False).logits
    torch.testing.assert_close(resumed, lw.forward(smollm2, ids, record=False).logits[5:], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("n", [-1, 99, 1.5, True])
def test_truncate_refuses_what_it_cannot_keep(smollm2, n):
    cache = KVCache.empty(smollm2.config, 8)
    lw.forward(smollm2, [1, 2, 3], cache, record=False)
    with pytest.raises(ValueError, match=r"cannot truncate a cache of 3 positions .* keep an int in \[0, 3\]"):
        cache.truncate(n)
    assert cache.length == 3


@needs_gemma
def test_gemma_decodes_past_its_sliding_window_with_the_cache_as_transformers(gemma, hf_gemma):
    """Gemma-3's local layers see only the last `window` positions: a prompt that ends just before the window
    (512) and tokens generated across it, with the cache, are transformers' greedy tokens."""
    window = min(w for w in (gemma.config.window(i) for i in range(gemma.config.n_layer)) if w is not None)
    ids = gemma.tokenizer.encode(eval_text())[:window - 4]
    ours = generate(gemma, ids, 10, stop_at_eos=False)
    assert len(ours.ids) > window + 4 and ours.cache.length > window    # decoded well past the window
    assert ours.new_ids == hf_greedy(hf_gemma, ids, 10)


# ---------------------------------------------------------------- every dtype

@pytest.fixture(scope="module")
def low_precision(smollm2) -> dict[torch.dtype, lw.Model]:
    return {dt: dataclasses.replace(smollm2, weights=lw.to_dtype(smollm2.weights, dt))
            for dt in (torch.bfloat16, torch.float16)}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("text", ["The capital of France is", "The history of the printing press"])
def test_low_precision_greedy_same_with_and_without_cache(low_precision, dtype, text):
    """With and without the cache the arithmetic differs (one new row vs the whole sequence), and bf16/fp16 keep
    2-3 significant digits (bf16: 8 mantissa bits, ~0.1 on a logit of 20 per rounding): the two runs must agree
    token for token until the first near-tie — top two logits within 0.5 — where the other run picks the runner-up."""
    model = low_precision[dtype]
    cached = generate(model, text, 8, stop_at_eos=False)
    rerun = generate(model, text, 8, stop_at_eos=False, kv_cache=False).new_ids
    first = next((i for i, (a, b) in enumerate(zip(cached.new_ids, rerun)) if a != b), None)
    if first is not None:
        (id1, _, p1), (id2, _, p2) = cached.steps[first].top[:2]
        assert first >= 3 and {id1, id2} == {cached.new_ids[first], rerun[first]} and math.log(p1 / p2) < 0.5, \
            f"cache and no cache differ at token {first} without a near-tie: top-2 p {p1:.3f} vs {p2:.3f}"
    c = cached.cache
    assert c.layers[0].keys.dtype == dtype and c.nbytes() == kv_cache_bytes(model.config, c.length, 2)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_matches_transformers_in_the_same_dtype(smollm2, hf_smollm2, low_precision, dtype):
    """Tokens as transformers' model .to(dtype) makes them; logits as far from fp32 as transformers' own."""
    hf = copy.deepcopy(hf_smollm2).to(dtype)
    text = "The capital of France is"
    ours = generate(low_precision[dtype], text, 5)
    assert ours.new_ids == hf_greedy(hf, ours.prompt_ids, 5)
    ids = smollm2.tokenizer.encode("Once upon a time, in a small village by the sea, there lived")
    with torch.no_grad():
        fp32, theirs = (m(torch.tensor([ids])).logits[0].float() for m in (hf_smollm2, hf))
    mine = lw.forward(low_precision[dtype], ids, record=False).logits.float()
    assert (mine - fp32).abs().max() <= 2 * (theirs - fp32).abs().max()


def test_a_cache_serves_one_dtype(smollm2, low_precision):
    cache = KVCache.empty(smollm2.config, 8)
    lw.forward(low_precision[torch.bfloat16], [1, 2], cache, record=False)
    with pytest.raises(ValueError, match="holds torch.bfloat16 keys, got torch.float32: a cache serves one model"):
        lw.forward(smollm2, [3], cache, record=False)


def test_quantized_bf16_model_generates(low_precision):
    q = lw.quantize_model(low_precision[torch.bfloat16], 8)
    text = "The capital of France is"
    assert generate(q, text, 6).new_ids == generate(q, text, 6, kv_cache=False).new_ids
