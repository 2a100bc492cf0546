"""What a student reads in a page's outputs (grpo_course.book.outputs): the checker itself, and,
where ``EXECUTED_NOTEBOOKS`` names a folder of executed pages (make book, book-smoke), every page."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from grpo_course.book.outputs import output_problems, significant_digits


def _page(*outputs, tags=()):
    return {"cells": [{"cell_type": "markdown", "source": "/root/x 0.1234567 nan"},
                      {"cell_type": "code", "metadata": {"tags": list(tags)}, "outputs": list(outputs)}]}


def _stdout(text):
    return {"output_type": "stream", "name": "stdout", "text": text}


def test_significant_digits_skip_leading_zeros():
    assert significant_digits("0", "0005207") == 4 and significant_digits("21", "090196") == 8
    assert significant_digits("0", "0") == 1


@pytest.mark.parametrize("text, what", [
    ("model cache: /root/.cache/grpo_course/smollm2\n", "an absolute path '/root/.cache/grpo_course/smollm2'"),
    ("adapter saved to /tmp/tmpab12/out\n", "an absolute path '/tmp/tmpab12/out'"),
    ("{'mean': 0.0005207075737416744}\n", "a float of more than 6 significant digits '0.0005207075737416744'"),
    ("cached: 100%|██| 64/64 [00:00<00:00, 13553.24it/s]\n", "'13553.24'"),
    ("ratio 21.090196\n", "'21.090196'"),
    ("disagreement: nan\n", "a NaN"),
])
def test_what_a_student_should_not_read_is_found(text, what):
    problems = output_problems(_page(_stdout(text)))
    assert len(problems) == 1 and what in problems[0] and problems[0].startswith("cell 1: ")


@pytest.mark.parametrize("text", [
    "torch 2.13.0 on 127.0.0.1, pass@1 0.123456, 1.5e-05, 3.14 %\n",
    "$GRPO_COURSE_CACHE/runs/calculator_sft and data/runs/reference/sft\n",
    "nanochat and a finance question\n",
])
def test_what_a_page_may_print_passes(text):
    assert output_problems(_page(_stdout(text))) == []


def test_the_book_s_view_of_a_cell():
    # what the book does not show is not checked: stderr, hidden outputs, widgets, markdown cells
    assert output_problems(_page({"output_type": "stream", "name": "stderr", "text": "/root/x"})) == []
    assert output_problems(_page(_stdout("/root/x"), tags=("remove-output",))) == []
    widget = {"output_type": "display_data", "data": {
        "application/vnd.jupyter.widget-view+json": {}, "text/plain": "13553.24it/s"}}
    assert output_problems(_page(widget)) == []
    # a table is read as its HTML shows it: a NaN cell is found, the style sheet's numbers are not
    table = {"output_type": "execute_result", "data": {
        "text/html": "<style>td {width: 33.3333333%}</style><table><tr><td>NaN</td></tr></table>",
        "text/plain": "0    NaN"}}
    problems = output_problems(_page(table))
    assert len(problems) == 1 and "a NaN" in problems[0]


EXECUTED = os.environ.get("EXECUTED_NOTEBOOKS")
PAGES = sorted(Path(EXECUTED).glob("*.ipynb")) if EXECUTED else []


@pytest.mark.skipif(not EXECUTED, reason="EXECUTED_NOTEBOOKS names no folder of executed pages")
def test_there_are_executed_pages_to_read():
    assert PAGES, f"EXECUTED_NOTEBOOKS={EXECUTED!r} holds no .ipynb"


@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_every_built_page_reads_clean(page):
    assert output_problems(page) == []
