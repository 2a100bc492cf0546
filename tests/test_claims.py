"""No hand-typed result claims: a markdown paragraph that states a percentage or a ratio quotes it
through a role (``{eval}`` from the cell that measured it, or ``{cite}`` of a source) in the same
paragraph. Checked over every chapter's markdown cells and the book's prose pages."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# a percentage ("12 %", "3.5%", "40 per cent") or a ratio ("2.6x", "4×")
CLAIM = re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s?(?:%|per ?cent\b|[x×](?![\w]))")
ROLE = re.compile(r"\{(?:eval|cite|cite:p|cite:t)\}`")
# numbers that state no result: the confidence level of every interval, a definition of the CPU
# utilization scale, and a matrix's dimensions ("576 × 49 152")
NOT_A_CLAIM = re.compile(r"95\s?%|100 % = one core|\d+ × \d")


def paragraphs(text: str) -> list[str]:
    """The prose paragraphs of a markdown text, code blocks, math blocks and code spans removed."""
    text = re.sub(r"(`{3,}|:{3,}).*?\1", "", text, flags=re.S)
    text = re.sub(r"\$\$.*?\$\$", "", text, flags=re.S)
    return [p for p in re.split(r"\n\s*\n", text) if p.strip()]


def unsupported_claims(text: str) -> list[str]:
    """The paragraphs of ``text`` that state a percentage or ratio with no role to back it."""
    found = []
    for paragraph in paragraphs(text):
        prose = NOT_A_CLAIM.sub("", re.sub(r"`[^`]*`", "", paragraph))
        if CLAIM.search(prose) and not ROLE.search(paragraph):
            found.append(paragraph.strip())
    return found


def prose_pages() -> list[tuple[str, str]]:
    pages = []
    for path in sorted((ROOT / "notebooks").glob("0*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        pages += [(f"{path.name} cell {i}", "".join(c["source"]))
                  for i, c in enumerate(cells) if c["cell_type"] == "markdown"]
    pages += [(path.name, path.read_text(encoding="utf-8")) for path in sorted((ROOT / "book").glob("*.md"))]
    return pages


PAGES = prose_pages()


@pytest.mark.parametrize(("where", "text"), PAGES, ids=[where for where, _ in PAGES])
def test_every_percentage_or_ratio_is_glued_or_cited(where, text):
    claims = unsupported_claims(text)
    assert not claims, f"{where}: a percentage or ratio typed by hand (glue it or cite it): {claims[0][:200]!r}"


def test_the_rule_catches_a_typed_claim_and_passes_quoted_ones():
    assert unsupported_claims("GRPO raised accuracy by 12 % on held-out problems.")
    assert unsupported_claims("The trainer is 2.6x faster than TRL.")
    assert unsupported_claims("- first point\n- INT8 weights shrink 4× in memory")
    assert not unsupported_claims("Accuracy went to {eval}`glued.acc` %, 12 % above chance.")
    assert not unsupported_claims("Public runs moved 2.42 % to 2.58 % {cite}`somebody2025`.")
    assert not unsupported_claims("Each figure shows a 95 % interval.")
    assert not unsupported_claims("The head is a 576 × 49 152 matrix; `x = 3 %` is code.")
    assert not unsupported_claims("```python\nprint(f'{a:.0%}')  # 50 %\n```")
