"""The reading line in numbers: the sentences and words of a chapter's markdown, as a student reads
them (issue 107: no sentence over :data:`MAX_SENTENCE_WORDS` words, no page over
:data:`MAX_PAGE_WORDS`).

What counts: the prose of markdown cells, admonitions included. What does not: code (fenced blocks;
inline code counts as one word), math (``$...$`` one word, ``$$...$$`` and ``{math}`` blocks none),
tables, headings, HTML lines, and the solutions of exercises (cells tagged ``solution``,
admonitions titled "Solution..."). A
glued value (``{eval}`glued.x```) is one word; a citation none; a glossary term its text.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

MAX_SENTENCE_WORDS = 45
MAX_PAGE_WORDS = 4000

_FENCE = re.compile(r"^(```+|:::+)\s*(\{[^}]*\})?\s*(.*)$")
_KEEP_DIRECTIVES = ("{admonition}", "{note}", "{tip}", "{important}", "{warning}", "{caution}",
                    "{attention}", "{hint}", "{seealso}", "{margin}", "{epigraph}")
_ABBREVIATIONS = ("e.g.", "i.e.", "et al.", "vs.", "cf.", "Fig.", "Eq.", "approx.", "etc.)")
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"”’)]*\s+(?=[A-Z0-9(*\"“‘`_\[{$])")


def _inline(text: str) -> str:
    """Inline markup as a reader sees it: a glued value, inline code or math one word, a citation
    none, a link or glossary term its text."""
    text = re.sub(r"\{eval\}`[^`]*`", "VALUE", text)
    text = re.sub(r"\{cite(:p|:t)?\}`[^`]*`", "", text)
    text = re.sub(r"\{(term|doc|ref|numref)\}`([^`<]*?)\s*(<[^>]*>)?`", r"\2", text)
    text = re.sub(r"\{[a-z-]+\}`[^`]*`", "ROLE", text)
    text = re.sub(r"``[^`]*``|`[^`]*`", "CODE", text)
    text = re.sub(r"\$[^$\n]+\$", "MATH", text)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[*_]{1,2}(\S[^*_]*?)[*_]{1,2}", r"\1", text)
    return text


def prose_blocks(markdown: str) -> list[str]:
    """The paragraphs and list items of one markdown cell that are prose (see the module doc)."""
    blocks, current, fences = [], [], []     # fences: the open blocks, True where kept

    def flush():
        if current:
            blocks.append(" ".join(current))
            current.clear()
    in_math = False
    for line in markdown.splitlines():
        stripped = line.strip()
        m = _FENCE.match(stripped)
        if m and (not fences or m.group(1)[0] == fences[-1][0][0]):
            marker, directive, rest = m.groups()
            if fences and marker == fences[-1][0] and not directive and not rest:
                fences.pop()
                flush()
                continue
            if directive or rest or not fences:
                keep = (directive or "") in _KEEP_DIRECTIVES and (not fences or fences[-1][1]) \
                    and not rest.lower().startswith("solution")
                flush()
                fences.append((marker, keep))
                continue
        if fences and not fences[-1][1]:
            continue
        if stripped.startswith(":") and fences:          # a directive's options (:class: ...)
            continue
        if stripped.startswith("$$"):
            in_math = not (stripped.endswith("$$") and len(stripped) > 2) and not in_math
            flush()
            continue
        if in_math:
            continue
        if not stripped or stripped.startswith(("#", "|", "<")):
            flush()
            continue
        if re.match(r"^([-*+]|\d+[.)])\s+", stripped):
            flush()
            stripped = re.sub(r"^([-*+]|\d+[.)])\s+", "", stripped)
        current.append(stripped)
    flush()
    return [b for b in (_inline(b).strip() for b in blocks) if b]


def sentences(block: str) -> list[str]:
    """The sentences of one paragraph."""
    text = block
    for i, abbr in enumerate(_ABBREVIATIONS):
        text = text.replace(abbr, f"ABBR{i}X")
    parts = _SENTENCE_END.split(text)
    out = []
    for part in parts:
        for i, abbr in enumerate(_ABBREVIATIONS):
            part = part.replace(f"ABBR{i}X", abbr)
        if part.strip():
            out.append(part.strip())
    return out


def words(text: str) -> int:
    return len([w for w in text.split() if any(ch.isalnum() for ch in w)])


def is_solution(cell: dict) -> bool:
    tags = cell.get("metadata", {}).get("tags", [])
    return "solution" in tags or "remove-cell" in tags


def page_prose(path: str | Path) -> list[str]:
    """Every prose sentence of a notebook's markdown cells, in order."""
    nb = json.loads(Path(path).read_text(encoding="utf-8"))
    out = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown" or is_solution(cell):
            continue
        for block in prose_blocks("".join(cell["source"])):
            out += sentences(block)
    return out


def long_sentences(path: str | Path, limit: int = MAX_SENTENCE_WORDS) -> list[tuple[int, str]]:
    """The sentences of a page over ``limit`` words, with their word counts."""
    return [(words(s), s) for s in page_prose(path) if words(s) > limit]


def page_words(path: str | Path) -> int:
    return sum(words(s) for s in page_prose(path))
