"""Every chapter's graded quiz: well-formed questions, shown with everything inside the output."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from grpo_course.book import quiz

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted(p.stem for p in (ROOT / "notebooks").glob("0*.ipynb"))


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_every_chapter_has_a_graded_quiz_shown_in_its_notebook(chapter):
    questions = quiz.load_quiz(chapter)
    assert len(questions) >= 5
    cells = json.loads((ROOT / "notebooks" / f"{chapter}.ipynb").read_text())["cells"]
    assert any(f'show_quiz("{chapter}")' in "".join(c["source"]) for c in cells
               if c["cell_type"] == "code"), f"{chapter} does not show its quiz"
    markdown = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    assert "{admonition} Answer" not in markdown, f"{chapter} still has ungraded answers"


def test_check_question_names_each_problem():
    good = {"type": "multiple_choice", "question": "q?",
            "answers": [{"answer": a, "correct": a == "b", "feedback": "why"} for a in "abc"]}
    assert quiz.check_question(good) == []
    two_right = json.loads(json.dumps(good))
    two_right["answers"][0]["correct"] = True
    assert "exactly one correct" in quiz.check_question(two_right)[0]
    silent = json.loads(json.dumps(good))
    silent["answers"][2]["feedback"] = ""
    assert quiz.check_question(silent) == ["every answer needs feedback"]
    assert "not one of" in quiz.check_question({"type": "essay"})[0]
    numeric = {"type": "numeric", "question": "n?", "answers": [{"type": "value", "value": 4}]}
    assert quiz.check_question(numeric) == ["a numeric question needs a correct value",
                                            "a numeric question needs a default feedback"]


def test_a_missing_or_broken_quiz_file_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(quiz, "QUIZ_DIR", tmp_path)
    with pytest.raises(quiz.QuizError, match="no quiz for chapter"):
        quiz.load_quiz("09_missing")
    (tmp_path / "09_bad.json").write_text("[{")
    with pytest.raises(quiz.QuizError, match="not valid JSON"):
        quiz.load_quiz("09_bad")


def test_show_quiz_puts_questions_and_scripts_in_the_output(monkeypatch):
    import jupyterquiz.dynamic.display as shown

    outputs = []
    monkeypatch.setattr(shown, "display", lambda obj: outputs.append(obj))
    quiz.show_quiz(CHAPTERS[2])
    html, script = outputs[0].data, outputs[1].data
    first = quiz.load_quiz(CHAPTERS[2])[0]["question"]
    assert json.dumps(first)[1:40] in script                   # the questions are embedded
    assert "function show_questions" in script                  # and jupyterquiz's scripts
    assert not re.search(r"(src|href)=[\"']https?://", html + script), "a request would leave"
