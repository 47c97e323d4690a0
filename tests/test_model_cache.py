"""The converted-weights cache: verified on load, rebuilt when damaged, safe with several processes, clear when
unwritable, shared by the users of a class server (a second user is `nobody` when the tests run as root), cleaned
after killed conversions; LLMWALK_CACHE's value; a user's own GGUF file; a half-assembled Gemma file recovers. Every
test uses a temporary LLMWALK_CACHE."""
import hashlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

import llmwalk as lw
from llmwalk import convert_gguf, model_cache, models
from llmwalk.weights import tensors
from markers import needs_gemma


def shared_conversion() -> Path:
    """The converted SmolLM2 in the cache the tests share (the `smollm2` fixture makes it)."""
    sha = models.REGISTRY["smollm2-135m"].sha256
    return models.cache_dir() / f"smollm2-135m-{sha[:12]}-v{model_cache.CONVERTER_VERSION}"


def converted_dir(cache) -> "os.PathLike":
    (out,) = [p for p in cache.glob("smollm2-135m-*") if p.is_dir()]
    return out


@pytest.fixture
def cache_copy(tmp_path, monkeypatch, smollm2):
    """A copy (mtimes kept) of the shared converted SmolLM2 cache, as LLMWALK_CACHE."""
    out = shared_conversion()
    shutil.copytree(out, tmp_path / out.name)
    monkeypatch.setenv("LLMWALK_CACHE", str(tmp_path))
    return tmp_path / out.name


def no_conversion(*args, **kwargs):
    raise AssertionError("the model was converted again")


def test_intact_cache_is_used_without_converting(cache_copy, smollm2, monkeypatch):
    monkeypatch.setattr(convert_gguf, "convert", no_conversion)
    model = lw.load_model(progress=False)
    assert torch.equal(model.weights.blocks[5].ffn_up.weight, smollm2.weights.blocks[5].ffn_up.weight)


def test_flipped_byte_in_cached_weights_is_rebuilt(cache_copy, smollm2):
    weights = cache_copy / "model.safetensors"
    with open(weights, "r+b") as f:                  # one weight byte, well past the safetensors header
        f.seek(weights.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x10]))
    assert "model.safetensors differs" in model_cache._cache_problem(cache_copy)
    with pytest.warns(UserWarning, match="converting again"):
        again = lw.load_model(progress=False)
    assert model_cache._cache_problem(cache_copy) is None
    for a, b in zip(tensors(again.weights), tensors(smollm2.weights)):
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
    assert "config.json differs" in model_cache._cache_problem(cache_copy)


def test_touched_but_unchanged_weights_are_accepted(cache_copy):
    os.utime(cache_copy / "model.safetensors", ns=(0, 0))           # mtime differs from the manifest: re-hashed
    assert model_cache._cache_problem(cache_copy) is None


def test_unwritable_cache_names_the_directory_and_the_fix_before_any_work(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("not a directory")
    monkeypatch.setenv("LLMWALK_CACHE", str(tmp_path / "a-file" / "cache"))
    monkeypatch.setattr(convert_gguf, "convert", no_conversion)
    with pytest.raises(models.CacheNotWritableError, match=r"a-file/cache.*LLMWALK_CACHE"):
        lw.load_model(progress=False)


CHILD = r"""
import encodings.ascii, hashlib, os, shutil, sys, time
import filelock, safetensors.torch                  # imported before dropping root: the other user may not be able
import llmwalk as lw                                # to read the interpreter's own files
from llmwalk import convert_gguf, model_cache

source, umask, user, action = sys.argv[1:]
os.umask(int(umask, 8))
if user == "other" and os.geteuid() == 0:
    os.setgid(65534)                                # nobody
    os.setuid(65534)


def copy_conversion(path, name, out, progress):     # what the conversion writes, copied from the shared cache
    print("converted", flush=True)
    for f in model_cache.CACHED_FILES:
        shutil.copyfile(os.path.join(source, f), out / f)      # copyfile: created under this process's umask
    if action == "hang":
        print("converting", flush=True)
        time.sleep(3600)


def no_conversion(*args):
    raise AssertionError("the model was converted")


acquire = filelock.FileLock.acquire
filelock.FileLock.acquire = lambda self, *a, **k: print("waiting", flush=True) or acquire(self, *a, **k)
convert_gguf.convert = no_conversion if action == "read" else copy_conversion
try:
    m = lw.load_model(progress=False)
    print(hashlib.sha256(m.weights.blocks[7].attn_v.weight.numpy().tobytes()).hexdigest())
except Exception as e:
    print(f"{type(e).__name__}: {e}")
"""
OTHER_USER = "a second user (nobody) needs root; as another user the cache's modes are still checked"


def child(cache, action, *, user="self", umask="022") -> subprocess.Popen:
    """A Python process loading SmolLM2 from `cache`: `action` "read" (converting fails), "convert" (a copy of the
    shared conversion stands in for the 20 s conversion) or "hang" (converts, then sleeps inside the conversion)."""
    env = {**os.environ, "LLMWALK_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", CHILD, str(shared_conversion()), umask, user, action], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def result(proc: subprocess.Popen) -> list[str]:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-2000:]
    return out.split("\n")[:-1]


@pytest.fixture
def expected(smollm2) -> str:
    """What CHILD prints for a correct load."""
    return hashlib.sha256(smollm2.weights.blocks[7].attn_v.weight.numpy().tobytes()).hexdigest()


@pytest.fixture
def class_dir():
    """A directory every user can reach (pytest's tmp_path is private to its user), with a space and 张伟 in its name."""
    path = Path(tempfile.mkdtemp(prefix="llmwalk class 张伟 "))
    path.chmod(0o755)
    yield path
    for p in (path, *path.rglob("*")):                  # undo the tests' read-only modes, so that it can be deleted
        if p.is_dir():
            p.chmod(0o755)
    shutil.rmtree(path)


def leftovers(cache) -> list[str]:
    return [p.name for p in Path(cache).iterdir() if ".tmp-" in p.name or ".old-" in p.name]


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_two_concurrent_first_loads_share_one_conversion(tmp_path, expected):
    results = [result(p) for p in [child(tmp_path, "convert") for _ in range(2)]]
    assert [lines[-1] for lines in results] == [expected, expected]
    assert sum(lines.count("converted") for lines in results) == 1       # the other one waited, then read
    assert leftovers(tmp_path) == []
    assert model_cache._cache_problem(converted_dir(tmp_path)) is None


def test_a_conversion_under_a_private_umask_is_readable_by_every_user(class_dir, expected):
    cache = class_dir / "cache"
    assert result(child(cache, "convert", umask="077"))[-1] == expected
    entry = converted_dir(cache)
    assert (mode(cache), mode(entry), mode(cache / f"{entry.name}.lock")) == (0o755, 0o755, 0o666)
    assert {f.name: mode(f) for f in entry.iterdir()} == {f: 0o644 for f in (*model_cache.CACHED_FILES, model_cache.MANIFEST)}
    assert result(child(cache, "read", user="other"))[-1] == expected


def test_a_complete_read_only_cache_is_read_without_writing_anything(class_dir, expected):
    cache = class_dir / "cache"
    result(child(cache, "convert"))
    for lock in cache.glob("*.lock"):                   # e.g. the entry was copied in by the class's admin
        lock.unlink()
    for p in (converted_dir(cache), cache):
        p.chmod(0o555)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in cache.rglob("*"))
    assert result(child(cache, "read", user="other"))[-1] == expected
    assert sorted((p.name, p.stat().st_mtime_ns) for p in cache.rglob("*")) == before


def test_an_old_private_entry_of_ours_is_made_readable_by_every_user_when_loaded(class_dir, expected):
    """Entries an earlier llmwalk wrote with mkdtemp's 0700 stay loadable by their owner and become shareable."""
    cache = class_dir / "cache"
    result(child(cache, "convert"))
    entry = converted_dir(cache)
    for p in entry.iterdir():
        p.chmod(0o600)
    entry.chmod(0o700)
    assert result(child(cache, "read"))[-1] == expected
    assert mode(entry) == 0o755 and {f.name: mode(f) for f in entry.iterdir()} == \
        {f: 0o644 for f in (*model_cache.CACHED_FILES, model_cache.MANIFEST)}


def test_a_model_missing_from_a_read_only_cache_names_llmwalk_cache_and_the_fix(class_dir):
    cache = class_dir / "cache"
    cache.mkdir(mode=0o555)
    message = result(child(cache, "read", user="other"))[-1]
    assert message.startswith(f"CacheNotWritableError: llmwalk converts a model once and keeps the result in {cache}")
    assert "set the environment variable LLMWALK_CACHE" in message and "'~/llmwalk-cache'" in message


@pytest.mark.skipif(os.geteuid() != 0, reason=OTHER_USER)
@pytest.mark.parametrize("lock_mode", [0o666, 0o644])
def test_another_users_private_conversion_fails_clearly_before_converting(class_dir, lock_mode, smollm2):
    cache = class_dir / "cache"
    cache.mkdir()
    cache.chmod(0o1777)                                 # sticky and world-writable, like /tmp
    result(child(cache, "convert"))
    entry = converted_dir(cache)
    for p in entry.iterdir():                           # what llmwalk wrote before it made the cache shared
        p.chmod(0o600)
    entry.chmod(0o700)
    (cache / f"{entry.name}.lock").chmod(lock_mode)
    lines = result(child(cache, "read", user="other"))
    assert lines[-1].startswith("CacheNotWritableError: ") and "LLMWALK_CACHE" in lines[-1], lines
    if lock_mode == 0o666:                              # it could take the lock, but not replace root's entry
        assert f"chmod -R a+rX '{entry}'" in lines[-1] and "not readable by this user" in lines[-1]
    assert leftovers(cache) == [] and model_cache._cache_problem(entry) is None


def test_the_staging_of_a_terminated_conversion_is_removed_by_the_next_load(tmp_path, expected):
    killed = child(tmp_path, "hang")
    assert killed.stdout.readline() == "waiting\n" and killed.stdout.readline() == "converted\n"
    assert killed.stdout.readline() == "converting\n"
    (staging,) = leftovers(tmp_path)
    assert (tmp_path / staging / "model.safetensors").stat().st_size > 100e6
    killed.send_signal(signal.SIGTERM)
    killed.communicate(timeout=60)
    assert killed.returncode == -signal.SIGTERM
    assert leftovers(tmp_path) == [staging]             # what SIGTERM leaves: the process had no chance to clean up
    assert result(child(tmp_path, "convert"))[-1] == expected
    assert leftovers(tmp_path) == [] and model_cache._cache_problem(converted_dir(tmp_path)) is None


def test_a_waiting_load_keeps_a_live_conversions_staging_and_removes_it_once_killed(tmp_path, expected):
    first = child(tmp_path, "hang")
    assert [first.stdout.readline() for _ in range(3)] == ["waiting\n", "converted\n", "converting\n"]
    (staging,) = leftovers(tmp_path)
    second = child(tmp_path, "convert")
    assert second.stdout.readline() == "waiting\n"          # it is about to block on the lock the first one holds
    assert leftovers(tmp_path) == [staging] and (tmp_path / staging / "model.safetensors").exists()
    first.kill()                                            # a Jupyter kernel restarted during its first load
    first.communicate(timeout=60)
    lines = ["waiting", *result(second)]
    assert lines[-1] == expected and lines.count("converted") == 1
    assert leftovers(tmp_path) == []


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
    monkeypatch.setattr(convert_gguf, "convert", no_conversion)             # the second load reads the cache
    assert torch.equal(lw.load_model(path, progress=False).weights.token_embd, model.weights.token_embd)


@needs_gemma
def test_half_assembled_gemma_file_is_reassembled(tmp_path):
    src = models.REGISTRY["gemma3-270m"]
    target = tmp_path / "gemma-3-270m-q4_k_m.gguf"
    target.write_bytes(b"GGUF" + b"\0" * 1000)          # what a crash in the middle of assembling leaves
    path = src.locate(tmp_path)
    assert path == target and models.sha256_of(path) == src.sha256
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []


@pytest.mark.parametrize("converting_now", [False, True])
def test_leftovers_next_to_a_complete_cache_go_unless_a_conversion_holds_the_lock(cache_copy, monkeypatch,
                                                                                    converting_now):
    stale = cache_copy.parent / f"{cache_copy.name}.tmp-killed"          # e.g. left by an older llmwalk version
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(bytes(1000))
    monkeypatch.setattr(convert_gguf, "convert", no_conversion)
    lock = model_cache._lock(cache_copy)
    if converting_now:
        lock.acquire()
    try:
        lw.load_model(progress=False)
    finally:
        lock.release()
    assert leftovers(cache_copy.parent) == ([stale.name] if converting_now else [])


def test_llmwalk_cache_expands_the_home_and_variables_and_is_made_absolute(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "张伟"))
    monkeypatch.setenv("CLASS", str(tmp_path / "class room"))
    monkeypatch.chdir(tmp_path)
    for value, expected in [("~/llmwalk cache", tmp_path / "张伟" / "llmwalk cache"),
                            ("${CLASS}/cache", tmp_path / "class room" / "cache"),
                            ("relative/cache", tmp_path / "relative" / "cache")]:
        monkeypatch.setenv("LLMWALK_CACHE", value)
        assert models.cache_dir() == expected, value


@pytest.mark.parametrize("value, problem", [("", "is empty"), ("  \t", "is empty"),
                                            ("$LLMWALK_NO_SUCH_VARIABLE/cache", "unset variable")])
def test_an_empty_or_unset_llmwalk_cache_is_refused_before_anything_is_written(tmp_path, monkeypatch, value, problem):
    monkeypatch.delenv("LLMWALK_NO_SUCH_VARIABLE", raising=False)
    monkeypatch.setenv("LLMWALK_CACHE", value)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=f"LLMWALK_CACHE=.*{problem}.*export LLMWALK_CACHE=/srv/llmwalk-cache"):
        lw.load_model(progress=False)
    assert list(tmp_path.iterdir()) == []               # nothing converted into the working directory
