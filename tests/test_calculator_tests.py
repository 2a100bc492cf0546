"""The calculator run's whole-problem tests, fixed before it trained: what they test, with and
without the tool, and the credit of each phase (grpo_course.measure.calculator_tests)."""
from __future__ import annotations

import json

from grpo_course.measure import calculator_tests as ct
from grpo_course.measure import paired
from grpo_course.measure import whole_problems as wp
from grpo_course.measure.evaluate import EvalResult, SampledResult


def test_the_tests_are_the_ones_fixed_in_advance():
    # (a) all 1,319 test problems, whole, greedy; (b) rows 0-511, whole, K = 4 at T = 1; both with the tool
    assert ct.GREEDY_ROWS == (0, 1319) and ct.SAMPLED_ROWS == (0, 512)
    assert (ct.SAMPLES, ct.TEMPERATURE, ct.SEED, ct.BUDGET) == (4, 1.0, 4321, 256)
    # the verdict is the curriculum run's rule, at the same thresholds
    assert (ct.ALPHA, ct.MIN_FORMAT) == (wp.ALPHA, wp.MIN_FORMAT) == (0.05, 0.95)
    assert ct.DESIGN["greedy"]["calculator"] and ct.DESIGN["sampled"]["calculator"]
    assert ct.DESIGN["sampled"]["rows"] == [0, 512] and ct.DESIGN["max_new_tokens"] == 256


def test_the_answers_arithmetic_is_read_without_the_tools_annotations():
    result = EvalResult.from_records([{"idx": 0, "correct": True, "formatted": True, "completion_tokens": 9,
                                       "completion": "3+4 = <<3+4=7>>7\n#### 7"}])
    assert paired.own_work(result).records[0]["completion"] == "3+4 = 7\n#### 7"
    plain = EvalResult.from_records([{"idx": 0, "correct": True, "formatted": True, "completion_tokens": 3,
                                      "completion": "#### 7"}])
    assert paired.own_work(plain) is plain


def test_the_record_holds_both_ways_every_phase_and_no_machine_path(monkeypatch, tmp_path):
    rows = [{"question": f"q{i} 3 4", "answer": str(i % 3 + 7), "idx": i, "solution": "#### 7"} for i in range(6)]
    calls = []

    def fake_greedy(folder, rows_, budget, progress=True, calculator=False):
        calls.append(("greedy", folder.split("/")[-1], calculator, budget))
        right = 4 if folder.endswith("calculator") and calculator else 1
        return EvalResult.from_records([{"idx": r["idx"], "correct": i < right, "formatted": True,
                                         "completion_tokens": 5, "tool_results": int(calculator),
                                         "completion": "<<3+4=7>>7\n#### 7" if calculator else "#### 7"}
                                        for i, r in enumerate(rows_)])

    def fake_samples(folder, rows_, samples, budget, seed, progress=True, calculator=False):
        calls.append(("sampled", str(folder).split("/")[-1], calculator, budget))
        right = 3 if str(folder).endswith("calculator") and calculator else 1
        return SampledResult(samples, [{"idx": r["idx"], "right": right if i % 2 else 0, "formatted": samples,
                                        "nll": 1.0, "tokens": 4} for i, r in enumerate(rows_)], 1.0, str(folder))

    monkeypatch.setattr(paired, "greedy_answers", fake_greedy)
    monkeypatch.setattr(wp, "greedy_answers", fake_greedy)      # wp.greedy: the phases' answers
    monkeypatch.setattr(paired, "cached_samples", fake_samples)
    monkeypatch.setattr(ct, "held_out_rows", lambda split, n, offset: rows)
    run = tmp_path / "calculator"
    out = ct.calculator_tests(run, tmp_path / "old", progress=False)
    assert set(out) >= {"with_calculator", "without_calculator", "verdict", "phases", "chance"}
    assert out["with_calculator"]["greedy"]["after"] > out["without_calculator"]["greedy"]["after"]
    assert list(out["phases"]["accuracy"]) == ["old_warm_start", "new_warm_start", "new_warm_start_tool", "grpo_tool"]
    assert "new_warm_start -> new_warm_start_tool" in out["phases"]["steps"]
    assert {c[3] for c in calls} == {256}
    assert ("greedy", "calculator", True, 256) in calls and ("sampled", "sft", True, 256) in calls
    assert str(tmp_path) not in json.dumps(out)
    # the page's table of phases: each phase's accuracy and the paired change from the one before
    rows = ct.phase_rows(out)
    assert [r["phase"] for r in rows] == list(ct.PHASE_NAMES.values())
    assert rows[0]["p"] is None and rows[0]["reading"] == "–"
    assert rows[3]["accuracy %"] == 100 * out["phases"]["accuracy"]["grpo_tool"] and rows[2]["p"] is not None


def test_a_record_shows_paths_relative_to_the_checkout_or_the_cache(monkeypatch, tmp_path):
    from grpo_course.infra.paths import project_root, shown_path
    monkeypatch.setenv("GRPO_COURSE_CACHE", str(tmp_path / "cache"))
    assert shown_path(project_root() / "data" / "runs" / "calculator") == "data/runs/calculator"
    assert shown_path(tmp_path / "cache" / "runs" / "x") == "$GRPO_COURSE_CACHE/runs/x"
    assert shown_path("/elsewhere/deep/run/sft") == "run/sft" and shown_path("smollm2-135m-instruct") == "smollm2-135m-instruct"


def test_no_committed_record_holds_a_machine_path():
    import re

    from grpo_course.infra.paths import project_root
    root = project_root()
    files = [*root.glob("data/*.json"), *root.glob("data/runs/*/run.json"),
             *root.glob("grpo_course/measurements/*.json")]
    assert files
    for path in files:
        found = re.findall(r'"(/(?:root|home|tmp|work|Users)/[^"]*)"', path.read_text(encoding="utf-8"))
        assert not found, f"{path.relative_to(root)}: {found[:2]}"


def _curve(solved_tool, old_solved, twice, own=None):
    n = 512
    point = {"step": 218, "epochs": 0.5, "accuracy_tool": solved_tool / n, "solved_tool": solved_tool,
             "format_tool": 0.97, "tool_results_per_answer": 2.5,
             "vs_old_tool": {"b_only": solved_tool, "a_only": old_solved, "p_value": 0.001 if twice else 0.4}}
    if own is not None:
        point.update({"accuracy_own": own / n, "solved_own": own, "format_own": 0.4,
                      "tool_vs_own": {"b_only": solved_tool - own, "a_only": 0, "p_value": 0.01}})
    return {"rows": ["train", 0, n], "old_warm_start": {"solved": old_solved, "accuracy": old_solved / n},
            "points": [{**point, "step": 109, "epochs": 0.25, "solved_tool": 1}, point], "best": 218,
            "twice_the_old": twice}


def test_the_curve_sentence_says_what_was_chosen_and_whether_it_clears_the_bar():
    said = ct.sft_curve_sentence(_curve(30, 10, True, own=12))
    assert said.startswith("With the calculator, the warm-up's adapter at step 218 (0.5 epochs)")
    assert "30 of 512" in said and "so the new one rose" in said and "is at least twice" in said
    assert "solved 12 (format 40 %): accuracy rose with the tool" in said
    flat = ct.sft_curve_sentence(_curve(12, 10, False))
    assert "no detectable change" in flat and "is not twice" in flat and "themselves" not in flat
    rows = ct.sft_curve_rows(_curve(30, 10, True))
    assert [r["SFT step"] for r in rows] == [109, 218] and rows[1]["accuracy %"] == 100 * 30 / 512


def test_the_live_recheck_samples_test_b_s_first_rows_with_the_tool(monkeypatch):
    import pytest
    with pytest.raises(ValueError, match="multiple of 4"):
        ct.live_recheck("data/runs/calculator", 6)
    seen = {}

    def fake_pair(before, after, rows, samples, budget, progress, **sampling):
        seen.update(before=str(before), after=str(after), n=len(rows), samples=samples, budget=budget, **sampling)
        one = SampledResult(samples, [{"idx": r["idx"], "right": 1, "formatted": samples, "nll": 1.0, "tokens": 4}
                                      for r in rows], 1.0, "m")
        return one, one

    monkeypatch.setattr(ct, "held_out_rows", lambda split, n, offset: [{"idx": offset + i} for i in range(n)])
    monkeypatch.setattr(ct, "sampled_pair", fake_pair)
    out = ct.live_recheck("data/runs/calculator", 8, progress=False)
    assert seen["before"].endswith("calculator/sft") and seen["n"] == 8 and seen["calculator"] is True
    assert (seen["samples"], seen["budget"], seen["seed"], seen["temperature"]) == (4, 256, 4321, 1.0)
    assert len(out["after"]["right"]) == 8
