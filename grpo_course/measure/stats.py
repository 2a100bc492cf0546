"""The course's statistics, in one place: a binomial proportion's Wilson interval, McNemar's exact
test for paired right/wrong outcomes, the paired difference of per-problem scores, and a linear
trend with its interval. Every held-out comparison of the book goes through these."""
from __future__ import annotations

import math
from collections.abc import Sequence
from functools import cache
from typing import Any

import mpmath  # torch's own dependency (through sympy): the incomplete beta function


def t_two_sided_p(t: float, df: int) -> float:
    """Two-sided p-value of Student's t statistic ``t`` with ``df`` degrees of freedom."""
    if df < 1:
        raise ValueError("Student's t needs at least one degree of freedom")
    if math.isinf(t):
        return 0.0
    return float(mpmath.betainc(df / 2, 0.5, 0, df / (df + t * t), regularized=True))


@cache
def t_quantile(df: int, level: float = 0.95) -> float:
    """The two-sided critical value of Student's t (``level`` of the mass within +-it): 12.71 at
    1 degree of freedom, 2.36 at 7, and the normal 1.96 as ``df`` grows."""
    lo, hi = 0.0, 1e3
    for _ in range(80):                      # bisection: the p-value falls as t grows
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_two_sided_p(mid, df) > 1 - level else (lo, mid)
    return (lo + hi) / 2


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95 % Wilson score interval of a binomial proportion (``(0, 1)`` when n = 0)."""
    if n <= 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # the interval always holds p; at p = 0 or 1 rounding can leave a bound a hair past it
    return (max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half)))


def mcnemar_test(a_correct: Sequence[bool], b_correct: Sequence[bool]) -> dict[str, Any]:
    """Exact two-sided McNemar test for paired right/wrong outcomes on the same problems.

    Only discordant problems count: ``b_only`` (B right, A wrong) and ``a_only``. Under
    "no difference" each discordant problem is a fair coin, so the p-value is a binomial tail.
    """
    if len(a_correct) != len(b_correct):
        raise ValueError("paired outcomes need the same problems for both models")
    a_only = sum(1 for a, b in zip(a_correct, b_correct, strict=False) if a and not b)
    b_only = sum(1 for a, b in zip(a_correct, b_correct, strict=False) if b and not a)
    m, k = a_only + b_only, min(a_only, b_only)
    tail = sum(math.comb(m, i) for i in range(k + 1)) / 2 ** m if m else 1.0
    return {"n": len(a_correct), "a_only": a_only, "b_only": b_only,
            "p_value": min(1.0, 2 * tail)}


def _mean_and_se(values: Sequence[float]) -> tuple[int, float, float]:
    """``n``, the mean and its standard error (the sample standard deviation over sqrt(n))."""
    n = len(values)
    mean = sum(map(float, values)) / n
    sd = math.sqrt(sum((float(v) - mean) ** 2 for v in values) / (n - 1))
    return n, mean, sd / math.sqrt(n)


def paired_difference(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """Mean of ``b - a`` over paired problems, its 95 % interval and two-sided p-value (the paired
    t-test: Student's t with n - 1 degrees of freedom, so a handful of problems gets the wide
    interval it deserves)."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError("a paired difference needs the same problems, at least 2")
    diffs = [float(y) - float(x) for x, y in zip(a, b, strict=False)]
    n, mean, se = _mean_and_se(diffs)
    p = t_two_sided_p(mean / se, n - 1) if se > 0 else (1.0 if mean == 0 else 0.0)
    half = t_quantile(n - 1) * se
    return {"n": n, "mean_a": sum(map(float, a)) / n, "mean_b": sum(map(float, b)) / n,
            "difference": mean, "lo": mean - half, "hi": mean + half, "p_value": p}


def p_text(p: float, alpha: float = 0.05) -> str:
    """A p-value to two significant digits (``5e-09``, ``0.18``), or three where two would round it
    across ``alpha``: 0.0497 counts as p < 0.05, so it is not written "0.05"."""
    two = f"{p:.2g}"
    return f"{p:.3g}" if (float(two) < alpha) != (p < alpha) else two


def describe_difference(d: dict[str, float], scale: float = 100.0, unit: str = "points") -> str:
    """A :func:`paired_difference` in words: ``+3.1 points (95 % CI +1.0 to +5.2, p = 0.004)``
    (``scale`` 100: a difference of proportions in percentage points)."""
    return (f"{scale * d['difference']:+.1f} {unit} (95 % CI {scale * d['lo']:+.1f} to "
            f"{scale * d['hi']:+.1f}, p = {p_text(d['p_value'])})")


def linear_trend(values: Sequence[float]) -> dict[str, float]:
    """Least-squares slope of ``values`` against their index, with a 95 % interval (Student's t
    with n - 2 degrees of freedom); NaNs are left out."""
    points = [(i, float(v)) for i, v in enumerate(values) if not math.isnan(float(v))]
    n = len(points)
    if n < 3:
        return {"slope": float("nan"), "lo": float("nan"), "hi": float("nan"), "n": n}
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    resid = sum((y - my - slope * (x - mx)) ** 2 for x, y in points)
    half = t_quantile(n - 2) * math.sqrt(resid / (n - 2) / sxx)
    return {"slope": slope, "lo": slope - half, "hi": slope + half, "n": n}


def reading(change: float, p: float, alpha: float = 0.05) -> str:
    """A paired change in plain words, decided by its p: ``rose``, ``fell`` or ``no detectable
    change`` (at ``alpha``)."""
    if p >= alpha:
        return "no detectable change"
    return "rose" if change > 0 else "fell"


def as_sentences(parts: list[str]) -> str:
    """Clauses as sentences: each begun with a capital, joined by ". " (the caller ends the last)."""
    return ". ".join(p[0].upper() + p[1:] for p in parts)


def interval_words(lo: float, hi: float, rose: str, fell: str, neither: str) -> str:
    """A change in the caller's words, decided by its 95 % interval: ``rose`` where the interval
    lies above 0, ``fell`` where below, else ``neither`` (the interval holds 0)."""
    return rose if lo > 0 else fell if hi < 0 else neither


def interval_reading(lo: float, hi: float) -> str:
    """A change in plain words, decided by its 95 % interval: ``rose`` where it lies above 0,
    ``fell`` where below, else ``no detectable change``."""
    return interval_words(lo, hi, "rose", "fell", "no detectable change")


def difference_reading(d: dict[str, float]) -> str:
    """A :func:`paired_difference` in words with its p (``rose, p = 0.003 (paired by problem)``).
    Where every problem moved by the same amount there is no spread to test (two problems on
    the smoke profile), and the words say so."""
    if d["lo"] == d["hi"]:
        return "the same change on every problem: no spread to test" if d["difference"] else "no change"
    return f"{reading(d['difference'], d['p_value'])}, p = {p_text(d['p_value'])} (paired by problem)"


def trend_words(values: Sequence[float]) -> str:
    """The direction of a series in words, from :func:`linear_trend`'s slope and 95 % interval:
    ``rose``, ``fell``, or ``showed no detectable trend`` (an interval that holds 0, or fewer than
    3 points)."""
    t = linear_trend(values)
    if t["n"] < 3 or t["lo"] <= 0 <= t["hi"]:
        return "showed no detectable trend"
    return "rose" if t["slope"] > 0 else "fell"


def pass_at_k_estimate(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one problem from ``n`` samples of which ``c`` are right: the chance
    that ``k`` of them drawn without replacement hold at least one right answer,
    ``1 - C(n-c, k) / C(n, k)`` (Chen et al. 2021, arXiv 2107.03374)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def mixed_group_chance(n: int, c: int, g: int) -> float:
    """The chance that a group of ``g`` of the ``n`` samples (``c`` right) holds both a right and
    a wrong answer: the groups where GRPO's correctness reward has a signal."""
    if not 0 <= c <= n or not 2 <= g <= n:
        raise ValueError(f"a mixed group needs 0 <= c <= n and 2 <= g <= n; got n={n}, c={c}, g={g}")
    return 1.0 - (math.comb(c, g) + math.comb(n - c, g)) / math.comb(n, g)


def mean_interval(values: Sequence[float],
                  bounds: tuple[float, float] = (-math.inf, math.inf)) -> dict[str, float]:
    """Mean of per-problem values with its 95 % interval (Student's t, n - 1 degrees of freedom),
    cut to ``bounds`` (a share's interval stays within 0 and 1)."""
    if len(values) < 2:
        raise ValueError("a mean's interval needs at least 2 values")
    n, mean, se = _mean_and_se(values)
    half = t_quantile(n - 1) * se
    return {"n": n, "mean": mean, "lo": max(bounds[0], mean - half),
            "hi": min(bounds[1], mean + half)}


def format_share(acc_a: float, fmt_a: float, acc_b: float, fmt_b: float) -> dict[str, float | None]:
    """How much of a change of accuracy the format explains: ``acc = fmt * r``, with ``r`` the
    accuracy among formatted answers, so ``acc_b - acc_a = r_a * (fmt_b - fmt_a) + fmt_b * (r_b - r_a)``.
    ``from_format`` is what more (or fewer) answers in the format give at the first model's accuracy
    per formatted answer; ``from_accuracy`` the change of that accuracy. A decomposition of point
    estimates, not a test. With no formatted answer before, the format explains all of it."""
    change = acc_b - acc_a
    if fmt_a <= 0:
        return {"change": change, "from_format": change, "from_accuracy": 0.0, "per_formatted_a": None,
                "per_formatted_b": acc_b / fmt_b if fmt_b > 0 else None}
    r_a = acc_a / fmt_a
    from_format = r_a * (fmt_b - fmt_a)
    return {"change": change, "from_format": from_format, "from_accuracy": change - from_format,
            "per_formatted_a": r_a, "per_formatted_b": acc_b / fmt_b if fmt_b > 0 else None}


def format_share_words(acc_a: float, fmt_a: float, acc_b: float, fmt_b: float) -> str:
    """:func:`format_share` in one clause (points of accuracy): how much of the change more answers
    in the format explain, and how much is a change of accuracy among formatted answers."""
    s = format_share(acc_a, fmt_a, acc_b, fmt_b)
    if s["per_formatted_a"] is None:
        return (f"no answer was in the format before, so the format explains all "
                f"{100 * s['change']:+.1f} points")
    return (f"of {100 * s['change']:+.1f} points, the format explains {100 * s['from_format']:+.1f} "
            f"({100 * fmt_a:.0f} → {100 * fmt_b:.0f} % formatted) and the share right per formatted answer "
            f"{100 * s['from_accuracy']:+.1f} ({100 * s['per_formatted_a']:.1f} → "
            f"{100 * (s['per_formatted_b'] or 0):.1f} %)")
