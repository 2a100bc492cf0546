"""Sphinx extension: a ``{memory-table}`` directive that tables ``grpo_course/measurements/memory.json``.

``bench/memory.py`` executes every chapter in a fresh kernel per profile and records its peak
resident memory and wall time there; this directive puts those measurements (not typed numbers)
in a page: one row per chapter, a peak and a time per profile, and the machine they were measured
on. Without the file the page says that nothing was measured and the build warns.
"""
from __future__ import annotations

import json

from docutils import nodes
from docutils.parsers.rst import Directive

PROFILES = ("binder", "full")


def _table(header: list[str], rows: list[list[str]]) -> nodes.table:
    table, group = nodes.table(), nodes.tgroup(cols=len(header))
    table += group
    group.extend(nodes.colspec(colwidth=1) for _ in header)
    for part, lines in ((nodes.thead(), [header]), (nodes.tbody(), rows)):
        for line in lines:
            row = nodes.row()
            for text in line:
                row += nodes.entry("", nodes.paragraph(text=text))
            part += row
        group += part
    return table


class MemoryTable(Directive):
    has_content = False

    def run(self):
        from grpo_course.infra.memory import CHAPTER_LIMIT_MIB
        from grpo_course.infra.memory import MEMORY_FILE as path

        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            warning = self.state.document.reporter.warning(
                f"memory-table: no measurements in {path} (run python bench/memory.py)",
                line=self.lineno)
            return [nodes.paragraph(text="Not measured yet: run python bench/memory.py."), warning]
        results = data.get("results", {})
        header = ["chapter"] + [f"{p}: {what}" for p in PROFILES for what in ("peak GiB", "minutes")]
        rows = []
        for chapter in sorted(results):
            cells = [chapter]
            for profile in PROFILES:
                r = results[chapter].get(profile)
                cells += ([f"{r['peak_rss_mib'] / 1024:.2f}", f"{r['wall_s'] / 60:.1f}"]
                          if r else ["—", "—"])
            rows.append(cells)
        machine = data.get("machine", {})
        note = (f"Measured by bench/memory.py on {machine.get('cpu', 'an unrecorded CPU')} "
                f"(torch {machine.get('torch', '?')}): peak resident memory of the kernel and the "
                f"processes it starts (summed, so shared pages count once per process), and wall "
                f"time, each chapter in a fresh kernel with the course cache as it was: the "
                f"shared warm start trained before, and evaluations of identical weights reused.")
        return [_table(header, rows), nodes.paragraph(text=note + " " + _verdict(data, CHAPTER_LIMIT_MIB))]


def _verdict(data: dict, limit: float) -> str:
    """One sentence: does every chapter's binder peak fit the binder profile's limit (MiB)?"""
    peaks = {c: r["binder"]["peak_rss_mib"] for c, r in data.get("results", {}).items()
             if "binder" in r}
    if not peaks:
        return "The binder profile was not measured."
    over = sorted(c for c, mib in peaks.items() if mib > limit)
    if over:
        return (f"Over the binder profile's {limit / 1024:.2f} GiB target: {', '.join(over)}; "
                f"{len(peaks) - len(over)} of {len(peaks)} measured chapters fit it.")
    return (f"Every measured chapter ({len(peaks)}) stays within the binder profile's "
            f"{limit / 1024:.2f} GiB target (highest: {max(peaks.values()) / 1024:.2f} GiB).")


def setup(app):
    app.add_directive("memory-table", MemoryTable)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
