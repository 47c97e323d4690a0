"""The oracle (transformers' own model and tokenizer converted from a GGUF file, and what gguf's own GGUFReader
reads from it), made once per machine.

Converting a GGUF file with transformers takes minutes (Gemma-3: ~2 min for the model, ~1 min for the tokenizer) and
each pytest-xdist worker used to do it again. Here the converted object is saved with `save_pretrained` into
`llmwalk.models.cache_dir() / "oracle" / <name>` ($LLMWALK_CACHE, else ~/.cache/llmwalk) and later runs load it
with `from_pretrained` (safetensors: seconds). The conversion itself is unchanged: the same `from_pretrained(...,
gguf_file=...)` call as before.

- Keyed to the source's content: key.json records the GGUF file's sha256 and size, transformers' version and this
  file's format version, not where the file lies: every checkout (each with its own .venv holding SmolLM2's GGUF)
  shares one conversion. Any mismatch converts again. It also records the saved files' sizes, so a truncated file does too.
- Checked before use: after saving, the copy is loaded back and compared with the fresh conversion (model: class,
  config, generation config, every state_dict tensor bit for bit, tied LM head; tokenizer: ids, pieces and decoding
  of a few texts, Chinese included, special tokens, chat template). Only a copy that passes is renamed into place, so
  a bad save can never become the oracle; when the check fails the run warns and uses the fresh conversion itself.
- Safe for concurrent workers: one process converts under a file lock into a private staging directory and renames
  it into place; the others wait for the lock and then load what it wrote.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from llmwalk.model_cache import cache_dir, move_into_place, sha256_of   # the model cache's rename and hash
from llmwalk.models import REGISTRY

FORMAT = 2              # bump when what is saved, or how it is checked, changes
KEY = "key.json"        # written last into the staging directory: a directory without it is never used
CHECK_TEXTS = ["The capital of France is Paris.", "法国的首都是什么", "人工智能 ChatGPT 巴黎 首都",
               "def f(x):\n    return x ** 2  # square\n", "emoji: 🙂👍🏽 and 🇫🇷!",
               "<|endoftext|> <bos> <|im_end|>"]


class BadSave(AssertionError):
    """The saved copy does not reload to the object that was converted."""


@dataclass(frozen=True)
class Kind:
    """How to make, save, load and compare one kind of oracle object."""
    convert: Callable[[Path], Any]            # the GGUF file -> the object (slow)
    save: Callable[[Any, Path], None]         # (the object, a directory) -> None: save_pretrained
    load: Callable[[Path], Any]               # a save_pretrained directory -> the object (fast)
    same: Callable[[Any, Any], None]          # (converted, reloaded) -> None, or BadSave
    versions: Callable[[], dict] = dict       # what else the object depends on besides the file and transformers


def root() -> Path:
    return cache_dir() / "oracle"


def transformers_version() -> str:
    import transformers
    return transformers.__version__


def source_key(gguf: Path) -> dict:
    return {"format": FORMAT, "sha256": sha256_of(Path(gguf)), "size": Path(gguf).stat().st_size,
            "transformers": transformers_version()}


def _saved_files(directory: Path) -> dict:
    return {p.name: p.stat().st_size for p in sorted(directory.iterdir()) if p.is_file() and p.name != KEY}


def _problem(out: Path, key: dict) -> str | None:
    """Why the cache in `out` cannot be used for `key` ("missing", "stale: ..."), or None when it can."""
    try:
        recorded = json.loads((out / KEY).read_text())
    except FileNotFoundError:
        return "missing"
    except (OSError, ValueError) as e:
        return f"unreadable key ({type(e).__name__}: {e})"
    changed = [k for k in key if recorded.get(k) != key[k]]
    if changed:
        return "stale: " + ", ".join(f"{k} {recorded.get(k)!r} -> {key[k]!r}" for k in changed)
    try:
        if _saved_files(out) != recorded.get("files"):
            return "damaged: the saved files' sizes differ from what was written"
    except OSError as e:
        return f"damaged: {e}"
    return None


def _load(out: Path, key: dict, kind: Kind):
    """The cached object in `out` when its key matches, else None (missing, stale, damaged or unreadable)."""
    problem = _problem(out, key)
    if problem is None:
        try:
            return kind.load(out)
        except Exception as e:            # e.g. a file replaced by another process while we read it
            problem = f"unreadable ({type(e).__name__}: {e})"
    if problem != "missing":
        warnings.warn(f"oracle cache {out} is {problem}; converting again")
    return None


def cached(name: str, gguf: Path, kind: Kind):
    """`kind.convert(gguf)`, made once and kept in root()/name; later calls load the saved copy."""
    out, key = root() / name, {**source_key(gguf), **kind.versions()}
    obj = _load(out, key, kind)
    if obj is not None:
        return obj
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f"{name}.tmp-", dir=out.parent))
    except OSError as e:                  # a read-only cache: convert as before, keep nothing
        warnings.warn(f"cannot keep the oracle in {out.parent} ({e}); converting without a cache")
        return kind.convert(gguf)
    from filelock import FileLock
    try:
        with FileLock(str(out.parent / f"{name}.lock")):
            if _problem(out, key) is None:                 # another worker converted it while we waited
                obj = _load(out, key, kind)
                if obj is not None:
                    return obj
            obj = kind.convert(gguf)
            try:
                kind.save(obj, staging)
                kind.same(obj, kind.load(staging))
            except (BadSave, ValueError, OSError) as e:    # nothing is moved into place: use the conversion itself
                warnings.warn(f"not caching the oracle {name}: {e}")
                return obj
            del obj
            (staging / KEY).write_text(json.dumps({**key, "files": _saved_files(staging)}, indent=1))
            for path in staging.iterdir():                 # mkdtemp's 0700 would hide a shared cache from others
                path.chmod(0o644)
            staging.chmod(0o755)
            move_into_place(staging, out)
            return kind.load(out)            # what every later run gets: the checked copy, from its final place
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# ---------------------------------------------------------------- the two kinds

def convert_model(gguf: Path):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()


def save_model(model, directory: Path) -> None:
    """save_pretrained of a model converted from GGUF, whose weights transformers has already de-quantized.

    transformers refuses to save a model loaded through its GGUF "quantizer" (is_serializable() is False), even when
    every weight is a plain float32 tensor in a plain module. Check that this is so, then save it without the quantizer
    (restored afterwards): what is saved is exactly the de-quantized model, and same_model() checks it reloads so.
    """
    odd = {type(m).__name__ for m in model.modules() if "gguf" in type(m).__module__.lower()}
    weights = {t.dtype for t in model.state_dict().values()}
    if odd or weights != {torch.float32}:
        raise BadSave(f"not a plain de-quantized model (modules {sorted(odd)}, dtypes {weights}): cannot cache it")
    quantizer, config = getattr(model, "hf_quantizer", None), model.config.__dict__.pop("quantization_config", None)
    try:
        model.hf_quantizer = None
        model.save_pretrained(directory)
    finally:
        model.hf_quantizer = quantizer
        if config is not None:
            model.config.quantization_config = config


def load_model(directory: Path):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()


def _config(model) -> dict:
    ignored = ("_name_or_path", "transformers_version", "architectures",  # set by save_pretrained itself
               "quantization_config")                                # not saved: see save_model()
    return {**{k: v for k, v in model.config.to_dict().items() if k not in ignored},
            "attention": model.config._attn_implementation}


def same_model(a, b) -> None:
    if type(a) is not type(b):
        raise BadSave(f"reloaded as {type(b).__name__}, converted as {type(a).__name__}")
    if _config(a) != _config(b):
        diff = {k for k in _config(a).keys() | _config(b).keys() if _config(a).get(k) != _config(b).get(k)}
        raise BadSave(f"config differs in {sorted(diff)}")
    sa, sb = a.state_dict(), b.state_dict()
    if sa.keys() != sb.keys():
        raise BadSave(f"state_dict keys differ: {sorted(sa.keys() ^ sb.keys())[:5]}")
    for k in sa:
        if sa[k].dtype != sb[k].dtype or sa[k].shape != sb[k].shape or not torch.equal(sa[k], sb[k]):
            raise BadSave(f"tensor {k} differs")
    generation = [{k: v for k, v in m.generation_config.to_dict().items() if k != "transformers_version"}
                  for m in (a, b)]
    if generation[0] != generation[1]:
        raise BadSave(f"generation_config differs: {generation[0]} != {generation[1]}")
    tied = [m.get_output_embeddings().weight.data_ptr() == m.get_input_embeddings().weight.data_ptr()
            for m in (a, b)]
    if tied[0] != tied[1]:
        raise BadSave(f"tied LM head: converted {tied[0]}, reloaded {tied[1]}")


def convert_tokenizer(gguf: Path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def save_tokenizer(tok, directory: Path) -> None:
    tok.save_pretrained(directory)


def load_tokenizer(directory: Path):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(directory))


def _tokenizer_facts(tok) -> dict:
    ids = [tok.encode(t) for t in CHECK_TEXTS]
    return {"class": type(tok).__name__, "len": len(tok), "ids": ids,
            "pieces": [tok.convert_ids_to_tokens(i) for i in ids], "decoded": [tok.decode(i) for i in ids],
            "special": {k: str(v) for k, v in tok.special_tokens_map.items()},
            "special_ids": [tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id],
            "chat_template": tok.chat_template}


def same_tokenizer(a, b) -> None:
    fa, fb = _tokenizer_facts(a), _tokenizer_facts(b)
    diff = [k for k in fa if fa[k] != fb[k]]
    if diff:
        raise BadSave(f"reloaded tokenizer differs in {diff}")


def reader_facts(gguf: Path) -> dict:
    """What gguf's own GGUFReader reads from the file: every metadata value (its GGUF.* entries are its own
    bookkeeping) and every tensor's name, type, shape, dtype and a sha256 of its bytes. GGUFReader takes ~15 s on
    Gemma-3's file (a numpy view of every string of the vocabulary): worth keeping once per machine."""
    import hashlib

    import gguf as gguf_package
    import numpy as np
    ref = gguf_package.GGUFReader(str(gguf))
    fields = {k: f.contents() for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    tensors = [[t.name, int(t.tensor_type), [int(n) for n in t.shape.tolist()], str(t.data.dtype),
                list(t.data.shape), hashlib.sha256(np.ascontiguousarray(t.data).data).hexdigest()] for t in ref.tensors]
    return {"fields": fields, "tensors": tensors}


def save_facts(facts: dict, directory: Path) -> None:
    (directory / "reader.json").write_text(json.dumps(facts, ensure_ascii=False), encoding="utf-8")


def load_facts(directory: Path) -> dict:
    return json.loads((directory / "reader.json").read_text(encoding="utf-8"))


def same_facts(a: dict, b: dict) -> None:
    if a != b:
        raise BadSave("the reader's facts do not reload equal (a value JSON does not keep?)")


def gguf_version() -> dict:
    from importlib.metadata import version
    return {"gguf": version("gguf")}


MODEL = Kind(convert_model, save_model, load_model, same_model)
TOKENIZER = Kind(convert_tokenizer, save_tokenizer, load_tokenizer, same_tokenizer)
READER = Kind(reader_facts, save_facts, load_facts, same_facts, gguf_version)


def hf_model(name: str):
    """transformers' model of the registered model `name`, loaded from its GGUF file (cached)."""
    return cached(f"{name}-model", REGISTRY[name].locate(cache_dir()), MODEL)


def hf_tokenizer(name: str):
    """transformers' tokenizer of the registered model `name`, converted from its GGUF file (cached)."""
    return cached(f"{name}-tokenizer", REGISTRY[name].locate(cache_dir()), TOKENIZER)


def gguf_reader(name: str) -> dict:
    """reader_facts of the registered model `name`'s GGUF file (cached)."""
    return cached(f"{name}-gguf-reader", REGISTRY[name].locate(cache_dir()), READER)


def ffn_swap_probs(hf, target: list[int], source: list[int], tokens: list[int], layers, positions) -> list[float]:
    """transformers' probabilities of `tokens` after `target` when the MLPs of `layers` write, at `positions`, what
    they wrote for `source` (forward hooks on its MLPs): the reference for llmwalk's FFN swaps."""
    mlps = [layer.mlp for layer in hf.model.layers]
    saved = {}
    handles = [m.register_forward_hook(lambda m, i, out, n=n: saved.__setitem__(n, out[0].clone()))
               for n, m in enumerate(mlps)]
    with torch.no_grad():
        hf(torch.tensor([source]))
    for h in handles:
        h.remove()

    def put(n):
        def hook(m, i, out):
            out = out.clone()
            out[0, positions] = saved[n][positions]
            return out
        return hook
    handles = [mlps[n].register_forward_hook(put(n)) for n in layers]
    with torch.no_grad():
        logits = hf(torch.tensor([target])).logits[0, -1]
    for h in handles:
        h.remove()
    return torch.softmax(logits, -1)[tokens].tolist()
