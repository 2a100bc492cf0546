"""grpo_course.measure.stats: the intervals and tests behind every comparison in the book."""
import math

import pytest

from grpo_course.measure.stats import (
    describe_difference,
    linear_trend,
    mcnemar_test,
    p_text,
    paired_difference,
    t_quantile,
    t_two_sided_p,
    wilson_interval,
)


def test_wilson_interval_holds_the_proportion():
    """0/n and n/n included: a bound past p by a rounding error broke chapter 3's error bars
    (matplotlib refuses a negative bar length)."""
    for n in range(1, 400):
        for k in range(n + 1):
            lo, hi = wilson_interval(k, n)
            assert 0.0 <= lo <= k / n <= hi <= 1.0, (k, n)
    assert wilson_interval(0, 11)[0] == 0.0 and wilson_interval(6, 6)[1] == 1.0


def test_wilson_interval_known_values():
    lo, hi = wilson_interval(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)
    lo, hi = wilson_interval(0, 200)
    assert lo == 0.0 and hi == pytest.approx(0.01885, abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_mcnemar_exact():
    # 10 problems, B right on 6 where A wrong, A right on 0 where B wrong: p = 2 * 0.5**6
    a = [False] * 6 + [True] * 2 + [False] * 2
    b = [True] * 6 + [True] * 2 + [False] * 2
    out = mcnemar_test(a, b)
    assert out["b_only"] == 6 and out["a_only"] == 0
    assert out["p_value"] == pytest.approx(2 * 0.5 ** 6)
    assert mcnemar_test(a, a)["p_value"] == 1.0
    with pytest.raises(ValueError):
        mcnemar_test([True], [True, False])


def test_linear_trend_recovers_a_known_slope():
    exact = linear_trend([1.0 + 0.5 * i for i in range(10)])
    assert exact["slope"] == pytest.approx(0.5) and exact["lo"] == pytest.approx(0.5)
    noisy = linear_trend([0.1 * i + (-1) ** i for i in range(40)])
    assert noisy["lo"] < 0.1 < noisy["hi"] and noisy["n"] == 40
    flat = linear_trend([(-1) ** i for i in range(40)])
    assert flat["lo"] < 0 < flat["hi"]
    assert math.isnan(linear_trend([1.0, float("nan"), 2.0])["slope"])


def test_paired_difference_has_an_interval_and_a_p_value():
    same = paired_difference([0.1, 0.2, 0.3], [0.1, 0.2, 0.3])
    assert same["difference"] == 0 and same["p_value"] == 1.0
    up = paired_difference([0.0] * 50 + [0.5] * 50, [0.2] * 50 + [0.6] * 50)
    assert up["difference"] == pytest.approx(0.15) and up["lo"] < 0.15 < up["hi"]
    assert up["p_value"] < 1e-6
    with pytest.raises(ValueError):
        paired_difference([1.0], [1.0, 2.0])


def test_describe_difference_says_the_change_its_interval_and_p():
    d = {"difference": 0.031, "lo": -0.0049, "hi": 0.0671, "p_value": 0.0912}
    assert describe_difference(d) == "+3.1 points (95 % CI -0.5 to +6.7, p = 0.091)"
    assert describe_difference(d, scale=1.0, unit="nats") == "+0.0 nats (95 % CI -0.0 to +0.1, p = 0.091)"


def test_student_t_matches_its_tables():
    # two-sided 95 % critical values from any t table
    for df, value in [(1, 12.706), (2, 4.303), (7, 2.365), (30, 2.042), (1000, 1.962)]:
        assert t_quantile(df) == pytest.approx(value, abs=1e-3)
    assert t_two_sided_p(0.0, 5) == pytest.approx(1.0)
    assert t_two_sided_p(2.228, 10) == pytest.approx(0.05, abs=1e-3)
    assert t_two_sided_p(float("inf"), 3) == 0.0
    with pytest.raises(ValueError):
        t_two_sided_p(1.0, 0)


def test_a_few_pairs_get_the_wide_interval_they_deserve():
    """8 problems: the t interval is 2.365 / 1.96 times the normal one, and its p-value larger."""
    a, b = [0.0, 1.0, 0.5, 0.2, 0.9, 0.4, 0.3, 0.6], [0.3, 1.2, 0.4, 0.6, 1.3, 0.5, 0.9, 0.8]
    out = paired_difference(a, b)
    diffs = [y - x for x, y in zip(a, b, strict=True)]
    mean = sum(diffs) / 8
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 7 / 8)
    assert out["hi"] - out["difference"] == pytest.approx(2.3646 * se, rel=1e-3)
    assert out["p_value"] > math.erfc(mean / se / math.sqrt(2))


def test_pass_at_k_estimate_is_the_chance_of_a_right_answer_among_k():
    from grpo_course.measure.stats import pass_at_k_estimate
    assert pass_at_k_estimate(16, 0, 8) == 0.0 and pass_at_k_estimate(16, 16, 1) == 1.0
    assert pass_at_k_estimate(16, 4, 1) == pytest.approx(0.25)          # pass@1: the mean
    assert pass_at_k_estimate(4, 1, 2) == pytest.approx(0.5)            # 3 of 6 pairs hold it
    assert pass_at_k_estimate(16, 1, 16) == 1.0
    values = [pass_at_k_estimate(16, 3, k) for k in (1, 2, 4, 8, 16)]
    assert values == sorted(values)                                     # rises with k
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k_estimate(4, 5, 2)


def test_mixed_group_chance():
    from grpo_course.measure.stats import mixed_group_chance
    assert mixed_group_chance(8, 0, 8) == 0.0 and mixed_group_chance(8, 8, 4) == 0.0
    assert mixed_group_chance(8, 1, 8) == 1.0
    assert mixed_group_chance(4, 2, 2) == pytest.approx(4 / 6)   # 4 of the 6 pairs mix
    with pytest.raises(ValueError, match="mixed group needs"):
        mixed_group_chance(4, 1, 1)


def test_mean_interval():
    from grpo_course.measure.stats import mean_interval
    m = mean_interval([0.0, 1.0, 0.0, 1.0])
    assert m["mean"] == 0.5 and m["lo"] < 0.5 < m["hi"] and m["n"] == 4
    assert mean_interval([0.2, 0.2])["lo"] == pytest.approx(0.2)
    with pytest.raises(ValueError):
        mean_interval([1.0])


def test_trend_words_come_from_the_slopes_interval():
    from grpo_course.measure.stats import trend_words
    assert trend_words([1.0, 2.0, 3.1, 3.9, 5.0]) == "rose"
    assert trend_words([2.12, 1.5, 0.9, 0.32]) == "fell"
    assert trend_words([1.0, 1.5, 0.9, 1.2, 1.1]) == "showed no detectable trend"
    assert trend_words([1.76, 1.53]) == "showed no detectable trend"      # two points: no interval


def test_interval_reading_and_difference_reading_follow_the_interval_and_p():
    from grpo_course.measure.stats import (
        difference_reading,
        interval_reading,
        interval_words,
        paired_difference,
    )

    assert interval_reading(0.1, 0.4) == "rose"
    assert interval_reading(-0.4, -0.1) == "fell"
    assert interval_reading(-0.1, 0.4) == "no detectable change"
    assert interval_reading(0.0, 0.4) == "no detectable change"           # an interval that touches 0 holds it
    words = ("longer", "shorter", "about as long")
    assert [interval_words(lo, hi, *words) for lo, hi in ((1, 2), (-2, -1), (-1, 1))] == list(words)
    up = paired_difference([0, 0, 0, 0, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1, 0])
    assert difference_reading(up).startswith("rose, p = ")
    flat = paired_difference([0, 1, 0, 1], [1, 0, 0, 1])
    assert difference_reading(flat).startswith("no detectable change")
    same = paired_difference([0, 0], [1, 1])                   # no spread: the t-test cannot judge
    assert difference_reading(same) == "the same change on every problem: no spread to test"
    assert difference_reading(paired_difference([1, 0], [1, 0])) == "no change"


def test_p_text_never_rounds_a_p_across_its_threshold():
    # two significant digits, except where they would write a p under 0.05 as "0.05"
    assert p_text(0.0497) == "0.0497"
    assert p_text(0.05) == "0.05"
    assert p_text(0.0502) == "0.05"
    assert p_text(3.7e-06) == "3.7e-06"
    assert p_text(0.684) == "0.68"
    assert p_text(0.0096, alpha=0.01) == "0.0096"
    assert p_text(0.00996, alpha=0.01) == "0.00996"


def test_format_share_splits_a_change_into_format_and_accuracy_per_formatted_answer():
    from grpo_course.measure.stats import format_share, format_share_words
    # 2 % right of 80 % formatted -> 3 % right of 100 %: 2.5 % per formatted answer before, 3 % after
    s = format_share(0.02, 0.80, 0.03, 1.00)
    assert s["from_format"] == pytest.approx(0.025 * 0.20) and s["from_accuracy"] == pytest.approx(0.01 - 0.005)
    assert s["from_format"] + s["from_accuracy"] == pytest.approx(s["change"])
    words = format_share_words(0.02, 0.80, 0.03, 1.00)
    assert words.startswith("of +1.0 points, the format explains +0.5 (80 → 100 % formatted)") and "2.5 → 3.0 %" in words
    assert len(words.split()) <= 30
    # all of it format: the same accuracy per formatted answer
    assert format_share(0.01, 0.5, 0.02, 1.0)["from_accuracy"] == pytest.approx(0.0)
    assert "explains all +2.0 points" in format_share_words(0.0, 0.0, 0.02, 0.9)
