"""What a training phase changed on held-out problems, beyond the final answer (chapter 3).

Accuracy counts a final number, however it was reached. A 135M model's few correct GSM8K
answers are mostly reached by wrong work that happens to land on the gold number, and which
problems it "solves" that way changes with every small change of its weights; accuracy then
cannot see what a phase taught. This module measures what it can see, per problem, so that two
evaluations of the same problems can be compared pairwise:

* :func:`step_f1` per record: the held-out counterpart of the dense ``intermediate_results``
  reward (F1 between the results the work computes and the gold solution's step results), and
  whether the work reaches at least one of them (``reached_step``);
* :func:`arithmetic_check`: how many ``a op b = c`` equations of the work are arithmetically right;
  a correct answer whose work has a wrong equation was not computed, it was guessed;
* :func:`chance_baseline`: how often the gold answer is one operation away from two numbers of the
  question, and what a uniform guess among those candidates scores;
* :func:`solved_overlap`: how many problems two models both solve, against the overlap two
  unrelated guessers with the same accuracies would have;
* :func:`phase_changes`: all of the above for two models, each with its paired test.
"""
from __future__ import annotations

import itertools
import math
import re
from fractions import Fraction
from typing import Any, Sequence

from .answers import normalize_number
from .data import solution_results
from .evaluate import EvalResult, mcnemar_test
from .rewards import step_f1

#: an equation of the work: a flat expression of numbers and + - * / x × ÷, then "=", then a number
EQUATION = re.compile(
    r"((?:\$?\d[\d,]*(?:\.\d+)?%?\s*[-+*/x×÷]\s*)+\$?\d[\d,]*(?:\.\d+)?%?)\s*=\s*\$?\s*(-?\d[\d,]*(?:\.\d+)?)")
_TOKEN = re.compile(r"\$?\d[\d,]*(?:\.\d+)?%?|[-+*/x×÷]")
_QUESTION_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def _number(text: str) -> Fraction:
    """``"$1,200"`` -> 1200, ``"15%"`` -> 3/20 (exact)."""
    text = text.replace(",", "").replace("$", "")
    return Fraction(text[:-1]) / 100 if text.endswith("%") else Fraction(text)


def evaluate_expression(expression: str) -> Fraction | None:
    """The exact value of a flat arithmetic expression (``*`` and ``/`` before ``+`` and ``-``),
    ``None`` if it is not one or divides by zero.

    >>> evaluate_expression("48/2 + 3 x 2")
    Fraction(30, 1)
    """
    tokens = _TOKEN.findall(expression)
    if not tokens or len(tokens) % 2 == 0:
        return None
    try:
        terms, ops = [_number(tokens[0])], []
        for op, tok in zip(tokens[1::2], tokens[2::2]):
            value = _number(tok)
            if op in "*x×":
                terms[-1] *= value
            elif op in "/÷":
                terms[-1] /= value
            else:
                terms.append(value)
                ops.append(op)
    except (ValueError, ZeroDivisionError, ArithmeticError):
        return None
    total = terms[0]
    for op, value in zip(ops, terms[1:]):
        total = total + value if op == "+" else total - value
    return total


def equation_is_right(expression: str, result: str) -> bool | None:
    """Whether ``expression = result`` holds: exactly, or rounded to the decimals the result
    shows (``16/3 = 5.33`` is right, ``16/3 = 5`` is not); ``None`` when it cannot be read."""
    value = evaluate_expression(expression)
    if value is None:
        return None
    try:
        written = _number(result)
    except (ValueError, ArithmeticError):
        return None
    decimals = len(result.split(".")[1]) if "." in result else 0
    return value == written or (decimals > 0 and round(float(value), decimals) == float(written))


def arithmetic_check(text: str) -> tuple[int, int]:
    """(right, wrong) equations ``a op b ... = c`` in ``text``.

    >>> arithmetic_check("She has 16/2 = 8 eggs.\\nShe sells 8*2 = 18 of them.")
    (1, 1)
    """
    right = wrong = 0
    for expression, result in EQUATION.findall(text or ""):
        verdict = equation_is_right(expression, result)
        if verdict is True:
            right += 1
        elif verdict is False:
            wrong += 1
    return right, wrong


def chance_candidates(question: str) -> set[Fraction]:
    """The numbers of ``question`` and every ``a + b``, ``a - b``, ``a * b``, ``a / b`` of two of
    them: the answers one operation away from the question."""
    numbers = []
    for raw in _QUESTION_NUMBER.findall(question):
        value = normalize_number(raw)
        if value is not None:
            numbers.append(Fraction(value))
    numbers = list(dict.fromkeys(numbers))
    out = set(numbers)
    for a, b in itertools.permutations(numbers, 2):
        out |= {a + b, a - b, a * b}
        if b:
            out.add(a / b)
    return out


def chance_baseline(dataset) -> dict[str, Any]:
    """How often the gold answer is one operation away from two numbers of the question
    (``one_step_reachable``), and the accuracy of a guesser that picks one of those candidates
    uniformly at random (``uniform_guess_accuracy``, its expectation)."""
    reachable, expected = 0, 0.0
    rows = list(dataset)
    for row in rows:
        candidates = chance_candidates(row["question"])
        if Fraction(row["answer"]) in candidates:
            reachable += 1
            expected += 1 / len(candidates)
    n = len(rows)
    return {"n": n, "one_step_reachable": reachable / n if n else 0.0,
            "uniform_guess_accuracy": expected / n if n else 0.0}


def step_scores(result: EvalResult, dataset) -> list[float]:
    """:func:`~grpo_course.rewards.step_f1` of every record against its gold solution
    (``dataset`` holds the evaluated rows, with ``idx`` and ``solution``)."""
    solutions = {row["idx"]: row["solution"] for row in dataset}
    return [step_f1(r["completion"], solution_results(solutions[r["idx"]])) for r in result.records]


def earned(record: dict[str, Any]) -> bool:
    """A correct answer whose work shows at least one equation and no wrong one."""
    right, wrong = arithmetic_check(record["completion"])
    return bool(record["correct"]) and right > 0 and wrong == 0


def solved_overlap(a: EvalResult, b: EvalResult) -> dict[str, float]:
    """Problems both models solve, and how many two unrelated guessers with the same accuracies
    would share by chance (``n * acc_a * acc_b``)."""
    both = sum(1 for x, y in zip(a.records, b.records) if x["correct"] and y["correct"])
    return {"both": both, "a": a.correct, "b": b.correct,
            "expected_if_unrelated": a.n * a.accuracy * b.accuracy}


def paired_difference(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """Mean of ``b - a`` over paired problems, its 95 % interval and two-sided p-value (normal
    approximation of the paired t-test; fine for the hundreds of problems evaluated here)."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError("a paired difference needs the same problems, at least 2")
    diffs = [float(y) - float(x) for x, y in zip(a, b)]
    n = len(diffs)
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    se = sd / math.sqrt(n)
    p = math.erfc(abs(mean) / se / math.sqrt(2)) if se > 0 else (1.0 if mean == 0 else 0.0)
    return {"n": n, "mean_a": sum(map(float, a)) / n, "mean_b": sum(map(float, b)) / n,
            "difference": mean, "lo": mean - 1.96 * se, "hi": mean + 1.96 * se, "p_value": p}


def phase_changes(a: EvalResult, b: EvalResult, dataset) -> dict[str, Any]:
    """What changed from model A to model B on the same held-out problems: accuracy, format,
    reaching a gold step (McNemar each), step F1 (paired difference), the share of right
    equations and equations per problem, correct answers with right arithmetic, and the
    overlap of the solved problems."""
    if [r["idx"] for r in a.records] != [r["idx"] for r in b.records]:
        raise ValueError("the two evaluations are not on the same problems")
    f1_a, f1_b = step_scores(a, dataset), step_scores(b, dataset)
    out: dict[str, Any] = {
        "accuracy": mcnemar_test([r["correct"] for r in a.records], [r["correct"] for r in b.records]),
        "format": mcnemar_test([r["formatted"] for r in a.records], [r["formatted"] for r in b.records]),
        "reached_step": mcnemar_test([f > 0 for f in f1_a], [f > 0 for f in f1_b]),
        "step_f1": paired_difference(f1_a, f1_b),
        "overlap": solved_overlap(a, b),
    }
    for tag, result, f1 in (("a", a, f1_a), ("b", b, f1_b)):
        checks = [arithmetic_check(r["completion"]) for r in result.records]
        right, wrong = sum(c[0] for c in checks), sum(c[1] for c in checks)
        out[tag] = {"reached_step": sum(f > 0 for f in f1) / len(f1), "step_f1": sum(f1) / len(f1),
                    "right_equation_share": right / (right + wrong) if right + wrong else None,
                    "equations_per_problem": (right + wrong) / len(checks),
                    "correct": result.correct,
                    "earned": sum(earned(r) for r in result.records)}
    return out
