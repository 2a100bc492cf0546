"""Each chapter's graded quiz: multiple-choice and numeric questions with immediate feedback.

The questions live in ``grpo_course/quizzes/<chapter>.json`` (package data) (``jupyterquiz``'s format). :func:`show_quiz`
validates a chapter's file and displays it with ``jupyterquiz``, which puts the questions and its
scripts into the cell's output itself: the quiz works in JupyterLab, in Colab and in the static
book with no request leaving the page.
"""
from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

QUIZ_DIR = Path(str(resources.files("grpo_course") / "quizzes"))   # package data
TYPES = ("multiple_choice", "numeric")


class QuizError(ValueError):
    """A quiz file that is missing or does not follow the format."""


def quiz_file(chapter: str) -> Path:
    """``grpo_course/quizzes/<chapter>.json`` (``chapter``: a notebook's stem, ``03_grpo_from_scratch``)."""
    path = QUIZ_DIR / f"{chapter}.json"
    if not path.is_file():
        raise QuizError(f"no quiz for chapter {chapter!r}: {path} is missing")
    return path


def check_question(q: dict[str, Any]) -> list[str]:
    """What is wrong with one question (empty when it is well formed): a known type, text, a
    multiple-choice question with one correct answer and feedback on every answer, a numeric
    one with a correct value and a default feedback."""
    problems = []
    if q.get("type") not in TYPES:
        return [f"type {q.get('type')!r} is not one of {TYPES}"]
    if not str(q.get("question", "")).strip():
        problems.append("no question text")
    answers = q.get("answers") or []
    if q["type"] == "multiple_choice":
        if sum(bool(a.get("correct")) for a in answers) != 1 or len(answers) < 3:
            problems.append("a multiple-choice question needs 3+ answers, exactly one correct")
        if not all(str(a.get("feedback", "")).strip() for a in answers):
            problems.append("every answer needs feedback")
    else:
        if not any(a.get("correct") and a.get("type") == "value" for a in answers):
            problems.append("a numeric question needs a correct value")
        if not any(a.get("type") == "default" for a in answers):
            problems.append("a numeric question needs a default feedback")
    return problems


def load_quiz(chapter: str) -> list[dict[str, Any]]:
    """A chapter's questions, checked by :func:`check_question`."""
    path = quiz_file(chapter)
    try:
        questions = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise QuizError(f"{path.name} is not valid JSON: {exc}") from exc
    if not isinstance(questions, list) or not questions:
        raise QuizError(f"{path.name} must hold a non-empty list of questions")
    for k, q in enumerate(questions, 1):
        problems = check_question(q)
        if problems:
            raise QuizError(f"{path.name} question {k}: " + "; ".join(problems))
    return questions


def show_quiz(chapter: str) -> None:
    """Display the chapter's quiz (answers shuffled on every display, every question shown)."""
    from jupyterquiz import display_quiz

    display_quiz(load_quiz(chapter), shuffle_answers=True)
