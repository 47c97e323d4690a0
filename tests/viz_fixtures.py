"""What the viz tests share: matplotlib headless (Agg, chosen before anything imports pyplot), SmolLM2 walked through
the running prompt, and what a figure shows as text. A viz test module imports it before llmwalk.viz."""
import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

import llmwalk as lw  # noqa: E402
from llmwalk.prompts import ENGLISH_QUESTION, PROMPT, QUESTION  # noqa: E402, F401  the tests' prompts

pytestmark = pytest.mark.usefixtures("one_thread")   # see conftest.py: a viz module sets it from here


@pytest.fixture(scope="module")
def model(smollm2):
    return smollm2


@pytest.fixture(scope="module")
def tok(model):
    return model.tokenizer


@pytest.fixture(scope="module")
def trace(model):
    """SmolLM2's recorded pass over the running prompt."""
    return lw.forward(model, model.tokenizer.encode(PROMPT))


@pytest.fixture(scope="module")
def logits(trace):
    """The next-token logits after the running prompt.  # [vocab]"""
    return trace.logits[-1]


def texts(fig: Figure) -> list[str]:
    """Every text drawn in a figure (titles, tick labels, annotations)."""
    return [t.get_text() for t in fig.findobj(matplotlib.text.Text)]
