"""The reading line a student can hold (issue 107): no prose sentence over 45 words on any page, no
page over 4,000 words of markdown (grpo_course.book.prose counts them: code, math, tables and
solutions left out, a glued value one word)."""
from __future__ import annotations

from pathlib import Path

import pytest

from grpo_course.book.prose import MAX_PAGE_WORDS, MAX_SENTENCE_WORDS, long_sentences, page_words, sentences

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "notebooks").glob("0*.ipynb"))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_no_sentence_over_the_limit(page):
    found = long_sentences(page)
    assert not found, f"{page.name}: {len(found)} sentences over {MAX_SENTENCE_WORDS} words, e.g. " \
                      f"({found[0][0]} words) {found[0][1][:160]}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.stem)
def test_no_page_over_the_word_limit(page):
    assert page_words(page) <= MAX_PAGE_WORDS


def test_the_counter_reads_as_a_student_does(tmp_path):
    import json

    from grpo_course.book.prose import page_prose, words
    cell = lambda text, tags=(): {"cell_type": "markdown", "metadata": {"tags": list(tags)}, "source": [text]}
    nb = {"cells": [cell("# A title\n\nThe run took {eval}`glued.minutes` minutes, e.g. on `make book`. "
                         "It rose.\n\n```python\nnot = prose\n```\n\n| a | table |\n|---|---|\n"),
                    cell("Solution text that is long.", ["solution"]),
                    cell("```{admonition} Solutions\n:class: dropdown\nHidden answer.\n```\n"
                         "```{admonition} How this was measured\n:class: dropdown\nA folded note.\n```")]}
    page = tmp_path / "p.ipynb"
    page.write_text(json.dumps(nb))
    assert page_prose(page) == ["The run took VALUE minutes, e.g. on CODE.", "It rose.", "A folded note."]
    assert words("The run took VALUE minutes, e.g. on CODE.") == 8
    assert sentences("One (a). Two $x$ here. 3 more.") == ["One (a).", "Two $x$ here.", "3 more."]
