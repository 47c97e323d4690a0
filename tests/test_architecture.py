"""The map matches the territory: no import cycle among llmwalk's modules, and the README's architecture table says
what the imports say (tests/architecture.py computes both; `python -m tests.architecture --write` fixes the table)."""
import pytest

import architecture


def test_no_module_of_llmwalk_imports_itself_through_others():
    """Every import counts, a function's too (`from .widgets import ...` inside a function is still a cycle, only
    hidden from the import system); TYPE_CHECKING blocks are left out, as they never run."""
    assert architecture.cycles(architecture.import_graph()) == []


def test_nothing_in_the_package_imports_the_benchmarks():
    """bench.py is a command at the top of the graph: what the claims or the lessons need from it (its prompts, its
    kernels, the timings the notebooks print, the CPU's name) lives in a module of its own."""
    assert [module for module, deps in architecture.import_graph().items() if "bench" in deps] == []


def test_the_readmes_architecture_table_lists_the_dependencies_the_imports_have():
    found, wanted = architecture.table_lines()
    assert found == wanted, ("README.md's architecture table differs from the imports: run "
                             "`python -m tests.architecture --write` (and check the rows it adds)")


def test_the_graph_sees_function_level_imports_and_skips_type_checking(tmp_path):
    """The two rules the checks above rely on, on a package made for the purpose: an import inside a function is
    an edge (a cycle through it is found), an import under `if TYPE_CHECKING:` is not."""
    pkg = tmp_path / "llmwalk"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nfrom . import b\nif TYPE_CHECKING:\n"
                              "    from .c import C\n")
    (pkg / "b.py").write_text("def f():\n    from .a import x\n")
    (pkg / "c.py").write_text("from .sub.d import y\nimport llmwalk.a\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "d.py").write_text("from .. import a\nfrom ..c import z\n")
    graph = architecture.import_graph(pkg)
    assert graph == {"": set(), "a": {"b"}, "b": {"a"}, "c": {"sub.d", "a"}, "sub": set(), "sub.d": {"a", "c"}}
    assert architecture.cycles(graph) == [["a", "b"], ["c", "sub.d"]]


def test_an_import_of_a_module_that_does_not_exist_is_named(tmp_path):
    pkg = tmp_path / "llmwalk"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .gone import x\n")
    with pytest.raises(ValueError, match="llmwalk.gone"):
        architecture.import_graph(pkg)
