"""Exercises-only student notebooks for an instructor who grades them (``make assignments``).

    python tools/assignments.py                 # -> _build/assignments/0N_<topic>.ipynb
    python tools/assignments.py --out DIR

Each chapter's coding exercises are a ``### Coding exercise`` prose cell and three cells tagged
``exercise`` (the stub), ``check`` and ``solution`` (a closed solution after the check). The
student version of a chapter holds only what grading needs: the chapter's title and a header, one
setup cell (the imports every stub may use), each exercise's prose, stub and check, and the
chapter's quiz. It has no training, no evaluation and no model, so executing it (the grading) takes
seconds. The solutions are left out, and so is every sentence that points at one; the cells keep
their nbgrader metadata (stub: ``solution``; check: ``grade``, locked, 1 point) and each check
becomes an assertion, so that nbgrader's autograder - or any notebook runner - fails a check that
does not pass.
"""
from __future__ import annotations

import copy
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:         # run as a script (python tools/<name>.py): the checkout's package
    sys.path.insert(0, str(ROOT))

from grpo_course.infra.atomic import write_text_atomic
from grpo_course.infra.errors import OneLineArgumentParser, report

COURSE = "GRPO on a CPU"

# The imports a stub and its solution may use without importing them (as tests/test_notebook_exercises
# runs each exercise standalone): the check cells import everything else they need themselves.
SETUP = "import numpy as np  # noqa: F401 (for your code)\nimport torch  # noqa: F401 (for your code)\n"
HEADING = re.compile(r"^#+\s*Coding exercise\b", re.M)
# Sentences of the prose that point at the solution the student version leaves out.
POINTS_AT_SOLUTION = re.compile(r"closed solution|solution follows|open it after your own try", re.I)
# What a solution looks like in a chapter; none of it may reach a student version.
SOLUTION_MARKERS = ("<details", "{admonition}", ":class: dropdown", "Solution (open it")

INTRO = """## Coding exercises

Write each function in its cell, in place of `raise NotImplementedError`, then run the check below
it. The check runs your function on random cases and on the edge cases, with the course's own
version switched off while yours runs (calling it raises), and prints the first case it gets wrong
with its inputs, what came back and the value expected. Calling any other function of the course's
package fails the check too (except the helpers an exercise's stub imports for you), and so does a
library function that would do the exercise's work for you. A check that passes prints
"all N cases pass"; each check is worth one point."""

QUIZ = """## Quiz (not graded)

Run the cell below and click an answer (or type a number and press Enter): the quiz says at once
whether it is right, and why."""


def _lines(text: str) -> list[str]:
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + [parts[-1]]


def _source(cell: dict[str, Any]) -> str:
    return "".join(cell["source"])


def _tags(cell: dict[str, Any]) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def graded_check(source: str) -> str:
    """A check cell whose last line ``check(...)`` becomes ``assert check(...) is True``."""
    lines = source.rstrip("\n").split("\n")
    start = max(i for i, line in enumerate(lines) if line and not line[0].isspace())
    call = "\n".join(lines[start:])
    if "check(" not in call:
        raise ValueError(f"a check cell must end with its check(...) call, not {call!r}")
    return "\n".join(lines[:start] + [f"assert {call} is True, \"the check above did not pass\""])


def plain_prose(text: str) -> str:
    """Exercise prose for a plain notebook: MyST's ``{term}``/``{cite}`` roles resolved or dropped,
    and every sentence that points at the (left out) solution removed."""
    text = re.sub(r"\{term\}`([^`<]*?)\s*<[^`]*>`", r"\1", text)
    text = re.sub(r"\{term\}`([^`]*)`", r"\1", text)
    text = re.sub(r"\s*\{cite(:p|:t)?\}`[^`]*`", "", text)
    paragraphs = []
    for paragraph in text.split("\n\n"):
        parts = re.split(r"(?<=[.!?])(\s+)(?=[A-Z*`(])", paragraph)
        kept = ""
        for sentence, gap in zip(parts[::2], [*parts[1::2], ""], strict=True):
            if not POINTS_AT_SOLUTION.search(sentence):
                kept += sentence + gap
        kept = kept.strip()
        if kept:
            paragraphs.append(kept)
    return "\n\n".join(paragraphs)


def exercises(notebook: dict[str, Any], name: str = "the chapter") -> list[dict[str, Any]]:
    """Each coding exercise of ``notebook``: its prose (markdown), its stub and its check cell."""
    cells = notebook["cells"]
    found = []
    for i, cell in enumerate(cells):
        if "exercise" not in _tags(cell):
            continue
        check = cells[i + 1] if i + 1 < len(cells) else None
        if check is None or "check" not in _tags(check):
            raise ValueError(f"{name}: the exercise in cell {i} has no check cell right after it")
        prose, k = [], i - 1
        while k >= 0 and cells[k]["cell_type"] == "markdown" and not _tags(cells[k]):
            prose.insert(0, cells[k])
            if HEADING.search(_source(cells[k])):
                break
            k -= 1
        if not prose or not HEADING.search(_source(prose[0])):
            raise ValueError(f"{name}: the exercise in cell {i} has no '### Coding exercise' prose "
                             "right above it")
        found.append({"prose": prose, "stub": cell, "check": check})
    if not found:
        raise ValueError(f"{name} has no cell tagged 'exercise'")
    return found


def _markdown(text: str, cell_id: str) -> dict[str, Any]:
    return {"cell_type": "markdown", "id": cell_id, "metadata": {}, "source": _lines(text)}


def _code(text: str, cell_id: str, metadata: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"cell_type": "code", "execution_count": None, "id": cell_id,
            "metadata": metadata or {}, "outputs": [], "source": _lines(text)}


def assignment(notebook: dict[str, Any], name: str) -> dict[str, Any]:
    """The exercises-only student notebook of the chapter ``notebook`` (file name ``name``)."""
    number = name[:2]
    first = _source(notebook["cells"][0]).strip().split("\n", 1)[0]
    if not first.startswith("# "):
        raise ValueError(f"{name}: the first cell does not start with the chapter's '# ' title")
    title = first[2:].strip()
    header = (f"# {title}\n\n"
              f"**Assignment for chapter {int(number)}** of *{COURSE}* (`notebooks/{name}`): the "
              "chapter's coding exercises, without its training or evaluation. Run the setup cell "
              "first; the chapter itself explains what each exercise builds on.")
    cells = [_markdown(header, f"ch{number}-title"),
             _code(SETUP, f"ch{number}-setup",
                   {"nbgrader": {"grade": False, "grade_id": f"ch{number}-setup", "locked": True,
                                 "schema_version": 3, "solution": False, "task": False}}),
             _markdown(INTRO, f"ch{number}-intro")]
    for ex in exercises(notebook, name):
        for cell in ex["prose"]:
            cells.append({**copy.deepcopy(cell), "source": _lines(plain_prose(_source(cell)))})
        stub, check = copy.deepcopy(ex["stub"]), copy.deepcopy(ex["check"])
        stub["outputs"], stub["execution_count"] = [], None
        check["outputs"], check["execution_count"] = [], None
        check["source"] = _lines(graded_check(_source(check)))
        cells += [stub, check]
    quiz = [c for c in notebook["cells"] if c["cell_type"] == "code" and "show_quiz(" in _source(c)]
    if quiz:
        cells += [_markdown(QUIZ, f"ch{number}-quiz-intro"),
                  _code(_source(quiz[0]), f"ch{number}-quiz")]
    for cell in cells:
        text = _source(cell)
        if "solution" in _tags(cell) or any(marker in text for marker in SOLUTION_MARKERS):
            raise ValueError(f"{name}: a solution would reach the student version: {text[:80]!r}")
    return {"cells": cells, "metadata": copy.deepcopy(notebook.get("metadata", {})),
            "nbformat": notebook.get("nbformat", 4), "nbformat_minor": notebook.get("nbformat_minor", 5)}


def build(notebooks: list[Path], out_dir: Path) -> list[Path]:
    """Write each chapter's :func:`assignment` into ``out_dir`` under the chapter's name (atomically)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for path in notebooks:
        notebook = assignment(json.loads(path.read_text(encoding="utf-8")), path.name)
        written.append(write_text_atomic(out_dir / path.name,
                                         json.dumps(notebook, indent=1, ensure_ascii=False) + "\n"))
    return written


def main(argv: list[str] | None = None) -> int:
    p = OneLineArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--notebooks", default=str(ROOT / "notebooks"), help="the chapters' folder")
    p.add_argument("--out", default=str(ROOT / "_build" / "assignments"), help="output folder")
    a = p.parse_args(argv)
    notebooks = sorted(Path(a.notebooks).glob("0*.ipynb"))
    if not notebooks:
        p.error(f"--notebooks {a.notebooks!r} holds no 0N_<topic>.ipynb chapter")
    if Path(a.out).exists() and not Path(a.out).is_dir():
        p.error(f"--out {a.out!r} is a file, not a folder")
    try:
        written = build(notebooks, Path(a.out))
    except (ValueError, OSError, json.JSONDecodeError) as exc:
        return report(exc)
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
