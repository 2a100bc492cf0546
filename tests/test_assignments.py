"""`make assignments`: the exercises-only student notebooks an instructor releases and autogrades."""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tools.assignments import SOLUTION_MARKERS, assignment, build, graded_check, main, plain_prose

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "notebooks").glob("0*.ipynb"))
GRADING_TIMEOUT_S = 120          # what an instructor's autograde may take per chapter (issue 56)


def _source(cell) -> str:
    return "".join(cell["source"])


def _tags(cell) -> list[str]:
    return cell["metadata"].get("tags", [])


def solutions(chapter: Path) -> list[str]:
    """The code of each closed solution of a chapter, in the order of its exercises."""
    cells = json.loads(chapter.read_text())["cells"]
    found = []
    for i, cell in enumerate(cells):
        if "exercise" in _tags(cell):
            assert "solution" in _tags(cells[i + 2]), f"{chapter.name}: no solution after cell {i}"
            found.append(re.search(r"```python\n(.*?)```", _source(cells[i + 2]), re.S).group(1))
    return found


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> list[Path]:
    return build(CHAPTERS, tmp_path_factory.mktemp("assignments"))


def test_an_exercises_only_notebook_per_page_with_stubs_and_graded_checks(built):
    assert [p.name for p in built] == [c.name for c in CHAPTERS] and len(built) == 10
    for path, chapter in zip(built, CHAPTERS, strict=True):
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        cells = nb["cells"]
        title = _source(json.loads(chapter.read_text())["cells"][0]).split("\n", 1)[0]
        assert _source(cells[0]).startswith(title + "\n")
        assert f"Assignment for chapter {int(path.name[:2])}**" in _source(cells[0])
        stubs = [c for c in cells if "exercise" in _tags(c)]
        checks = [c for c in cells if "check" in _tags(c)]
        assert len(stubs) == len(solutions(chapter)) >= 2 and len(checks) == len(stubs)
        assert all(c["metadata"]["nbgrader"]["solution"] for c in stubs)
        assert all(c["metadata"]["nbgrader"]["grade"] and c["metadata"]["nbgrader"]["locked"]
                   for c in checks)
        assert all(_source(c).endswith('is True, "the check above did not pass"') for c in checks)
        assert all(not c.get("outputs") for c in cells if c["cell_type"] == "code")
        # each exercise's prose right above its stub, the check right below it
        for k, cell in enumerate(cells):
            if "exercise" in _tags(cell):
                assert "Coding exercise" in _source(cells[k - 1]) and "check" in _tags(cells[k + 1])
        # no training, evaluation or model: only the setup, the stubs, the checks and the quiz
        code = [_source(c) for c in cells if c["cell_type"] == "code"]
        assert len(code) == 1 + 2 * len(stubs) + 1 and "show_quiz(" in code[-1]
        assert not any(re.search(r"load_model|load_gsm8k|evaluate_model|CourseTrainer|train\(", s)
                       for s in code)


def test_no_solution_prose_or_solution_code_in_any_notebook(built):
    for path, chapter in zip(built, CHAPTERS, strict=True):
        text = path.read_text()
        cells = json.loads(text)["cells"]
        assert not any("solution" in _tags(c) for c in cells), path.name
        for marker in (*SOLUTION_MARKERS, "Solutions", "closed solution", "open it after your own try"):
            assert marker not in text, f"{path.name} holds {marker!r}"
        code = "\n".join(_source(c) for c in cells if c["cell_type"] == "code")
        shown = {ast.dump(node) for node in ast.walk(ast.parse(code)) if isinstance(node, ast.stmt)}
        for solution in solutions(chapter):
            for node in ast.walk(ast.parse(solution)):
                if isinstance(node, ast.stmt) and not isinstance(node, ast.Import | ast.ImportFrom):
                    assert ast.dump(node) not in shown, f"{path.name} holds {ast.unparse(node)!r}"
            for line in solution.splitlines():
                line = line.split("#")[0].strip()
                if len(line) >= 20 and not line.startswith(("def ", "from ", "import ")):
                    assert line not in text, f"{path.name} holds the solution's line {line!r}"


def test_prose_that_points_at_the_solution_is_dropped_and_roles_resolved():
    prose = ("### Coding exercise 1: x\n\nIt comes as a stub, a check and a closed solution: the check\n"
             "runs it. Write `f(x)` from {term}`mixed groups <Mixed group>` and {term}`GRPO`\n"
             "{cite}`shao2024deepseekmath`. A closed solution follows each check: open it after your own try.")
    assert plain_prose(prose) == ("### Coding exercise 1: x\n\nWrite `f(x)` from mixed groups and GRPO.")


def test_a_chapter_whose_exercise_lacks_its_prose_or_its_check_is_refused():
    stub = {"cell_type": "code", "metadata": {"tags": ["exercise"]}, "source": ["def f(): ..."]}
    check = {"cell_type": "code", "metadata": {"tags": ["check"]}, "source": ["check(f, g, [])"]}
    title = {"cell_type": "markdown", "metadata": {}, "source": ["# 9. A chapter"]}
    prose = {"cell_type": "markdown", "metadata": {}, "source": ["### Coding exercise 1: f"]}
    assert len(assignment({"cells": [title, prose, stub, check]}, "09_x.ipynb")["cells"]) == 6
    with pytest.raises(ValueError, match="no '### Coding exercise' prose"):
        assignment({"cells": [title, stub, check]}, "09_x.ipynb")
    with pytest.raises(ValueError, match="no check cell"):
        assignment({"cells": [title, prose, stub]}, "09_x.ipynb")
    with pytest.raises(ValueError, match="no cell tagged 'exercise'"):
        assignment({"cells": [title, prose]}, "09_x.ipynb")


def test_a_graded_check_fails_the_stub_and_passes_a_solution():
    check = graded_check("from grpo_course.book import exercises\n\n"
                         "exercises.check(roofline_bound, exercises.roofline_bound,\n"
                         "                exercises.roofline_cases())")
    stub = "def roofline_bound(i, p, b):\n    raise NotImplementedError\n"
    with pytest.raises(AssertionError):
        exec(stub + check, {})
    exec("def roofline_bound(i, p, b):\n    return min(p, i * b)\n" + check, {})


def test_bad_folders_get_one_line_and_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--notebooks", str(tmp_path)])
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert err.startswith("error: --notebooks") and err.count("\n") == 1
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit) as stop:
        main(["--out", str(tmp_path / "file")])
    assert stop.value.code == 2 and capsys.readouterr().err.startswith("error: --out")


def test_the_command_line_writes_the_folder(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "assignments.py"), "--out",
                          str(tmp_path / "a")], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert len(list((tmp_path / "a").glob("0*.ipynb"))) == 10


def _grade(path: Path, solved: list[str] | None = None) -> tuple[nbformat.NotebookNode, float]:
    """Execute an assignment as an autograder does (every cell, errors recorded), the whole notebook
    under the grading timeout (a cell past it raises); with ``solved``, each solution pasted into
    its stub first (errors then raise)."""
    nb = nbformat.read(path, as_version=4)
    if solved is not None:
        stubs = [c for c in nb.cells if "exercise" in _tags(c)]
        for cell, solution in zip(stubs, solved, strict=True):
            cell.source += "\n\n\n" + solution
    start = time.monotonic()

    def left(cell) -> float:             # what is left of the notebook's budget (0 would mean none)
        return max(0.01, start + GRADING_TIMEOUT_S - time.monotonic())

    NotebookClient(nb, timeout=GRADING_TIMEOUT_S, timeout_func=left, startup_timeout=GRADING_TIMEOUT_S,
                   allow_errors=solved is None, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    return nb, time.monotonic() - start


def _printed(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o["output_type"] == "stream")


def _errors(cell) -> list[str]:
    return [o["ename"] for o in cell.get("outputs", []) if o["output_type"] == "error"]


@pytest.mark.heavy
@pytest.mark.parametrize("chapter", CHAPTERS, ids=[c.name[:2] for c in CHAPTERS])
def test_the_assignment_grades_unsolved_and_solved_within_the_timeout(chapter, built, capsys,
                                                                     record_property):
    """The smoke version of an instructor's autograde: the chapter's assignment runs top to bottom
    with its stubs as released (every check "not written yet", failing its assertion) and with the
    chapter's solutions pasted in (every check passes), the whole notebook under a 120 s timeout."""
    path = next(p for p in built if p.name == chapter.name)
    nb, unsolved = _grade(path)
    assert all(c.execution_count for c in nb.cells if c.cell_type == "code"), path.name
    for cell in nb.cells:
        if "check" in _tags(cell):
            assert "not written yet" in _printed(cell) and _errors(cell) == ["AssertionError"]
        elif cell.cell_type == "code":
            assert not _errors(cell), (path.name, cell.source, cell.outputs)
    nb, solved = _grade(path, solutions(chapter))
    checks = [c for c in nb.cells if "check" in _tags(c)]
    for cell in checks:
        assert re.search(r"all \d+ cases pass", _printed(cell)), (path.name, _printed(cell))
    assert not any(_errors(c) for c in nb.cells), path.name
    record_property("grading_seconds", {"unsolved": round(unsolved, 1), "solved": round(solved, 1)})
    with capsys.disabled():
        print(f"\n{path.name}: graded in {unsolved:.1f} s unsolved, {solved:.1f} s solved "
              f"({len(checks)} checks)")
