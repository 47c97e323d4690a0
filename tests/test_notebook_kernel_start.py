"""conftest.py (beside pyproject.toml): a notebook kernel that dies while starting (two workers' kernels racing for TCP ports) is
started again, up to three times; one that never starts still fails its notebook."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def conftest(monkeypatch):
    monkeypatch.delenv("LLMWALK_OTHER_CPU", raising=False)   # the kernel's environment is tests/test_platforms.py's
    spec = importlib.util.spec_from_file_location("notebooks_conftest", ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    import nbval.kernel
    monkeypatch.setattr(nbval.kernel, "start_new_kernel", nbval.kernel.start_new_kernel)   # restored afterwards
    spec.loader.exec_module(module)
    return module


def failing(times: int):
    """A kernel start that dies `times` times, then returns ('km', 'kc'); counts its calls."""
    calls = []

    def start(*args, **kwargs):
        calls.append(kwargs)
        if len(calls) <= times:
            raise RuntimeError("Kernel died before replying to kernel_info")
        return "km", "kc"
    return start, calls


@pytest.mark.parametrize("deaths", [0, 1, 2])
def test_a_kernel_that_dies_while_starting_is_started_again(conftest, monkeypatch, caplog, deaths):
    start, calls = failing(deaths)
    monkeypatch.setattr(conftest, "_start_new_kernel", start)
    import nbval.kernel
    assert nbval.kernel.start_new_kernel is conftest.start_new_kernel      # what RunningKernel calls
    assert nbval.kernel.start_new_kernel(kernel_name="python", cwd="x") == ("km", "kc")
    assert calls == [{"kernel_name": "python", "cwd": "x"}] * (deaths + 1)
    assert caplog.text.count("died while starting") == deaths


def test_a_kernel_that_never_starts_fails_after_three_starts(conftest, monkeypatch):
    start, calls = failing(10)
    monkeypatch.setattr(conftest, "_start_new_kernel", start)
    with pytest.raises(RuntimeError, match="Kernel died"):
        conftest.start_new_kernel(kernel_name="python")
    assert len(calls) == conftest.STARTS == 3
