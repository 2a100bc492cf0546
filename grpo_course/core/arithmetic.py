"""Arithmetic in a model's work: the ``a op b = c`` equations it writes, and whether they hold.

Chapter 3 reads a completion's equations twice: :mod:`grpo_course.measure.attribution` counts the right
and wrong ones on held-out problems, and the ``grounded_steps`` reward
(:mod:`grpo_course.core.rewards`) credits a gold intermediate result only when a right equation
computes it.
"""
from __future__ import annotations

import re
from fractions import Fraction

#: an equation of the work: a flat expression of numbers and + - * / x × ÷, then "=", then a number
EQUATION = re.compile(
    r"((?:\$?\d[\d,]*(?:\.\d+)?%?\s*[-+*/x×÷]\s*)+\$?\d[\d,]*(?:\.\d+)?%?)\s*=\s*\$?\s*(-?\d[\d,]*(?:\.\d+)?)")
_TOKEN = re.compile(r"\$?\d[\d,]*(?:\.\d+)?%?|[-+*/x×÷]")


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
        for op, tok in zip(tokens[1::2], tokens[2::2], strict=False):
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
    for op, value in zip(ops, terms[1:], strict=False):
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
