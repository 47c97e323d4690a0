"""The map of llmwalk computed from its imports: which module imports which (every import statement, at the top or
inside a function; `if TYPE_CHECKING:` blocks, read only by type checkers, left out), its cycles, and the README's
"Architecture" table with the "depends on" column as the imports say.

    python -m tests.architecture            # the table as the imports say, and whether the README's differs
    python -m tests.architecture --write    # rewrite the README's table: its "depends on" column from the imports,
                                            # a row for each new module, none for a module that is gone

tests/test_architecture.py fails while the README's table differs from it or a cycle exists.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "llmwalk"
README = ROOT / "README.md"
HEADING = "## Architecture"
HEADER = ("| module | responsibility | depends on |", "|---|---|---|")
PACKAGES = ("claims", "exercises", "viz")     # shown as one row each: `claims/`


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package by dotted name relative to it ("models", "viz.widgets"; "" is __init__.py)."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every Import / ImportFrom node, at any depth, outside `if TYPE_CHECKING:` blocks."""
    for node in ast.iter_child_nodes(tree):
        for child in node.orelse if isinstance(node, ast.If) and _is_type_checking(node) else [node]:
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child
            yield from _imports(child)


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that module `name` imports ("from . import convert_gguf" is the module convert_gguf,
    "from .. import Block" the package's __init__, "")."""
    is_package = path.name == "__init__.py"
    here = name.split(".") if name else []
    found = set()
    for node in _imports(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
            bases = [t for t in targets if t == "llmwalk" or t.startswith("llmwalk.")]
            found |= {_known(b.removeprefix("llmwalk").lstrip("."), known) for b in bases}
            continue
        if node.level == 0:
            if not (node.module == "llmwalk" or node.module.startswith("llmwalk.")):
                continue
            base = node.module.removeprefix("llmwalk").lstrip(".").split(".")
            base = [p for p in base if p]
        else:
            package = here if is_package else here[:-1]
            base = package[:len(package) - (node.level - 1)] + (node.module.split(".") if node.module else [])
        for alias in node.names:
            sub = ".".join(base + [alias.name])
            found.add(sub if sub in known else _known(".".join(base), known))
    return found - {name}


def _known(name: str, known: dict[str, Path]) -> str:
    if name not in known:
        raise ValueError(f"an import names llmwalk.{name}, which is not a module of the package")
    return name


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """{module: the package's modules it imports}, over every module of the package."""
    known = modules(package)
    return {name: imports_of(name, path, known) for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: each strongly connected set of more than one module (Tarjan), sorted."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def cell_name(module: str) -> str:
    """How the table names a module: `models.py`, `viz/` (for anything in viz), `__init__.py` (the package's)."""
    top = module.split(".")[0]
    if top in PACKAGES:
        return f"{top}/"
    return f"{module or '__init__'}.py"


def dependency_name(module: str) -> str:
    """How the "depends on" column names a module: `models`, `viz/`, `llmwalk` (the package's __init__)."""
    name = cell_name(module)
    return "llmwalk" if name == "__init__.py" else name.removesuffix(".py")


# ---------------------------------------------------------------- the README's table

def _split(line: str) -> list[str]:
    """The cells of a markdown table row (a `|` inside backticks is text, not a border)."""
    cells, cell, code = [], "", False
    for ch in line.strip().strip("|"):
        if ch == "`":
            code = not code
        if ch == "|" and not code:
            cells.append(cell.strip())
            cell = ""
        else:
            cell += ch
    return cells + [cell.strip()]


def read_table(text: str) -> tuple[int, int, list[tuple[list[str], str, str]]]:
    """(first line, end line, rows) of the table under the Architecture heading; a row is (the names its first cell
    lists in backticks that are modules or packages, its responsibility, its "depends on" cell)."""
    lines = text.split("\n")
    start = next(i for i, line in enumerate(lines) if line.startswith(HEADING))
    first = next(i for i in range(start, len(lines)) if lines[i].startswith("|"))
    end = next((i for i in range(first, len(lines)) if not lines[i].startswith("|")), len(lines))
    rows = []
    for line in lines[first + 2:end]:
        names_cell, responsibility, depends = _split(line)
        names = [n for n in names_cell.split("`")[1::2] if n.endswith((".py", "/"))]
        rows.append((names, responsibility, depends))
    return first, end, rows


def computed_rows(graph: dict[str, set[str]], rows: list[tuple[list[str], str, str]]):
    """The README's rows with their "depends on" as the imports say, a row for each module no row names (its
    docstring's first sentence as the responsibility), none for a name that is no module (a .py or a package; a
    row of data only, `strings/`, keeps its other names)."""
    cells = {}
    for module in graph:
        cells.setdefault(cell_name(module), set()).add(module)
    out, named = [], set()
    for names, responsibility, _ in rows:
        code = [n for n in names if n in cells]
        if not code:
            continue
        named |= set(code)
        out.append(([n for n in names if n in cells or not n.endswith(".py")], responsibility, code))
    for name in sorted(set(cells) - named):
        out.append(([name], _first_sentence(name), [name]))
    table = []
    for names, responsibility, code in out:
        members = set().union(*(cells[n] for n in code))
        deps = {dependency_name(d) for m in members for d in graph[m]} - {dependency_name(m) for m in members}
        table.append((names, responsibility, ", ".join(f"`{d}`" for d in sorted(deps)) or "—"))
    return table


def _first_sentence(cell: str) -> str:
    path = PACKAGE / (cell.rstrip("/") + "/__init__.py" if cell.endswith("/") else cell)
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or "(no docstring)"
    return " ".join(doc.split("\n\n")[0].split()).split(". ")[0].rstrip(".").replace("|", "\\|")


def render(rows) -> list[str]:
    return [*HEADER, *(f"| {', '.join(f'`{n}`' for n in names)} | {resp} | {deps} |" for names, resp, deps in rows)]


def table_lines(text: str | None = None) -> tuple[list[str], list[str]]:
    """(the README's table lines, the table as the imports say)."""
    text = README.read_text(encoding="utf-8") if text is None else text
    first, end, rows = read_table(text)
    return text.split("\n")[first:end], render(computed_rows(import_graph(), rows))


def main(argv: list[str]) -> int:
    text = README.read_text(encoding="utf-8")
    found, wanted = table_lines(text)
    for cycle in cycles(import_graph()):
        print("import cycle:", " <-> ".join(cycle))
    if found == wanted:
        print("README.md's architecture table matches the imports")
        return 0
    if "--write" in argv:
        first, end, _ = read_table(text)
        lines = text.split("\n")
        README.write_text("\n".join(lines[:first] + wanted + lines[end:]), encoding="utf-8")
        print(f"rewrote README.md's architecture table ({len(wanted) - 2} rows)")
        return 0
    print("README.md's architecture table differs from the imports; `python -m tests.architecture --write` "
          "rewrites it. The imports say:")
    print("\n".join(wanted))
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
