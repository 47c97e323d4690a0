"""The class's kernel (llmwalk.classroom as an IPython extension, loaded by the hub's kernel spec): a cell's result is
not kept for the life of the kernel (IPython's Out[n] and _ would hold every figure a notebook returned), and the heap
is trimmed after every cell."""
import weakref

from IPython.core.interactiveshell import InteractiveShell

from llmwalk import classroom


class Figure:               # stands for what a viz call returns
    pass


def test_a_cells_result_is_not_kept_and_the_heap_is_trimmed_after_each_cell(monkeypatch):
    trims = []
    monkeypatch.setattr(classroom, "return_freed_heap", lambda: trims.append(1))
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
    finally:
        InteractiveShell.clear_instance()

