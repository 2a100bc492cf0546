"""The curriculum run's whole-problem tests, fixed before it trained: what they test and when
they pass (grpo_course.measure.whole_problems)."""
from __future__ import annotations

import pytest

from grpo_course.measure import paired
from grpo_course.measure import whole_problems as wp
from grpo_course.measure.paired import live_recheck_sentence


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
    # beside each accuracy its format and the guesser's score, "–" where the record lacks them
    assert a["format % (warm start → run)"] == "–" and a["guesser %"] == "–"
    record["greedy"]["format_before"], record["chance"] = 0.81, {"uniform_guess_accuracy": 0.0079}
    a, _ = wp.result_rows(record, "curriculum")
    assert a["format % (warm start → run)"] == "81 → 99" and a["guesser %"] == "0.8"
    said = wp.verdict_sentence(record)
    assert said.startswith("the curriculum run did not pass") and "sampled pass@1 did not rise significantly (p = 0.2)" in said
    assert said.endswith(", while greedy accuracy rose (p = 0.01)")
    fell = _record(before=0.03, after=0.01, p_greedy=0.001)
    assert wp.result_rows(fell, "x")[0]["reading"] == "fell"
    assert "passed the test" in wp.verdict_sentence(_record(p_sampled=0.01, diff=0.01, lo=0.002))
    # the reference run trained before the tests were written: they were applied after it
    assert wp.verdict_sentence(record, "the reference run", fixed_before=False).startswith(
        "the reference run did not pass the same test, applied after it trained:")


def test_start_table_counts_each_start_and_its_right_share_early_and_late():
    rows = [{"starts/whole/groups": 2, "starts/whole/correct": 0.0, "starts/whole/trained": 1,
             "starts/1/groups": 2, "starts/1/correct": 0.25, "starts/1/trained": 2}] * 4 \
        + [{"starts/whole/groups": 1, "starts/whole/correct": 0.5, "starts/whole/trained": 1}] * 4
    table = {r["start"]: r for r in wp.start_table(rows, ["whole", "1", "2"])}
    assert table["whole"]["groups sampled"] == 12 and table["whole"]["groups trained"] == 8
    assert table["whole"]["right %, first 2 steps"] == 0.0 and table["whole"]["right %, last 2 steps"] == 50.0
    assert table["1"]["right %, first 2 steps"] == 25.0
    assert table["1"]["right %, last 2 steps"] != table["1"]["right %, last 2 steps"]   # NaN: never sampled late
    assert table["2"]["groups sampled"] == 0


def test_the_live_recheck_needs_whole_sampling_blocks():
    with pytest.raises(ValueError, match="multiple of 4"):
        wp.live_recheck("data/runs/curriculum", 6)


def test_the_live_recheck_sentence_says_match_or_how_far_it_is():
    bench = {"sampled": {"before": {"right": [0, 1, 0, 0, 2]}, "after": {"right": [1, 1, 0, 0, 0]}}}
    same = {"before": {"right": [0, 1, 0, 0]}, "after": {"right": [1, 1, 0, 0]}}
    assert "match the benchmark's, for both models" in live_recheck_sentence(same, bench, wp.SAMPLES, "AMD EPYC")
    other = {"before": {"right": [0, 0, 0, 0]}, "after": {"right": [1, 1, 0, 0]}}
    text = live_recheck_sentence(other, bench, wp.SAMPLES, "AMD EPYC")
    assert "1 of 2 models' counts differ" in text and "+12.5 points against the benchmark's +6.2." in text
    assert "from its AMD EPYC" in text and text.endswith("moved the same way as the benchmark's")
    # short sentences, none of them past 40 words (it was one of 77)
    assert max(len(part.split()) for part in text.split(". ")) <= 40
    fell = {"before": {"right": [0, 1, 0, 0]}, "after": {"right": [0, 0, 0, 0]}}
    assert live_recheck_sentence(fell, bench, wp.SAMPLES, "AMD EPYC").endswith("on this machine the result may differ")


def test_the_answers_sentence_puts_the_chance_baseline_beside_the_answers():
    side = lambda share, eq, earned: {"right_equation_share": share, "equations_per_problem": eq,
                                      "earned": earned}
    tests = {"greedy": {"n": 1319, "before": 0.01, "after": 0.02, "format_before": 0.9, "format_after": 0.99,
                        "mcnemar": {"b_only": 20, "a_only": 7, "p_value": 0.019},
                        "answers": {"a": side(0.5, 2.0, 10), "b": side(None, 0.0, 12)}},
             "chance": {"uniform_guess_accuracy": 0.012}}
    text = wp.answers_sentence(tests)
    assert "1.0 → 2.0 % (n = 1319; 20 problems gained, 7 lost, McNemar p = 0.019)" in text
    assert "right equations per answer 1.00 → 0.00" in text and "arithmetic 10 → 12 problems" in text
    assert text.endswith("at random would score 1.2 %")


def test_the_format_reading_gives_the_work_beside_the_format_without_a_verdict_from_it():
    """The work's means are untested, so the sentence gives them with no direction word and no
    'form, not arithmetic' reading (fewer equations per answer lowered right equations per answer
    while the share of right ones rose: the product had read as 'did not rise')."""
    side = lambda share, eq: {"right_equation_share": share, "equations_per_problem": eq}
    tests = lambda fb, fa, a, b: {"greedy": {"n": 1319, "format_before": fb, "format_after": fa,
                                             "answers": {"a": side(*a), "b": side(*b)}}}
    fewer = wp.format_reading(tests(0.81, 0.999, (0.55, 2.23), (0.58, 1.90)), "The run")
    assert fewer.startswith("The run's format rose (81 → 100 %, n = 1319)")
    assert "right equations went from 55 % to 58 %" in fewer and "from 2.23 to 1.90 (both untested)" in fewer
    assert "arithmetic" not in fewer and "did not rise" not in fewer
    flat = wp.format_reading(tests(0.80, 0.81, (None, 0.0), (0.5, 2.2)), "The run")
    assert "format did not change detectably" in flat and "went from – to 50 %" in flat


def test_samples_are_cached_block_by_block_with_the_seeds_of_one_call(monkeypatch, tmp_path):
    """A stopped bench loses at most one cache block, and the blocks draw what one call would:
    the sampling block from problem lo is seeded seed + lo, whichever cache block holds it."""
    monkeypatch.setenv("GRPO_COURSE_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_model.safetensors").write_bytes(b"weights")
    (folder / "adapter_config.json").write_text('{"target_modules": ["q_proj", "v_proj"]}')
    rows = [{"question": f"q{i}", "answer": str(i), "idx": i} for i in range(2 * paired.CACHE_BLOCK + 8)]
    calls = []

    def fake_records(model, tok, block, samples, budget, temperature, seed, batch_prompts, *rest):
        calls.append(len(block))
        # sampled_blocks seeds the sampling block at position lo of its call with seed + lo
        return [{"idx": r["idx"], "seed": seed + j - j % batch_prompts, "right": 1, "formatted": 1,
                 "nll": 1.0, "tokens": 2} for j, r in enumerate(block)]

    monkeypatch.setattr(paired, "load_model", lambda name: (object(), object()))
    monkeypatch.setattr(paired, "sampled_records", fake_records)
    first = paired.cached_samples(folder, rows, 4, 16, seed=100)
    assert calls == [paired.CACHE_BLOCK, paired.CACHE_BLOCK, 8] and paired.CACHE_BLOCK % paired.BATCH_PROMPTS == 0
    assert [r["seed"] for r in first.records] == [100 + i - i % paired.BATCH_PROMPTS for i in range(len(rows))]
    again = paired.cached_samples(folder, rows, 4, 16, seed=100)           # every block from the cache
    assert calls == [paired.CACHE_BLOCK, paired.CACHE_BLOCK, 8] and again.records == first.records
    blocks = sorted((tmp_path / "cache" / "sampled_tests").glob("*.json"))
    blocks[-1].unlink()                                                 # one block lost: only it again
    paired.cached_samples(folder, rows, 4, 16, seed=100)
    assert len(calls) == 4


def test_what_the_course_shows_on_whole_problems_comes_from_the_shipped_records():
    import json
    from pathlib import Path

    fixed = json.loads((Path(__file__).resolve().parents[1] / "data" / "reference_test.json").read_text())
    whole = fixed["transfer"]["whole_problems"]
    (row,) = wp.shipped_rows(fixed, None)
    assert row["run"] == "reference run" and row["warm start %"] == 100 * whole["before"]
    said = wp.shipped_sentence(fixed, None)
    assert f"p = {whole['mcnemar']['p_value']:.2g}: {row['reading']}" in said and "have not run yet" in said
    record = _record(p_greedy=0.2)
    both = wp.shipped_rows(fixed, {"run": record, "reference": record})
    assert [r["run"] for r in both] == ["reference run", "curriculum run", "curriculum run", "reference run",
                                        "reference run"]
    said = wp.shipped_sentence(fixed, {"run": record, "reference": record})
    assert said.startswith("on whole GSM8K test problems, none of the 5 shipped tests shows a detectable change")
    assert said.endswith("sampled pass@1 did not rise significantly (p = 0.2)")
    assert ". The curriculum run did not pass the test fixed before it trained" in said
    assert "no test on whole problems" in wp.shipped_sentence(None, None)


def test_the_shipped_sentence_counts_falls_beside_rises(monkeypatch):
    row = {"run": "r", "test": "t", "warm start %": 1.0, "run %": 2.0, "interval or pairs": "x", "p": 0.01}
    readings = ["rose", "fell", "no detectable change"]
    monkeypatch.setattr(wp, "shipped_rows", lambda *a: [{**row, "reading": r} for r in readings])
    said = wp.shipped_sentence(None, None, detail=False)
    assert said.startswith("on whole GSM8K test problems, of the 3 shipped tests 1 rose and 1 fell, the rest")
    monkeypatch.setattr(wp, "shipped_rows", lambda *a: [{**row, "reading": r} for r in ("rose", "fell")])
    assert wp.shipped_sentence(None, None, detail=False).startswith(
        "on whole GSM8K test problems, of the 2 shipped tests 1 rose and 1 fell. ")
    monkeypatch.setattr(wp, "shipped_rows", lambda *a: [{**row, "reading": "fell"}])
    assert wp.shipped_sentence(None, None, detail=False).startswith(
        "on whole GSM8K test problems, the one shipped test fell")


def test_a_live_change_of_zero_does_not_agree_with_a_fall():
    bench = {"sampled": {"before": {"right": [1, 1, 0, 0]}, "after": {"right": [0, 0, 0, 0]}}}
    flat = {"before": {"right": [0, 0, 0, 0]}, "after": {"right": [0, 0, 0, 0]}}
    assert live_recheck_sentence(flat, bench, wp.SAMPLES, "AMD EPYC").endswith("on this machine the result may differ")
    one = {"sampled": {"before": {"right": [0, 0, 0, 0]}, "after": {"right": [1, 0, 0, 0]}}}   # +1 sample of 16
    assert live_recheck_sentence(flat, one, wp.SAMPLES, "AMD EPYC").endswith(
        "the two changes differ by 1 right sample of 16, too few to confirm or contradict it")


def test_validation_sentence_reads_each_step_against_step_0_by_its_own_test():
    from grpo_course.measure.whole_problems import validation_sentence, whole_step_change
    flat = {"accuracy": 0.02, "ci95": [0.01, 0.04]}
    points = [{"step": 0, "pass_at_1": {"mean": 0.035}, "whole_greedy": flat},
              {"step": 40, "pass_at_1": {"mean": 0.083},
               "vs_step_0": {"pass_at_1": {"difference": 0.048, "lo": 0.032, "hi": 0.064, "p_value": 9e-9}},
               "whole_greedy": {**flat, "accuracy": 0.018,
                                "vs_step_0": {"a_only": 12, "b_only": 9, "p_value": 0.66}}}]
    text = validation_sentence(points, 4)
    assert text.startswith("Step 0: whole problems 2.0 % [1.0, 4.0], one line left pass@1 3.5 % "
                           "(4 samples a problem), the warm start. Step 40: ")
    assert "(9 gained, 12 lost, McNemar p = 0.66: no detectable change)" in text
    assert "pass@1 8.3 %, +4.8 points (95 % CI +3.2 to +6.4, p = 9e-09): rose" in text
    assert text.endswith(". So on whole problems no kept step beat the warm start detectably: "
                         "validation gives no step to choose there")
    assert whole_step_change(points, points[0]) is None
    change = whole_step_change(points, points[1])
    assert (change["before"], round(change["after"], 9)) == (2.0, 1.8)
    assert {k: change[k] for k in ("step", "gained", "lost", "p_value", "reading")} == {
        "step": 40, "gained": 9, "lost": 12, "p_value": 0.66, "reading": "no detectable change"}
    points[1]["whole_greedy"] = {**flat, "accuracy": 0.06, "vs_step_0": {"a_only": 1, "b_only": 21, "p_value": 1e-5}}
    assert validation_sentence(points, 4).endswith("So on whole problems step 40 beat the warm start detectably")
    sampled_only = [{k: v for k, v in p.items() if k != "whole_greedy"} for p in points]
    assert validation_sentence(sampled_only, 4).endswith(
        ". Whole problems were not tested on this curve (its --whole_n was 0)")


def test_the_candidate_rule_takes_the_best_step_among_those_that_rose_and_else_none():
    from grpo_course.measure.whole_problems import candidate_steps, chosen_candidate
    flat = {"accuracy": 0.02, "ci95": [0.01, 0.04]}

    def curve(run, lr, *after):
        """A run's curve: step 0 at 2 %, then a step 40 and 100 at ``after`` (accuracy, gained, lost, p)."""
        points = [{"step": 0, "pass_at_1": {"mean": 0.03}, "whole_greedy": flat}]
        for step, (acc, up, down, p) in zip((40, 100), after, strict=True):
            points.append({"step": step, "pass_at_1": {"mean": 0.05},
                           "vs_step_0": {"pass_at_1": {"difference": 0.02, "p_value": 0.01}}, "whole_greedy": {
                **flat, "accuracy": acc, "vs_step_0": {"a_only": down, "b_only": up, "p_value": p}}})
        return {"run": f"data/runs/{run}", "points": points,
                "recipe": {"learning_rate": lr, "start_mix": ["whole", "1"], "pool_prompts": 512}}

    flat_runs = [curve("curriculum", 3e-4, (0.018, 9, 12, 0.66), (0.023, 12, 10, 0.8)),
                 curve("curriculum_lr2x", 6e-4, (0.05, 20, 5, 0.003), (0.03, 9, 4, 0.27))]
    rows = candidate_steps(flat_runs)
    assert [(r["run"], r["step"], r["reading"]) for r in rows] == [
        ("curriculum", 40, "no detectable change"), ("curriculum", 100, "no detectable change"),
        ("curriculum_lr2x", 40, "rose"), ("curriculum_lr2x", 100, "no detectable change")]
    assert (rows[2]["learning_rate"], rows[2]["starts"], rows[2]["pool"]) == (6e-4, "whole 1", 512)
    assert (rows[2]["one_line_left"], rows[2]["one_line_left_p"]) == (2.0, 0.01)
    assert chosen_candidate(rows)["run"] == "curriculum_lr2x" and chosen_candidate(rows)["step"] == 40
    # a higher accuracy that did not rise detectably is not chosen over one that did
    rows[1] = {**rows[1], "after": 9.0}
    assert chosen_candidate(rows)["step"] == 40
    # one that fell is not chosen either, and where none rose none is
    assert chosen_candidate([r for r in rows if r["reading"] != "rose"]) is None
    fell = candidate_steps([curve("x", 1e-4, (0.0, 0, 11, 0.001), (0.02, 3, 3, 1.0))])
    assert fell[0]["reading"] == "fell" and chosen_candidate(fell) is None


def test_the_format_share_of_the_shipped_curriculum_test_adds_up():
    import json
    from pathlib import Path

    from grpo_course.measure.stats import format_share
    record = json.loads((Path(__file__).resolve().parents[1] / "data" / "curriculum_test.json").read_text())
    said = wp.format_share_sentence(record["run"])
    assert said.startswith("Greedy accuracy: of ") and ". Sampled pass@1: of " in said
    s = record["run"]["sampled"]
    split = format_share(s["pass_at_1"]["mean_a"], s["before"]["format_rate"],
                         s["pass_at_1"]["mean_b"], s["after"]["format_rate"])
    assert split["from_format"] + split["from_accuracy"] == pytest.approx(s["pass_at_1"]["difference"])
