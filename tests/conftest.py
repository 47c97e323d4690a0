"""Shared fixtures: the real models are loaded once per test session."""
import pytest
import torch

import llmwalk as lw
import oracle


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module that opts in (pytestmark = pytest.mark.usefixtures("one_thread")).

    Decoding and elementwise passes over 100M weights are memory-bound, so one thread is about as fast; on a shared
    2-core machine OpenMP's second thread mostly waits for a busy core (measured: ~5x slower, up to 50x for plots).
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def smollm2():
    return lw.load_model("smollm2-135m", progress=False)


@pytest.fixture(scope="session")
def gemma():
    return lw.load_model("gemma3-270m", progress=False)


def hf_from_gguf(name: str):
    """transformers' own model loaded from the same GGUF file: the reference oracle.

    Converted once per machine and kept under llmwalk's cache (tests/oracle.py: keyed to the GGUF file and
    transformers' version, checked to reload identically, safe for concurrent pytest workers).
    """
    return oracle.hf_model(name)


@pytest.fixture(scope="session")
def hf_smollm2():
    return hf_from_gguf("smollm2-135m")


@pytest.fixture(scope="session")
def hf_gemma():
    return hf_from_gguf("gemma3-270m")


@pytest.fixture(scope="session")
def once_per_run(tmp_path_factory, testrun_uid, worker_id):
    """(name, compute) -> compute(), made once in a test run and shared by its workers: the first to ask computes it
    (the others wait) and pickles it into a folder of this run's. For a measurement two test files both need, in
    the same language and thread count (both part of the name), e.g. a section's claims."""
    import pickle

    from filelock import FileLock
    base = tmp_path_factory.getbasetemp()
    folder = (base if worker_id == "master" else base.parent / f"shared-{testrun_uid}") / "once"
    folder.mkdir(parents=True, exist_ok=True)

    def once(name: str, compute):
        path = folder / f"{name}-{lw.language()}-{torch.get_num_threads()}threads.pickle"
        with FileLock(f"{path}.lock"):
            if path.exists():
                return pickle.loads(path.read_bytes())
            value = compute()
            path.write_bytes(pickle.dumps(value))
            return value
    return once
