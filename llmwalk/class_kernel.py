"""The kernel a class's students run: `python -m llmwalk.class_kernel -f {connection_file}` (the hub's kernel spec).

Thirty students' kernels run the same imports (Python, torch, llmwalk, matplotlib) and load the same model, so most
of their private memory holds the same bytes in every kernel — but at different addresses, as address-space layout
randomization puts each process's heap and libraries elsewhere, and with dicts laid out by a per-process string hash
seed, so no two kernels' pages are alike. This launcher starts the kernel with both fixed (Linux: the process
personality ADDR_NO_RANDOMIZE, as `setarch -R` sets it; PYTHONHASHSEED=0), and the class's IPython extension
(llmwalk.classroom) asks the Linux kernel to merge this process's identical pages with other processes'
(prctl PR_SET_MEMORY_MERGE, Linux ≥ 6.4). Merging then happens where the server runs KSM (kernel samepage merging,
`/sys/kernel/mm/ksm/run` = 1, which the hub's configuration switches on): a merged page is one copy in RAM, and a
kernel that writes to it gets its own copy back. README.md, "Teaching a class", has what it saves and its cost.

Elsewhere (macOS, Windows, an older Linux) the kernel starts as usual.
"""
from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

ADDR_NO_RANDOMIZE = 0x0040000            # <linux/personality.h>
PR_SET_MEMORY_MERGE = 67                 # <linux/prctl.h>, Linux 6.4
KERNEL_ARGS = ["--InteractiveShellApp.extra_extensions=llmwalk.classroom"]   # the kernel's own, before the spec's


def fixed_layout() -> bool:
    """Turn address-space randomization off for the programs this process executes next; False where it cannot."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    current = libc.personality(0xFFFFFFFF)                  # 0xffffffff: query, change nothing
    return current != -1 and libc.personality(current | ADDR_NO_RANDOMIZE) != -1


def merge_identical_pages() -> bool:
    """Let the Linux kernel merge this process's identical pages with other processes' (KSM), all of them, those
    mapped later too; False where it cannot (not Linux, Linux < 6.4)."""
    if not sys.platform.startswith("linux"):
        return False
    return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_MEMORY_MERGE, 1, 0, 0, 0) == 0


def write_spec(folder: Path, python: str = sys.executable, name: str = "llmwalk") -> Path:
    """Write the kernel spec `name` (the name the notebooks ask for) that starts this launcher, into
    folder/kernels/<name> (a JUPYTER_PATH entry: found before the venv's own spec of the same name)."""
    spec = folder / "kernels" / name
    spec.mkdir(parents=True, exist_ok=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [python, "-m", "llmwalk.class_kernel", "-f", "{connection_file}"],
        "display_name": "llmwalk (class)", "language": "python", "metadata": {"debugger": True},
        "kernel_protocol_version": "5.5"}, indent=1))
    return spec


# ---------------------------------------------------------------- KSM, the Linux kernel's side (root only)

KSM = Path("/sys/kernel/mm/ksm")


def ksm_available() -> bool:
    """Whether this process can switch KSM on: Linux with KSM built in, and root (the files are root's)."""
    return (KSM / "run").exists() and os.access(KSM / "run", os.W_OK)


def ksm_full_scans() -> int:
    return int((KSM / "full_scans").read_text())


@contextmanager
def ksm_running(pages_to_scan: int = 5000) -> Iterator[None]:
    """KSM on, scanning `pages_to_scan` pages every 20 ms (a measurement wants the merging done in seconds; the
    default, 100, takes minutes for a class) and every page at every scan (smart_scan off: on, a page that did not
    merge while its kernel was still importing is skipped for several scans after), then the settings it found put
    back."""
    settings = {"pages_to_scan": str(pages_to_scan), "smart_scan": "0", "run": "1"}
    before = {name: (KSM / name).read_text().strip() for name in settings if (KSM / name).exists()}
    for name in before:
        (KSM / name).write_text(settings[name])
    try:
        yield
    finally:
        for name in reversed(before):
            (KSM / name).write_text(before[name])


def merges(pid: int) -> bool:
    """Whether process `pid` asked for its pages to be merged (Linux ≥ 6.4: /proc/<pid>/ksm_stat)."""
    try:
        return "ksm_merge_any: yes" in Path(f"/proc/{pid}/ksm_stat").read_text()
    except OSError:
        return False


def wait_for_ksm(pids: list[int], scans: int = 4, timeout: float = 300) -> None:
    """Wait until KSM has gone over every mergeable page `scans` more times (the first pass finds pages that are
    alike, the next merges those still unchanged); at once if none of `pids` has its pages merged (KSM then has
    nothing of theirs to scan, and may not scan at all)."""
    if not any(map(merges, pids)):
        return
    target, deadline = ksm_full_scans() + scans, time.monotonic() + timeout
    while ksm_full_scans() < target:
        if time.monotonic() > deadline:
            raise TimeoutError(f"KSM did not finish {scans} full scans in {timeout:.0f} s")
        time.sleep(0.2)


def _laid_out() -> bool:
    """Whether this process already runs with the fixed layout and hash seed (the launcher's second stage)."""
    if os.environ.get("PYTHONHASHSEED") != "0":
        return False
    if not sys.platform.startswith("linux"):
        return True
    return bool(int(Path("/proc/self/personality").read_text(), 16) & ADDR_NO_RANDOMIZE)


def _preload() -> None:
    """Import what every notebook imports before the kernel reads its connection file: what comes before these imports
    decides where their objects land, and the connection file (ports, key, paths) differs from kernel to kernel.
    The kernel starts anyway if one fails: the notebook's own import then says why."""
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")   # what ipykernel sets later
    try:
        import torch  # noqa: F401
        import llmwalk.viz  # noqa: F401
    except Exception:           # noqa: BLE001 (any failure here is the notebook's to report, in its first cell)
        pass


def main(argv: list[str] | None = None) -> None:
    """Start the IPython kernel (with the class's extension): first execute this module again with the layout and
    the hash seed fixed, then, in that process, import the notebooks' modules and run the kernel."""
    args = sys.argv[1:] if argv is None else argv
    if not _laid_out():
        fixed_layout()
        os.execve(sys.executable, [sys.executable, "-Xfrozen_modules=off", "-m", "llmwalk.class_kernel", *args],
                  {**os.environ, "PYTHONHASHSEED": "0"})
    if sys.path[0] in ("", os.getcwd()):        # as ipykernel_launcher: the kernel puts the notebook's folder back
        del sys.path[0]
    _preload()
    from ipykernel import kernelapp
    sys.argv = [sys.argv[0], *KERNEL_ARGS, *args]
    kernelapp.launch_new_instance()


if __name__ == "__main__":
    main()
