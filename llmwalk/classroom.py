"""The memory a class takes: N Jupyter kernels, each running a notebook's code cells, measured from /proc (Linux).

    python -m llmwalk.classroom [--kernels 1 4 8] [--notebook notebooks/04_layers.ipynb] [--ksm] [--plain-kernel]

The converted weights are one safetensors file that every kernel memory-maps copy-on-write: its pages sit in the page
cache once, however many kernels read them. A kernel's PSS (proportional set size) charges each page it shares with
n processes 1/n to each, so the PSS of the kernels adds up to the memory they take together, and what one more learner
costs is how much that sum grows per kernel. The private part (pages no other process maps) is split by where it
lives: anonymous memory (the heap, malloc's arenas, torch's buffers, the traces a notebook keeps), pages of a library
or file that this process wrote (a shared library's relocations: copied on write), and clean file pages nobody else
maps.

A class's kernels (class_kernel.py, the hub's kernel spec; this measurement's too unless told `--plain-kernel`) load
this module as an IPython extension (`load_ipython_extension`, below). Where KSM merges the pages those kernels hold
alike, the merged pages count 1/n in each of the n kernels, as shared file pages do (`--ksm` switches it on here).
"""
from __future__ import annotations

import argparse
import asyncio
import os
import re
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from .class_kernel import ksm_available, ksm_running, merge_identical_pages, wait_for_ksm, write_spec
from .tokens import return_freed_heap

WEIGHTS_SUFFIX = ".safetensors"
NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "04_layers.ipynb"
KERNEL = "llmwalk"
WITHOUT_GEMMA = "import llmwalk\nllmwalk.is_installed = lambda name: False   # the notebook's cells as if Gemma-3 were not installed"


@dataclass(frozen=True)
class Memory:
    """One process's memory in MB, from /proc/<pid>/smaps (smaps_rollup's PSS is the sum of the mappings' PSS)."""

    pss: float                  # proportional set size: private pages + each shared page / its number of mappers
    private_anonymous: float    # heap, malloc arenas, anonymous mmaps (tensors a notebook keeps, torch's buffers)
    private_written_files: float    # pages of mapped files this process wrote (shared libraries' relocations: COW)
    private_clean_files: float  # file pages (libraries, weights) that no other process has mapped
    weights_mapped: float       # resident pages of the mapped safetensors files, shared or not
    weights_shared: float       # of which other processes map too (Shared_Clean + Shared_Dirty)
    weights_written: float      # of which this process wrote: an in-place edit's private copy (Private_Dirty)

    @property
    def private(self) -> float:
        return self.private_anonymous + self.private_written_files + self.private_clean_files


def mappings(pid: int | str):
    """(path or "", {field: kB}) for each mapping of process `pid`."""
    text = Path(f"/proc/{pid}/smaps").read_text()       # pid "self": this process
    for block in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", text.strip()):
        head, _, body = block.partition("\n")
        parts = head.split(maxsplit=5)
        path = parts[5] if len(parts) == 6 else ""
        yield path, {k: int(v) for k, v in re.findall(r"^(\w+):\s+(\d+) kB", body, re.M)}


def memory(pid: int | str) -> Memory:
    """Process `pid`'s memory split as `Memory` says (Linux only: it reads /proc/<pid>/smaps)."""
    sums = dict.fromkeys(("pss", "anon", "written", "clean", "w_rss", "w_shared", "w_dirty"), 0)
    for path, f in mappings(pid):
        sums["pss"] += f.get("Pss", 0)
        private = f.get("Private_Clean", 0) + f.get("Private_Dirty", 0)
        if not path.startswith("/"):                # [heap], [stack], [anon:...], or no name: anonymous memory
            sums["anon"] += private
            continue
        written = min(f.get("Anonymous", 0), private)   # a file page that was written is an anonymous copy
        sums["written"] += written
        sums["clean"] += private - written
        if path.endswith(WEIGHTS_SUFFIX):
            sums["w_rss"] += f.get("Rss", 0)
            # Shared_Dirty too: a file copied moments ago has dirty page-cache pages until the kernel writes them back,
            # mapped by every reader all the same (a page this process wrote is a private copy: Private_Dirty).
            sums["w_shared"] += f.get("Shared_Clean", 0) + f.get("Shared_Dirty", 0)
            sums["w_dirty"] += f.get("Private_Dirty", 0)
    mb = {k: v / 1024 for k, v in sums.items()}
    return Memory(mb["pss"], mb["anon"], mb["written"], mb["clean"], mb["w_rss"], mb["w_shared"], mb["w_dirty"])


def load_ipython_extension(ip) -> None:
    """A class's kernel keeps less: no cache of every cell's result (IPython's Out[n] and _n hold each figure a
    notebook returned, with its drawn pixels, for the life of the kernel), and the heap a cell freed goes back to
    the OS after it (glibc keeps freed small blocks otherwise). Measured on 04: ~50 MB less per kernel (README)."""
    ip.displayhook.cache_size, ip.displayhook.do_full_cache = 0, False
    ip.events.register("post_run_cell", _after_cell)
    merge_identical_pages()         # pages alike in every student's kernel: one copy where KSM runs (class_kernel.py)


def _after_cell(result) -> None:
    return_freed_heap()


def descendants(pid: int) -> list[int]:
    """The processes started by `pid`, their children, ... (Linux: /proc/<pid>/task/*/children), `pid` excluded."""
    out, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:          # the process or thread ended meanwhile
                continue
            out += children
            todo += children
    return sorted(set(out))


def kernel_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment plus `extra` (e.g. MALLOC_ARENA_MAX), for the kernels."""
    return {**os.environ, **(extra or {})}


async def _class(n: int, notebook: Path, env: dict[str, str], timeout: int, prelude: str,
                 settle: Callable[[list[int]], None]) -> list[Memory]:
    """Start n kernels, run every code cell of `notebook` in each at the same time (after `prelude`, if any), wait for
    settle(their pids) once all are done, measure them all, stop them."""
    import nbformat
    from nbclient import NotebookClient
    done, measured = [asyncio.Event() for _ in range(n)], asyncio.Event()
    pids: list[int | None] = [None] * n

    async def learner(i: int) -> None:
        nb = nbformat.read(notebook, as_version=4)
        if prelude:
            nb.cells.insert(0, nbformat.v4.new_code_cell(prelude))
        client = NotebookClient(nb, kernel_name=KERNEL, timeout=timeout,
                                resources={"metadata": {"path": str(notebook.parent)}})
        try:
            async with client.async_setup_kernel(env=env):
                pids[i] = client.km.provisioner.process.pid
                for index, cell in enumerate(nb.cells):
                    if cell.cell_type == "code":
                        await client.async_execute_cell(cell, index)
                done[i].set()
                await measured.wait()           # the kernel keeps what the notebook made until all are measured
        finally:
            done[i].set()

    tasks = [asyncio.create_task(learner(i)) for i in range(n)]
    await asyncio.gather(*(d.wait() for d in done))
    try:
        for t in tasks:
            if t.done() and t.exception():
                raise t.exception()
        await asyncio.to_thread(settle, pids)
        return [memory(pid) for pid in pids]
    finally:
        measured.set()
        await asyncio.gather(*tasks, return_exceptions=True)


def measure_class(n: int, notebook: Path = NOTEBOOK, *, env: dict[str, str] | None = None, prelude: str = "",
                  class_kernel: bool = True, ksm: bool = False, timeout: int = 1800) -> list[Memory]:
    """The memory of each of n kernels (kernel name 'llmwalk') that each ran `notebook`'s code cells, all alive.

    class_kernel: the kernels a class runs (class_kernel.py's launcher and this module's extension, the spec the
    hub writes); else the venv's own. ksm: KSM switched on for the measurement (root), and the kernels measured
    once it has merged what it can (class_kernel.wait_for_ksm)."""
    settle = wait_for_ksm if ksm else (lambda pids: None)
    with tempfile.TemporaryDirectory() as folder, _jupyter_path(Path(folder) if class_kernel else None), \
            (ksm_running() if ksm else nullcontext()):
        if class_kernel:
            write_spec(Path(folder))
        return run_to_end(_class(n, Path(notebook), kernel_env(env), timeout, prelude, settle))


def run_to_end(coroutine):
    """asyncio.run(coroutine), also where this thread already runs an event loop (a notebook's kernel, a browser
    test's Playwright), which asyncio.run refuses: there on a thread of its own, waited for."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


@contextmanager
def _jupyter_path(folder: Path | None) -> Iterator[None]:
    """Kernel specs found in `folder` first (jupyter_client reads JUPYTER_PATH whenever it looks a spec up)."""
    before = os.environ.get("JUPYTER_PATH")
    if folder is not None:
        os.environ["JUPYTER_PATH"] = os.pathsep.join([str(folder), *([before] if before else [])])
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("JUPYTER_PATH", None)
        else:
            os.environ["JUPYTER_PATH"] = before


def report(runs: dict[int, list[Memory]]) -> str:
    """A table per run of kernels."""
    lines = []
    for n, kernels in runs.items():
        lines.append(f"{n} kernel{'s' * (n > 1)}: PSS sum {sum(k.pss for k in kernels):.0f} MB")
        lines.append("  kernel   PSS  private = anonymous + written file pages + clean file pages   "
                     "weights mapped (shared)")
        for i, k in enumerate(kernels):
            lines.append(f"  {i:>6} {k.pss:5.0f}  {k.private:7.0f}   {k.private_anonymous:9.0f}   "
                         f"{k.private_written_files:18.0f}   {k.private_clean_files:16.0f}   "
                         f"{k.weights_mapped:9.0f} ({k.weights_shared:.0f})")
    return "\n".join(lines)


def per_learner(runs: dict[int, list[Memory]]) -> dict[int, float]:
    """{n: MB each kernel beyond the first adds to the PSS sum, from 1 to n kernels} (needs a run of 1 kernel)."""
    one = sum(k.pss for k in runs[1])
    return {n: (sum(k.pss for k in kernels) - one) / (n - 1) for n, kernels in runs.items() if n > 1}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m llmwalk.classroom", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", type=int, nargs="+", default=[1, 4, 8], help="class sizes to measure")
    parser.add_argument("--notebook", type=Path, default=NOTEBOOK, help="the notebook each kernel runs")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable for the kernels (e.g. MALLOC_ARENA_MAX=2); repeatable")
    parser.add_argument("--plain-kernel", action="store_true",
                        help="the venv's own kernels, not the class's (class_kernel.py: the extension, which keeps no "
                             "Out cache and trims the heap, and the fixed layout that lets KSM merge their pages)")
    parser.add_argument("--ksm", action="store_true",
                        help="switch KSM on for the measurement (root; the hub's configuration does it on a server), "
                             "and measure once it has merged what it can")
    parser.add_argument("--without-gemma", action="store_true",
                        help="run the notebook as if Gemma-3 were not installed (SmolLM2 only)")
    args = parser.parse_args(argv)
    if args.ksm and not ksm_available():
        parser.error("--ksm needs Linux with KSM (/sys/kernel/mm/ksm) and root, to switch it on")
    env = dict(item.split("=", 1) for item in args.env)
    from .machine import memory_line        # imports torch: only the measuring command needs it
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {memory_line()}")
    print(f"notebook: {args.notebook}{' without Gemma-3' * args.without_gemma}; kernel environment: "
          f"{env or 'inherited'}; {'plain kernels' if args.plain_kernel else 'the class kernel (llmwalk.class_kernel)'}; "
          f"KSM {'switched on, measured after it merged' if args.ksm else 'as the machine has it'}", flush=True)
    prelude = WITHOUT_GEMMA if args.without_gemma else ""
    runs = {}
    for n in args.kernels:
        runs[n] = measure_class(n, args.notebook, env=env, prelude=prelude, class_kernel=not args.plain_kernel,
                                ksm=args.ksm)
        print(report({n: runs[n]}), flush=True)
    for n, mb in (per_learner(runs) if 1 in runs else {}).items():
        print(f"each learner beyond the first, from 1 to {n} kernels: {mb:.0f} MB")


if __name__ == "__main__":
    main()
