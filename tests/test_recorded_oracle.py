"""The readable forward pass (record=True, the one the notebooks show) of every architecture against transformers.

test_loaders.py checks the fast path (record=False) on the same tiny random models; this checks what a trace
records: the residual stream after every layer, the final norm, the attention weights and the logits, each
against what transformers computes on the same weights (hidden_states and attentions of its eager attention).
"""
import pytest
import torch

import llmwalk as lw
from test_loaders import SUPPORTED, saved, tiny

# The fast path's bound in test_loaders.py: float32 on 64-wide toys agrees to ~1e-6; a wrong step is off by 1e-2+.
ATOL = 1e-4
CASES = [(k, o) for k, o in SUPPORTED if k in ("gpt2", "mistral", "qwen2")]


@pytest.mark.parametrize("kind,overrides", CASES, ids=[f"{k}-{o}" for k, o in CASES])
def test_recorded_trace_matches_transformers(tmp_path, kind, overrides):
    hf = tiny(kind, **overrides)
    hf.set_attn_implementation("eager")            # sdpa returns no attention weights
    model = lw.load_model(saved(hf, tmp_path))
    ids = torch.randint(0, 1000, (40,), generator=torch.Generator().manual_seed(1)).tolist()   # > window 8
    trace = lw.forward(model, ids)
    with torch.no_grad():
        ref = hf(torch.tensor([ids]), output_hidden_states=True, output_attentions=True)
    hidden = torch.cat(ref.hidden_states)          # the embeddings, each layer's output, the last one normed
    torch.testing.assert_close(trace.resid[:-1], hidden[:-1], atol=ATOL, rtol=0)
    torch.testing.assert_close(trace.final, hidden[-1], atol=ATOL, rtol=0)
    torch.testing.assert_close(trace.attn, torch.cat(ref.attentions), atol=ATOL, rtol=0)
    torch.testing.assert_close(trace.logits, ref.logits[0], atol=ATOL, rtol=0)
