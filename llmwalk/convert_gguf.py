"""GGUF files (the offline models are GGUF): the header read and checked before anything trusts it, the architecture
read from the metadata, and every tensor dequantized into llmwalk's fp32 weights (once: `model_cache.py` keeps them).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from .checkpoint import CorruptModelFileError, UnsupportedModelError, finish, weights_from_flat
from .model_cache import save_converted
from .tokens import TokenizerMeta
from .weights import Config

if TYPE_CHECKING:
    from gguf import GGMLQuantizationType

# A GGUF file states every count and length it holds (metadata arrays, strings, tensors and their shapes), and a
# reader that trusts them can be made to loop or to allocate without end (gguf's GGUFReader loops forever on an array
# claiming 10^12 elements in a 178-byte file). So llmwalk reads the header itself, in one walk that checks each claim
# against the bytes the file still has and against a bound no model llmwalk can run comes near. (It is also quicker:
# GGUFReader makes a numpy view of every string of a vocabulary, ~13 s for Gemma-3's 262,144 tokens.)
GGUF_MAX_ITEMS = 1 << 24        # entries of one array, keys, tensors (Gemma-3's vocabulary: 262,144 tokens)
GGUF_MAX_PARAMS = 2 * 10**9     # llmwalk converts to fp32 in memory: 8 GB of weights
_GGUF_SCALARS = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8",
                 12: "<f8"}     # GGUFValueType -> numpy dtype
_GGUF_STRING, _GGUF_ARRAY = 8, 9
_GGUF_TYPED = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16,
               "I32": np.int32, "I64": np.int64}    # tensor types stored as plain values; the others as blocks of bytes


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]      # as GGUF lists it, the fastest-varying dimension first
    data: np.ndarray            # a read-only view of the file: [.., shape[0]] values, or the quantized blocks' bytes


@dataclass(frozen=True)
class GGUFFile:
    fields: dict                # metadata key -> a number, a string, a numpy array or a list of strings
    tensors: list[GGUFTensor]


class _GGUFHeader:
    """A cursor over a GGUF file's header that refuses any claim the file's remaining bytes cannot hold."""

    def __init__(self, path: Path, data):
        self.path, self.data, self.pos, self.size = path, data, 0, len(data)

    def refuse(self, claim: str):
        raise CorruptModelFileError(f"{self.path} is not a readable GGUF file: {claim} (the file has "
                                    f"{self.size} bytes); it is damaged or not a model, re-download it")

    def skip(self, n: int, what: str) -> int:
        """Move past `n` bytes; where they start."""
        if n > self.size - self.pos:
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
        if n > GGUF_MAX_ITEMS or n * min_bytes > self.size - self.pos:
            self.refuse(f"{what} claims {n} items")
        return n

    def string(self, what: str) -> bytes:
        return self.take(self.uint(8, f"{what} (length)"), what)

    def value(self, vtype: int, what: str, depth: int = 0):
        dtype = _GGUF_SCALARS.get(vtype)
        if dtype:
            return np.frombuffer(self.take(np.dtype(dtype).itemsize, what), dtype)[0].item()
        if vtype == _GGUF_STRING:
            return self.string(what).decode("utf-8", "replace")
        if vtype == _GGUF_ARRAY and depth < 2:
            itype = self.uint(4, what)
            dtype = _GGUF_SCALARS.get(itype)
            n = self.count(what, np.dtype(dtype).itemsize if dtype else 8)   # a string or an array: >= 8 bytes
            if dtype:                                   # fixed-size elements: one read
                return np.frombuffer(self.take(n * np.dtype(dtype).itemsize, what), dtype)
            return [self.value(itype, what, depth + 1) for _ in range(n)]
        self.refuse(f"{what} has value type {vtype} (nested {depth} deep), which GGUF models do not use")


def read_gguf(path: Path) -> GGUFFile:
    """The metadata and tensors of the GGUF file `path` (the tensors as views of the file), every claim of its header
    checked first; CorruptModelFileError when it cannot be read, UnsupportedModelError when it is too large."""
    import mmap
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import quant_shape_to_byte_shape
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
            fields = {}
            for _ in range(h.count("the metadata key count", 13)):
                key = h.string("a metadata key").decode("utf-8", "replace")
                if key in fields:
                    h.refuse(f"the metadata key {key!r} appears twice")
                fields[key] = h.value(h.uint(4, f"metadata {key!r}"), f"metadata {key!r}")
            infos = []
            for _ in range(n_tensors):
                name = h.string("a tensor name").decode("utf-8", "replace")
                n_dims = h.uint(4, f"tensor {name!r}")
                if not 1 <= n_dims <= 4:
                    h.refuse(f"tensor {name!r} has {n_dims} dimensions (GGUF allows 1 to 4)")
                dims = tuple(h.uint(8, f"tensor {name!r}") for _ in range(n_dims))
                infos.append((name, dims, h.uint(4, f"tensor {name!r}"), h.uint(8, f"tensor {name!r}")))
            alignment = fields.get("general.alignment", 32)
            if not isinstance(alignment, int) or not 1 <= alignment <= 1 << 16 or alignment & (alignment - 1):
                h.refuse(f"general.alignment is {alignment!r} (a power of two is expected)")
            start = -(-h.pos // alignment) * alignment          # tensor data starts after the header, aligned
    file = np.memmap(path, dtype=np.uint8, mode="r")
    tensors, params, known = [], 0, set(GGMLQuantizationType)
    for name, dims, kind, offset in infos:
        if kind not in known:
            h.refuse(f"tensor {name!r} has an unknown type {kind}")
        if any(t.name == name for t in tensors):
            h.refuse(f"tensor {name!r} appears twice")
        kind = GGMLQuantizationType(kind)
        block, block_bytes = GGML_QUANT_SIZES[kind]
        n = math.prod(dims)
        if dims[0] % block or start + offset + n // block * block_bytes > h.size:
            h.refuse(f"tensor {name!r} claims shape {list(dims)} of {kind.name} at offset {offset}")
        raw = file[start + offset:start + offset + n // block * block_bytes]
        shape = tuple(reversed(dims))
        data = (raw.view(_GGUF_TYPED[kind.name]).reshape(shape) if kind.name in _GGUF_TYPED
                else raw.reshape(quant_shape_to_byte_shape(shape, kind)))
        tensors.append(GGUFTensor(name, kind, dims, data))
        params += n
    if params > GGUF_MAX_PARAMS:
        raise UnsupportedModelError(f"{path} holds {params:,} parameters; llmwalk computes in fp32 in "
                                    f"memory and loads models up to {GGUF_MAX_PARAMS:,}: pick a smaller model")
    return GGUFFile(fields, tensors)


def check_gguf(path: Path) -> None:
    """CorruptModelFileError unless `path` is a GGUF file whose header claims only what its size can hold."""
    read_gguf(path)


def _gguf_field(reader: GGUFFile, key: str, default=None):
    return reader.fields.get(key, default)


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
    vocab = len(reader.fields["tokenizer.ggml.tokens"])
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


def convert(path: Path, name: str, out: Path, progress: bool) -> None:
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
    model = finish(config, weights_from_flat(flat, config, str(path)), None, str(path))
    _save_gguf_tokenizer(path, name, config.family, out)
    save_converted(model, out)


# The tokenizer class transformers' AutoTokenizer picks for a GGUF file of each architecture. AutoTokenizer finds it
# by reading the model's config from the file, which for these architectures parses the whole file a second time
# with gguf's GGUFReader (~14 s for Gemma-3's 262,144-token vocabulary); naming the class skips that second parse.
# tests/test_tokens.py checks the class against the one AutoTokenizer picks.
TOKENIZER_CLASS = {"llama": "TokenizersBackend", "gemma3": "GemmaTokenizer"}


def _save_gguf_tokenizer(path: Path, name: str, family: str, out: Path) -> None:
    """Build the model's tokenizer from the vocabulary inside the GGUF file (via transformers, once)."""
    import transformers
    try:
        tok = getattr(transformers, TOKENIZER_CLASS[family]).from_pretrained(str(path.parent), gguf_file=path.name)
    except (KeyError, IndexError, ValueError) as e:     # e.g. KeyError('scores'), from deep in transformers
        raise CorruptModelFileError(f"{path}: transformers cannot build its tokenizer from the tokenizer.ggml.* "
                                    f"metadata ({type(e).__name__}: {e}): they are incomplete; re-download the file, "
                                    "or convert the model again with llama.cpp's convert_hf_to_gguf.py") from e
    tok.backend_tokenizer.save(str(out / "tokenizer.json"))
    TokenizerMeta(name=name, chat_template=tok.chat_template, bos_token=tok.bos_token, eos_token=tok.eos_token,
                  eos_token_ids=(tok.eos_token_id,)).save(out / "tokenizer_meta.json")
