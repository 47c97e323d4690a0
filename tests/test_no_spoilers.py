"""No predict-then-reveal answer is printed before its question, in the stored notebooks of both editions.

For each cell that calls `reveal(`, the answer is read from its stored output (the formats of
strings/<lang>/exercises.toml [reveal]). The question is the markdown cell before the `guess = ...` cell; every cell
before the question must not show that answer in its stored text output. Cells between the question and the reveal
may (the learner has written a guess by then: a claims table there is fine). To keep clear of numbers that merely
recur, the answer is matched as printed:
- a number with decimals (0.67): any number printed to at least as many decimals that rounds to it, and the same as
  a percentage (67.3 %);
- a number with a unit (188.7 MB): such a number followed by the unit;
- a whole number (10): printed as that number on a line that also shows one of the reveal cell's own literals
  (top_p_filter(logits, 0.9) → "0.9", the prompt "The capital of France is"): a count means nothing without what it
  counts;
- text (' Berlin'): the answer's repr, quotes included.
"""
import ast
import json
import re
import subprocess
from pathlib import Path

import pytest

from llmwalk import i18n

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
NUMBER = re.compile(r"(?<![\w.])(-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?)(?![\w.]*\d)(\s?%)?")


def reveal_patterns() -> list[re.Pattern]:
    """The reveal formats of both languages, each with the answer as a named group."""
    patterns = []
    for lang in ("en", "zh"):
        for key, text in i18n.table(lang).items():
            if not key.startswith("exercises.reveal."):
                continue
            rx = re.escape(text).replace(r"\{answer\}", "(?P<answer>.+?)").replace(r"\{guess\}", ".+?")
            patterns.append(re.compile(rx))
    return patterns


def text_output(cell: dict) -> str:
    """A cell's stored text: its streams and the text/plain of its results (figures are pictures, not text)."""
    parts = []
    for out in cell.get("outputs", []):
        text = out.get("text") if out.get("output_type") == "stream" else out.get("data", {}).get("text/plain")
        if text:
            parts.append("".join(text) if isinstance(text, list) else text)
    return "\n".join(parts)


def source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def answer_of(cell: dict) -> str | None:
    out = text_output(cell)
    for p in reveal_patterns():
        for line in out.splitlines():
            m = p.fullmatch(line.strip())
            if m:
                return m.group("answer")
    return None


def guess_name(code: str) -> str:
    """The variable a reveal cell passes as the guess: reveal(guess, answer) → "guess"."""
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "reveal" \
                and node.args and isinstance(node.args[0], ast.Name):
            return node.args[0].id
    return "guess"


def literals(code: str) -> set[str]:
    """The constants a reveal cell computes its answer from (not reveal's own keyword arguments, not small
    integers that index or round): the words a line must share with a whole-number answer."""
    tree = ast.parse(code)
    skip = {id(k.value) for node in ast.walk(tree) if isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", "")) == "reveal" for k in node.keywords}
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and id(node) not in skip:
            v = node.value
            if isinstance(v, str) and v.strip():
                found.add(v.strip())
            elif isinstance(v, float) or (isinstance(v, int) and not isinstance(v, bool) and abs(v) > 2):
                found.add(repr(v))
    return found


def _numbers(line: str):
    """(value, decimals) of every number in a line; a percentage as a fraction (67.3 % → 0.673, 3 decimals)."""
    for m in NUMBER.finditer(line):
        digits, percent = m.group(1).replace(",", ""), m.group(2)
        decimals = len(digits.partition(".")[2])
        value = float(digits)
        yield (value / 100, decimals + 2) if percent else (value, decimals), m


def spoils(answer: str, line: str, keys: set[str]) -> bool:
    """Whether one line of an earlier output shows `answer` as printed (see the module's docstring)."""
    if answer[:1] in "'\"":
        return answer in line
    m = re.fullmatch(r"(-?[\d,]+(?:\.\d+)?)\s*(\S.*)?", answer)
    if not m:
        return answer in line
    digits, unit = m.group(1).replace(",", ""), m.group(2)
    value, decimals = float(digits), len(digits.partition(".")[2])
    significant = len(digits.replace("-", "").replace(".", "").lstrip("0"))
    for (x, d), found in _numbers(line):
        if unit:
            if d >= decimals and round(x, decimals) == value and line[found.end():].lstrip().startswith(unit):
                return True
        elif decimals and significant >= 2:             # 0.67: two digits do not recur by chance on one page
            if d >= decimals and round(x, decimals) == value:
                return True
        elif d >= decimals and round(x, decimals) == value and (decimals or d == 0) and any(k in line for k in keys):
            return True                                 # 10, 0.5: only beside what they count
    return False


def spoilers(nb: dict) -> list[str]:
    """'cell i (answer a): printed in cell j: <line>' for every answer shown before its question."""
    cells, found = nb["cells"], []
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "code" or "reveal(" not in source(cell):
            continue
        answer = answer_of(cell)
        if answer is None:
            found.append(f"cell {i} calls reveal( but its stored output shows no answer: execute the notebook")
            continue
        assigned = re.compile(rf"^\s*{guess_name(source(cell))}\s*=", re.M)
        guess = next((j for j in range(i, -1, -1) if cells[j]["cell_type"] == "code"
                      and assigned.search(source(cells[j]))), i)
        question = next((j for j in range(guess, -1, -1) if cells[j]["cell_type"] == "markdown"), guess)
        keys = literals(source(cell))
        for j in range(question):
            for line in text_output(cells[j]).splitlines():
                if spoils(answer, line, keys):
                    found.append(f"cell {i}'s answer {answer} (question: cell {question}) is printed before it, "
                                 f"in cell {j}: {line.strip()[:160]}")
    return found


def notebooks() -> list[Path]:
    return sorted(p for p in NOTEBOOKS.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)


@pytest.mark.parametrize("path", notebooks(), ids=lambda p: str(p.relative_to(NOTEBOOKS)))
def test_no_answer_is_printed_before_its_question(path):
    found = spoilers(json.loads(path.read_text(encoding="utf-8")))
    assert not found, f"{path.relative_to(ROOT)}:\n" + "\n".join(found)


# ---------------------------------------------------------------- the test finds the spoilers it was made for

KNOWN = "c1842a4"       # the notebooks as the reviews read them (issue 26: three answers printed before the question)


def at_known(path: str) -> dict:
    shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{KNOWN}:{path}"], capture_output=True, text=True)
    if shown.returncode:
        pytest.fail(f"git show {KNOWN}:{path} failed ({shown.stderr.strip()}): the test needs the repository's "
                    f"history (a full clone, not a shallow one)")
    return json.loads(shown.stdout)


@pytest.mark.parametrize("edition", ["notebooks", "notebooks/zh"])
@pytest.mark.parametrize("notebook, answer, cells", [
    ("04_layers.ipynb", "0.67", {23}),               # "mean over layers and heads: 67.3%"
    ("05_lm_head.ipynb", "0.77", {14}),              # "P(' Paris') = 0.77" (and 10, 12, 41: the same number)
    ("06_sampling.ipynb", "10", {23, 45}),           # the top-p table's 0.9 row, and the claims table
])
def test_the_spoilers_the_reviews_found_are_caught(edition, notebook, answer, cells):
    found = spoilers(at_known(f"{edition}/{notebook}"))
    assert found and all(f"answer {answer} " in f for f in found), found
    assert cells <= {int(re.search(r"in cell (\d+):", f).group(1)) for f in found}, found


@pytest.mark.parametrize("edition", ["notebooks", "notebooks/zh"])
@pytest.mark.parametrize("notebook", ["02_tokenization.ipynb", "03_embedding.ipynb", "07_autoregressive.ipynb",
                                      "08_cost.ipynb"])
def test_no_false_alarm_where_the_reviews_found_none(edition, notebook):
    assert spoilers(at_known(f"{edition}/{notebook}")) == []


def test_matching_follows_the_printed_format():
    assert spoils("0.67", "mean over layers and heads: 67.3%", set())
    assert spoils("0.67", "p = 0.673", set()) and not spoils("0.67", "p = 0.7", set())
    assert not spoils("0.67", "cosine 0.68", set()) and not spoils("0.67", "1.67 GFLOPs", set())
    assert spoils("188.7 MB", "the cache: 188.7 MB", set()) and not spoils("188.7 MB", "188.7 ms", set())
    assert spoils("10", "0.9   | 10   | 458", {"0.9"}) and not spoils("10", "top 10 tokens", {"0.9"})
    assert not spoils("10", "0.9 | 100", {"0.9"}) and not spoils("10", "0.9 | 10.4", {"0.9"})
    assert spoils("0.5", "top-p 0.9: 0.52", {"0.9"}) and not spoils("0.5", "cosine 0.52", {"0.9"})
    assert spoils("' Berlin'", "next: ' Berlin' (0.8)", set()) and not spoils("' Berlin'", "Berlin", set())
