"""The class's kernel (llmwalk.class_kernel's launcher, llmwalk.classroom as an IPython extension, the hub's kernel
spec): a cell's result is not kept for the life of the kernel (IPython's Out[n] and _ would hold every figure a
notebook returned), the heap is trimmed after every cell, and the pages every student's kernel holds alike are
merged where KSM runs."""
import subprocess
import sys
import weakref

import nbformat
import pytest
from IPython.core.interactiveshell import InteractiveShell

from llmwalk import class_kernel, classroom


class Figure:               # stands for what a viz call returns
    pass


def test_a_cells_result_is_not_kept_and_the_heap_is_trimmed_after_each_cell(monkeypatch):
    trims, merges = [], []
    monkeypatch.setattr(classroom, "return_freed_heap", lambda: trims.append(1))
    monkeypatch.setattr(classroom, "merge_identical_pages", lambda: merges.append(1))
    ip = InteractiveShell.instance()
    try:
        ip.user_ns["Figure"] = Figure
        ip.run_cell("fig = Figure()")
        ref = weakref.ref(ip.user_ns["fig"])
        ip.run_cell("fig")                              # displayed as the cell's result
        ip.run_cell("%load_ext llmwalk.classroom")
        ip.run_cell("del fig")
        assert ref() is not None, "a plain kernel keeps a displayed result (Out, _): the test would not notice"
        ip.run_cell("fig = Figure()")
        ref = weakref.ref(ip.user_ns["fig"])
        ip.run_cell("fig")
        ip.run_cell("del fig")
        assert ref() is None, "the class kernel kept a cell's result after the learner deleted it"
        assert len(trims) == 5                          # after each cell from the one that loaded it on
        assert merges == [1]                            # asked once, at load
    finally:
        InteractiveShell.clear_instance()



def ksm_usable() -> str | None:
    """Why the merging cannot be measured here, or None: KSM must be switchable (Linux, root) and this Linux must
    take PR_SET_MEMORY_MERGE (6.4 and later)."""
    if not class_kernel.ksm_available():
        return "KSM cannot be switched on here (Linux with /sys/kernel/mm/ksm, and root)"
    probe = subprocess.run([sys.executable, "-c", "from llmwalk.class_kernel import merge_identical_pages as m; "
                            "print(m())"], capture_output=True, text=True)
    return None if probe.stdout.strip() == "True" else "this Linux has no PR_SET_MEMORY_MERGE (it came in 6.4)"


def test_class_kernels_pages_alike_are_merged_and_plain_kernels_are_not(tmp_path):
    """Two kernels that imported torch and llmwalk and loaded SmolLM2, KSM on, each asking for its pages to be merged:
    the class's kernels (fixed layout and hash seed) keep under half the private memory the venv's plain kernels
    keep. Without the fixed layout the same bytes sit at other addresses in each kernel, and next to nothing merges."""
    reason = ksm_usable()
    if reason:
        pytest.skip(f"{reason}: the merging of the class's kernels goes unmeasured on this machine")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "import torch\nimport llmwalk as lw\nmodel = lw.load_model()\nmodel.tokenizer.encode('The capital of France is')")])
    path = tmp_path / "load.ipynb"
    nbformat.write(nb, path)
    ask = "from llmwalk.class_kernel import merge_identical_pages\nassert merge_identical_pages()"
    private = {kind: [m.private_anonymous for m in classroom.measure_class(
        2, path, class_kernel=kind == "class", ksm=True, prelude="" if kind == "class" else ask, timeout=300)]
        for kind in ("class", "plain")}
    print(f"\nprivate anonymous MB after KSM, two kernels each: {private}")
    assert max(private["class"]) < 0.5 * min(private["plain"]), private


def test_a_class_is_measured_from_a_thread_that_already_runs_an_event_loop():
    """measure_class's coroutine runs to its end from inside a running loop too (a notebook's kernel; in the test run,
    a worker that ran the browser test, whose Playwright keeps a loop running): asyncio.run alone refuses there, which
    failed this module's KSM test whenever it came after the browser test on the same worker. Checked on a fresh
    thread, which runs no loop whatever this worker ran before."""
    import asyncio
    import threading
    from concurrent.futures import ThreadPoolExecutor

    async def which_thread():
        await asyncio.sleep(0)
        return threading.get_ident()

    async def inside_a_loop():
        return classroom.run_to_end(which_thread())

    async def plain_asyncio_run_inside_a_loop():
        coroutine = which_thread()
        try:
            return asyncio.run(coroutine)
        finally:
            coroutine.close()

    def checks():
        here = threading.get_ident()
        assert classroom.run_to_end(which_thread()) == here                   # no loop: asyncio.run, here
        assert asyncio.run(inside_a_loop()) != here                           # a loop: on a thread of its own
        with pytest.raises(RuntimeError, match="running event loop"):        # what asyncio.run alone does
            asyncio.run(plain_asyncio_run_inside_a_loop())
    with ThreadPoolExecutor(1) as pool:
        pool.submit(checks).result()
