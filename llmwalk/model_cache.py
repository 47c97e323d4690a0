"""The converted-weights cache: a model converted once (GGUF dequantized, say) is kept as a directory and read back.

A converted model is a directory: config.json, model.safetensors, tokenizer.json, tokenizer_meta.json and
manifest.json (each file's size, mtime and sha256, written at conversion). Loading checks the manifest: the small
files are hashed every time (a hand-edited config.json must not change the model); the 538 MB safetensors file is
re-hashed only when its size or mtime differ from the manifest (hashing it costs ~0.6 s, reading the stat nothing),
which catches a truncated, replaced or rewritten file but, by design, not bytes changed in place with the size and
mtime put back. Conversion happens once, under a file lock, in a staging directory that is renamed into place, so
concurrent first loads are safe; a staging directory is made only by the lock's holder, so whoever holds the lock
next (a conversion, or a load that finds the lock free) deletes those that killed processes left. A class may share
one cache (LLMWALK_CACHE=/srv/llmwalk-cache): whatever is moved in is readable by every user whatever their umask,
any user may take the lock, and loading a complete cache writes nothing, so a read-only cache works.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
import warnings
from dataclasses import asdict, fields
from pathlib import Path
from typing import Callable

from .checkpoint import CacheNotWritableError, Model, weights_from_flat
from .tokens import HFTokenizer, TokenizerMeta
from .weights import Config, check_weights, tensors

CONVERTER_VERSION = 2   # bump when the converted cache format or the conversion changes (2: manifest.json)


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


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


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


def save_converted(model: Model, out: Path) -> None:
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


def cached_or_converted(out: Path, source: str, convert: Callable[[Path], None]) -> Model:
    """The converted model in `out`; `convert(staging_dir)` writes it first when it is missing or damaged."""
    model, _ = _cached(out, source)           # no lock: a complete read-only cache is read without writing
    if model is not None:
        _remove_leftovers_if_idle(out)
        _share_if_private(out)
        return model
    with converting(out) as staging:
        model, problem = _cached(out, source)     # another process may have converted it meanwhile
        if model is None:
            _clear_for_conversion(out, problem)
            convert(staging)
            _write_manifest(staging)
            move_into_place(staging, out)
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


class converting:
    """`with converting(target) as staging:` holds `target`'s lock and a fresh staging directory next to it.

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


def move_into_place(staging: Path, out: Path) -> None:
    """Rename the finished `staging` file or directory to `out`, replacing a damaged `out` (readers never see a half).

    What is moved in becomes readable by every user whatever the umask (mkdtemp's is 0700): a class may share a cache.
    """
    for path in (staging, *(staging.rglob("*") if staging.is_dir() else ())):
        path.chmod(0o755 if path.is_dir() else 0o644)
    _set_aside(out)
    staging.rename(out)


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
