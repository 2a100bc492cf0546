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


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_each_chapter_has_a_result_box_at_the_top_filled_at_the_end(path):
    """The box (grpo_course.book.results) comes before the chapter's first heavy cell and is filled
    by a cell after every other result, before the run-time cell."""
    nb = nbformat.read(path, as_version=4)
    code = [(i, c.source) for i, c in enumerate(nb.cells) if c.cell_type == "code"]
    tops = [i for i, s in code if "results_box()" in s]
    fills = [i for i, s in code if "fill_results_box(" in s]
    timed = [i for i, s in code if "total_minutes = " in s]
    assert len(tops) == 1 and tops[0] <= 3, f"{path.name}: the result box belongs at the top"
    assert len(fills) == 1 and timed and fills[0] < timed[0], \
        f"{path.name}: fill the result box once, before the run-time cell"


def test_toc_lists_every_notebook():
    toc = (ROOT / "_toc.yml").read_text()
    for path in NOTEBOOKS:
        assert f"notebooks/{path.stem}" in toc, f"{path.name} is missing from _toc.yml"


def _glue_name_patterns(source: str) -> list[str]:
    """The names a code cell glues, as regexes (an f-string name such as f"{tag}_acc" matches any tag)."""
    import ast
    import re

    # IPython magics and shell lines are not Python: blank them out before parsing
    tree = ast.parse("\n".join("" if line.lstrip().startswith(("!", "%")) else line
                               for line in source.splitlines()))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "glue" and node.args:
            name = node.args[0]
            if isinstance(name, ast.Constant):
                found.append(re.escape(name.value))
            elif isinstance(name, ast.JoinedStr):
                found.append("".join(re.escape(v.value) if isinstance(v, ast.Constant) else r"\w+"
                                     for v in name.values))
            else:
                found.append(r"\w+")
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_prose_quotes_glued_values_that_are_computed_before_it(path):
    """Prose quotes numbers as {eval}`glued.name` (rendered by jupyterlab-myst and by the book), never
    with {glue} roles (raw text in JupyterLab); run top to bottom, a markdown cell may only quote what an
    earlier cell glued, or JupyterLab shows an error where the number should be."""
    import re

    nb = nbformat.read(path, as_version=4)
    glued: list[str] = []
    problems = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            glued += _glue_name_patterns(cell.source)
            continue
        if "{glue" in cell.source:
            problems.append(f"cell {i}: a {{glue}} role (write {{eval}}`glued.name`)")
        for expr in re.findall(r"\{eval\}`([^`]*)`", cell.source):
            name = re.fullmatch(r"glued\.(\w+)", expr)
            if not name:
                problems.append(f"cell {i}: {{eval}}`{expr}` is not glued.<name>")
            elif not any(re.fullmatch(p, name.group(1)) for p in glued):
                problems.append(f"cell {i}: glued.{name.group(1)} is quoted before any cell glues it")
    assert not problems, f"{path.name}: " + "; ".join(problems)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_a_chapter_that_quotes_glued_values_imports_glued(path):
    """JupyterLab evaluates each {eval}`glued.name` in the kernel: without ``glued`` imported
    every quoted number shows a NameError (ruff's F401 fix once removed it from chapter 3)."""
    import re

    nb = nbformat.read(path, as_version=4)
    quotes = any("{eval}`glued." in c.source for c in nb.cells if c.cell_type == "markdown")
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert not quotes or re.search(r"from grpo_course\.book\.glue import [^\n]*\bglued\b", code)


def _glossary_terms() -> set[str]:
    """The terms of book/glossary.md's ``{glossary}`` block: its unindented lines."""
    import re

    text = (ROOT / "book" / "glossary.md").read_text()
    block = re.search(r"```\{glossary\}\n(.*?)\n```", text, re.S).group(1)
    return {line.strip() for line in block.splitlines() if line.strip() and not line[0].isspace()}


def test_every_term_role_names_a_glossary_term():
    """A {term} role whose target is not a glossary term renders as plain text with a Sphinx
    warning that nobody reads: every chapter's and every book page's roles must resolve."""
    import re

    terms = _glossary_terms()
    assert len(terms) > 20, "the glossary block was not found"
    pages = [(p.name, "\n".join(c.source for c in nbformat.read(p, as_version=4).cells
                                if c.cell_type == "markdown")) for p in NOTEBOOKS]
    pages += [(p.name, p.read_text()) for p in sorted((ROOT / "book").glob("*.md"))]
    missing = []
    for name, text in pages:
        for role in re.findall(r"\{term\}`([^`]*)`", text):
            target = re.fullmatch(r"(?s).*<([^>]*)>", role)
            target = (target.group(1) if target else role).strip()
            if not any(target.lower() == t.lower() for t in terms):
                missing.append(f"{name}: {{term}}`{role}`")
    assert not missing, "roles whose target is not in book/glossary.md: " + "; ".join(missing)


def _section_code(path: Path, heading: str) -> list[str]:
    """The code cells between markdown ``heading`` and the next heading of any level."""
    nb = nbformat.read(path, as_version=4)
    cells, inside = [], False
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            if cell.source.startswith(heading):
                inside = True
            elif inside and cell.source.lstrip().startswith("#"):
                break
        elif inside:
            cells.append(cell.source)
    return cells


def test_chapter_3_loop_is_written_out_in_at_most_60_lines():
    """Your GRPO loop: the student's code, not the package's trainer or loss, short enough to read."""
    import re

    cells = _section_code(ROOT / "notebooks" / "03_grpo_from_scratch.ipynb", "## Your GRPO loop")
    assert cells, "chapter 3 has no '## Your GRPO loop' section with code"
    code = "\n".join(cells)
    lines = [l for l in code.splitlines() if l.strip() and not l.strip().startswith(("#", "from ", "import "))
             and "yours_or_course(" not in l]          # the step's own lines: its imports and parts aside
    assert len(lines) <= 60, f"the loop section has {len(lines)} code lines (at most 60)"
    # the four parts are the student's exercises, picked where their checks passed
    parts = {"advantages_of": "my_group_advantages", "token_logps_of": "my_token_logps",
             "surrogate_of": "my_clipped_surrogate", "aggregate_of": "my_aggregate_loss"}
    for part, mine in parts.items():
        assert re.search(rf"{part} = exercises\.yours_or_course\({mine},", code), \
            f"the loop does not pick {mine} (the student's exercise) for {part}"
        assert f"{part}(" in code, f"the loop does not call {part}"
    step = "\n".join(l for l in code.splitlines() if "yours_or_course(" not in l)
    for name in ("CourseTrainer", "grpo_loss", "aggregate_loss", "clipped_surrogate",
                 "per_token_logps", "group_advantages", "trainer.step("):
        assert name not in step, f"the loop section calls {name}: it must write the step out"
    for piece in ("torch.exp", "backward()", "optimizer.step()", "completion_mask", "disable_adapter",
                  "clip_grad_norm_"):
        assert piece in code, f"the loop section does not write out {piece}"
    assert re.search(r"for step in tqdm\(range\(steps\)", code) and "P.loop.steps" in code, \
        "the loop must run P.loop.steps steps with a progress bar"
    assert "LiveCurves" in code, "the loop must plot its reward as it trains"
