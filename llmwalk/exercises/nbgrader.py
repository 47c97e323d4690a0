"""nbgrader assignments from the exercises: one command writes a course a teacher can hand out and grade.

    python -m llmwalk.exercises.nbgrader COURSE_DIR [--assignment NAME] [--notebooks 04_layers 05_lm_head ...]
                                                    [--language zh]

writes COURSE_DIR/source/NAME/exercises.ipynb (NAME "llmwalk" and every exercise unless told otherwise) and, if the
course has none yet, COURSE_DIR/nbgrader_config.py with per-cell time limits that fit CPU model loading. The
notebook is built from the catalogue each time (nothing generated is kept in the repository, so it cannot go stale
when an exercise is added): per exercise a read-only description, a solution cell whose body is the teacher's
solution from solutions.py between `### BEGIN SOLUTION` and `### END SOLUTION` (nbgrader's generate_assignment turns
it into `raise NotImplementedError()`), and a read-only test cell worth points that calls `assert_passes`, llmwalk's
grader: a wrong function loses the cell's points, and the grader's verdict (the case, expected vs got, the hint) is
what the feedback shows. The cell display()s a passing verdict: a value it returned would be read by nbgrader as a
partial score.
"""
from __future__ import annotations

import argparse
import ast
import inspect
import json
import sys
import textwrap
from pathlib import Path

from ..i18n import LANGUAGES, set_language, t
from ..i18n import language as current_language
from . import EXERCISES, solutions
from .grader import Exercise

NOTEBOOK = "exercises.ipynb"
KERNEL = {"name": "llmwalk", "display_name": "llmwalk (.venv)", "language": "python"}   # the set-up's kernel
# The grader stops a learner's function after 10 s on one case and an exercise has at most ten cases
# (tests/test_nbgrader.py checks the limit covers the largest): a correct but slow function may take two minutes,
# and the first test cell that needs SmolLM2 (swiglu_ffn's and logit_lens's cases use its real weights) also loads
# it from disk. nbgrader's default of 30 s per cell would fail such an answer as a timeout.
CELL_TIMEOUT = 300
CONFIG = f'''"""nbgrader's settings for this course (written by python -m llmwalk.exercises.nbgrader)."""
c = get_config()  # noqa: F821 (nbgrader defines it)

# Seconds one cell may run when nbgrader executes a notebook (autograde, validate). llmwalk's grader stops a
# learner's function after 10 s on one case and an exercise has at most ten cases; the first cell that needs
# SmolLM2 also loads its weights from disk. nbgrader's default, 30 s, would fail a correct but slow answer.
c.Execute.timeout = {CELL_TIMEOUT}
c.Execute.startup_timeout = 120          # a kernel starting on a busy server (the default is 60 s)
'''
SETUP = """import math
from typing import Callable

import torch
from torch import Tensor

import llmwalk as lw
from llmwalk.exercises import assert_passes, gpt2_ranks   # gpt2_ranks(): GPT-2's merge table, for bpe
lw.set_language("{language}")"""


def points(ex: Exercise) -> int:
    """An exercise's points: one per five minutes it takes (at least one)."""
    return max(1, ex.minutes // 5)


def _cell(kind: str, source: str, grade_id: str, *, solution: bool = False, grade: int | None = None) -> dict:
    """A notebook cell with nbgrader's metadata: read-only unless it is a solution, graded when given points."""
    meta = {"grade": grade is not None, "grade_id": grade_id, "locked": not solution, "schema_version": 3,
            "solution": solution, "task": False}
    if grade is not None:
        meta["points"] = grade
    cell = {"cell_type": kind, "id": grade_id.replace("_", "-"), "metadata": {"nbgrader": meta}, "source": source}
    return cell | ({"execution_count": None, "outputs": []} if kind == "code" else {})


def solution_source(name: str) -> str:
    """The solution cell: solutions.py's function, its body marked as the solution. Helpers it calls from
    solutions.py (softmax, causal_mask) are imported inside the marked part: in the notebook those names are the
    learner's own, graded apart."""
    fn = getattr(solutions, name)
    lines = textwrap.dedent(inspect.getsource(fn)).splitlines()
    tree = ast.parse("\n".join(lines)).body[0]
    body = tree.body[1:] if ast.get_docstring(tree) is not None else tree.body
    start = body[0].lineno - 1
    indent = " " * (len(lines[start]) - len(lines[start].lstrip()))
    own = {n for n, f in vars(solutions).items() if inspect.isfunction(f) and f.__module__ == solutions.__name__}
    helpers = sorted({node.id for node in ast.walk(tree) if isinstance(node, ast.Name)} & own - {name})
    marked = [f"{indent}### BEGIN SOLUTION"]
    if helpers:
        marked.append(f"{indent}from llmwalk.exercises.solutions import {', '.join(helpers)}   # the teacher's own")
    return "\n".join(lines[:start] + marked + lines[start:] + [f"{indent}### END SOLUTION"])


def assignment(*, notebooks: list[str] | None = None, language: str = "en") -> dict:
    """The source notebook (nbformat 4 JSON) of the exercises of `notebooks` (all when None), in `language`."""
    if language not in LANGUAGES:
        raise ValueError(f"language must be one of {', '.join(LANGUAGES)}, got {language!r}")
    known = sorted({ex.notebook for ex in EXERCISES.values()})
    unknown = sorted(set(notebooks or ()) - set(known))
    if unknown:
        raise ValueError(f"no exercises for {', '.join(unknown)}: choose among {', '.join(known)}")
    chosen = [ex for ex in EXERCISES.values() if notebooks is None or ex.notebook in notebooks]
    total, previous = sum(points(ex) for ex in chosen), current_language()
    set_language(language)                  # the texts below, in the assignment's language
    try:
        cells = [_cell("markdown", t("nbgrader.intro", n=len(chosen), total=total), "intro"),
                 _cell("code", SETUP.format(language=language), "setup")]
        for i, ex in enumerate(chosen):
            if i == 0 or chosen[i - 1].notebook != ex.notebook:
                cells.append(_cell("markdown", t("nbgrader.chapter", notebook=ex.notebook),
                                   "chapter_" + ex.notebook.replace("/", "_")))
            cells += [_cell("markdown", t("nbgrader.exercise", name=ex.name, signature=ex.signature,
                                          minutes=ex.minutes, points=points(ex), total=total), f"about_{ex.name}"),
                      _cell("code", solution_source(ex.name), ex.name, solution=True),
                      _cell("code", f'display(assert_passes("{ex.name}", {ex.name}))', f"test_{ex.name}",
                            grade=points(ex))]
    finally:
        set_language(previous)
    return {"cells": cells, "metadata": {"kernelspec": KERNEL, "language_info": {"name": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


def write(course: Path, *, assignment_name: str = "llmwalk", notebooks: list[str] | None = None,
          language: str = "en") -> Path:
    """Write the source notebook into the nbgrader course `course` (and its nbgrader_config.py if it has none);
    return the notebook's path."""
    course = Path(course)
    path = course / "source" / assignment_name / NOTEBOOK
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(assignment(notebooks=notebooks, language=language), indent=1, ensure_ascii=False)
                    + "\n", encoding="utf-8")
    config = course / "nbgrader_config.py"
    if not config.exists():
        config.write_text(CONFIG, encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmwalk.exercises.nbgrader", description=__doc__.split("\n")[0])
    parser.add_argument("course", type=Path, help="the nbgrader course directory (created if missing)")
    parser.add_argument("--assignment", default="llmwalk", help="the assignment's name (default: llmwalk)")
    parser.add_argument("--notebooks", nargs="+", metavar="NOTEBOOK",
                        help="only these notebooks' exercises, e.g. 04_layers deep_dives/quantization")
    parser.add_argument("--language", default="en", choices=LANGUAGES, help="the texts' and verdicts' language")
    args = parser.parse_args(argv)
    try:
        path = write(args.course, assignment_name=args.assignment, notebooks=args.notebooks, language=args.language)
    except ValueError as error:
        parser.error(str(error))
    print(f"wrote {path}; next, in {args.course}: nbgrader generate_assignment {args.assignment}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
