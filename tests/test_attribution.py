"""Direct logit attribution: the parts add up to the run's logit, and each part equals a computation that does not
use llmwalk.attribution — a head zeroed through forward's hook, or transformers' own tensors."""
from dataclasses import replace

import pytest
import torch

import llmwalk as lw
from llmwalk import interventions as iv
from llmwalk.attribution import logit_attribution

FRANCE = "The capital of France is"


@pytest.fixture(scope="module")
def france(smollm2):
    return smollm2.tokenizer.encode(FRANCE)


@pytest.fixture(scope="module")
def trace(smollm2, france):
    return lw.forward(smollm2, france)


def _inverse_rms(x, eps):
    return 1 / torch.sqrt((x.double() ** 2).mean() + eps)


@pytest.mark.parametrize("word, position", [(" Paris", -1), (" Berlin", -1), (" the", 2)])
def test_the_parts_add_up_to_the_logit(smollm2, trace, word, position):
    token = smollm2.tokenizer.token_id(word)
    a = logit_attribution(smollm2, trace, token, position)
    real = trace.logits[position, token]
    assert a.logit == float(real)
    parts = torch.cat([torch.tensor([a.embedding]), a.heads.flatten(), a.ffns])
    assert len(parts) == 1 + smollm2.config.n_layer * (smollm2.config.n_head + 1)
    torch.testing.assert_close(parts.sum(), real, atol=1e-3, rtol=1e-4)
    assert a.total == pytest.approx(float(real), abs=1e-3)
    assert parts.abs().sum() > 2 * abs(float(real))          # parts of both signs: the sum is not one big part


def test_a_last_only_trace_gives_the_same_parts_at_the_last_position(smollm2, trace, france):
    paris = smollm2.tokenizer.token_id(" Paris")
    short = lw.forward(smollm2, france, last_only=True)
    a, b = logit_attribution(smollm2, trace, paris), logit_attribution(smollm2, short, paris)
    assert b.position == a.position == len(france) - 1
    torch.testing.assert_close(b.heads, a.heads)
    assert b.logit == pytest.approx(a.logit, abs=1e-4)
    with pytest.raises(ValueError, match="last position only"):
        logit_attribution(smollm2, short, paris, 2)


@pytest.mark.parametrize("layer, head", [(23, 4), (29, 1), (0, 0), (16, 8)])
def test_a_heads_part_is_what_zeroing_it_takes_from_the_stream_read_by_the_head(smollm2, trace, france, layer, head):
    """Zero the head through forward's hook: at its own layer the stream loses exactly what the head wrote. That
    vector, read along the final norm's weight and W_U's row with the run's 1/rms, is the head's part."""
    paris, w, pos = smollm2.tokenizer.token_id(" Paris"), smollm2.weights, len(france) - 1
    hooked = lw.forward(smollm2, france, hooks=iv.ablate_head(layer, head))
    written = trace.layers[layer].resid_mid[pos].double() - hooked.layers[layer].resid_mid[pos].double()
    expected = _inverse_rms(trace.resid[-1, pos], smollm2.config.norm_eps) * \
        (written * w.output_norm.weight.double()) @ w.output[paris].double()
    got = logit_attribution(smollm2, trace, paris).heads[layer, head]
    torch.testing.assert_close(got.double(), expected, atol=2e-4, rtol=1e-3)
    assert abs(float(expected)) > 1e-3 or (layer, head) == (0, 0)        # not a trivially empty part


@torch.no_grad()
def test_every_part_matches_transformers_tensors(smollm2, hf_smollm2, france):
    """The oracle: o_proj's input (the heads side by side), each MLP's output, the embedding and the final norm's
    input, captured with torch hooks on transformers' model; each head's part is its slice of o_proj's input times
    the matching columns of o_proj.weight, read through model.norm.weight and lm_head.weight."""
    hf, config = hf_smollm2.model, smollm2.config
    pos, d_head = len(france) - 1, config.d_head
    seen = {}
    handles = [hf.embed_tokens.register_forward_hook(lambda m, i, out: seen.__setitem__("emb", out[0, pos])),
               hf.norm.register_forward_pre_hook(lambda m, i: seen.__setitem__("resid", i[0][0, pos]))]
    for n, layer in enumerate(hf.layers):
        handles.append(layer.self_attn.o_proj.register_forward_pre_hook(
            lambda m, i, n=n: seen.__setitem__(("z", n), i[0][0, pos])))
        handles.append(layer.mlp.register_forward_hook(lambda m, i, out, n=n: seen.__setitem__(("ffn", n), out[0, pos])))
    logits = hf_smollm2(torch.tensor([france])).logits[0, pos]
    for h in handles:
        h.remove()
    paris = smollm2.tokenizer.token_id(" Paris")
    direction = hf.norm.weight.double() * hf_smollm2.lm_head.weight[paris].double()
    scale = _inverse_rms(seen["resid"], hf_smollm2.config.rms_norm_eps)
    ours = logit_attribution(smollm2, lw.forward(smollm2, france), paris)
    heads = torch.tensor([[float(scale * (seen[("z", n)][h * d_head:(h + 1) * d_head].double()
                                          @ layer.self_attn.o_proj.weight[:, h * d_head:(h + 1) * d_head].double().T)
                                 @ direction) for h in range(config.n_head)] for n, layer in enumerate(hf.layers)])
    ffns = torch.tensor([float(scale * seen[("ffn", n)].double() @ direction) for n in range(config.n_layer)])
    torch.testing.assert_close(ours.heads.double(), heads.double(), atol=2e-3, rtol=1e-3)
    torch.testing.assert_close(ours.ffns.double(), ffns.double(), atol=2e-3, rtol=1e-3)
    assert ours.embedding == pytest.approx(float(scale * seen["emb"].double() @ direction), abs=2e-3)
    assert ours.logit == pytest.approx(float(logits[paris]), abs=2e-3)


def test_gemma_s_post_attention_norm_is_frozen_too_and_the_parts_still_add_up(gemma):
    ids = gemma.tokenizer.encode("法国的首都是")
    trace = lw.forward(gemma, ids)
    token = int(trace.logits[-1].argmax())
    a = logit_attribution(gemma, trace, token)
    assert a.heads.shape == (gemma.config.n_layer, gemma.config.n_head)
    assert a.total == pytest.approx(float(trace.logits[-1, token]), abs=2e-3)
    # the heads of one layer, together, wrote what that layer's attention added to the stream
    layer = trace.layers[5]
    torch.testing.assert_close(a.head_out[5].sum(0), (layer.resid_mid - trace.resid[5])[-1].float(),
                               atol=1e-3, rtol=1e-3)


def test_bad_input_is_refused_with_a_clear_error(smollm2, trace, france):
    paris = smollm2.tokenizer.token_id(" Paris")
    with pytest.raises(TypeError, match="must be a Trace"):
        logit_attribution(smollm2, trace.logits, paris)
    with pytest.raises(ValueError, match="record=False"):
        logit_attribution(smollm2, lw.forward(smollm2, france, record=False), paris)
    for token in (" Paris", -1, smollm2.config.vocab_size, 3.0, True):
        with pytest.raises(ValueError, match="token must be a token id"):
            logit_attribution(smollm2, trace, token)
    for position in (5, -6, 1.0):
        with pytest.raises(ValueError, match=r"position must be an int in \[-5, 5\)"):
            logit_attribution(smollm2, trace, paris, position)
    doubled = lw.forward(smollm2, france, hooks={"blocks.12.attn_out": lambda a: 2 * a})
    with pytest.raises(ValueError, match="do not add up"):
        logit_attribution(smollm2, doubled, paris)
    gpt2_like = replace(smollm2, config=replace(smollm2.config, norm="layernorm"))
    with pytest.raises(ValueError, match="RMSNorm.*layernorm"):
        logit_attribution(gpt2_like, trace, paris)
    other = replace(smollm2, config=replace(smollm2.config, n_layer=12))
    with pytest.raises(ValueError, match="another model"):
        logit_attribution(other, trace, paris)
