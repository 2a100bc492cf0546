"""Sphinx extension: a ``{memory-table}`` directive that tables ``grpo_course/measurements/memory.json``.

``bench/memory.py`` executes every chapter in a fresh kernel per profile and records its peak
resident memory and wall time there; this directive puts those measurements (not typed numbers)
in a page: one row per chapter, a peak and a time per profile, and the machine they were measured
on. Without the file the page says that nothing was measured and the build warns.
"""
from __future__ import annotations

import json
from pathlib import Path

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
        note = (f"Measured by bench/memory.py on {_machines(data)}: peak resident memory of the "
                f"kernel and the processes it starts (summed, so shared pages count once per "
                f"process), and wall time, each chapter in a fresh kernel with the course cache as "
                f"it was: the shared warm start trained before, and evaluations of identical "
                f"weights reused.{_dates(results)} These are not this build's minutes: each page "
                f"states its own run time at its end.")
        return [_table(header, rows),
                nodes.paragraph(text=note + _unmeasured(results) + " " + _verdict(data, CHAPTER_LIMIT_MIB))]


def _unmeasured(results: dict) -> str:
    """The pages the table has no row for: `` Not measured: <pages>.`` (or nothing)."""
    pages = sorted(nb.stem for nb in (Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))
    missing = [page for page in pages if page not in results]
    return f" Not measured: {', '.join(missing)}." if missing else ""


def _dates(results: dict) -> str:
    """When the entries were measured: `` Measured between <first> and <last>.`` (or one date)."""
    dates = sorted(str(e["date"])[:10] for r in results.values() for e in r.values() if e.get("date"))
    if not dates:
        return ""
    return f" Measured on {dates[0]}." if dates[0] == dates[-1] else \
        f" Measured between {dates[0]} and {dates[-1]}."


def _describe(machine: dict) -> str:
    bf16 = "native bf16" if machine.get("native_bf16") else "no native bf16: fp32"
    return f"{machine.get('cpu') or 'an unrecorded CPU'} ({bf16})"


def _machines(data: dict) -> str:
    """Which machine measured which entries: each entry's own record (``bench/memory.py`` keeps
    one with each), else the file's top-level one."""
    default = data.get("machine", {})
    by_machine: dict[str, list[str]] = {}
    for chapter, by_profile in sorted(data.get("results", {}).items()):
        for profile, entry in by_profile.items():
            by_machine.setdefault(_describe(entry.get("machine", default)), []).append(f"{chapter} on {profile}")
    if len(by_machine) <= 1:
        return next(iter(by_machine), _describe(default))
    common = max(by_machine, key=lambda m: len(by_machine[m]))
    others = "; ".join(f"{', '.join(runs)} on {m}" for m, runs in by_machine.items() if m != common)
    return f"{common}, except {others}"


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
