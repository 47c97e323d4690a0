"""The reliability probe's small misuses (B21: G19, G20, Q6, Z7, Z8): each a clear error naming the fix."""
import pytest
import torch

import llmwalk as lw
from llmwalk.layers import causal_mask
from llmwalk.models import is_installed
from llmwalk.report import table
from llmwalk.speculative import verify
from llmwalk.weights import to_dtype


@pytest.fixture(scope="module")
def model():
    return lw.load_model()


@pytest.mark.parametrize("draft", [None, "model"])
def test_speculative_needs_a_draft(model, draft):            # G19: was AttributeError 'NoneType' has no 'reset'
    with pytest.raises(TypeError, match="ModelDraft"):
        lw.speculative_generate(model, model if draft == "model" else None, "Hi", max_new_tokens=2)


@pytest.mark.parametrize("drafted", [[20], [-1], [True]])
def test_verify_refuses_ids_outside_the_vocabulary(drafted):   # G20: was torch's "Class values must be smaller"
    p = torch.full((2, 10), 0.1)
    with pytest.raises(ValueError, match="not token ids of a 10-token vocabulary"):
        verify(p, None, drafted)


def test_verify_still_accepts_a_valid_draft():
    p = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    assert verify(p, None, [1]) == (1, 0)             # the draft token has all the mass: accepted, then the bonus


@pytest.mark.parametrize("dtype", [torch.int8, "bfloat16", torch.bool])
def test_to_dtype_refuses_what_is_not_a_float_dtype(model, dtype):    # Q6: was a matmul dtype error at generate
    with pytest.raises(TypeError, match="float dtype"):
        to_dtype(model.weights, dtype)


def test_to_dtype_converts_to_a_float_dtype(model):
    assert to_dtype(model.weights, torch.bfloat16).token_embd.dtype == torch.bfloat16


def test_is_installed_names_the_registered_models():    # Z7: was a raw KeyError
    with pytest.raises(ValueError, match="smollm2-135m"):
        is_installed("nope")


@pytest.mark.parametrize("args, match", [((-1,), "0 <= t <= s"), ((3, 2), "0 <= t <= s"), ((2.0,), "0 <= t <= s"),
                                         ((3, 3, 0), "window must be an int >= 1")])
def test_causal_mask_refuses_impossible_shapes(args, match):   # Z8: torch RuntimeError / odd or all-False masks
    with pytest.raises(ValueError, match=match):
        causal_mask(*args)


def test_causal_mask_with_a_cache_is_the_last_rows_of_the_full_mask():
    assert torch.equal(causal_mask(2, 5), torch.ones(5, 5, dtype=torch.bool).tril()[3:])


def test_table_refuses_ragged_rows_and_a_missing_header():      # Z8: IndexError / TypeError from deep inside
    with pytest.raises(ValueError, match=r"rows \[1\] do not have 2 cells"):
        table([(1, 2), (3,)], ("a", "b"))
    for header in (None, "ab", ()):
        with pytest.raises(TypeError, match="header must be a list"):
            table([], header)
