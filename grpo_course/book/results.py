"""Each chapter's result box: a short table at the top of the page, made from data.

A row says what was measured, its value, its n and 95 % interval where it has them, the reading in
plain words, and where the number comes from: this page (computed on the machine that runs it) or a
file the course ships (a long run or a benchmark, on the machine and date it names). The top cell
shows the box empty (:func:`results_box`); the chapter's last cells fill it (:func:`fill_results_box`)
through IPython's ``update_display``. Jupyter's executor writes the update into the top cell's
output, so the built book shows the filled table where the page begins, and a live kernel (JupyterLab,
Colab) fills it when those cells run.
"""
from __future__ import annotations

import math
import subprocess
from typing import Any

import pandas as pd

from grpo_course.infra.paths import project_root
from grpo_course.measure.stats import p_text

RESULTS_ID = "chapter-results"
COLUMNS = ("measure", "value", "n", "95 % interval or pairs", "reading", "from")   # pairs: McNemar's gained, lost
THIS_PAGE = "this page"


def result(measure: str, value: str, reading: str = "", n: int | str = "", interval: str = "",
           source: str = THIS_PAGE) -> dict[str, Any]:
    """One row of the box (``source``: :data:`THIS_PAGE`, or the shipped file with its machine and
    date, see :func:`shipped`)."""
    return dict(zip(COLUMNS, (measure, value, n, interval, reading, source), strict=True))


def committed(path: str) -> str | None:
    """The date ``path`` (relative to the project) was last committed, from git; ``None`` outside a
    clone (a Colab or Binder copy may have no history) or where the file has changed since (its
    last commit dates an older measurement)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args, "--", path], cwd=project_root(), capture_output=True,
                              text=True, timeout=10).stdout.strip()
    try:
        if git("status", "--porcelain"):
            return None
        return git("log", "-1", "--format=%cs") or None
    except (OSError, subprocess.SubprocessError):
        return None


def shipped(path: str, facts: dict[str, Any] | None) -> str:
    """Where a shipped number comes from: the file, and the CPU and date it records; a file that
    records no date gives the date it was committed (the measurement is no later)."""
    facts = facts or {}
    cpu, date = facts.get("cpu"), facts.get("date")
    if not date and (day := committed(path)):
        date = f"committed {day}"
    where = ", ".join(str(x) for x in (cpu, date) if x)
    return f"shipped: {path}" + (f" ({where})" if where else "")


def measured_on(facts: dict[str, Any] | None, what: str = "") -> str:
    """Where a shipped benchmark ran, as one line a page prints (not a dump of its record): the CPU,
    its bf16 precision, the threads, the date and the minutes where ``facts`` has them."""
    facts = facts or {}
    parts = [str(facts["cpu"])] if facts.get("cpu") else []
    if "native_bf16" in facts:
        parts.append("native bf16" if facts["native_bf16"] else "no native bf16 (fp32)")
    if facts.get("threads"):
        parts.append(f"{facts['threads']} threads")
    if facts.get("date"):
        parts.append(str(facts["date"]))
    if facts.get("minutes") is not None:
        parts.append(f"{facts['minutes']:.0f} min")
    return (f"{what}: " if what else "") + "measured on " + (", ".join(parts) or "a machine it does not name")


def results_table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The box's rows as a table, one measure a row."""
    return pd.DataFrame(rows, columns=list(COLUMNS)).set_index("measure")


#: The box's layout, the same in the book, JupyterLab and Colab: the measure and the reading keep a
#: readable width (a narrow page would squeeze them to a word a line) and a table wider than the
#: page scrolls inside its own box instead of pushing the page sideways.
STYLE = """<style>
.grpo-results {overflow-x: auto; max-width: 100%;}
.grpo-results table {border-collapse: collapse; font-size: 0.92em;}
.grpo-results th, .grpo-results td {text-align: left; vertical-align: top; padding: 0.3em 0.6em;
  white-space: normal; overflow-wrap: anywhere;}
.grpo-results tbody th {min-width: 11em; max-width: 18em;}
.grpo-results td:nth-child(2), .grpo-results td:nth-child(4) {min-width: 6em;}
.grpo-results td:nth-child(5) {min-width: 16em;}
.grpo-results td:nth-child(6) {min-width: 10em; font-size: 0.9em;}
</style>"""


class ResultsTable:
    """The box's table (``table``, one measure a row) as a page shows it: HTML with :data:`STYLE`,
    every cell whole (pandas would cut each at 50 characters); plain text where HTML is not read."""

    def __init__(self, table: pd.DataFrame):
        self.table = table

    def _repr_html_(self) -> str:
        with pd.option_context("display.max_colwidth", None):
            return f'{STYLE}<div class="grpo-results">{self.table.to_html()}</div>'

    def __repr__(self) -> str:
        with pd.option_context("display.max_colwidth", None):
            return self.table.to_string()


def results_box(display_id: str = RESULTS_ID) -> None:
    """The empty box at the top of a chapter, to be filled by :func:`fill_results_box`."""
    from IPython.display import Markdown, display
    display(Markdown("*This page's results appear here once its last cells have run.*"),
            display_id=display_id)


def fill_results_box(rows: list[dict[str, Any]], display_id: str = RESULTS_ID) -> None:
    """Fill the box at the top of the chapter with ``rows`` (nothing is shown where it is called)."""
    from IPython.display import update_display
    update_display(ResultsTable(results_table(rows)), display_id=display_id)


def p_values_as_text(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with its p-value columns (``p``, or a name ending in `` p``) written as numbers of
    two significant digits (``5e-09``, ``0.18``), which rounding a table to a few decimals would show
    as ``0.0``; a row without a test (None or NaN) shows "–": call it before ``.round``."""
    out = table.copy()
    for col in out.columns:
        if str(col) == "p" or str(col).endswith(" p"):
            out[col] = ["–" if v is None or (isinstance(v, float) and math.isnan(v))   # no test there
                        else p_text(v) if isinstance(v, (int, float)) else v for v in out[col]]
    return out
