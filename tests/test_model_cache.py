"""The converted-weights cache: verified on load, rebuilt when damaged, safe with several processes, clear when
unwritable; a user's own GGUF file; a half-assembled Gemma file recovers. Every test uses a temporary LLMWALK_CACHE."""
import os
import shutil
import subprocess
import sys

import pytest
import torch

import llmwalk as lw
from llmwalk import models
from markers import needs_gemma


def converted_dir(cache) -> "os.PathLike":
    (out,) = [p for p in cache.glob("smollm2-135m-*") if p.is_dir()]
    return out


@pytest.fixture
def cache_copy(tmp_path, monkeypatch, smollm2):
    """A copy (mtimes kept) of the shared converted SmolLM2 cache, as LLMWALK_CACHE."""
    out = models.cache_dir() / f"smollm2-135m-{models.REGISTRY['smollm2-135m'].sha256[:12]}-v{models.CONVERTER_VERSION}"
    shutil.copytree(out, tmp_path / out.name)
    monkeypatch.setenv("LLMWALK_CACHE", str(tmp_path))
    return tmp_path / out.name


def no_conversion(*args, **kwargs):
    raise AssertionError("the model was converted again")


def test_intact_cache_is_used_without_converting(cache_copy, smollm2, monkeypatch):
    monkeypatch.setattr(models, "_convert_gguf", no_conversion)
    model = lw.load_model(progress=False)
    assert torch.equal(model.weights.blocks[5].ffn_up.weight, smollm2.weights.blocks[5].ffn_up.weight)


def test_flipped_byte_in_cached_weights_is_rebuilt(cache_copy, smollm2):
    weights = cache_copy / "model.safetensors"
    with open(weights, "r+b") as f:                  # one weight byte, well past the safetensors header
        f.seek(weights.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x10]))
    assert "model.safetensors differs" in models._cache_problem(cache_copy)
    with pytest.warns(UserWarning, match="converting again"):
        again = lw.load_model(progress=False)
    assert models._cache_problem(cache_copy) is None
    for a, b in zip(models.tensors(again.weights), models.tensors(smollm2.weights)):
        assert a[0] == b[0] and torch.equal(a[1], b[1]), a[0]


def test_unreadable_cache_is_rebuilt(cache_copy, smollm2):
    (cache_copy / "model.safetensors").write_bytes(b"garbage")
    with pytest.warns(UserWarning, match="converting again"):
        again = lw.load_model(progress=False)
    assert torch.equal(again.weights.blocks[3].attn_q.weight, smollm2.weights.blocks[3].attn_q.weight)


def test_hand_edited_config_is_detected_even_with_its_old_mtime(cache_copy):
    config = cache_copy / "config.json"
    stat = config.stat()
    config.write_text(config.read_text().replace('"rope_theta": 100000.0', '"rope_theta": 100001.0'))
    os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert config.stat().st_size == stat.st_size                    # same size, same mtime: only the hash tells
    assert "config.json differs" in models._cache_problem(cache_copy)


def test_touched_but_unchanged_weights_are_accepted(cache_copy):
    os.utime(cache_copy / "model.safetensors", ns=(0, 0))           # mtime differs from the manifest: re-hashed
    assert models._cache_problem(cache_copy) is None


def test_unwritable_cache_names_the_directory_and_the_fix_before_any_work(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("not a directory")
    monkeypatch.setenv("LLMWALK_CACHE", str(tmp_path / "a-file" / "cache"))
    monkeypatch.setattr(models, "_convert_gguf", no_conversion)
    with pytest.raises(models.CacheNotWritableError, match=r"a-file/cache.*LLMWALK_CACHE"):
        lw.load_model(progress=False)


CHILD = """
import hashlib, llmwalk as lw
from llmwalk import models
convert = models._convert_gguf
models._convert_gguf = lambda *args: print("converted") or convert(*args)
m = lw.load_model(progress=False)
print(hashlib.sha256(m.weights.blocks[7].attn_v.weight.numpy().tobytes()).hexdigest())
"""


def test_two_concurrent_first_loads_share_one_conversion(tmp_path, smollm2):
    env = {**os.environ, "LLMWALK_CACHE": str(tmp_path), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", CHILD], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    results = [p.communicate(timeout=900) for p in procs]
    for p, (out, err) in zip(procs, results):
        assert p.returncode == 0, err[-2000:]
    import hashlib
    expected = hashlib.sha256(smollm2.weights.blocks[7].attn_v.weight.numpy().tobytes()).hexdigest()
    assert [out.split()[-1] for out, _ in results] == [expected, expected]
    assert sum(out.split().count("converted") for out, _ in results) == 1       # the other one waited, then read
    entries = sorted(p.name for p in tmp_path.iterdir())
    assert [e for e in entries if ".tmp-" in e or ".old-" in e] == []          # no staging left behind
    assert models._cache_problem(converted_dir(tmp_path)) is None


def test_users_gguf_path_loads_like_transformers(tmp_path, monkeypatch, hf_smollm2):
    monkeypatch.setenv("LLMWALK_CACHE", str(tmp_path / "cache"))
    path = shutil.copy(models.REGISTRY["smollm2-135m"].locate(models.cache_dir()), tmp_path / "my-model.gguf")
    model = lw.load_model(path, progress=False)
    assert model.config.name == "my-model" and model.tokenizer is not None
    ids = model.tokenizer.encode("The capital of France is")
    with torch.no_grad():
        ref = hf_smollm2(torch.tensor([ids])).logits[0]
    ours = lw.forward(model, ids, record=False).logits
    assert (ours - ref).abs().max() <= 1e-3 and torch.equal(ours.argmax(-1), ref.argmax(-1))
    monkeypatch.setattr(models, "_convert_gguf", no_conversion)             # the second load reads the cache
    assert torch.equal(lw.load_model(path, progress=False).weights.token_embd, model.weights.token_embd)


@needs_gemma
def test_half_assembled_gemma_file_is_reassembled(tmp_path):
    src = models.REGISTRY["gemma3-270m"]
    target = tmp_path / "gemma-3-270m-q4_k_m.gguf"
    target.write_bytes(b"GGUF" + b"\0" * 1000)          # what a crash in the middle of assembling leaves
    path = src.locate(tmp_path)
    assert path == target and models.sha256_of(path) == src.sha256
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []
