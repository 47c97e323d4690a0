"""The oracle cache's own logic (tests/oracle.py), on a tiny random Llama and a tiny tokenizer, with a fake converter
in place of the minutes-long GGUF conversion: when it converts, when it must not, how concurrent callers share one
conversion, and that a copy that does not reload identically never becomes the oracle."""
import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

import oracle


def tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                        hidden_size=16, intermediate_size=32, vocab_size=64,
                                        max_position_embeddings=64, tie_word_embeddings=True)).eval()


def tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tok.train_from_iterator(oracle.CHECK_TEXTS * 3, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


class Converter:
    """A stand-in for the GGUF conversion that counts its calls."""

    def __init__(self, make=tiny_llama):
        self.make, self.calls = make, 0

    def __call__(self, gguf):
        self.calls += 1
        return self.make()


def fake_model_kind(convert) -> oracle.Kind:
    return oracle.Kind(convert, oracle.save_model, oracle.load_model, oracle.same_model)


def never(gguf):
    raise AssertionError("the converter ran although the cache matches")


def same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.fixture
def source(tmp_path, monkeypatch):
    """A stand-in GGUF file (the cache keys on its content, sha256 and size) and a private cache."""
    monkeypatch.setenv("LLMWALK_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + bytes(60))
    return path


def test_cache_lives_under_llmwalks_cache_dir(source, tmp_path):
    assert oracle.root() == tmp_path / "cache" / "oracle"


def test_first_use_converts_saves_and_a_matching_key_never_converts_again(source):
    convert = Converter()
    first = oracle.cached("tiny", source, fake_model_kind(convert))
    assert convert.calls == 1 and same_weights(first, tiny_llama())
    out = oracle.root() / "tiny"
    key = json.loads((out / oracle.KEY).read_text())
    assert key["size"] == source.stat().st_size and key["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
    assert key["transformers"] == oracle.transformers_version() and "model.safetensors" in key["files"]
    again = oracle.cached("tiny", source, fake_model_kind(never))
    assert same_weights(again, first)
    assert first.lm_head.weight.data_ptr() == first.model.embed_tokens.weight.data_ptr()     # still tied
    assert again.lm_head.weight.data_ptr() == again.model.embed_tokens.weight.data_ptr()
    assert sorted(p.name for p in oracle.root().iterdir()) == ["tiny", "tiny.lock"]           # no staging left


def test_the_same_file_elsewhere_or_touched_shares_the_conversion(source, tmp_path):
    """Each checkout has its own copy of SmolLM2's GGUF (inside its .venv): the same bytes, converted once."""
    oracle.cached("tiny", source, fake_model_kind(Converter()))
    copy = tmp_path / "other-checkout" / "model.gguf"
    copy.parent.mkdir()
    copy.write_bytes(source.read_bytes())
    st = source.stat()
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert same_weights(oracle.cached("tiny", copy, fake_model_kind(never)), tiny_llama())


@pytest.mark.parametrize("change", ["content", "size", "transformers"])
def test_a_key_mismatch_converts_again(source, monkeypatch, change):
    convert = Converter()
    oracle.cached("tiny", source, fake_model_kind(convert))
    if change == "content":                                           # same size, other bytes
        source.write_bytes(b"GGUF" + bytes(59) + b"x")
    elif change == "size":
        source.write_bytes(source.read_bytes() + b"x")
    else:
        monkeypatch.setattr(oracle, "transformers_version", lambda: "0.0.0")
    convert.make = lambda: tiny_llama(seed=1)                         # a new conversion: other weights
    with pytest.warns(UserWarning, match="stale.*converting again"):
        got = oracle.cached("tiny", source, fake_model_kind(convert))
    assert convert.calls == 2 and same_weights(got, tiny_llama(seed=1))
    assert same_weights(oracle.cached("tiny", source, fake_model_kind(never)), got)     # the new key is kept


def test_a_damaged_save_converts_again(source):
    convert = Converter()
    oracle.cached("tiny", source, fake_model_kind(convert))
    weights = oracle.root() / "tiny" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.warns(UserWarning, match="damaged.*converting again"):
        got = oracle.cached("tiny", source, fake_model_kind(convert))
    assert convert.calls == 2 and same_weights(got, tiny_llama())


def test_a_copy_that_reloads_differently_never_becomes_the_oracle(source):
    def load_wrong(directory):
        model = oracle.load_model(directory)
        with torch.no_grad():
            model.model.norm.weight[0] += 1e-3
        return model
    kind = oracle.Kind(Converter(), oracle.save_model, load_wrong, oracle.same_model)
    with pytest.warns(UserWarning, match="not caching the oracle tiny: tensor model.norm.weight differs"):
        got = oracle.cached("tiny", source, kind)
    assert same_weights(got, tiny_llama())                            # the conversion itself is used...
    assert sorted(p.name for p in oracle.root().iterdir()) == ["tiny.lock"]   # ...and nothing was kept


def test_a_model_transformers_left_quantized_is_not_cached(source):
    model = tiny_llama().to(torch.float16)
    with pytest.raises(oracle.BadSave, match="not a plain de-quantized model"):
        oracle.save_model(model, source.parent)


def test_the_tokenizer_is_cached_and_reloads_to_the_same_ids(source):
    convert = Converter(tiny_tokenizer)
    kind = oracle.Kind(convert, oracle.save_tokenizer, oracle.load_tokenizer, oracle.same_tokenizer)
    first = oracle.cached("tok", source, kind)
    again = oracle.cached("tok", source, dataclasses.replace(kind, convert=never))
    assert convert.calls == 1
    for text in oracle.CHECK_TEXTS:
        assert again.encode(text) == first.encode(text) == tiny_tokenizer().encode(text)
    assert again.decode(again.encode("法国的首都是什么")) == "法国的首都是什么"


def test_a_tokenizer_that_reloads_differently_is_refused():
    other = tiny_tokenizer()
    other.add_tokens(["首都"])
    with pytest.raises(oracle.BadSave, match="ids"):
        oracle.same_tokenizer(tiny_tokenizer(), other)


def test_a_concurrent_second_caller_waits_and_gets_the_same_result(source):
    """Thread A converts (slowly); B starts meanwhile, waits on the lock, then loads what A saved."""
    started, release = threading.Event(), threading.Event()
    results, b_calls = {}, []

    def slow(gguf):
        started.set()
        assert release.wait(30)
        return tiny_llama(seed=7)

    def b_convert(gguf):
        b_calls.append(1)
        return tiny_llama(seed=8)

    a = threading.Thread(target=lambda: results.update(a=oracle.cached("tiny", source, fake_model_kind(slow))))
    b = threading.Thread(target=lambda: results.update(b=oracle.cached("tiny", source, fake_model_kind(b_convert))))
    a.start()
    assert started.wait(30)
    b.start()
    time.sleep(0.5)
    assert b.is_alive() and "b" not in results                        # B is waiting for A's lock
    release.set()
    a.join(30), b.join(30)
    assert not b_calls and same_weights(results["a"], results["b"]) and same_weights(results["b"], tiny_llama(7))


CHILD = """
import hashlib, sys, torch
sys.path.insert(0, sys.argv[1])
import oracle, test_oracle_cache as t
calls = []
kind = t.fake_model_kind(lambda gguf: calls.append(1) or t.tiny_llama(seed=8))
print("calling", flush=True)
model = oracle.cached("tiny", __import__("pathlib").Path(sys.argv[2]), kind)
print(len(calls), t.same_weights(model, t.tiny_llama(seed=7)), flush=True)
"""


def test_a_second_process_waits_for_the_first_and_loads_its_conversion(source):
    """As two pytest-xdist workers: the child process arrives while this one converts, and does not convert."""
    started, release, results = threading.Event(), threading.Event(), {}

    def slow(gguf):
        started.set()
        assert release.wait(120)
        return tiny_llama(seed=7)

    a = threading.Thread(target=lambda: results.update(a=oracle.cached("tiny", source, fake_model_kind(slow))))
    a.start()
    assert started.wait(30)
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(Path(__file__).parent), str(source)],
                             stdout=subprocess.PIPE, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        assert child.stdout.readline().strip() == "calling"
        time.sleep(1.0)                                               # the child is now waiting for the lock
        assert child.poll() is None
        release.set()
        a.join(60)
        out, _ = child.communicate(timeout=120)
    finally:
        release.set()
        if child.poll() is None:
            child.kill()
    assert out.split() == ["0", "True"], out                         # it did not convert; it got A's weights
    assert same_weights(results["a"], tiny_llama(seed=7))
