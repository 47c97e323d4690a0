"""A real JupyterLab on 127.0.0.1 and a headless Chromium driven by Playwright: the learner's first minute."""
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
import secrets

import pytest

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("LLMWALK_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-quic"]
# Settings a learner would not need, but a test does: every cell in the DOM (no windowing), no news pop-up.
LAB_SETTINGS = {"@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
                "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false"}}


def pytest_collection_modifyitems(config, items):
    reason = None
    if CHROMIUM is None:
        reason = "no Chromium: apt-get install chromium (python llmwalk_setup.py test does as root), or set LLMWALK_CHROMIUM"
    elif shutil.which("jupyter", path=str(Path(sys.executable).parent)) is None:
        reason = "JupyterLab is not installed in this environment: pip install -e '.[notebooks]'"
    for item in items:
        if reason and "e2e" in str(item.fspath):
            item.add_marker(pytest.mark.skip(reason=reason))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The Chinese edition is read with JupyterLab's own interface in Chinese (jupyterlab-language-pack-zh-cn, in the
# notebooks extra): the setting a learner picks under Settings → Language.
LAB_SETTINGS_ZH = {**LAB_SETTINGS, "@jupyterlab/translation-extension/plugin.jupyterlab-settings": {"locale": "zh_CN"}}


def _serve_lab(tmp: Path, settings: dict):
    """JupyterLab serving a copy of notebooks/ (so autosave never touches the stored notebooks), with `settings`."""
    root = tmp / "notebooks"
    shutil.copytree(REPO / "notebooks", root)
    for name, value in settings.items():
        (tmp / "settings" / Path(name).parent).mkdir(parents=True, exist_ok=True)
        (tmp / "settings" / name).write_text(json.dumps(value))
    token, port = secrets.token_hex(16), _free_port()
    env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(tmp / "settings"), JUPYTERLAB_WORKSPACES_DIR=str(tmp / "ws"),
               JUPYTER_CONFIG_DIR=str(tmp / "config"), JUPYTER_RUNTIME_DIR=str(tmp / "runtime"))
    log = open(tmp / "lab.log", "w")
    server = subprocess.Popen([str(Path(sys.executable).parent / "jupyter"), "lab", "--no-browser", "--allow-root",
                               "--ip=127.0.0.1", f"--port={port}", f"--IdentityProvider.token={token}",
                               f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True"],
                              env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=1)
                break
            except OSError:
                time.sleep(0.5)
        else:
            raise RuntimeError(f"JupyterLab did not start; see {tmp / 'lab.log'}")
        yield {"base": base, "token": token, "log": tmp / "lab.log"}
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    """JupyterLab in English."""
    yield from _serve_lab(tmp_path_factory.mktemp("lab"), LAB_SETTINGS)


@pytest.fixture(scope="session")
def lab_zh(tmp_path_factory):
    """JupyterLab with its interface in Simplified Chinese."""
    yield from _serve_lab(tmp_path_factory.mktemp("lab_zh"), LAB_SETTINGS_ZH)


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        yield b
        b.close()


def is_local(url: str) -> bool:
    """Served by this machine (JupyterLab on 127.0.0.1), or no request at all (data:, blob:, about:)."""
    parts = urllib.parse.urlsplit(url)
    return parts.scheme in ("data", "blob", "about") or parts.hostname in ("127.0.0.1", "localhost", "::1")


def _refuse_outside(context) -> list[str]:
    """Abort every request of `context`'s pages to anywhere but this machine before it is sent; return the list
    those requests' URLs are collected in."""
    outside = []
    context.route(lambda url: not is_local(url), lambda route: outside.append(route.request.url) or route.abort())
    return outside


@pytest.fixture
def refuse_outside():
    return _refuse_outside


@pytest.fixture
def page(browser):
    """A page that works offline: a request to anywhere but this machine is refused, and fails the test."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    outside = _refuse_outside(context)
    yield context.new_page()
    context.close()
    assert not outside, f"the page asked for something outside this machine: {outside}"


@pytest.fixture(scope="session")
def shots_dir(tmp_path_factory) -> Path:
    """Where screenshots go: docs/screenshots when LLMWALK_UPDATE_SCREENSHOTS=1, else a temporary folder."""
    if os.environ.get("LLMWALK_UPDATE_SCREENSHOTS") == "1":
        return REPO / "docs" / "screenshots"
    return tmp_path_factory.mktemp("screenshots")
