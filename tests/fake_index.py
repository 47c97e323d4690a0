"""Package indexes served on 127.0.0.1 for the set-up's tests: tiny fake wheels pip installs like real ones."""
import base64
import contextlib
import functools
import hashlib
import http.server
import socket
import threading
import zipfile
from pathlib import Path


def fake_wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A wheel pip installs like any other: one module that says its version, and valid metadata (with `requires`
    as its Requires-Dist lines)."""
    module = name.replace("-", "_")
    dist = f"{module}-{version}.dist-info"
    files = {f"{module}/__init__.py": f"__version__ = {version!r}\n",
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                 + "".join(f"Requires-Dist: {r}\n" for r in requires),
             f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: llmwalk-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{path},sha256={base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b'=').decode()},"
                     f"{len(text.encode())}\n" for path, text in files.items()) + f"{dist}/RECORD,,\n"
    wheel = folder / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in {**files, f"{dist}/RECORD": record}.items():
            z.writestr(path, text)
    return wheel


def simple_index(root: Path, name: str, versions: list[str], requires: tuple[str, ...] = ()) -> None:
    """A PEP 503 "simple" index in `root`: root/<name>/index.html links the wheels beside it."""
    folder = root / name
    folder.mkdir(parents=True)
    links = "".join(f'<a href="{fake_wheel(folder, name, v, requires).name.replace("+", "%2B")}">{v}</a>\n' for v in versions)
    (folder / "index.html").write_text(f"<!DOCTYPE html><html><body>\n{links}</body></html>\n")


@contextlib.contextmanager
def serve(root: Path):
    """`root` over HTTP on 127.0.0.1 while the block runs; yields its base address."""
    handler = functools.partial(type("Quiet", (http.server.SimpleHTTPRequestHandler,),
                                     {"log_message": lambda *a: None}), directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def dead_url() -> str:
    """An address on 127.0.0.1 nothing listens on: connections to it are refused at once."""
    with socket.socket() as closed:              # bound, never listened on, then freed
        closed.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{closed.getsockname()[1]}/cpu"
