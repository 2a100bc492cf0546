"""The curriculum run's whole-problem tests, fixed before it trained: what they test and when
they pass (grpo_course.measure.whole_problems)."""
from __future__ import annotations

import pytest

from grpo_course.measure import whole_problems as wp


def test_the_tests_are_the_ones_fixed_in_advance():
    # (a) all 1,319 test problems, whole, greedy; (b) rows 0-511, whole, K = 4 at T = 1
    assert wp.GREEDY_ROWS == (0, 1319) and wp.SAMPLED_ROWS == (0, 512)
    assert (wp.SAMPLES, wp.TEMPERATURE, wp.ALPHA, wp.MIN_FORMAT) == (4, 1.0, 0.05, 0.95)
    # a whole answer's budget: the full profile's evaluation (as the reference run's transfer test)
    from grpo_course.config import get_profile
    assert wp.budget(None) == 200 == get_profile("full").eval.max_new_tokens and wp.budget(1) == 64
    assert wp.DESIGN["sampled"]["samples"] == 4 and wp.DESIGN["greedy"]["rows"] == [0, 1319]


def _results(before, after, p_greedy, diff, p_sampled, fmt_greedy=0.99, fmt_sampled=0.99):
    greedy = {"before": before, "after": after, "format_after": fmt_greedy,
              "mcnemar": {"p_value": p_greedy}}
    sampled = {"pass_at_1": {"difference": diff, "p_value": p_sampled},
               "after": {"format_rate": fmt_sampled}}
    return greedy, sampled


@pytest.mark.parametrize("args, passed", [
    ((0.010, 0.030, 0.001, 0.02, 0.001), True),
    ((0.010, 0.030, 0.200, 0.02, 0.001), False),       # greedy rose, not significantly
    ((0.030, 0.010, 0.001, 0.02, 0.001), False),       # greedy fell significantly
    ((0.010, 0.030, 0.001, -0.02, 0.001), False),      # sampled pass@1 fell
    ((0.010, 0.030, 0.001, 0.02, 0.001, 0.94), False),  # greedy format below 95 %
    ((0.010, 0.030, 0.001, 0.02, 0.001, 0.99, 0.90), False),  # sampled format below 95 %
])
def test_it_passes_only_where_both_rise_significantly_and_the_format_holds(args, passed):
    verdict = wp.whole_verdict(*_results(*args))
    assert verdict["passed"] is passed
    assert set(verdict) == {"passed", "greedy_rose", "sampled_rose", "format_ok"}


def _record(before=0.016, after=0.031, gained=40, lost=20, p_greedy=0.01, diff=0.004, lo=-0.002,
            hi=0.010, p_sampled=0.2):
    greedy, sampled = _results(before, after, p_greedy, diff, p_sampled)
    greedy.update(n=1319, mcnemar={"p_value": p_greedy, "a_only": lost, "b_only": gained})
    sampled.update(rows=[0, 512], pass_at_1={"difference": diff, "lo": lo, "hi": hi,
                                             "p_value": p_sampled, "mean_a": 0.012, "mean_b": 0.016})
    sampled["after"]["samples"] = 4
    return {"greedy": greedy, "sampled": sampled, "verdict": wp.whole_verdict(greedy, sampled)}


def test_the_record_reads_in_words_from_its_numbers():
    record = _record()
    a, b = wp.result_rows(record, "curriculum")
    assert a["reading"] == "rose" and a["interval or pairs"] == "40 gained, 20 lost"
    assert abs(a["change (points)"] - 1.5) < 1e-9 and a["test"].endswith("all 1319 test problems")
    assert b["reading"] == "no detectable change" and b["interval or pairs"] == "95 % CI -0.2 to +1.0"
    assert b["test"] == "(b) sampled pass@1, K = 4, rows 0-511"
    said = wp.verdict_sentence(record)
    assert said.startswith("the curriculum run did not pass") and "sampled pass@1 did not" in said
    assert "greedy" not in said.split(":", 1)[1]
    fell = _record(before=0.03, after=0.01, p_greedy=0.001)
    assert wp.result_rows(fell, "x")[0]["reading"] == "fell"
    assert "passed the test" in wp.verdict_sentence(_record(p_sampled=0.01, diff=0.01, lo=0.002))
