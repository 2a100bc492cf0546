"""Notebooks are stored without outputs and follow the chapter anatomy."""
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("0*_*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ holds no chapter"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    dirty = [i for i, c in enumerate(nb.cells)
             if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count"))]
    assert not dirty, f"{path.name}: cells {dirty} carry outputs; strip them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_chapter_anatomy(path):
    nb = nbformat.read(path, as_version=4)
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    for heading in ("**Objectives**", "## Summary", "## Exercises"):
        assert heading in text, f"{path.name} lacks {heading}"
    assert "get_profile()" in code, f"{path.name} must read its sizes from the profile"
    assert "glue(" in code, f"{path.name} must glue the numbers its prose quotes"
    assert ":class: dropdown" in text, f"{path.name}: exercise solutions should be hidden"


def test_toc_lists_every_notebook():
    toc = (ROOT / "_toc.yml").read_text()
    for path in NOTEBOOKS:
        assert f"notebooks/{path.stem}" in toc, f"{path.name} is missing from _toc.yml"
