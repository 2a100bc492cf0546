"""What a phase changed beyond the final answer: step F1, arithmetic, chance, paired tests."""
from __future__ import annotations

from fractions import Fraction

import pytest

from grpo_course.core.arithmetic import arithmetic_check, equation_is_right, evaluate_expression
from grpo_course.measure.attribution import (
    chance_baseline,
    chance_candidates,
    changes_table,
    earned,
    failed_bars,
    farming_checks,
    held_out_rewards,
    phase_changes,
    recipe_rows,
    solved_overlap,
)
from grpo_course.measure.evaluate import EvalResult
from grpo_course.measure.stats import paired_difference

ROWS = [
    {"idx": 0, "question": "Tom has 12 apples and buys 30 more. How many apples does he have?",
     "solution": "12+30=<<12+30=42>>42\n#### 42", "answer": "42"},
    {"idx": 1, "question": "A box holds 6 pens. How many pens are in 4 boxes and 3 loose pens?",
     "solution": "6*4=<<6*4=24>>24\n24+3=<<24+3=27>>27\n#### 27", "answer": "27"},
    {"idx": 2, "question": "Ann reads 15 pages a day for 2 weeks of 7 days. How many pages?",
     "solution": "2*7=<<2*7=14>>14 days\n15*14=<<15*14=210>>210\n#### 210", "answer": "210"},
]


def _result(completions, golds=("42", "27", "210")):
    from grpo_course.core.answers import answers_match, extract_hash_answer
    records = []
    for i, (text, gold) in enumerate(zip(completions, golds, strict=False)):
        guess = extract_hash_answer(text)
        records.append({"idx": i, "completion": text, "correct": answers_match(guess, gold),
                        "formatted": guess is not None})
    return EvalResult.from_records(records)


def test_expressions_follow_operator_precedence_exactly():
    assert evaluate_expression("48/2 + 3 x 2") == 30
    assert evaluate_expression("10 - 4 - 3") == 3
    assert evaluate_expression("$1,200 * 15%") == 180
    assert evaluate_expression("7 / 3") == Fraction(7, 3)
    assert evaluate_expression("5 / 0") is None


@pytest.mark.parametrize("expression, result, right", [
    ("16/3", "5.33", True), ("16/3", "5", False), ("16/2", "8", True), ("16/2", "8.0", True),
    ("50,000 - 80,000", "30,000", False), ("2.5 * 4", "10", True), ("1/3", "0.3", True),
])
def test_an_equation_is_right_when_exact_or_rounded_as_written(expression, result, right):
    assert equation_is_right(expression, result) is right


def test_arithmetic_check_counts_right_and_wrong_equations():
    text = ("She has 16/2 = 8 eggs.\nShe sells 8*2 = 18 of them.\nThe total is $3 + $4 = $7.\n"
            "No equation here, and x = 5 is not one.\n#### 7")
    assert arithmetic_check(text) == (2, 1)
    assert arithmetic_check("") == (0, 0)


def test_chance_candidates_are_one_operation_from_the_question():
    found = chance_candidates("Tom has 12 apples and buys 30 more.")
    assert {12, 30, 42, 18, -18, 360, Fraction(2, 5), Fraction(5, 2)} == found
    base = chance_baseline(ROWS)
    # 42 = 12 + 30 is one step away; 27 and 210 need two steps
    assert base["n"] == 3 and base["one_step_reachable"] == pytest.approx(1 / 3)
    assert base["uniform_guess_accuracy"] == pytest.approx(1 / 3 / len(found))
    assert base["copy_last_accuracy"] is None                     # no starts


def test_chance_baseline_at_a_start_counts_its_numbers_and_copying():
    row = {"question": "Tom has 12 apples and buys 30 more. He eats 2.", "answer": "40",
           "start": "12 + 30 = 42 apples\n"}
    base = chance_baseline([row])
    assert base["one_step_reachable"] == 1.0                      # 42 - 2: from the start's number
    assert base["copy_last_accuracy"] == 0.0
    assert chance_baseline([{**row, "answer": "42"}])["copy_last_accuracy"] == 1.0


def test_earned_needs_a_correct_answer_and_only_right_equations():
    lucky = {"completion": "12*30 = 40\n#### 42", "correct": True}
    computed = {"completion": "12+30 = 42\n#### 42", "correct": True}
    bare = {"completion": "#### 42", "correct": True}
    assert not earned(lucky) and earned(computed) and not earned(bare)




def test_phase_changes_pairs_every_measure():
    before = _result(["12*30 = 42\n#### 42", "I do not know", "15*2 = 30\n#### 30"])
    after = _result(["12+30 = 42\n#### 42", "6*4 = 24\n#### 24", "2*7 = 14\n15*14 = 210\n#### 210"])
    out = phase_changes(before, after, ROWS)
    assert out["accuracy"]["b_only"] == 1 and out["accuracy"]["a_only"] == 0
    assert out["format"]["b_only"] == 1
    # before: only 42 reaches a gold step; after: every problem does
    assert out["reached_step"]["b_only"] == 2 and out["a"]["reached_step"] == pytest.approx(1 / 3)
    assert out["step_f1"]["difference"] > 0
    assert out["a"]["right_equation_share"] == pytest.approx(1 / 2)
    assert out["b"]["right_equation_share"] == 1.0 and out["b"]["earned"] == 2
    assert out["a"]["earned"] == 0
    assert out["overlap"] == solved_overlap(before, after)
    assert out["overlap"]["both"] == 1 and out["overlap"]["expected_if_unrelated"] == pytest.approx(2 / 3)
    assert out["equations"]["difference"] == pytest.approx((4 - 2) / 3)    # 2 -> 4 equations
    assert out["a"]["format"] == pytest.approx(2 / 3) and out["b"]["format"] == 1.0
    with pytest.raises(ValueError, match="same problems"):
        phase_changes(before, _result(["#### 1", "#### 2"], golds=("1", "2")), ROWS)


def _changes(reached=(10, 40, 1e-5), f1_lo=0.01, equations=(3.0, 3.2), shares=(0.45, 0.44),
             fmt=0.97):
    return {"reached_step": {"a_only": reached[0], "b_only": reached[1], "p_value": reached[2]},
            "step_f1": {"lo": f1_lo},
            "a": {"equations_per_problem": equations[0], "right_equation_share": shares[0]},
            "b": {"equations_per_problem": equations[1], "right_equation_share": shares[1],
                  "format": fmt}}


def test_farming_checks_pass_a_clean_gain_and_name_each_failed_bar():
    assert all(farming_checks(_changes()).values())
    farmed = farming_checks(_changes(equations=(3.4, 4.8)))        # +41 % equations
    assert [k for k, ok in farmed.items() if not ok] == ["equations_not_inflated"]
    assert not farming_checks(_changes(reached=(40, 10, 1e-5)))["gold_step_up"]    # it fell
    assert not farming_checks(_changes(reached=(20, 30, 0.2)))["gold_step_up"]     # noise
    assert not farming_checks(_changes(f1_lo=-0.001))["step_f1_up"]
    assert not farming_checks(_changes(shares=(0.45, 0.42)))["right_share_kept"]
    assert not farming_checks(_changes(fmt=0.94))["format_kept"]


def test_held_out_rewards_score_each_answer_against_its_own_problem():
    from grpo_course.core.rewards import EXACT_REWARD, NEAR_REWARD, STEP_REWARD
    after = _result(["12+30 = 42\n#### 42", "6*4 = 24\n#### 24", "I do not know"])
    got = held_out_rewards(after, ROWS, {"correctness": 1.0, "intermediate_results": 2.0})
    assert got[0] == pytest.approx(EXACT_REWARD + 2 * STEP_REWARD)         # right, the one step
    assert got[1] == pytest.approx(NEAR_REWARD + 2 * STEP_REWARD * 2 / 3)    # 24/27; 24 of {24, 27}
    assert got[2] == pytest.approx(-1.0)                                     # no answer, no step
    with pytest.raises(ValueError, match="answers for"):
        held_out_rewards(after, ROWS[:2], {"correctness": 1.0})


def test_changes_table_has_every_measure_with_its_test():
    before = _result(["12*30 = 42\n#### 42", "I do not know", "15*2 = 30\n#### 30"])
    after = _result(["12+30 = 42\n#### 42", "6*4 = 24\n#### 24", "2*7 = 14\n15*14 = 210\n#### 210"])
    changes = phase_changes(before, after, ROWS)
    reward = paired_difference([0.0, 1.0, 2.0], [1.0, 1.0, 3.0])
    rows = changes_table(changes, reward, chance_baseline(ROWS))
    by = {r["measure"]: r for r in rows}
    assert list(by) == ["the recipe's reward (mean)", "format (%)", "reaches a gold step (%)",
                        "step F1 (mean)", "right equations (% of equations)",
                        "equations per answer", "correct with only right equations",
                        "accuracy (%)", "accuracy of a chance guesser (%)"]
    assert by["the recipe's reward (mean)"]["change"] == pytest.approx(2 / 3)
    assert by["equations per answer"]["start"] == pytest.approx(2 / 3)
    assert by["equations per answer"]["after"] == pytest.approx(4 / 3)
    assert by["accuracy (%)"]["start"] == pytest.approx(100 / 3)
    assert by["accuracy (%)"]["after"] == pytest.approx(200 / 3)     # 24 is not 27
    assert "McNemar" in by["reaches a gold step (%)"]["test"]
    assert "95 % CI" in by["step F1 (mean)"]["test"]


def test_failed_bars_names_what_was_missed():
    assert failed_bars({"step_f1_up": True, "format_kept": True}) == "passes every bar"
    said = failed_bars({"step_f1_up": True, "equations_not_inflated": False})
    assert said.startswith("misses") and "10 % more equations" in said


def test_recipe_rows_show_every_recipe_on_every_slice_and_who_passes_all():
    before = _result(["12*30 = 42\n#### 42", "I do not know", "15*2 = 30\n#### 30"])
    after = _result(["12+30 = 42\n#### 42", "6*4 = 24\n#### 24", "2*7 = 14\n15*14 = 210\n#### 210"])
    vs = phase_changes(before, after, ROWS)

    def held(ok):
        return {"format": 1.0, "accuracy": 2 / 3, "vs_warm_start": vs,
                "checks": {"step_f1_up": True, "equations_not_inflated": ok}}
    bench = {"recipes": {"profile": {"steps": 3, "held_out": {"0:3": held(False), "3:6": held(True)}},
                         "grounded": {"steps": 4, "held_out": {"0:3": held(True), "3:6": held(True)}}}}
    rows, verdicts = recipe_rows(bench)
    assert [(r["slice"], r["recipe"]) for r in rows] == [("0–2", "profile"), ("3–5", "profile"),
                                                         ("0–2", "grounded"), ("3–5", "grounded")]
    assert rows[0]["bars passed"] == "1/2" and rows[2]["gold step %"] == pytest.approx(100.0)
    assert "misses" in verdicts[0] and "rows 3–5 it passes every bar" in verdicts[0]
    assert "McNemar p = " in verdicts[0]          # the gold-step change is read with its test
    assert verdicts[-1] == "recipes that pass every bar on every slice: grounded"


def test_the_lever_benchmark_reads_with_intervals_and_ties():
    """Page 3b: the lever benchmark's shares come with Wilson intervals; tied levers are all named,
    and overlapping intervals are read as not separated; the correctness reward is said to be tiers."""
    from grpo_course.measure.attribution import lever_rows, lever_sentence

    def v(share, s=10.0, steps=5, prompts=2.0):
        return {"steps": steps, "prompts_sampled_per_step": prompts, "informative_share_sampled": share,
                "steps_with_signal": 1.0, "s_per_step": s, "correctness": -0.4, "completion_length": 70.0,
                "truncated_share": 0.1, "clip_ratio": 0.0}
    variants = {"plain": v(0.6), "G=8": v(0.9, 26), "intermediate_results": v(0.9, 19), "profile": v(0.9)}
    rows = lever_rows(variants)
    assert rows[0]["groups sampled"] == 10 and rows[0]["95 % CI"] == "31-83"
    said = lever_sentence(variants)
    assert "G = 8, 90 % of 10" in said and "the dense reward, 90 % of 10" in said
    assert "do not separate them" in said and "tiers, -1 to 3" in said
    far = lever_sentence({"plain": v(0.1, prompts=20.0), "G=8": v(0.9, prompts=20.0)})
    assert far.endswith(". The intervals do not overlap")
    # a newer record counts its groups: 5 steps of dynamic sampling drew 16 groups, 9 informative
    counted = lever_rows({"dynamic_sampling": {**v(0.55, prompts=3.2), "groups_sampled": 16,
                                               "informative_groups_sampled": 9}})[0]
    assert counted["groups sampled"] == 16 and counted["informative groups %"] == 100 * 9 / 16


def test_the_overlap_of_solved_problems_is_read_only_where_it_can_say_something():
    from grpo_course.measure.attribution import churn_reading

    def changes(a, b, both, expected):
        return {"a": {"correct": a}, "b": {"correct": b},
                "overlap": {"both": both, "expected_if_unrelated": expected}}
    assert "solved none" in churn_reading(changes(3, 0, 0, 0.0))
    assert "too few" in churn_reading(changes(3, 8, 1, 0.1))
    assert "no more solved problems than unrelated" in churn_reading(changes(10, 9, 2, 1.5))
    assert "survived" in churn_reading(changes(10, 9, 6, 1.5))


def test_length_change_reads_its_word_from_the_slope_interval():
    """Page 3c said 'longer' or 'shorter' from ±20 % of two window means; the word now needs the
    95 % interval of the per-step slope to leave 0."""
    from types import SimpleNamespace

    from grpo_course.measure.attribution import length_change
    cfg = SimpleNamespace(mask_truncated_completions=True, loss_type="dapo")
    rising = [{"completion_length": 30 + 2 * i + (i % 2)} for i in range(10)]
    flat = [{"completion_length": 40 + (3 if i % 2 else -3)} for i in range(10)]
    assert length_change(rising, cfg, 3)["verdict"] == "longer"
    assert length_change(rising[::-1], cfg, 3)["verdict"] == "shorter"
    assert length_change(flat, cfg, 3)["verdict"] == "about as long"
    short = length_change(rising[:2], cfg, 1)
    assert short["verdict"] == "too few steps to tell" and "cannot show" in short["reading"]
    said = length_change(rising, SimpleNamespace(mask_truncated_completions=False, loss_type="grpo"), 3)
    assert "cut-off answers kept in the loss" in said["pushes"] and "`grpo`" in said["pushes"]
    assert said["first"] == (30 + 33 + 34) / 3
