"""The English and the Chinese edition of the notebooks stay in step (issue 15): every notebook has its twin under
notebooks/zh/ (same relative path) and back; twins have the same code cells in the same order, equal as Python
token streams once string literals and comments are set aside (only those may be translated), the same
`# NBVAL_...` markers and the same cell tags. Each edition's first code cell sets its language."""
import io
import re
import tokenize
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
STRING = "<string>"
SKIPPED = {tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER}   # no code in them
FSTRING_START, FSTRING_END = (getattr(tokenize, name, None) for name in ("FSTRING_START", "FSTRING_END"))
NBVAL = re.compile(r"#\s*(NBVAL_\w+)")


def code_tokens(source: str) -> list[tuple[str, int]]:
    """(token text, line) of a code cell, every string literal one STRING placeholder: implicit concatenation
    ("a" "b") and, on Python >= 3.12, the pieces of an f-string fold into one, as Python 3.11 tokenizes them.
    Comments and blank lines are left out: a translated comment may take more or fewer lines."""
    out: list[tuple[str, int]] = []
    depth = 0                                           # inside an f-string (3.12+ splits it into tokens)
    for tok in tokenize.generate_tokens(io.StringIO(source + "\n").readline):
        if FSTRING_START is not None and tok.type in (FSTRING_START, FSTRING_END):
            depth += 1 if tok.type == FSTRING_START else -1
            text = STRING
        elif depth or tok.type == tokenize.STRING:
            text = STRING
        elif tok.type in SKIPPED or (tok.type == tokenize.NEWLINE and not tok.string):
            continue
        else:
            text = tok.string
        if text == STRING and out and out[-1][0] == STRING:
            continue
        out.append((text, tok.start[0]))
    return out


def code_cells(path: Path) -> list[nbformat.NotebookNode]:
    return [cell for cell in nbformat.read(path, as_version=4).cells if cell.cell_type == "code"]


def _tags(cell) -> list[str]:
    return list(cell.metadata.get("tags", []))


def _first_difference(a: list, b: list) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x[0] != y[0]), min(len(a), len(b)))


def _token_at(tokens: list, i: int) -> str:
    return f"{tokens[i][0]!r} (line {tokens[i][1]})" if i < len(tokens) else "the end of the cell"


def edition_problems(english: Path, chinese: Path, name: str = "") -> list[str]:
    """What differs between the code of two twin notebooks, each problem naming the notebook (`name`, by default
    the English file's), the cell and the first differing token; [] when they are in step."""
    name = name or english.name
    en_cells, zh_cells = code_cells(english), code_cells(chinese)
    problems = []
    if len(en_cells) != len(zh_cells):
        problems.append(f"{name}: {len(en_cells)} code cells in English, {len(zh_cells)} in Chinese")
    for n, (en, zh) in enumerate(zip(en_cells, zh_cells), start=1):
        where = f"{name}, code cell {n}"
        try:
            a, b = code_tokens(en.source), code_tokens(zh.source)
        except (tokenize.TokenError, SyntaxError) as error:
            problems.append(f"{where}: cannot be tokenized ({error})")
            continue
        if [text for text, _ in a] != [text for text, _ in b]:
            i = _first_difference(a, b)
            problems.append(f"{where}: code differs at token {i + 1}: English {_token_at(a, i)}, "
                            f"Chinese {_token_at(b, i)}")
        if NBVAL.findall(en.source) != NBVAL.findall(zh.source):
            problems.append(f"{where}: NBVAL markers differ: {NBVAL.findall(en.source)} vs {NBVAL.findall(zh.source)}")
        if _tags(en) != _tags(zh):
            problems.append(f"{where}: tags differ: {_tags(en)} vs {_tags(zh)}")
    other = [[_tags(c) for c in nbformat.read(p, as_version=4).cells if c.cell_type != "code" and _tags(c)]
             for p in (english, chinese)]
    if other[0] != other[1]:
        problems.append(f"{name}: markdown cells' tags differ: {other[0]} vs {other[1]}")
    return problems


def _editions(root: Path = NOTEBOOKS) -> list[str]:
    """Every notebook's path relative to its edition (root/ English, root/zh/ Chinese), in either edition."""
    english = {p.relative_to(root) for p in root.rglob("*.ipynb")
               if p.relative_to(root).parts[0] != "zh" and ".ipynb_checkpoints" not in p.parts}
    chinese = {p.relative_to(root / "zh") for p in (root / "zh").rglob("*.ipynb")
               if ".ipynb_checkpoints" not in p.parts}
    return sorted(str(p) for p in english | chinese)


def missing_twin(notebook: str, root: Path = NOTEBOOKS) -> str | None:
    if not (root / notebook).exists():
        return f"notebooks/zh/{notebook} has no English twin notebooks/{notebook}"
    if not (root / "zh" / notebook).exists():
        return f"notebooks/{notebook} has no Chinese twin notebooks/zh/{notebook}"
    return None


@pytest.mark.parametrize("notebook", _editions())
def test_the_two_editions_have_the_same_code(notebook):
    problem = missing_twin(notebook)
    assert problem is None, problem
    problems = edition_problems(NOTEBOOKS / notebook, NOTEBOOKS / "zh" / notebook, notebook)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("notebook", _editions())
@pytest.mark.parametrize("edition, language", [("", "en"), ("zh", "zh")])
def test_the_first_code_cell_sets_the_editions_language(notebook, edition, language):
    path = NOTEBOOKS / edition / notebook
    if not path.exists():
        pytest.fail(f"notebooks/{edition + '/' if edition else ''}{notebook} is missing (see the test above)")
    assert f'lw.set_language("{language}")' in code_cells(path)[0].source, \
        f"the first code cell of {path.relative_to(NOTEBOOKS.parent)} must call lw.set_language(\"{language}\")"


def test_there_are_notebooks_to_compare():
    assert len(_editions()) >= 12


# ---------------------------------------------------------------- the test of the test

def _notebook(path: Path, *sources: str, tags: tuple = ()) -> Path:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# title")] +
                                  [nbformat.v4.new_code_cell(s) for s in sources])
    for cell in nb.cells[1:]:
        cell.metadata["tags"] = list(tags)
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


ENGLISH = ('import llmwalk as lw\nlw.set_language("en")\nmodel = lw.load_model()  # SmolLM2, offline',
           '# NBVAL_IGNORE_OUTPUT\nids = model.tokenizer.encode("The capital of France is")\n'
           'print(f"{len(ids)} tokens", "and"\n      " more")')


def test_only_strings_and_comments_may_differ(tmp_path):
    english = _notebook(tmp_path / "en" / "01.ipynb", *ENGLISH)
    chinese = _notebook(tmp_path / "zh" / "01.ipynb",
                        'import llmwalk as lw\nlw.set_language("zh")\n# 默认模型\n# SmolLM2，离线\n'
                        'model = lw.load_model()',
                        '# NBVAL_IGNORE_OUTPUT\nids = model.tokenizer.encode("The capital of France is")\n'
                        'print(f"{len(ids)} 个词块", "以及更多")')
    assert edition_problems(english, chinese) == []


def test_a_changed_statement_fails_naming_the_notebook_cell_and_token(tmp_path):
    english = _notebook(tmp_path / "en" / "01.ipynb", *ENGLISH)
    chinese = _notebook(tmp_path / "zh" / "01.ipynb", ENGLISH[0],
                        ENGLISH[1].replace("model.tokenizer.encode", "model.tokenizer.decode"))
    (problem,) = edition_problems(english, chinese)
    assert "01.ipynb" in problem and "code cell 2" in problem and "'encode'" in problem and "'decode'" in problem


@pytest.mark.parametrize("change", [
    lambda cells: cells[:1],                                                        # a cell missing
    lambda cells: cells[::-1],                                                      # cells reordered
    lambda cells: (cells[0], cells[1].replace("# NBVAL_IGNORE_OUTPUT\n", "")),      # a marker dropped
    lambda cells: (cells[0].replace("= lw.load_model()", "= lw.load_model('gpt2')"), cells[1]),   # an argument added
])
def test_missing_reordered_unmarked_or_changed_cells_fail(tmp_path, change):
    english = _notebook(tmp_path / "en" / "01.ipynb", *ENGLISH)
    chinese = _notebook(tmp_path / "zh" / "01.ipynb", *change(ENGLISH))
    assert edition_problems(english, chinese)


def test_a_notebook_in_one_edition_only_fails_both_ways(tmp_path):
    _notebook(tmp_path / "01.ipynb", *ENGLISH)
    _notebook(tmp_path / "zh" / "01.ipynb", *ENGLISH)
    _notebook(tmp_path / "deep_dives" / "kv.ipynb", *ENGLISH)
    _notebook(tmp_path / "zh" / "02.ipynb", *ENGLISH)
    assert _editions(tmp_path) == ["01.ipynb", "02.ipynb", "deep_dives/kv.ipynb"]
    assert missing_twin("01.ipynb", tmp_path) is None
    assert "no English twin notebooks/02.ipynb" in missing_twin("02.ipynb", tmp_path)
    assert "no Chinese twin notebooks/zh/deep_dives/kv.ipynb" in missing_twin("deep_dives/kv.ipynb", tmp_path)


def test_different_tags_fail(tmp_path):
    english = _notebook(tmp_path / "en" / "01.ipynb", *ENGLISH, tags=("your-turn",))
    chinese = _notebook(tmp_path / "zh" / "01.ipynb", *ENGLISH)
    assert any("tags differ" in p for p in edition_problems(english, chinese))


# The test command checks each twin in one configuration (llmwalk_setup.py): the Chinese edition with this CPU's
# kernels, the English one with torch's portable kernels and numba for a plain x86-64. That checks every computation
# both ways only if the two editions' stored outputs print the same numbers: a float a kernel computed is printed
# with a decimal point; the Chinese edition writes the article's own 1.2 亿 and 3.6 亿 where the English one writes
# 120 M and 360 M (its integers), and widgets' reprs are cut at different lengths.
DECIMAL = re.compile(r"(?<![\w.])-?\d+\.\d+(?:e[-+]?\d+)?(?!\s*亿)")


def printed_decimals(cell) -> list[str]:
    """The decimal numbers of a code cell's stored text outputs, sorted (a sentence may put them in another order)."""
    texts = [output.get("text", "") if output.output_type == "stream" else output.get("data", {}).get("text/plain", "")
             for output in cell.get("outputs", []) if "image/png" not in output.get("data", {})]
    return sorted(n for text in texts if not text.startswith(("VBox(", "HBox(")) for n in DECIMAL.findall(text))


@pytest.mark.parametrize("notebook", _editions())
def test_the_two_editions_print_the_same_numbers(notebook):
    english, chinese = code_cells(NOTEBOOKS / notebook), code_cells(NOTEBOOKS / "zh" / notebook)
    for i, (en, zh) in enumerate(zip(english, chinese)):
        if "NBVAL_IGNORE_OUTPUT" in en.source:            # what varies by machine: neither edition's is checked
            continue
        assert printed_decimals(en) == printed_decimals(zh), (notebook, f"code cell {i}")


def test_a_number_printed_in_one_edition_only_fails(tmp_path):
    english = _notebook(tmp_path / "en.ipynb", "print(0.25)")
    chinese = _notebook(tmp_path / "zh.ipynb", "print(0.25)")
    for path, text in ((english, "p = 0.25, 1.2 亿\n"), (chinese, "p = 0.25，1.2 亿\n")):
        nb = nbformat.read(path, as_version=4)
        nb.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
        nbformat.write(nb, path)
    same = [printed_decimals(code_cells(p)[0]) for p in (english, chinese)]
    assert same[0] == same[1] == ["0.25"]
    cell = code_cells(chinese)[0]
    cell.outputs[0].text = "p = 0.26\n"
    assert printed_decimals(cell) != same[0]
