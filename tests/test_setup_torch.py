"""The set-up picks torch's CPU build on a Linux without an NVIDIA GPU, for real: pip, run by the script's own step,
installs into a scratch venv from package indexes served on 127.0.0.1. One index stands for the configured registry
(a tiny fake `torch 2.13.0`, as PyPI's CUDA build is on Linux), the other for PyTorch's CPU index (a fake
`torch 2.13.0+cpu`)."""
import importlib.util
import os
import subprocess
import venv
from pathlib import Path

import pytest

from fake_index import dead_url, serve, simple_index

REPO = Path(__file__).resolve().parents[1]
BIN = "Scripts" if os.name == "nt" else "bin"


def load_setup_script():
    spec = importlib.util.spec_from_file_location("llmwalk_setup", REPO / "llmwalk_setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def indexes(tmp_path_factory):
    """http://127.0.0.1:<port>/registry/ (torch 2.13.0) and /cpu/ (torch 2.13.0+cpu), and a port nothing listens on."""
    root = tmp_path_factory.mktemp("indexes")
    simple_index(root / "registry", "torch", ["2.13.0"])
    simple_index(root / "cpu", "torch", ["2.13.0+cpu"])
    with serve(root) as base:
        yield {"registry": f"{base}/registry", "cpu": f"{base}/cpu", "dead": dead_url()}


@pytest.fixture(scope="module")
def scratch_venv(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("venv") / "scratch venv"
    venv.create(folder, with_pip=True)
    return folder / BIN / ("python.exe" if os.name == "nt" else "python")


@pytest.fixture
def installed_torch(indexes, scratch_venv, monkeypatch):
    """Runs the script's torch step into the scratch venv as on a GPU-less Linux, with only the local registry
    configured; returns the torch version pip installed there."""
    for name in [n for n in os.environ if n.startswith("PIP_")] + ["LLMWALK_TORCH", "LLMWALK_TORCH_CPU_INDEX"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)            # no find-links, no other index of this machine
    monkeypatch.setenv("PIP_INDEX_URL", indexes["registry"])
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    setup = load_setup_script()
    monkeypatch.setattr(setup, "wants_cpu_index", lambda platform: True)   # this Linux, or any: the choice is tested below

    def install() -> str:
        subprocess.run([scratch_venv, "-m", "pip", "uninstall", "-y", "-q", "torch"], check=True, capture_output=True)
        setup.install_torch(setup.pip_install(scratch_venv))
        return subprocess.run([scratch_venv, "-c", "import torch; print(torch.__version__)"], check=True,
                              capture_output=True, text=True).stdout.strip()
    return install


def test_the_cpu_build_is_picked_from_the_cpu_index(installed_torch, indexes, monkeypatch, capsys):
    monkeypatch.setenv("LLMWALK_TORCH_CPU_INDEX", indexes["cpu"])
    assert installed_torch() == "2.13.0+cpu"              # the registry offered 2.13.0 too: pip took the CPU build
    said = capsys.readouterr().out
    assert f"CPU build (torch==2.13.0+cpu) from PyTorch's CPU wheel index {indexes['cpu']}" in said
    assert "LLMWALK_TORCH" in said and said.count("torch: ") == 1       # what it chose and how to choose otherwise


def test_llmwalk_torch_is_obeyed(installed_torch, indexes, monkeypatch, capsys):
    monkeypatch.setenv("LLMWALK_TORCH_CPU_INDEX", indexes["cpu"])
    monkeypatch.setenv("LLMWALK_TORCH", "torch==2.13.0")                  # e.g. a CUDA build on purpose
    assert installed_torch() == "2.13.0"
    assert "torch: torch==2.13.0 (LLMWALK_TORCH)" in capsys.readouterr().out


def test_an_unreachable_cpu_index_falls_back_to_the_registry_and_says_so(installed_torch, indexes, monkeypatch, capsys):
    monkeypatch.setenv("LLMWALK_TORCH_CPU_INDEX", indexes["dead"])
    assert installed_torch() == "2.13.0"
    said = capsys.readouterr().out
    assert f"note: PyTorch's CPU wheel index {indexes['dead']} did not answer" in said and "Connection refused" in said


def test_the_build_is_chosen_by_platform(monkeypatch, tmp_path):
    """Linux without /dev/nvidia0: the CPU index; Linux with it, macOS, Windows: the registry's torch."""
    setup = load_setup_script()
    monkeypatch.delenv("LLMWALK_TORCH", raising=False)
    monkeypatch.setenv("LLMWALK_TORCH_CPU_INDEX", "http://127.0.0.1:9/cpu")
    monkeypatch.setattr(setup, "unreachable", lambda index: None)
    for platform, gpu, expected in [("linux", False, ["torch==2.13.0", "--extra-index-url", "http://127.0.0.1:9/cpu"]),
                                    ("linux", True, ["torch==2.13.0"]), ("darwin", False, ["torch==2.13.0"]),
                                    ("win32", False, ["torch==2.13.0"])]:
        monkeypatch.setattr(setup, "has_nvidia_gpu", lambda: gpu)
        assert setup.torch_spec(platform) == expected, (platform, gpu)
    monkeypatch.setenv("LLMWALK_TORCH", "skip")
    assert setup.torch_spec() == []
    monkeypatch.setenv("LLMWALK_TORCH", "torch==2.13.0 --index-url 'http://127.0.0.1:9/a b'")
    assert setup.torch_spec() == ["torch==2.13.0", "--index-url", "http://127.0.0.1:9/a b"]
