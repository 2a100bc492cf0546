"""The Colab edition: every chapter's markdown, rendered by a plain CommonMark renderer (what
Colab shows), holds no MyST role or directive; values come from the book's run."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from grpo_course import colab

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("0*_*.ipynb"))
SITE = "https://grpo-course.github.io/grpo-on-a-cpu/"
PAGE = SITE + "notebooks/"
MYST_LEFT = re.compile(r"\{(eval|term|cite|admonition|figure|note|glue)[^}]*\}|^:class:|^```\{|^:::",
                       re.M)


class AnyValue(dict):
    """Every glued name has a value (the real chapters quote hundreds)."""

    def __contains__(self, name):
        return True

    def __missing__(self, name):
        return f"<{name}>"


def test_roles_become_values_links_and_citations():
    text = ("Accuracy {eval}`glued.acc` % with a {term}`Wilson interval` and "
            "{term}`k3 <k3 estimator>` {cite}`kirkpatrick2017ewc,schwarz2018progress`.")
    out = colab.to_commonmark(text, {"acc": "1.8"}, SITE, PAGE,
                              cites={"kirkpatrick2017ewc": "Kirkpatrick et al. 2017"})
    assert "**1.8** *(book run)* %" in out
    assert f"[Wilson interval]({SITE}book/glossary.html#term-Wilson-interval)" in out
    assert f"[k3]({SITE}book/glossary.html#term-k3-estimator)" in out
    assert f"([Kirkpatrick et al. 2017]({SITE}book/references.html); " in out
    assert "[schwarz2018progress]" in out                     # an unknown key keeps its name


def test_a_value_that_was_never_glued_is_one_clear_error():
    with pytest.raises(colab.ColabError, match="'missing'"):
        colab.to_commonmark("{eval}`glued.missing`", {}, SITE, PAGE)


def test_admonitions_become_details_or_blockquotes_and_links_absolute():
    text = ("Try it.\n\n```{admonition} Solution\n:class: dropdown\n1. Four.\n2. Eight.\n```\n\n"
            "```{admonition} Note\nPlain *text*.\n```\n"
            "[![badge](../book/images/colab-badge.svg)](https://colab.example/x) and [ch 3](03_grpo.ipynb)")
    out = colab.to_commonmark(text, {}, SITE, PAGE)
    assert "<details>\n<summary>Solution</summary>\n\n1. Four.\n2. Eight.\n\n</details>" in out
    assert "> **Note**\n>\n> Plain *text*." in out
    assert f"]({SITE}book/images/colab-badge.svg)" in out and f"]({PAGE}03_grpo.html)" in out
    assert not MYST_LEFT.search(out)


def test_glued_values_and_glossary_ids_are_read_from_the_build():
    executed = {"cells": [{"cell_type": "code", "outputs": [
        {"output_type": "display_data", "metadata": {"scrapbook": {"name": "acc"}},
         "data": {"application/papermill.record/text/plain": "1.8"}}]}]}
    assert colab.glued_values(executed) == {"acc": "1.8"}
    # myst-nb 1.x keeps the values in <chapter>.glue.json, and none in the executed notebook
    glue_json = {"acc": {"output_type": "display_data", "metadata": {"scrapbook": {"name": "acc"}},
                         "data": {"text/plain": "2.5"}}, "n": {"data": {"text/plain": ["51", "2"]}}}
    assert colab.glued_values({"cells": []}, glue_json) == {"acc": "2.5", "n": "512"}
    html = ('<dl><dt id="term-Native-bf16">Native bf16<a class="headerlink" href="#x">¶</a></dt>'
            '<dt id="term-AMX">AMX<a class="headerlink" href="#y">¶</a></dt></dl>')
    ids = colab.glossary_ids(html)
    assert ids == {"Native bf16": "term-Native-bf16", "AMX": "term-AMX"}
    assert colab.term_anchor("native  BF16", ids) == "term-Native-bf16"


def test_read_glue_file_beside_the_executed_notebook(tmp_path):
    executed = tmp_path / "01_x.ipynb"
    assert colab.read_glue_file(executed) == {}
    (tmp_path / "01_x.glue.json").write_text('{"acc": {"data": {"text/plain": "1.0"}}}')
    assert colab.glued_values({"cells": []}, colab.read_glue_file(executed)) == {"acc": "1.0"}
    (tmp_path / "01_x.glue.json").write_text("{not json")
    with pytest.raises(colab.ColabError, match="01_x.glue.json"):
        colab.read_glue_file(executed)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_chapter_renders_as_plain_commonmark(path):
    source = json.loads(path.read_text())
    cites = colab.cite_labels(ROOT / "book" / "references.bib")
    edition = colab.colab_notebook(source, AnyValue(), SITE, cites=cites)
    md = MarkdownIt("commonmark")
    markdown = [c for c in edition["cells"] if c["cell_type"] == "markdown"]
    for cell in markdown:
        text = "".join(cell["source"])
        assert not MYST_LEFT.search(text), text[:300]
        html = md.render(text)
        assert not MYST_LEFT.search(html), html[:300]
        assert "](../" not in text                       # every link resolves from Colab
    code = [c for c in edition["cells"] if c["cell_type"] == "code"]
    assert [c["source"] for c in code] == [c["source"] for c in source["cells"]
                                           if c["cell_type"] == "code"]      # code unchanged
    assert all(c["outputs"] == [] for c in code)
    assert "*(book run)*" in "".join("".join(c["source"]) for c in markdown)


def test_write_edition_from_a_built_book(tmp_path):
    root, build = tmp_path / "book", tmp_path / "book" / "_build"
    (root / "notebooks").mkdir(parents=True)
    (root / "book").mkdir()
    shutil.copy(ROOT / "_config.yml", root / "_config.yml")
    shutil.copy(ROOT / "book" / "references.bib", root / "book" / "references.bib")
    chapter = NOTEBOOKS[0]
    shutil.copy(chapter, root / "notebooks" / chapter.name)
    names = set(re.findall(r"\{eval\}`glued\.(\w+)`", chapter.read_text()))
    executed = {"cells": [{"cell_type": "code", "outputs": [
        {"output_type": "display_data", "metadata": {"scrapbook": {"name": n}},
         "data": {"application/papermill.record/text/plain": "7"}} for n in names]}]}
    (build / "jupyter_execute" / "notebooks").mkdir(parents=True)
    (build / "jupyter_execute" / "notebooks" / chapter.name).write_text(json.dumps(executed))
    (build / "html").mkdir()
    assert colab.main(["--root", str(root), "--build", str(build)]) == 0
    written = json.loads((build / "colab" / chapter.name).read_text())
    assert (build / "html" / "colab" / chapter.name).is_file()
    assert "**7** *(book run)*" in "".join("".join(c["source"]) for c in written["cells"])


def test_colab_cli_answers_a_missing_build_in_one_line(tmp_path, capsys):
    assert colab.main(["--root", str(ROOT), "--build", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "run `make book` first" in err[0]
