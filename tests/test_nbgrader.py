"""The graded assignment, with the real nbgrader, offline: `python -m llmwalk.exercises.nbgrader` writes a course,
nbgrader's generate_assignment writes the student version, autograde grades submissions and generate_feedback
writes what a student gets back. The solutions score full marks; every wrong implementation in the exercises' tests
scores 0 on its part, its verdict and hint in the feedback (student k submits the k-th wrong implementation of
every exercise that has one, so one autograde covers them all, and leaves the others as handed out; the last of them
submits the solution of the others, which keeps its points beside wrong answers); the untouched student version
scores 0 with no error in nbgrader's log. Every process (nbgrader, its kernels) has the offline
guard on its PYTHONPATH and the course's per-cell time limit."""
import html
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("nbgrader", reason="nbgrader is in the classroom extra: pip install -e '.[classroom]'")
from nbgrader.api import Gradebook  # noqa: E402
from traitlets.config import PyFileConfigLoader  # noqa: E402

from llmwalk.exercises import EXERCISES, ExerciseFailed, assert_passes, check, grader, solutions  # noqa: E402
from llmwalk.exercises import nbgrader as assignments  # noqa: E402
from wrong_implementations import wrong_implementations  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
GUARD = REPO / "tests" / "offline"
ASSIGNMENT, NOTEBOOK = "llmwalk", "exercises"
WRONG = {name: wrong_implementations(name) for name in EXERCISES}


def _env() -> dict:
    """nbgrader's environment, which its kernels inherit: this checkout first, the tests' helpers, the offline guard,
    and the venv's commands (nbgrader runs alembic)."""
    path = [str(REPO), str(REPO / "tests"), str(GUARD), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, path)), OMP_NUM_THREADS="1",
                PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))


def _run(course: Path, *args: str) -> str:
    done = subprocess.run([sys.executable, *args], cwd=course, env=_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def _nbgrader(course: Path, *args: str) -> str:
    return _run(course, "-m", "nbgrader", *args)


def _cells(notebook: dict) -> dict[str, dict]:
    """grade_id -> cell, its source as one string (nbgrader writes a list of lines)."""
    cells = {cell["metadata"]["nbgrader"]["grade_id"]: cell for cell in notebook["cells"]}
    for cell in cells.values():
        cell["source"] = "".join(cell["source"])
    return cells


def _submission(release: dict, source: dict, replace: dict[str, str]) -> dict:
    """The student version with the solution cells of `replace` (exercise -> code); the others are left as given."""
    notebook = json.loads(json.dumps(release))
    for grade_id, cell in _cells(notebook).items():
        if grade_id in replace:
            cell["source"] = replace[grade_id]
    return notebook


def _unplaced(text: str) -> str:
    """Text without memory addresses (a function shown as an input is `<function f at 0x…>` in each process)."""
    return re.sub(r" at 0x[0-9a-f]+>", " at 0x…>", text)


def _text(feedback: Path) -> str:
    """The feedback page as a student reads it: tags dropped, entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", feedback.read_text(encoding="utf-8")))


K = max(len(rows) for rows in WRONG.values())
STUDENTS = ["solutions", "stub", *(f"wrong{k}" for k in range(K))]


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    course = tmp_path_factory.mktemp("course")
    _run(course, "-m", "llmwalk.exercises.nbgrader", str(course))
    _nbgrader(course, "generate_assignment", ASSIGNMENT)
    source = json.loads((course / "source" / ASSIGNMENT / f"{NOTEBOOK}.ipynb").read_text(encoding="utf-8"))
    release = json.loads((course / "release" / ASSIGNMENT / f"{NOTEBOOK}.ipynb").read_text(encoding="utf-8"))
    answers = {name: _cells(source)[name]["source"] for name in EXERCISES}
    submissions = {"solutions": answers, "stub": {}}
    for k in range(K):
        submissions[f"wrong{k}"] = {name: (f"from wrong_implementations import wrong\n{name} = wrong({name!r}, {k})"
                                           if k < len(WRONG[name]) else answers[name])
                                    for name in EXERCISES if k < len(WRONG[name]) or k == K - 1}
    for student, replace in submissions.items():
        folder = course / "submitted" / student / ASSIGNMENT
        folder.mkdir(parents=True)
        (folder / f"{NOTEBOOK}.ipynb").write_text(json.dumps(_submission(release, source, replace)), encoding="utf-8")
    start = time.monotonic()
    log = _nbgrader(course, "autograde", ASSIGNMENT)
    graded = time.monotonic() - start
    _nbgrader(course, "generate_feedback", ASSIGNMENT)
    slowest = max(_cell_seconds(course, student) for student in STUDENTS)
    print(f"\nautograde: {len(STUDENTS)} submissions in {graded:.0f} s; the slowest cell took {slowest:.1f} s "
          f"(limit {assignments.CELL_TIMEOUT} s per cell)")
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        scores = {student: {grade.name: (grade.score, grade.max_score) for grade in
                            gradebook.find_submission_notebook(NOTEBOOK, ASSIGNMENT, student).grades}
                  for student in STUDENTS}
    return dict(path=course, log=log, scores=scores, release=release, source=source)


def _cell_seconds(course: Path, student: str) -> float:
    """The longest a cell ran in the student's autograded notebook (nbclient stamps each cell's start and end)."""
    from datetime import datetime
    notebook = json.loads((course / "autograded" / student / ASSIGNMENT / f"{NOTEBOOK}.ipynb").read_text("utf-8"))
    spans = [cell["metadata"]["execution"] for cell in notebook["cells"] if "execution" in cell["metadata"]]
    return max((datetime.fromisoformat(s["shell.execute_reply"].replace("Z", "+00:00"))
                - datetime.fromisoformat(s["iopub.execute_input"].replace("Z", "+00:00"))).total_seconds()
               for s in spans)


def _feedback(course, student: str) -> str:
    return _text(course["path"] / "feedback" / student / ASSIGNMENT / f"{NOTEBOOK}.html")


def test_every_exercise_is_graded_with_one_point_per_five_minutes(course):
    for name, ex in EXERCISES.items():
        assert course["scores"]["solutions"][f"test_{name}"][1] == max(1, ex.minutes // 5), name


def test_the_solutions_score_full_marks(course):
    lost = {part: score for part, score in course["scores"]["solutions"].items() if score[0] != score[1]}
    assert not lost, lost


def test_the_student_version_holds_no_solution_and_the_same_grading_cells(course):
    release, source = _cells(course["release"]), _cells(course["source"])
    assert set(release) == set(source)
    for name in EXERCISES:
        stub = release[name]["source"]
        assert "raise NotImplementedError()" in stub and "BEGIN SOLUTION" not in stub, stub
        body = assignments.solution_source(name).split("### BEGIN SOLUTION")[1].split("### END SOLUTION")[0]
        assert body.strip() and body.strip() not in stub
        assert stub.splitlines()[0] == source[name]["source"].splitlines()[0]      # the def line stays
        assert release[f"test_{name}"]["source"] == f'display(assert_passes("{name}", {name}))'


@pytest.mark.parametrize("k", range(K))
def test_each_wrong_implementation_scores_zero_on_its_part_with_its_verdict_in_the_feedback(course, k):
    scores, feedback = course["scores"][f"wrong{k}"], _feedback(course, f"wrong{k}")
    for name in EXERCISES:
        score, full = scores[f"test_{name}"]
        if k >= len(WRONG[name]):
            kept = full if k == K - 1 else 0      # the solution beside wrong answers; a part left as handed out
            assert score == kept, (name, k, score, kept)
            continue
        fn, case, word = WRONG[name][k]
        assert score == 0, (name, k, case)
        result = check(name, fn)                    # the verdict the grader gives here, in this process
        assert result.case == case and word.lower() in result.hint.lower(), str(result)
        for line in _unplaced(str(ExerciseFailed(result))).splitlines():    # the verdict, line by line
            assert line in _unplaced(feedback), (name, k, line)


def test_an_untouched_stub_scores_zero_without_an_error(course):
    scores = course["scores"]["stub"]
    assert all(score == 0 for score, _ in scores.values()), scores
    assert sum(full for _, full in scores.values()) == sum(assignments.points(ex) for ex in EXERCISES.values())
    assert not re.search(r"\| (ERROR|CRITICAL)\]|Traceback", course["log"]), course["log"][-3000:]
    feedback = _feedback(course, "stub")
    assert feedback.count("not implemented yet") == len(EXERCISES)
    assert "Traceback (most recent call last)" not in feedback and "grader.py" not in feedback   # the verdict alone


def test_grading_ran_offline_with_a_cell_time_limit_that_fits_the_grader(course):
    refused = subprocess.run([sys.executable, "-c", "import socket; socket.getaddrinfo('example.org', 443)"],
                             env=_env(), capture_output=True, text=True)
    assert refused.returncode != 0 and "OfflineError" in refused.stderr, refused.stderr
    config = PyFileConfigLoader("nbgrader_config.py", path=str(course["path"])).load_config()
    assert config.Execute.timeout == assignments.CELL_TIMEOUT
    # a correct but slow function: up to grader.TIMEOUT on each case of the largest exercise, then SmolLM2's load
    most_cases = max(len(ex.cases()) for ex in EXERCISES.values())
    assert assignments.CELL_TIMEOUT >= grader.TIMEOUT * most_cases + 60 > 30     # 30 s: nbgrader's default


def test_a_teachers_own_config_is_kept(tmp_path):
    (tmp_path / "nbgrader_config.py").write_text("c = get_config()\n")
    assignments.write(tmp_path, notebooks=["06_sampling"], language="zh")
    assert (tmp_path / "nbgrader_config.py").read_text() == "c = get_config()\n"
    notebook = json.loads((tmp_path / "source" / "llmwalk" / f"{NOTEBOOK}.ipynb").read_text(encoding="utf-8"))
    graded = [cell["metadata"]["nbgrader"]["grade_id"] for cell in notebook["cells"]
              if cell["metadata"]["nbgrader"]["grade"]]
    assert graded == ["test_apply_temperature", "test_top_k_filter", "test_top_p_filter"]
    assert 'lw.set_language("zh")' in _cells(notebook)["setup"]["source"]


def test_each_chapter_is_one_section_and_every_cell_id_is_unique():
    """nbgrader refuses a notebook whose grade ids repeat: a chapter's exercises must sit under one heading."""
    cells = assignments.assignment()["cells"]
    ids = [cell["metadata"]["nbgrader"]["grade_id"] for cell in cells]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
    chapters = [i for i in ids if i.startswith("chapter_")]
    assert len(chapters) == len({ex.notebook for ex in EXERCISES.values()})


def test_an_unknown_notebook_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="no exercises for 10_nothing: choose among 02_tokenization"):
        assignments.assignment(notebooks=["10_nothing"])


# ---------------------------------------------------------------- assert_passes, the test cells' call

def test_assert_passes_returns_the_verdict_of_a_right_function():
    result = assert_passes("softmax", solutions.softmax)
    assert result.passed


def test_assert_passes_raises_the_verdict_alone_for_a_wrong_function():
    with pytest.raises(AssertionError) as raised:
        assert_passes("softmax", lambda x: x.exp())
    result = check("softmax", lambda x: x.exp())
    assert not result.passed and str(raised.value) == f"softmax: {result}"
    assert raised.value._render_traceback_() == f"softmax: {result}".splitlines()   # what IPython shows: no frames
    assert result.hint and result.hint in str(raised.value)


def test_a_warning_from_a_right_function_is_shown_on_stdout_not_stderr(capfd):
    """nbgrader gives 0 to a test cell that wrote to stderr: a warning must not cost a right answer its points."""
    def softmax(logits):
        import warnings
        warnings.warn("a learner's warning", UserWarning)
        return solutions.softmax(logits)
    assert assert_passes("softmax", softmax).passed
    out, err = capfd.readouterr()
    assert "a learner's warning" in out and not err
