"""Sphinx extension: a ``{whole-problems}`` directive that tables what the shipped runs show on
whole GSM8K test problems (``grpo_course.measure.whole_problems.shipped_rows``).

The intro is Markdown, not a notebook, so it cannot glue a cell's output; this directive puts the
records' numbers and their readings in the page instead of typed words: the reference run's
transfer test (``data/reference_test.json``) and the curriculum run's tests fixed in advance
(``data/curriculum_test.json``, written by ``bench/curriculum_test.py``), each with the machine
and date the record names. A record that is missing is said in the page.
"""
from __future__ import annotations

import json
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import Directive
from memory_table import _table

RECORDS = ("reference_test.json", "curriculum_test.json")


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _source(name: str, record: dict | None) -> str:
    from grpo_course.book.results import shipped

    if record is None:
        return f"data/{name}: not written yet"
    return shipped(f"data/{name}", {"cpu": record.get("cpu"), "date": record.get("date")}).removeprefix("shipped: ")


class WholeProblems(Directive):
    has_content = False

    def run(self):
        from grpo_course.infra.paths import project_root
        from grpo_course.measure.whole_problems import shipped_rows, shipped_sentence

        data = project_root() / "data"
        reference, curriculum = (_read(data / name) for name in RECORDS)
        rows = shipped_rows(reference, curriculum)
        header = ["run", "test", "warm start %", "run %", "change (points)", "interval or pairs", "p", "reading"]
        cells = [[str(r["run"]), str(r["test"]), f"{r['warm start %']:.1f}", f"{r['run %']:.1f}",
                  f"{r['change (points)']:+.1f}", str(r["interval or pairs"]), f"{r['p']:.2g}", str(r["reading"])]
                 for r in rows]
        text = shipped_sentence(reference, curriculum)
        sources = "; ".join(_source(name, record) for name, record in zip(RECORDS, (reference, curriculum), strict=True))
        out = [_table(header, cells)] if cells else []
        return out + [nodes.paragraph(text=f"{text[0].upper()}{text[1:]}. Records: {sources}.")]


def setup(app):
    app.add_directive("whole-problems", WholeProblems)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
