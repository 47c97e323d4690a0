"""Hostile model files (reliability review, sections 1.7 and B1, B2, B7, B20, B21): nothing hangs, nothing lies.

Each hostile load runs in a child process under a 3 GB address-space limit and a generous timeout: before the
fixes, the first two GGUF files below looped until memory ran out. Each must end with a ValueError (or TypeError)
that names the file and the fix. Writing the files by hand keeps every claimed count exactly where the review put it.
"""
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

import llmwalk as lw
from llmwalk import model_cache
from llmwalk.models import CorruptModelFileError, UnknownModelError
from test_loaders import max_logit_diff, saved, tiny, tiny_gguf

ROOT = Path(__file__).resolve().parents[1]
CAP = 3 << 30           # bytes of address space for the child (torch alone maps ~1 GB)
TIMEOUT = 120           # seconds: only "it ends at all", the child reports its own time and peak memory

# A server that imports llmwalk once and forks a child per load: each child starts from the same freshly imported
# process (nothing loaded before it), is capped and timed, and reports; importing torch again for every file (~2.5 s
# each, ~25 files) is what the fork saves.
SERVER = """
import json, os, resource, signal, sys, time
import llmwalk as lw
for line in sys.stdin:
    request = json.loads(line)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        os.dup2(2, 1)                               # stdout is the server's replies: anything printed goes to stderr
        resource.setrlimit(resource.RLIMIT_AS, (request["cap"], request["cap"]))
        signal.alarm(request["timeout"])            # a load that hangs is killed, and the test says so
        os.environ["LLMWALK_CACHE"] = request["cache"]
        t = time.perf_counter()
        try:
            lw.load_model(request["path"], progress=False)
            out = {"type": None, "msg": ""}
        except Exception as e:
            out = {"type": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__], "msg": str(e)}
        out.update(seconds=time.perf_counter() - t, peak_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        with os.fdopen(write, "wb") as pipe:
            pipe.write(json.dumps(out).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"status": status, "said": said}), flush=True)
"""
_server: list = []       # (the server, the file its stderr goes to), once started


@pytest.fixture(autouse=True, scope="module")
def _stop_server():
    yield
    for server, _ in _server:
        server.stdin.close()
        server.wait(timeout=30)


def load_capped(path, cache) -> dict:
    """lw.load_model(path) in a child process under CAP and TIMEOUT: its exception type, message, time, peak RSS."""
    if not _server:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        stderr = tempfile.TemporaryFile()
        _server.append((subprocess.Popen([sys.executable, "-c", SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=stderr, env=env, cwd=ROOT, text=True), stderr))
    server, stderr = _server[0]
    server.stdin.write(json.dumps({"path": str(path), "cache": str(cache), "cap": CAP, "timeout": TIMEOUT}) + "\n")
    server.stdin.flush()
    reply = json.loads(server.stdout.readline() or '{"status": "the server ended", "said": ""}')
    if reply["status"] != 0 or not reply["said"]:
        stderr.seek(0)
        raise AssertionError(f"the capped load of {path} ended with wait status {reply['status']} (a signal's number "
                             f"when killed: SIGALRM = {int(signal.SIGALRM)} is the timeout); the server's stderr:\n"
                             + stderr.read().decode(errors="replace")[-2000:])
    out = json.loads(reply["said"])
    print(f"{Path(path).name}: {out['type']} in {out['seconds']:.2f} s, peak {out['peak_mb']:.0f} MB")
    return out


def refused(path, cache, *needles, file=None) -> dict:
    """Assert the capped load of `path` raised a ValueError/TypeError naming `file` (default: `path`) and saying
    each of `needles`."""
    out = load_capped(path, cache)
    assert {"ValueError", "TypeError"} & set(out.get("mro", ())), out
    for needle in (str(file or path),) + needles:
        assert needle in out["msg"], (needle, out["msg"])
    return out


# ---------------------------------------------------------------- GGUF headers written byte by byte

def s(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


ARCH = s(b"general.architecture") + struct.pack("<I", 8) + s(b"llama")


def header(n_tensors=0, n_kv=2) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv)


HOSTILE_GGUF = {   # name: (file bytes, what the error must say)
    # B1 / H1: a uint8 array claiming 10^12 elements in 178 bytes (GGUFReader loops forever on it)
    "array_1e12": (header() + ARCH + s(b"tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 0, 10**12) + bytes(64),
                   "claims 1000000000000"),     # items (the count) or bytes (the skip): two bounds
    # H2: an array of strings claiming 10^12
    "strarray_1e12": (header() + ARCH + s(b"tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, 10**12) + bytes(64),
                      "claims 1000000000000 items"),
    # H3: one string 10 GB long
    "string_10gb": (header(n_kv=1) + s(b"general.architecture") + struct.pack("<IQ", 8, 10 * 10**9) + b"llama",
                    "claims 10000000000 bytes"),
    # H4: 10^12 metadata keys; then 10^12 tensors
    "kvcount_1e12": (header(n_kv=10**12) + ARCH, "metadata key count claims"),
    "tensorcount_1e12": (header(n_tensors=10**12) + ARCH, "tensor count claims"),
    # a tensor claiming 10^6 x 10^6 fp32 values in a file of a few hundred bytes
    "tensor_1e12": (header(n_tensors=1, n_kv=1) + ARCH + s(b"token_embd.weight")
                    + struct.pack("<IQQIQ", 2, 10**6, 10**6, 0, 0) + bytes(64), "claims shape [1000000, 1000000]"),
    "tensor_100_dims": (header(n_tensors=1, n_kv=1) + ARCH + s(b"token_embd.weight") + struct.pack("<I", 100)
                        + bytes(900), "100 dimensions"),
    "unknown_value_type": (header(n_kv=1) + s(b"x") + struct.pack("<I", 77) + bytes(64), "value type 77"),
    "nested_arrays": (header(n_kv=1) + s(b"x") + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 40 + bytes(64),
                      "nested 2 deep"),
    "version_7": (b"GGUF" + struct.pack("<IQQ", 7, 0, 0) + bytes(64), "GGUF version 7"),
}


@pytest.mark.parametrize("name", HOSTILE_GGUF)
def test_hostile_gguf_headers_end_with_a_clear_error(tmp_path, name):
    data, says = HOSTILE_GGUF[name]
    path = tmp_path / f"{name}.gguf"
    path.write_bytes(data)
    refused(path, tmp_path / "cache", says, "re-download it")


def test_gguf_magic_is_checked_before_hashing(tmp_path, monkeypatch):
    """B20: a 10 GB sparse file named .gguf is refused at its first 4 bytes, without hashing it."""
    path = tmp_path / "sparse_10g.gguf"
    with open(path, "wb") as f:
        f.truncate(10 * 10**9)
    monkeypatch.setenv("LLMWALK_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(model_cache, "sha256_of", lambda p: pytest.fail(f"hashed {p}"))
    with pytest.raises(CorruptModelFileError, match=r"sparse_10g.gguf is not a GGUF file .*'GGUF'"):
        lw.load_model(path)


def test_a_gguf_file_is_hashed_once_per_version_not_on_every_load(tmp_path, monkeypatch):
    """B20's second half: a multi-GB GGUF was re-hashed on every load for its cache key. Now its digest is kept in
    the cache under the file's path, size, mtime and inode: a second load reads nothing of it, a touched file is
    hashed again (same key, no conversion), and a rewritten one gets a key and a conversion of its own."""
    path = tiny_gguf(tmp_path / "tiny.gguf")
    monkeypatch.setenv("LLMWALK_CACHE", str(tmp_path / "cache"))
    hashed, real = [], model_cache.sha256_of
    monkeypatch.setattr(model_cache, "sha256_of", lambda p: hashed.append(Path(p).name) or real(p))
    first = lw.load_model(path, progress=False)
    second = lw.load_model(path, progress=False)
    assert hashed.count("tiny.gguf") == 1 and first.source == second.source
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    assert lw.load_model(path, progress=False).source == first.source and hashed.count("tiny.gguf") == 2
    path.write_bytes(path.read_bytes()[:-4] + b"\x00\x00\x80\x3f")   # same size, the last weight now 1.0
    changed = lw.load_model(path, progress=False)
    assert hashed.count("tiny.gguf") == 3 and changed.source != first.source


def test_a_cache_that_cannot_keep_the_digest_still_loads_the_gguf_file(tmp_path, monkeypatch):
    """Where the digest cannot be written (here its folder's name is taken by a file; a read-only cache is the
    same for a non-root user), the file is hashed on every load and loads."""
    path = tiny_gguf(tmp_path / "tiny.gguf")
    cache = tmp_path / "cache"
    monkeypatch.setenv("LLMWALK_CACHE", str(cache))
    cache.mkdir()
    (cache / model_cache.GGUF_DIGESTS).write_text("not a folder")
    assert model_cache.gguf_sha256(path) == model_cache.sha256_of(path)
    assert lw.load_model(path, progress=False).config.n_layer == 1
    assert (cache / model_cache.GGUF_DIGESTS).read_text() == "not a folder"


# ---------------------------------------------------------------- GGUF files whose header is valid, but whose claims are not

def test_the_tiny_gguf_is_a_valid_model(tmp_path):
    """The control for the cases below: without a hostile change the same file loads (and under an upper-case
    suffix, H11, which used to give "no such file")."""
    path = tiny_gguf(tmp_path / "tiny.GGUF")
    assert load_capped(path, tmp_path / "cache")["type"] is None


@pytest.mark.parametrize("kwargs,says", [
    ({"block_count": 10**9}, "block_count is 1000000000 but its tensors hold layers 0..0"),     # B2 / H5
    ({"block_count": 2}, "block_count is 2 but its tensors hold layers 0..0"),
    ({"head_count": 0}, "llama.attention.head_count is 0, it must be >= 1"),                    # H7
    ({"tokens": False}, "lacks the GGUF metadata tokenizer.ggml.tokens"),                       # H8
    ({"scores": False}, "cannot build its tokenizer"),                                          # H9
])
def test_gguf_claims_its_tensors_do_not_back_are_refused(tmp_path, kwargs, says):
    refused(tiny_gguf(tmp_path / "tiny.gguf", **kwargs), tmp_path / "cache", says, "re-download")


def test_a_full_disk_during_conversion_says_so(tmp_path, monkeypatch):
    """C4: safetensors reports a full disk as a raw SafetensorError; the error names the cache and the fix."""
    import safetensors.torch
    from safetensors import SafetensorError

    def full_disk(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    monkeypatch.setenv("LLMWALK_CACHE", str(tmp_path / "cache"))
    with pytest.raises(lw.CacheNotWritableError, match=rf"disk holding {tmp_path / 'cache'} is full: .* needs "
                                                           r"\d+ MB there.*LLMWALK_CACHE"):
        lw.load_model(tiny_gguf(tmp_path / "tiny.gguf"), progress=False)


# ---------------------------------------------------------------- Hugging Face directories

def edit_config(path, **changes):
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    return path


@pytest.mark.parametrize("changes,error,says", [
    ({"num_hidden_layers": 10**9}, "CorruptModelFileError",                                      # H12
     "num_hidden_layers in config.json is 1000000000 but its tensors hold layers 0..2"),
    ({"num_attention_heads": 0}, "CorruptModelFileError", "num_attention_heads is 0; it must be a positive int"),
    ({"hidden_size": None}, "CorruptModelFileError", "config.json has no 'hidden_size'"),
    ({"rms_norm_eps": "1e-6"}, "TypeError", "Config.norm_eps of 'model' must be a positive finite number, got '1e-6'"),
])
def test_hf_config_claims_are_checked(tmp_path, changes, error, says):
    path = edit_config(saved(tiny("llama"), tmp_path), **changes)
    out = load_capped(path, tmp_path / "cache")
    assert out["type"] == error and says in out["msg"], out


@pytest.mark.parametrize("name", ["config.json", "tokenizer_config.json", "model.safetensors"])
def test_files_that_are_not_what_they_say_are_named(tmp_path, name):
    """H17/H24: a symlink to /etc/passwd (or any non-JSON text) gave raw parse errors naming no file."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    path = saved(tiny("llama"), tmp_path)
    Tokenizer(WordLevel({"<unk>": 0, "a": 1}, unk_token="<unk>")).save(str(path / "tokenizer.json"))  # read with it
    (path / name).unlink(missing_ok=True)
    (path / name).symlink_to("/etc/passwd")
    refused(path, tmp_path / "cache", "re-download", file=path / name)


def test_a_safetensors_header_claiming_a_huge_tensor_is_named(tmp_path):
    """H19: a [100000, 100000] fp32 tensor claimed in a 100-byte file."""
    path = saved(tiny("llama"), tmp_path)
    head = json.dumps({"w": {"dtype": "F32", "shape": [100000, 100000], "data_offsets": [0, 4 * 10**10]}}).encode()
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(head)) + head + bytes(8))
    refused(path, tmp_path / "cache", "not a readable safetensors file", file=path / "model.safetensors")


# ---------------------------------------------------------------- which weight files a directory means (B7)

def from_transformers(path):
    import transformers as tf
    return tf.AutoModelForCausalLM.from_pretrained(path).eval()


IDS = list(range(1, 30))


def test_a_stray_safetensors_file_is_not_merged(tmp_path):
    """H21: zz-override.safetensors redefining the final norm changed the logits by 382; transformers ignores it."""
    from safetensors.torch import save_file
    hf = tiny("llama")
    path = saved(hf, tmp_path)
    save_file({"model.norm.weight": torch.full((64,), 1000.0)}, str(path / "zz-override.safetensors"))
    assert max_logit_diff(lw.load_model(path), from_transformers(path), IDS) <= 1e-4
    assert max_logit_diff(lw.load_model(path), hf, IDS) <= 1e-4


def test_mistral_hub_layout_loads_from_the_index(tmp_path):
    """H22: shards + model.safetensors.index.json + consolidated.safetensors (Mistral's native names)."""
    from safetensors.torch import save_file
    hf = tiny("mistral", sliding_window=8)
    path = tmp_path / "model"
    hf.save_pretrained(path, safe_serialization=True, max_shard_size="100KB")
    assert not (path / "model.safetensors").exists() and len(list(path.glob("model-*.safetensors"))) > 1
    native = {k.replace("model.layers.", "layers.").replace("self_attn.k_proj", "attention.wk"): v.clone()
              for k, v in hf.state_dict().items()}
    save_file(native, str(path / "consolidated.safetensors"))
    assert max_logit_diff(lw.load_model(path), from_transformers(path), IDS) <= 1e-4


def test_a_directory_without_the_standard_weight_names_is_refused_like_transformers(tmp_path):
    path = saved(tiny("llama"), tmp_path)
    (path / "model.safetensors").rename(path / "weights.safetensors")
    with pytest.raises(OSError):
        from_transformers(path)
    with pytest.raises(UnknownModelError, match=r"no model.safetensors .*only weights.safetensors.*rename"):
        lw.load_model(path)


@pytest.mark.parametrize("shard,says", [("../model.safetensors", "not safetensors files of the directory"),
                                        ("model-00009-of-00009.safetensors", "missing")])
def test_an_index_naming_shards_outside_or_missing_is_refused(tmp_path, shard, says):
    path = tmp_path / "model"
    tiny("llama").save_pretrained(path, safe_serialization=True, max_shard_size="100KB")
    index = json.loads((path / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.norm.weight"] = shard
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    shutil.copy(next(path.glob("model-*.safetensors")), tmp_path / "model.safetensors")    # what "../" would reach
    with pytest.raises(CorruptModelFileError, match=rf"index.json lists shards that are {says}: {shard}"):
        lw.load_model(path)
