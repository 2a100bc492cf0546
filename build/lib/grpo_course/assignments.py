"""Student versions of the chapters for an instructor who grades them (``make assignments``).

    python -m grpo_course.assignments                 # -> _build/assignments/0N_<topic>.ipynb
    python -m grpo_course.assignments --out DIR

Each chapter's coding exercises are three cells tagged ``exercise`` (the stub), ``check`` and
``solution`` (a closed solution after the check). The student version keeps the stubs and the
checks with their nbgrader metadata (stub: ``solution``; check: ``grade``, locked, 1 point), drops
every ``solution`` cell and every output, and turns each check into an assertion, so that
nbgrader's autograder - or any notebook runner - fails a check that does not pass.
"""
from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

from .atomic import write_text_atomic
from .errors import OneLineArgumentParser, report

ROOT = Path(__file__).resolve().parents[1]


def _lines(text: str) -> list[str]:
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + [parts[-1]]


def graded_check(source: str) -> str:
    """A check cell whose last line ``check(...)`` becomes ``assert check(...) is True``."""
    lines = source.rstrip("\n").split("\n")
    start = max(i for i, line in enumerate(lines) if line and not line[0].isspace())
    call = "\n".join(lines[start:])
    if "check(" not in call:
        raise ValueError(f"a check cell must end with its check(...) call, not {call!r}")
    return "\n".join(lines[:start] + [f"assert {call} is True, \"the check above did not pass\""])


def student_version(notebook: dict[str, Any]) -> dict[str, Any]:
    """``notebook`` without its solutions and outputs, its checks made assertions."""
    out = copy.deepcopy(notebook)
    cells = []
    for cell in out["cells"]:
        tags = cell.get("metadata", {}).get("tags", [])
        if "solution" in tags:
            continue
        if cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
            if "check" in tags:
                cell["source"] = _lines(graded_check("".join(cell["source"])))
        cells.append(cell)
    out["cells"] = cells
    return out


def build(notebooks: list[Path], out_dir: Path) -> list[Path]:
    """Write each notebook's :func:`student_version` into ``out_dir`` (atomically)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for path in notebooks:
        notebook = student_version(json.loads(path.read_text(encoding="utf-8")))
        counts = sum("exercise" in c.get("metadata", {}).get("tags", [])
                     for c in notebook["cells"])
        if counts == 0:
            raise ValueError(f"{path.name} has no cell tagged 'exercise'")
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
