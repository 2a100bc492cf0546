"""Checks of a built book (make test runs this with BOOK_HTML pointing at the HTML)."""
import os
import re
from pathlib import Path

import pytest

HTML = os.environ.get("BOOK_HTML")
pytestmark = pytest.mark.skipif(not HTML, reason="BOOK_HTML is not set (run through make test)")
ROOT = Path(__file__).resolve().parents[1]


def chapters():
    return sorted(p.stem for p in (ROOT / "notebooks").glob("0*_*.ipynb"))


def test_index_and_chapters_exist():
    html = Path(HTML)
    assert (html / "index.html").is_file() or (html / "book" / "intro.html").is_file()
    for stem in chapters():
        assert (html / "notebooks" / f"{stem}.html").is_file(), f"{stem} was not built"


@pytest.mark.parametrize("stem", chapters())
def test_chapter_page_has_outputs_and_no_errors(stem):
    page = (Path(HTML) / "notebooks" / f"{stem}.html").read_text(encoding="utf-8")
    assert "cell_output" in page, f"{stem}: the page shows no executed output"
    assert "Traceback (most recent call last)" not in page
    assert not re.search(r'class="[^"]*\berror\b', page), f"{stem}: a cell error is rendered"
