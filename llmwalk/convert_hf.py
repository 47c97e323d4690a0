"""Hugging Face directories (config.json + safetensors) of GPT-2, Llama, Mistral and Qwen2, read into llmwalk's
weights as transformers reads them; anything that would change the maths and llmwalk does not compute is refused.
"""
from __future__ import annotations

import json
from functools import partial
from pathlib import Path

from torch import Tensor

from .checkpoint import (PICKLE_SUFFIXES, Checkpoint, CorruptModelFileError, Model, UnknownModelError,
                         UnsupportedModelError, finish, pickle_refusal)
from .tokens import HFTokenizer, Tokenizer, TokenizerMeta, gpt2_tokenizer
from .weights import Block, Config, Linear, Weights

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
    return finish(config, weights, _hf_dir_tokenizer(path, name, config), str(path))


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
        raise pickle_refusal(path / pickles[0])
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


def _lm_head(hf: dict, ckpt: Checkpoint, embd: Tensor, path: Path, tied_default: bool) -> Tensor:
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
    ckpt = Checkpoint({k.removeprefix("transformer."): v for k, v in sd.items()})
    ckpt.check_layers(r"h\.(\d+)\.", hf["n_layer"], what=str(path), key="n_layer in config.json")
    d = hf["n_embd"]
    norm = partial(ckpt.norm, bias=True)
    lin = partial(ckpt.linear, bias=True)                 # GPT-2's Conv1D already holds [d_in, d_out]
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
    ckpt = Checkpoint(sd)
    ckpt.check_layers(r"model\.layers\.(\d+)\.", n_layer, what=str(path), key="num_hidden_layers in config.json")
    sliding_window, global_layers = _window(hf, kind, n_layer, path)
    qkv_bias = kind == "qwen2" or (kind == "llama" and hf.get("attention_bias", False))
    o_bias = kind == "llama" and hf.get("attention_bias", False)
    mlp_bias = kind == "llama" and hf.get("mlp_bias", False)
    norm = partial(ckpt.norm, bias=False)
    lin = partial(ckpt.linear, transposed=True)           # nn.Linear: [d_out, d_in]
    blocks = []
    for i in range(n_layer):
        p = f"model.layers.{i}"
        blocks.append(Block(
            attn_norm=norm(f"{p}.input_layernorm"), attn_q=lin(f"{p}.self_attn.q_proj", bias=qkv_bias),
            attn_k=lin(f"{p}.self_attn.k_proj", bias=qkv_bias), attn_v=lin(f"{p}.self_attn.v_proj", bias=qkv_bias),
            attn_output=lin(f"{p}.self_attn.o_proj", bias=o_bias), ffn_norm=norm(f"{p}.post_attention_layernorm"),
            ffn_gate=lin(f"{p}.mlp.gate_proj", bias=mlp_bias), ffn_up=lin(f"{p}.mlp.up_proj", bias=mlp_bias),
            ffn_down=lin(f"{p}.mlp.down_proj", bias=mlp_bias)))
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
