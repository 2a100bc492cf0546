"""Reward functions: tier tables, the DOTALL regex, and property tests (never raise, finite)."""
from __future__ import annotations

import math
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_course.core import rewards as R
from grpo_course.core.answers import HASH_FORMAT, TAG_FORMAT, AnswerFormat, extract_answer, normalize_number
from grpo_course.core.rewards import (
    REWARD_FUNCTIONS,
    answer_tier,
    combined,
    correctness,
    exact_format,
    format_regex,
    heuristic,
    number_extraction,
    score_completions,
    weighted_sum,
)

GOOD = "Janet has 16 - 3 - 4 = 9 eggs.\nShe earns 9 * 2 = 18 dollars.\n#### 18"
GOOD_TAGS = "<reasoning>\n16 - 3 - 4 = 9\n9 * 2 = 18\n</reasoning>\n<answer>\n18\n</answer>"


# ---------------------------------------------------------------- format regex
def test_registry_names_match_function_names():
    assert list(REWARD_FUNCTIONS) == ["exact_format", "approximate_format", "correctness",
                                      "number_extraction", "heuristic", "intermediate_results",
                                      "grounded_steps"]
    for name, fn in REWARD_FUNCTIONS.items():
        assert fn.__name__ == name


@pytest.mark.parametrize("fmt,text", [(HASH_FORMAT, GOOD), (TAG_FORMAT, GOOD_TAGS)])
def test_format_regex_is_dotall_and_matches_multiline(fmt, text):
    regex = format_regex(fmt)
    assert regex.flags & re.DOTALL, "the format regex lost re.DOTALL"
    match = regex.match(text)
    assert match is not None and match.group("answer").strip() == "18"
    assert exact_format([text], fmt=fmt) == [3.0]


@pytest.mark.parametrize("fmt,text", [(HASH_FORMAT, GOOD), (TAG_FORMAT, GOOD_TAGS)])
def test_regex_without_dotall_misses_multiline_completion(fmt, text):
    """The popular-notebook pitfall: same pattern, no DOTALL -> silently no match."""
    broken = re.compile(format_regex(fmt).pattern)  # flags dropped
    assert broken.match(text) is None
    assert format_regex(fmt).match(text) is not None


def test_exact_format_fails_when_regex_loses_dotall(monkeypatch):
    """If the module's regex were compiled without DOTALL, the exact_format test above
    would see 0.0 instead of 3.0 (demonstrated by swapping it in)."""
    pattern = format_regex(HASH_FORMAT).pattern
    monkeypatch.setattr(R, "format_regex", lambda fmt=HASH_FORMAT: re.compile(pattern))
    assert R.exact_format([GOOD]) == [0.0]


@pytest.mark.parametrize("text,score", [
    (GOOD, 3.0),
    (GOOD + "\n\n", 3.0),                        # trailing whitespace is fine
    ("work 2+2=4\n#### $1,000.50", 3.0),
    ("#### 18", 0.0),                            # no reasoning
    ("The answer is #### 18", 0.0),              # marker not on its own line
    (GOOD + "\nThanks!", 0.0),                   # text after the answer
    ("work\n#### 5\n#### 18", 0.0),              # two answers
    ("work\n####", 0.0),                         # empty answer slot
    ("work\n####\n18", 0.0),                     # answer not on the marker's line
    ("", 0.0),
])
def test_exact_format_table(text, score):
    assert exact_format([text]) == [score]


def test_tag_format_table():
    assert exact_format([GOOD_TAGS], fmt=TAG_FORMAT) == [3.0]
    assert exact_format([GOOD_TAGS + " extra"], fmt=TAG_FORMAT) == [0.0]
    assert exact_format(["<reasoning>x</reasoning><answer>18"], fmt=TAG_FORMAT) == [0.0]
    assert exact_format([GOOD], fmt=TAG_FORMAT) == [0.0]
    assert exact_format([GOOD_TAGS]) == [0.0]   # default is the #### format


def test_answer_format_render_roundtrip():
    for fmt in (HASH_FORMAT, TAG_FORMAT, AnswerFormat("<think>", "</think>", "<SOLUTION>",
                                                      "</SOLUTION>")):
        text = fmt.render("step one\nstep two", "42")
        assert exact_format([text], fmt=fmt) == [3.0]
        assert extract_answer(text, fmt) == "42"
    with pytest.raises(ValueError, match="solution_start"):
        AnswerFormat(solution_start="")


# ---------------------------------------------------------------- tiers
@pytest.mark.parametrize("slot,gold,tier", [
    ("18", "18", 3.0), ("18.0", "18", 3.0), ("$18", "18", 3.0), ("1,000.50", "1000.5", 3.0),
    ("3/4", "0.75", 3.0), ("1e5", "100000", 3.0), ("-3", "-3", 3.0), ("18 dollars", "18", 3.0),
    ("19", "18", 1.5), ("16.2", "18", 1.5), ("19.8", "18", 1.5),     # ratio in [0.9, 1.1]
    ("15", "18", 0.5), ("21", "18", 0.5),                          # ratio in [0.8, 1.2]
    ("10", "18", -0.5), ("-18", "18", -0.5), ("5", "0", -0.5),     # wrong
    ("", "18", -1.0), ("eighteen", "18", -1.0),                    # missing
])
def test_correctness_tiers(slot, gold, tier):
    assert correctness([f"work\n#### {slot}"], answer=[gold]) == [tier]


def test_correctness_missing_marker_and_chat_messages():
    assert correctness(["the answer is 18"], answer=["18"]) == [R.MISSING_REWARD]
    msgs = [[{"role": "assistant", "content": GOOD}]]
    assert correctness(msgs, answer=["18"]) == [3.0]
    assert answer_tier(None, "18") == R.MISSING_REWARD


def test_correctness_bad_answers_raise_readable_errors():
    with pytest.raises(ValueError, match="needs the gold answers"):
        correctness([GOOD])
    with pytest.raises(ValueError, match="2 completions but 1 answers"):
        correctness([GOOD, GOOD], answer=["18"])


def test_number_extraction_and_approximate_format():
    assert number_extraction([GOOD, "work\n#### n/a", "18"]) == [1.5, 0.0, 0.0]
    approx = R.approximate_format([GOOD, "no marker", "a\n#### 1\n#### 2", GOOD + "\n" + "x" * 50])
    assert approx[0] == 0.5 and approx[1] == -0.5 and approx[2] == -0.5
    assert approx[3] == pytest.approx(0.5 - 0.05)
    tags = R.approximate_format([GOOD_TAGS, "<answer>18</answer>"], fmt=TAG_FORMAT)
    assert tags == [2.0, 0.0]


def test_heuristic_is_hackable():
    hack = "Step 1: 2 + 2 = 4\nStep 2: 4 * 3 = 12\nStep 3: 12 - 1 = 11 so we are done now\n#### 11"
    assert heuristic([hack]) == [2.0]
    assert correctness([hack], answer=["18"]) == [R.WRONG_REWARD]
    assert heuristic(["hello"]) == [0.0]


def test_score_completions_weighted_sum_and_combined():
    scores = score_completions([GOOD, "no"], ["18", "18"])
    assert set(scores) == set(REWARD_FUNCTIONS) - set(R.NEEDS_SOLUTION)   # no solutions given
    with_solutions = score_completions([GOOD, "no"], ["18", "18"], solutions=["3*6=<<3*6=18>>18\n#### 18"] * 2)
    assert set(with_solutions) == set(REWARD_FUNCTIONS)
    assert with_solutions["intermediate_results"][1] == 0.0
    assert scores["correctness"] == [3.0, -1.0]
    weights = {"correctness": 1.0, "exact_format": 0.5, "number_extraction": 0.5}
    total = weighted_sum(scores, weights)
    assert total == [3.0 + 1.5 + 0.75, -1.0]
    assert combined([GOOD, "no"], answer=["18", "18"]) == total
    only = score_completions([GOOD], names=["heuristic"])
    assert list(only) == ["heuristic"]
    with pytest.raises(ValueError, match="unknown reward"):
        score_completions([GOOD], ["18"], names=["corectness"])
    with pytest.raises(ValueError, match="weights name"):
        weighted_sum({"heuristic": [1.0]}, {"correctness": 1.0})


def test_trl_style_call_and_reward_for():
    """TRL passes prompts, completion_ids, dataset columns and trainer_state as keywords."""
    kwargs = dict(prompts=["q"], completion_ids=[[1, 2]], answer=["18"], trainer_state=None,
                  question=["q"])
    assert correctness(completions=[GOOD], **kwargs) == [3.0]
    bound = R.reward_for("exact_format", TAG_FORMAT)
    assert bound.__name__ == "exact_format"
    assert bound(completions=[GOOD_TAGS], **kwargs) == [3.0]
    assert R.reward_for("correctness") is correctness
    with pytest.raises(ValueError, match="unknown reward"):
        R.reward_for("nope")


# ---------------------------------------------------------------- properties
_FRAGMENTS = ["####", "#### ", "<reasoning>", "</reasoning>", "<answer>", "</answer>", "\n",
              " ", "=", "+", "*", "/", "-", ".", ",", "$", "%", "1,000.50", "-3", "3/4", "1e5",
              "1e999", "1/0", "٣", "⁵", "½", "\u2212", "0", "18", "9" * 60, "Step 1:", "NaN",
              "inf", "\x00", "\ud7ff", "😀"]
texts = st.one_of(
    st.text(max_size=200),
    st.lists(st.one_of(st.sampled_from(_FRAGMENTS), st.text(max_size=8)), max_size=30)
    .map("".join),
)
completions = st.one_of(
    texts,
    texts.map(lambda t: [{"role": "assistant", "content": t}]),
    st.none(),
)
golds = st.one_of(st.sampled_from(["18", "0", "-3", "0.75", "100000", "1000.5"]),
                  st.text(max_size=10), st.integers(), st.floats(allow_nan=True))


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.lists(st.tuples(completions, golds), min_size=1, max_size=4),
       fmt=st.sampled_from([HASH_FORMAT, TAG_FORMAT]))
@pytest.mark.heavy
def test_every_reward_returns_one_finite_float_per_completion(batch, fmt):
    comps = [c for c, _ in batch]
    answers = [g for _, g in batch]
    scores = score_completions(comps, answers, fmt=fmt, solutions=[str(g) for g in answers])
    scores["combined"] = combined(comps, answer=answers, fmt=fmt)
    for name, values in scores.items():
        assert len(values) == len(comps), name
        assert all(isinstance(v, float) and math.isfinite(v) for v in values), (name, values)
    assert all(v in (0.0, R.FORMAT_REWARD) for v in scores["exact_format"])
    assert all(v in (0.0, R.NUMBER_REWARD) for v in scores["number_extraction"])
    assert all(v in (3.0, 1.5, 0.5, -0.5, -1.0) for v in scores["correctness"])
    assert all(0.0 <= v <= 2.0 for v in scores["heuristic"])
    assert all(0.0 <= v <= R.STEP_REWARD for v in scores["intermediate_results"])
    assert all(0.0 <= v <= R.STEP_REWARD for v in scores["grounded_steps"])


@settings(max_examples=500, deadline=None)
@given(text=texts, fmt=st.sampled_from([HASH_FORMAT, TAG_FORMAT]))
def test_parsers_never_raise(text, fmt):
    """The inner parsers themselves do not raise (the safety net is not hiding bugs)."""
    value = extract_answer(text, fmt)
    assert value is None or isinstance(value, str)
    assert isinstance(R._approximate(text, fmt), float)
    assert set(R.heuristic_checks(text)) == {"has_number", "shows_operations",
                                             "reasonable_length", "step_structure"}
    assert answer_tier(value, "18") in (3.0, 1.5, 0.5, -0.5, -1.0)


@settings(max_examples=300, deadline=None)
@given(reasoning=st.text(min_size=1, max_size=80).filter(lambda s: s.strip() and "####" not in s),
       number=st.one_of(st.integers(-10**9, 10**9).map(str),
                        st.decimals(-10**6, 10**6, places=2, allow_nan=False,
                                    allow_infinity=False).map(str)))
def test_rendered_answers_are_correct(reasoning, number):
    text = HASH_FORMAT.render(reasoning, number)
    gold = normalize_number(number)
    assert correctness([text], answer=[gold]) == [3.0]
    assert number_extraction([text]) == [1.5]


def test_huge_and_pathological_inputs_are_fast_and_finite():
    import time
    start = time.perf_counter()
    huge = ["a" * 200_000, "1" * 100_000, "####" * 20_000, "x\n" * 50_000 + "#### 5 x",
            "<reasoning>" * 10_000 + "<answer>" * 10_000, "#### " + "9" * 5000 + "/" + "9" * 5000]
    for fmt in (HASH_FORMAT, TAG_FORMAT):
        for values in score_completions(huge, ["5"] * len(huge), fmt=fmt).values():
            assert all(math.isfinite(v) for v in values)
    assert time.perf_counter() - start < 10


# ---------------------------------------------------------------- grounded_steps
GOLD_SOLUTION = "She sold 48/2 = <<48/2=24>>24 in May.\n48+24 = <<48+24=72>>72\n#### 72"


@pytest.mark.parametrize("work,expected", [
    ("48/2 = 24\n48 + 24 = 72", 1.0),                       # both gold steps, both computed
    ("48/2 = 24", 0.5),                                       # one of two gold steps
    ("48/2 = 25\n48 + 24 = 72", 0.5),                        # a wrong equation earns nothing
    ("So she has 24 and then = 72", 0.0),                     # gold values with no equation
    ("48/2 = 24\n48/2 = 24\n48/2 = 24", 1 / 3),             # repeating a scoring step dilutes it
    ("48/2 = 24\n48 + 24 = 72\n2*3 = 6\n1+1 = 2", 0.5),    # past the gold count, extra dilutes
])
def test_grounded_steps_credits_right_equations_only_and_caps_by_count(work, expected):
    text = f"{work}\n#### 72"
    got = R.grounded_steps([text], solution=[GOLD_SOLUTION])[0]
    assert got == pytest.approx(R.STEP_REWARD * expected)


def test_repeating_scoring_steps_pays_under_intermediate_results_but_not_grounded_steps():
    """Repeats cost the F1-based reward nothing (it compares sets of values), so a policy may
    pad its work freely; the grounded reward divides by every equation written."""
    solution = "3*4 = <<3*4=12>>12\n12+5 = <<12+5=17>>17\n17-2 = <<17-2=15>>15\n#### 15"
    plain = "3*4 = 12\n12 + 5 = 17\n#### 15"
    padded = "3*4 = 12\n12 + 5 = 17\n3*4 = 12\n12 + 5 = 17\n1 + 16 = 17\n#### 15"
    dense = R.intermediate_results([plain, padded], solution=[solution] * 2)
    grounded = R.grounded_steps([plain, padded], solution=[solution] * 2)
    assert dense[1] == dense[0]
    assert grounded == pytest.approx([R.STEP_REWARD * 2 / 3, R.STEP_REWARD * 2 / 5])


# ---------------------------------------------------------------- dense correctness
SOLUTION = ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
            "Natalia sold 48+24 = <<48+24=72>>72 clips altogether.\n#### 72")


def test_intermediate_results_by_hand():
    from grpo_course.core.data import solution_results
    from grpo_course.core.rewards import intermediate_results
    assert solution_results(SOLUTION) == ["24", "72"]
    texts = ["48/2 = 24\n48+24 = 72\n#### 72",          # both steps: F1 1
             "48/2 = 24\n48+2 = 50\n#### 50",            # first step only: 2*1/(2+2)
             "48*2 = 96\n#### 96",                       # no step right
             "no work at all\n#### 72"]                  # nothing computed: 0
    assert intermediate_results(texts, solution=[SOLUTION] * 4) == pytest.approx(
        [1.0, 0.5, 0.0, 0.0])
    with pytest.raises(ValueError, match="solution"):
        intermediate_results(texts)


def test_intermediate_results_resists_chapter_2_hacks():
    """The heuristic hack of chapter 2 computes nothing the solution computes; listing every
    number costs precision: F1 stays small however many gold values the list hits."""
    from grpo_course.core.rewards import heuristic, intermediate_results
    hack = ("Step 1: 2 + 2 = 4\nStep 2: 4 * 3 = 12\nStep 3: 12 - 1 = 11\n"
            "So the final result is clearly the number below.\n#### 11")
    spam = "\n".join(f"x = {k}" for k in range(100)) + "\n#### 72"
    h, s = intermediate_results([hack, spam], solution=[SOLUTION] * 2)
    assert heuristic([hack])[0] == 2.0 and h == 0.0
    assert s == pytest.approx(2 * 2 / (100 + 2)) and s < 0.05
