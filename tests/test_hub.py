"""The class server recipe (classroom/hub/jupyterhub_config.py) run for real: JupyterHub from PyPI and its proxy
configurable-http-proxy from npm, on 127.0.0.1. Four students log in, get their notebooks handed out and their
servers spawned, and run one notebook's code cells in their `llmwalk` kernels at the same time, through the proxy
(REST and the kernel websocket, each with the student's own token); the outputs must equal the stored ones (compared
as nbval compares them, with notebooks/sanitize.cfg). The model cache is a read-only copy nothing may write to, and
the weights must be shared between the four kernels. Everything started is stopped at the end, checked by pid.

Only two parts of the recipe are replaced: the authenticator (DummyAuthenticator with a password) and the spawner
(SimpleLocalProcessSpawner runs every student as the current user; it does not enforce the recipe's mem_limit or
cpu_limit, which SystemdSpawner enforces on a real server)."""
import asyncio
import concurrent.futures
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import nbformat
import pytest
import requests

from llmwalk import class_kernel, classroom, model_cache, models
from markers import gemma_installed

pytest.importorskip("jupyterhub", reason="the class server test needs the classroom extra: pip install -e '.[classroom]'")
from nbval.plugin import coalesce_streams, find_comment_markers, find_metadata_tags, get_sanitize_patterns  # noqa: E402
from nbval.plugin import transform_streams_for_comparison  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "classroom" / "hub" / "jupyterhub_config.py"
NOTEBOOK = "01_one_second.ipynb"         # short, every output compared (no nbval-ignore cell but its timings)
STUDENTS = [f"student{i}" for i in range(1, 5)]
PASSWORD = "class-of-2026"
VENV = Path(sys.executable).parent.parent
# nbval's own list of what it does not compare (metadata, counts, widget model ids, images without nbdime).
SKIP_COMPARE = ("metadata", "traceback", "prompt_number", "output_type", "name", "execution_count",
                "application/vnd.jupyter.widget-view+json", "image/png", "image/jpeg")
SANITIZE = get_sanitize_patterns((REPO / "notebooks" / "sanitize.cfg").read_text())

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the recipe is for a Linux server")


def proxy_command() -> str:
    """configurable-http-proxy as the recipe finds it, or a failure that says how to install it (a skip only on a
    machine without npm outside CI)."""
    found = shutil.which("configurable-http-proxy") or VENV / "node_modules" / ".bin" / "configurable-http-proxy"
    if Path(found).exists():
        return str(found)
    fix = f"npm install --prefix {VENV} configurable-http-proxy (python llmwalk_setup.py test does it when npm exists)"
    if shutil.which("npm") is None and not os.environ.get("CI"):
        pytest.skip(f"no npm on this machine, so no configurable-http-proxy for JupyterHub: install Node.js, then {fix}")
    pytest.fail(f"configurable-http-proxy (JupyterHub's proxy, from npm) is missing: {fix}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def snapshot(tree: Path) -> dict:
    return {str(p.relative_to(tree)): (p.stat().st_size, p.stat().st_mtime_ns, p.stat().st_mode)
            for p in sorted([tree, *tree.rglob("*")])}


@pytest.fixture(scope="module")
def read_only_cache(tmp_path_factory):
    """A copy of the converted models the notebook loads (mtimes kept, so no re-hash), every file and folder a-w."""
    cache = tmp_path_factory.mktemp("class-cache")
    names = ["smollm2-135m"] + (["gemma3-270m"] if gemma_installed() else [])
    for name in names:
        src = models.REGISTRY[name]
        entry = models.cache_dir() / f"{name}-{src.sha256[:12]}-v{models.CONVERTER_VERSION}"
        if not (entry / model_cache.MANIFEST).exists():
            models.load_model(name, progress=False)          # convert it in the test cache first
        shutil.copytree(entry, cache / entry.name)
    for p in sorted([cache, *cache.rglob("*")], reverse=True):
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    yield cache
    for p in [cache, *cache.rglob("*")]:
        p.chmod(p.stat().st_mode | stat.S_IWUSR)


class Hub:
    """JupyterHub with the recipe's config and the test's two replacements, stopped (with everything it started)."""

    def __init__(self, root: Path, cache: Path, proxy: str):
        self.url, self.token = f"http://127.0.0.1:{free_port()}", uuid.uuid4().hex
        self.homes, state = root / "home", root / "state"
        self.homes.mkdir()
        state.mkdir()
        config = root / "jupyterhub_config.py"
        config.write_text(f"""
c = get_config()
load_subconfig({str(RECIPE)!r})
c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = {PASSWORD!r}
c.JupyterHub.spawner_class = "simple"
c.SimpleLocalProcessSpawner.home_dir_template = {str(self.homes / "{username}")!r}
c.JupyterHub.bind_url = {self.url!r}
c.JupyterHub.hub_bind_url = "http://127.0.0.1:{free_port()}"
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{free_port()}"
c.ConfigurableHTTPProxy.command = [{proxy!r}]
c.JupyterHub.services.append({{"name": "teacher", "api_token": {self.token!r}}})
c.Spawner.args = list(c.Spawner.args) + {["--allow-root"] if os.getuid() == 0 else []!r}   # a test machine's root
c.JupyterHub.load_roles.append({{"name": "teacher", "services": ["teacher"],
                                 "scopes": ["admin:users", "admin:servers", "tokens", "access:servers"]}})
""")
        path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        # LLMWALK_KSM=0: the test machine's KSM setting is left alone (test_class_kernel measures the merging).
        env = dict(os.environ, PYTHONPATH=path, LLMWALK_CACHE=str(cache), LLMWALK_HUB_STATE=str(state), LLMWALK_KSM="0")
        self.log = open(root / "jupyterhub.log", "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "jupyterhub", "-f", str(config)], cwd=state, env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        self.started: dict[int, str] = {}          # every process seen under the hub: pid -> its command line
        try:
            self.wait_until(self.answers, "the hub to answer", 90)
        except BaseException:
            self.stop()                            # the caller gets no Hub to stop
            raise

    def answers(self) -> bool:
        try:
            return self.api("GET", "/hub/api/").ok
        except requests.ConnectionError:
            return False

    def api(self, method: str, path: str, **kwargs) -> requests.Response:
        """A call to the hub's REST API as the teacher (a service with admin scopes)."""
        return requests.request(method, self.url + path, timeout=30, **kwargs,
                                headers={"Authorization": f"token {self.token}"})

    def wait_until(self, condition, what: str, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not condition():
            assert self.proc.poll() is None, f"the hub exited while waiting for {what}: {self.tail()}"
            assert time.monotonic() < end, f"timed out waiting for {what}: {self.tail()}"
            time.sleep(0.5)

    def tail(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()[-3000:]

    def processes(self) -> dict[int, str]:
        found = {}
        for pid in [self.proc.pid, *classroom.descendants(self.proc.pid)]:
            try:
                found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                pass
        self.started.update(found)
        return found

    def stop(self) -> list[str]:
        """Stop the hub as an administrator would (SIGTERM: it stops the servers and the proxy); kill what is left
        and return it."""
        self.processes()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        left = []
        for pid, cmdline in self.started.items():
            try:
                alive = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode() == cmdline
            except OSError:
                alive = False
            if alive and pid != self.proc.pid:
                left.append(cmdline)
                os.kill(pid, signal.SIGKILL)
        return left


def log_in(hub: Hub, name: str) -> None:
    """The login form, as a browser posts it (the hub's XSRF cookie included)."""
    browser = requests.Session()
    browser.get(hub.url + "/hub/login", timeout=30)
    reply = browser.post(hub.url + "/hub/login", allow_redirects=False, timeout=30, data={
        "username": name, "password": PASSWORD, "_xsrf": browser.cookies.get("_xsrf", "")})
    assert reply.status_code == 302 and "jupyterhub-session-id" in browser.cookies, \
        f"{name} could not log in: HTTP {reply.status_code}"
    wrong = requests.Session()
    wrong.get(hub.url + "/hub/login", timeout=30)
    refused = wrong.post(hub.url + "/hub/login", allow_redirects=False, timeout=30, data={
        "username": name, "password": "wrong", "_xsrf": wrong.cookies.get("_xsrf", "")})
    assert refused.status_code != 302, "the hub let a student in with a wrong password"


def spawn(hub: Hub, name: str) -> None:
    """Ask the hub to start the student's server (as the login page's redirect to /hub/spawn does)."""
    assert hub.api("POST", f"/hub/api/users/{name}/server").status_code in (201, 202), hub.tail()


def token_when_ready(hub: Hub, name: str) -> str:
    """Wait for the student's server; return a token of the student's own (what their browser would hold)."""
    hub.wait_until(lambda: hub.api("GET", f"/hub/api/users/{name}").json()["servers"].get("", {}).get("ready"),
                   f"{name}'s server", 180)
    reply = hub.api("POST", f"/hub/api/users/{name}/tokens", json={"note": "the test's browser"})
    assert reply.status_code == 201, reply.text
    return reply.json()["token"]


async def run_notebook(hub: Hub, name: str, token: str) -> tuple[nbformat.NotebookNode, list]:
    """Open the student's handed-out notebook through the proxy, start its kernel (a session, as JupyterLab does)
    and execute its code cells over the kernel websocket; return (the stored notebook, each code cell's outputs)."""
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect
    base, auth = f"/user/{name}/api", {"Authorization": f"token {token}"}
    path = f"llmwalk/{NOTEBOOK}"
    stored = await asyncio.to_thread(requests.get, f"{hub.url}{base}/contents/{path}", headers=auth, timeout=60)
    assert stored.ok, f"{name}'s handed-out notebook: HTTP {stored.status_code}"
    nb = nbformat.from_dict(stored.json()["content"])
    session = await asyncio.to_thread(requests.post, f"{hub.url}{base}/sessions", headers=auth, timeout=120, json={
        "path": path, "type": "notebook", "name": NOTEBOOK, "kernel": {"name": "llmwalk"}})
    assert session.status_code == 201, session.text
    kernel = session.json()["kernel"]["id"]
    ws = await websocket_connect(HTTPRequest(f"{hub.url.replace('http', 'ws')}{base}/kernels/{kernel}/channels",
                                             headers=auth))
    outputs = []
    try:
        for cell in nb.cells:
            if cell.cell_type == "code":
                outputs.append(await execute(ws, cell.source, name))
    finally:
        ws.close()
    return nb, outputs


async def execute(ws, code: str, name: str) -> list:
    msg_id = uuid.uuid4().hex
    ws.write_message(json.dumps({
        "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": name, "session": uuid.uuid4().hex,
                   "version": "5.3"},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                    "allow_stdin": False, "stop_on_error": True}}))
    outs = []
    while True:
        raw = await asyncio.wait_for(ws.read_message(), 900)
        assert raw is not None, f"{name}'s kernel websocket closed"
        if not isinstance(raw, str):
            continue                                     # binary frames: widget buffers
        msg = json.loads(raw)
        stopped = msg["msg_type"] == "status" and msg["content"].get("execution_state") in ("restarting", "dead")
        assert not stopped, f"{name}'s kernel stopped ({msg['content']['execution_state']}) while running:\n{code}"
        if msg.get("parent_header", {}).get("msg_id") != msg_id or msg["channel"] != "iopub":
            continue
        kind = msg["msg_type"]
        if kind in ("stream", "display_data", "execute_result", "error"):
            out = nbformat.v4.output_from_msg(msg)
            assert kind != "error", f"{name}'s cell failed: {out.ename}: {out.evalue}\n{code}"
            outs.append(out)
        elif kind == "clear_output":
            outs.clear()
        elif kind == "status" and msg["content"]["execution_state"] == "idle":
            return outs


# A student's first kernel builds matplotlib's font cache in the new home, and says so on stderr when that takes
# over 5 s (four students at once on a loaded test machine can): a notice of the machine, not of the notebook.
FONT_CACHE_NOTICE = "Matplotlib is building the font cache; this may take a moment.\n"


def comparable(outputs: list) -> dict:
    """nbval's view of a cell's outputs: streams merged, every key but those it skips, sanitized."""
    flat: dict[str, list] = {}
    outputs = [o for o in outputs if not (o.get("name") == "stderr" and o.get("text") == FONT_CACHE_NOTICE)]
    for out in transform_streams_for_comparison(coalesce_streams([nbformat.from_dict(o) for o in outputs])):
        for key, value in out.items():
            items = value.items() if key == "data" else [(key, value)]
            for k, v in items:
                if k not in SKIP_COMPARE:
                    flat.setdefault(k, []).append(sanitize(v))
    return flat


def sanitize(value):
    import re
    if isinstance(value, str):
        for regex, replace in SANITIZE:
            value = re.sub(regex, replace, value)
    return value


def connection_file(cmdline: str) -> str:
    """The kernel's connection file, from its command line (`... -f FILE`)."""
    words = cmdline.split()
    return words[words.index("-f") + 1]


def compared(cell) -> bool:
    markers = dict(find_comment_markers(cell.source)) | dict(find_metadata_tags(cell.metadata))
    return not markers.get("skip") and markers.get("check", True)


def test_four_students_run_a_notebook_at_once_through_the_hub(tmp_path, read_only_cache):
    before = snapshot(read_only_cache)
    hub = Hub(tmp_path, read_only_cache, proxy_command())
    try:
        for name in STUDENTS:
            log_in(hub, name)
        for name in STUDENTS:
            spawn(hub, name)
        tokens = {name: token_when_ready(hub, name) for name in STUDENTS}
        for name in STUDENTS:                                   # handed out on first login, both editions
            home = hub.homes / name / "llmwalk"
            assert (home / NOTEBOOK).exists() and (home / "zh" / NOTEBOOK).exists(), sorted(home.iterdir())
        assert any("jupyterhub_idle_culler" in cmd for cmd in hub.processes().values()), "no idle culler running"

        async def the_class():
            return await asyncio.gather(*(run_notebook(hub, name, tokens[name]) for name in STUDENTS))

        # In a thread of its own: an earlier test in this worker may have left an event loop running in this one.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            results = pool.submit(asyncio.run, the_class()).result()
        for name, (nb, outputs) in zip(STUDENTS, results):
            cells = [cell for cell in nb.cells if cell.cell_type == "code"]
            for i, (cell, got) in enumerate(zip(cells, outputs)):
                if compared(cell):
                    assert comparable(got) == comparable(cell.outputs), f"{name}, code cell {i}:\n{cell.source}"

        running = hub.processes()
        mem = {pid: classroom.memory(pid) for pid in running}
        kernels = [pid for pid, cmd in running.items() if "-m llmwalk.class_kernel" in cmd]
        assert len(kernels) == len(STUDENTS), f"the students' kernels are not the class's kernel spec: {running}"
        for pid in kernels:      # the layout KSM can merge (test_class_kernel.py), the extension loaded (it asks)
            assert int(Path(f"/proc/{pid}/personality").read_text(), 16) & class_kernel.ADDR_NO_RANDOMIZE, pid
            assert b"PYTHONHASHSEED=0" in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"), pid
            assert class_kernel.merges(pid) or not Path(f"/proc/{pid}/ksm_stat").exists(), pid
            connection = json.loads(Path(connection_file(running[pid])).read_text())   # no TCP port to collide on
            assert connection["transport"] == "ipc" and len(connection["ip"]) < 100, connection
        print(f"\nthe class's memory (PSS, MB), {len(STUDENTS)} students having run {NOTEBOOK}:")
        for role, pids in (("hub, proxy, culler", [p for p in running if p not in kernels and "singleuser" not in
                                                   running[p]]),
                           ("students' servers", [p for p in running if "singleuser" in running[p]]),
                           ("students' kernels", kernels)):
            print(f"  {role:20} {sum(mem[p].pss for p in pids):6.0f}  ({', '.join(f'{mem[p].pss:.0f}' for p in pids)})")
        print(f"  {'all of it':20} {sum(m.pss for m in mem.values()):6.0f}")
        for pid in kernels:      # the four kernels read one copy of the weights, from the class's cache
            weights = {path for path, _ in classroom.mappings(pid) if path.endswith(classroom.WEIGHTS_SUFFIX)}
            assert weights and all(path.startswith(f"{read_only_cache}/") for path in weights), weights
            assert mem[pid].weights_shared > 0.9 * mem[pid].weights_mapped > 0, mem[pid]
    finally:
        left = hub.stop()
    assert not left, f"still running after the hub stopped: {left}"
    assert snapshot(read_only_cache) == before, "something wrote to the shared read-only model cache"
