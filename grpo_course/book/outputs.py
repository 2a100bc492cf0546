"""What a student reads in a page's outputs, checked on the executed notebooks.

A built page shows each code cell's standard output and its displayed results (the book drops
standard error, ``stderr_output: remove-warn``). :func:`output_problems` lists what a student
should never meet there: a machine's absolute path, a NaN where "none" is meant, and a float
printed to more digits than it means (a raw ``0.0005207075737416744``, or a progress bar of cached
results at ``13553.24it/s``). ``make book`` and ``book-smoke`` run it over the pages they built
(``tests/test_outputs.py``).
"""
from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

#: a path from a machine's root: a home, a temporary or a work folder (a page shows paths relative
#: to the checkout or as $GRPO_COURSE_CACHE/..., infra.paths.shown_path)
ABSOLUTE_PATH = re.compile(r"(?<![\w.~$/])/(?:root|home|tmp|work|Users|var|opt|mnt|private|srv)/[^\s'\"<>)]*")
NAN = re.compile(r"(?<![\w.])(?:nan|NaN|NAN)(?![\w])")
#: a decimal number (not part of a version or an address such as 2.13.0)
DECIMAL = re.compile(r"(?<![\w.])[-+]?(\d+)\.(\d+)(?:[eE][-+]?\d+)?(?![.\d])")
MAX_DIGITS = 6                  # significant digits a displayed float may have
HIDDEN = {"remove-output", "remove-cell"}   # tags whose outputs the book does not show
WIDGET = "application/vnd.jupyter.widget-view+json"


def significant_digits(whole: str, fraction: str) -> int:
    """Significant digits of the decimal ``whole.fraction`` (leading zeros do not count)."""
    return len((whole + fraction).lstrip("0")) or 1


def displayed_texts(cell: dict[str, Any]) -> list[str]:
    """The texts a built page shows for a code cell: its standard output and, of each displayed
    result, the richest text form (HTML without its tags, else Markdown, else plain text);
    nothing for a cell whose outputs the book hides, a widget or a figure."""
    if cell.get("cell_type") != "code" or HIDDEN & set(cell.get("metadata", {}).get("tags", [])):
        return []
    texts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream":
            if out.get("name") == "stdout":
                texts.append("".join(out.get("text", "")))
            continue
        data = out.get("data", {})
        if WIDGET in data:
            continue
        for kind in ("text/html", "text/markdown", "text/plain"):
            if kind in data:
                text = "".join(data[kind])
                if kind == "text/html":
                    # the text a reader sees: no tags, no style sheet, entities decoded
                    text = re.sub(r"<style.*?</style>|<script.*?</script>", " ", text, flags=re.S)
                    text = html.unescape(re.sub(r"<[^>]+>", " ", text))
                texts.append(text)
                break
    return texts


def text_problems(text: str) -> list[str]:
    """What a student should not read in ``text``: absolute paths, NaNs and long floats."""
    found = [f"an absolute path {m.group(0)!r}" for m in ABSOLUTE_PATH.finditer(text)]
    found += [f"a NaN in {_around(text, m)!r}" for m in NAN.finditer(text)]
    found += [f"a float of more than {MAX_DIGITS} significant digits {m.group(0)!r}"
              for m in DECIMAL.finditer(text) if significant_digits(m.group(1), m.group(2)) > MAX_DIGITS]
    return found


def _around(text: str, match: re.Match, width: int = 30) -> str:
    return text[max(0, match.start() - width):match.end() + width].replace("\n", " ")


def output_problems(notebook: dict[str, Any] | str | Path) -> list[str]:
    """Each problem of an executed notebook's displayed outputs, as ``cell N: what``."""
    if not isinstance(notebook, dict):
        notebook = json.loads(Path(notebook).read_text())
    return [f"cell {i}: {problem}" for i, cell in enumerate(notebook.get("cells", []))
            for text in displayed_texts(cell) for problem in text_problems(text)]
