"""Every architecture a Hugging Face directory may hold: equal to transformers on the same weights, or refused.

Each case is a tiny random model made by transformers itself and saved with save_pretrained(safe_serialization=True);
the reference is that same transformers model's logits.
"""
import json

import pytest
import torch

import llmwalk as lw
from llmwalk.checkpoint import UnsupportedModelError
from llmwalk.convert_hf import HF_TYPES
from llmwalk.model_cache import GGUF_DIGESTS
import oracle
from markers import needs_gemma

TINY = dict(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, hidden_size=64, intermediate_size=96,
            vocab_size=1000, max_position_embeddings=128)


def tiny(kind: str, **overrides):
    """A tiny random transformers model of `kind` (a model_type), in eval mode."""
    import transformers as tf
    torch.manual_seed(0)
    if kind == "gpt2":
        config = tf.GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=1000, n_positions=128, **overrides)
        return tf.GPT2LMHeadModel(config).eval()
    config_cls, model_cls = {"llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
                             "mistral": (tf.MistralConfig, tf.MistralForCausalLM),
                             "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
                             "gemma3_text": (tf.Gemma3TextConfig, tf.Gemma3ForCausalLM),
                             "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM)}[kind]
    model = model_cls(config_cls(**{**TINY, **overrides})).eval()
    with torch.no_grad():        # random biases: transformers initialises them to zero, which would hide a dropped one
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0, 0.5)
    return model


def saved(hf, tmp_path):
    hf.save_pretrained(tmp_path / "model", safe_serialization=True)
    return tmp_path / "model"


def max_logit_diff(model, hf, ids) -> float:
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    return (lw.forward(model, ids, record=False).logits - ref).abs().max().item()


# (model_type, config overrides): every configuration that changes the maths and that llmwalk computes
SUPPORTED = [
    ("gpt2", {}),
    ("gpt2", {"tie_word_embeddings": False}),
    ("llama", {}),
    ("llama", {"tie_word_embeddings": True}),
    ("llama", {"attention_bias": True}),
    ("llama", {"mlp_bias": True}),
    ("llama", {"head_dim": 32}),                        # head_dim != hidden_size / num_attention_heads
    ("llama", {"rope_parameters": {"rope_type": "default", "rope_theta": 500.0}}),
    ("mistral", {"sliding_window": 8}),
    ("mistral", {"sliding_window": None}),
    ("qwen2", {}),                                      # q/k/v biases
    ("qwen2", {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1}),
]


@pytest.mark.parametrize("kind,overrides", SUPPORTED, ids=[f"{k}-{o}" for k, o in SUPPORTED])
def test_accepted_architectures_match_transformers(tmp_path, kind, overrides):
    hf = tiny(kind, **overrides)
    model = lw.load_model(saved(hf, tmp_path))
    ids = torch.randint(0, 1000, (40,), generator=torch.Generator().manual_seed(1)).tolist()   # > window 8
    assert max_logit_diff(model, hf, ids) <= 1e-4
    assert model.config.n_params == sum(p.numel() for p in hf.parameters())
    assert model.config.family == kind


def test_every_accepted_model_type_is_covered():
    assert set(HF_TYPES) == {kind for kind, _ in SUPPORTED}


def test_sliding_window_is_really_used(tmp_path):
    """The mistral case above could pass if the window never mattered: without it the logits differ."""
    hf = tiny("mistral", sliding_window=8)
    model = lw.load_model(saved(hf, tmp_path))
    assert model.config.sliding_window == 8 and all(model.config.window(i) == 8 for i in range(3))
    ids = list(range(1, 41))
    from dataclasses import replace
    unwindowed = lw.models.Model(replace(model.config, sliding_window=None), model.weights, None, "test")
    assert max_logit_diff(unwindowed, hf, ids) > 1e-2


@pytest.mark.parametrize("kind,overrides,match", [
    ("llama", {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}, "rope_type='linear'"),
    ("llama", {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                   "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
                                   "rope_theta": 10000.0}}, "rope_type='llama3'"),
    ("llama", {"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ("gpt2", {"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
    ("gpt2", {"scale_attn_weights": False}, "scale_attn_weights"),
    ("gpt2", {"activation_function": "relu"}, "activation 'relu'"),
])
def test_unsupported_features_are_refused_by_name(tmp_path, kind, overrides, match):
    with pytest.raises(UnsupportedModelError, match=match):
        lw.load_model(saved(tiny(kind, **overrides), tmp_path))


@pytest.mark.parametrize("kind", ["gemma3_text", "qwen3"])
def test_other_model_types_are_refused(tmp_path, kind):
    with pytest.raises(UnsupportedModelError, match=f"model_type '{kind}' is not supported.*llama"):
        lw.load_model(saved(tiny(kind), tmp_path))


def test_tensors_the_config_does_not_explain_are_refused(tmp_path):
    """A Qwen2 checkpoint relabelled "llama" carries q/k/v biases the llama config does not mention."""
    path = saved(tiny("qwen2"), tmp_path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    with pytest.raises(UnsupportedModelError, match=r"tensors llmwalk does not compute with.*q_proj\.bias"):
        lw.load_model(path)


def test_untied_head_without_lm_head_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file
    path = saved(tiny("llama"), tmp_path)
    sd = load_file(str(path / "model.safetensors"))
    del sd["lm_head.weight"]
    save_file(sd, str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UnsupportedModelError, match="tie_word_embeddings=false without an lm_head"):
        lw.load_model(path)


def test_config_that_disagrees_with_the_weights_is_refused(tmp_path):
    path = saved(tiny("llama"), tmp_path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "num_key_value_heads": 4}))
    with pytest.raises(ValueError, match=r"do not match its config: blocks.0.attn_k.weight is \[64, 32\], "
                                         r"expected \[64, 64\]"):
        lw.load_model(path)


def test_quantized_checkpoints_are_refused(tmp_path):
    path = saved(tiny("llama"), tmp_path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "quantization_config": {"quant_method": "gptq"}}))
    with pytest.raises(UnsupportedModelError, match="quantized checkpoint \\(gptq\\)"):
        lw.load_model(path)


# ---------------------------------------------------------------- GGUF files a user may pass: llama and gemma3 only

def tiny_gguf(path, arch="llama", rope_scaling=False, extra_tensors=(), *, block_count=1, head_count=2,
              tokens=True, scores=True):
    """A one-layer fp32 GGUF file written with gguf's own writer (d_model 8, 2 heads, a sentencepiece vocab of 4).

    The keyword arguments make it hostile: a block_count or head_count its tensors do not have, no vocabulary.
    """
    import gguf
    import numpy as np
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(block_count), w.add_embedding_length(8), w.add_head_count(head_count), w.add_head_count_kv(2)
    w.add_feed_forward_length(16), w.add_context_length(32), w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    if tokens:
        w.add_token_list(["<unk>", "<s>", "a", "b"])
    if scores:
        w.add_token_scores([0.0, 0.0, -1.0, -2.0])
    if rope_scaling:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(2.0)
    rng = np.random.default_rng(0)
    shapes = {"token_embd.weight": (4, 8), "output_norm.weight": (8,), "blk.0.attn_norm.weight": (8,),
              "blk.0.ffn_norm.weight": (8,), "blk.0.attn_q.weight": (8, 8), "blk.0.attn_k.weight": (8, 8),
              "blk.0.attn_v.weight": (8, 8), "blk.0.attn_output.weight": (8, 8), "blk.0.ffn_gate.weight": (16, 8),
              "blk.0.ffn_up.weight": (16, 8), "blk.0.ffn_down.weight": (8, 16)}
    for name in extra_tensors:
        shapes[name] = (8,)
    for name, shape in shapes.items():
        w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return path


@pytest.mark.parametrize("kwargs,match", [
    ({"arch": "qwen2"}, "GGUF architecture 'qwen2' is not supported: llmwalk runs llama and gemma3"),
    ({"rope_scaling": True}, r"RoPE scaling \(linear"),
    ({"extra_tensors": ["blk.0.attn_q.bias"]}, r"tensors llmwalk does not compute with \(e.g. blocks.0.attn_q.bias"),
])
def test_unsupported_gguf_files_are_refused(tmp_path, monkeypatch, kwargs, match):
    monkeypatch.setenv("LLMWALK_CACHE", str(tmp_path / "cache"))
    with pytest.raises(UnsupportedModelError, match=match):
        lw.load_model(tiny_gguf(tmp_path / "tiny.gguf", **kwargs), progress=False)
    assert [p for p in (tmp_path / "cache").iterdir()                          # nothing half-converted is left
            if p.is_dir() and p.name != GGUF_DIGESTS] == []


def _read_alike(path, ref: dict) -> None:
    """llmwalk's read_gguf gives what gguf's own GGUFReader gives (`ref`: oracle.reader_facts): every metadata
    value, every tensor's type, shape, dtype and bytes."""
    import hashlib

    import numpy as np

    from llmwalk.convert_gguf import read_gguf
    ours = read_gguf(path)
    assert list(ours.fields) == list(ref["fields"])
    for key in ours.fields:
        mine, theirs = ours.fields[key], ref["fields"][key]
        assert (np.array_equal(mine, theirs) if isinstance(mine, np.ndarray) else mine == theirs), key
    assert [t.name for t in ours.tensors] == [t[0] for t in ref["tensors"]]
    for mine, (name, kind, shape, dtype, data_shape, sha) in zip(ours.tensors, ref["tensors"]):
        assert (mine.tensor_type, list(mine.shape), str(mine.data.dtype)) == (kind, shape, dtype), name
        assert list(mine.data.shape) == data_shape, name
        assert hashlib.sha256(np.ascontiguousarray(mine.data).data).hexdigest() == sha, name


def test_read_gguf_reads_the_tiny_file_as_gguf_does(tmp_path):
    path = tiny_gguf(tmp_path / "tiny.gguf")
    _read_alike(path, oracle.reader_facts(path))


@pytest.mark.parametrize("name", ["smollm2-135m", pytest.param("gemma3-270m", marks=needs_gemma)])
def test_read_gguf_reads_the_shipped_files_as_gguf_does(name):
    """SmolLM2's file holds Q4_1, Q8_0 and F32 tensors, Gemma-3's Q4_K, Q5_0, Q6_K, Q8_0 and F32 ones, and
    vocabularies of 49,152 and 262,144 tokens. GGUFReader's reading is kept once per machine (tests/oracle.py)."""
    from llmwalk import models
    _read_alike(models.REGISTRY[name].locate(models.cache_dir()), oracle.gguf_reader(name))
