"""What a training phase changed on held-out problems, beyond the final answer (chapter 3).

Accuracy counts a final number, however it was reached. A 135M model's few correct GSM8K
answers are mostly reached by wrong work that happens to land on the gold number, and which
problems it "solves" that way changes with every small change of its weights; accuracy then
cannot see what a phase taught. This module measures what it can see, per problem, so that two
evaluations of the same problems can be compared pairwise:

* :func:`step_f1` per record: the held-out counterpart of the dense ``intermediate_results``
  reward (F1 between the results the work computes and the gold solution's step results), and
  whether the work reaches at least one of them (``reached_step``);
* :func:`grpo_course.core.arithmetic.arithmetic_check`: how many ``a op b = c`` equations of the work are arithmetically right;
  a correct answer whose work has a wrong equation was not computed, it was guessed;
* :func:`chance_baseline`: how often the gold answer is one operation away from two numbers of the
  question, and what a uniform guess among those candidates scores;
* :func:`solved_overlap`: how many problems two models both solve, against the overlap two
  unrelated guessers with the same accuracies would have;
* :func:`phase_changes`: all of the above for two models, each with its paired test;
* :func:`length_change`: the completion length over a run's steps, read from its slope's interval.
"""
from __future__ import annotations

import itertools
import re
from fractions import Fraction
from typing import Any

from grpo_course.core.answers import normalize_number
from grpo_course.core.arithmetic import arithmetic_check
from grpo_course.core.data import last_number, solution_results
from grpo_course.core.rewards import score_completions, step_f1, weighted_sum
from grpo_course.measure.evaluate import EvalResult
from grpo_course.measure.stats import (
    as_sentences,
    interval_words,
    linear_trend,
    mcnemar_test,
    p_text,
    paired_difference,
    reading,
    wilson_interval,
)

_QUESTION_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


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
    """How often the gold answer is one operation away from two numbers of the question and of
    the row's ``start``, where it has one (``one_step_reachable``), and the accuracy of a guesser
    that picks one of those candidates uniformly at random (``uniform_guess_accuracy``, its
    expectation); at a start, also the accuracy of copying the start's last number
    (``copy_last_accuracy``, ``None`` without starts)."""
    reachable, expected, copied, starts = 0, 0.0, 0, 0
    rows = list(dataset)
    for row in rows:
        start = row.get("start") or ""
        candidates = chance_candidates(row["question"] + "\n" + start)
        if Fraction(row["answer"]) in candidates:
            reachable += 1
            expected += 1 / len(candidates)
        if "start" in row:
            starts += 1
            copied += last_number(start) == row["answer"]
    n = len(rows)
    return {"n": n, "one_step_reachable": reachable / n if n else 0.0,
            "uniform_guess_accuracy": expected / n if n else 0.0,
            "copy_last_accuracy": copied / starts if starts else None}


def step_scores(result: EvalResult, dataset) -> list[float]:
    """:func:`~grpo_course.core.rewards.step_f1` of every record against its gold solution
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
    both = sum(1 for x, y in zip(a.records, b.records, strict=False) if x["correct"] and y["correct"])
    return {"both": both, "a": a.correct, "b": b.correct,
            "expected_if_unrelated": a.n * a.accuracy * b.accuracy}


def paired_mcnemar(a: EvalResult, b: EvalResult, key: str) -> dict[str, Any]:
    """McNemar's exact test of one right/wrong field of the records (``correct``, ``formatted``)
    of two evaluations on the same problems."""
    return mcnemar_test([r[key] for r in a.records], [r[key] for r in b.records])


def phase_changes(a: EvalResult, b: EvalResult, dataset) -> dict[str, Any]:
    """What changed from model A to model B on the same held-out problems: accuracy, format,
    reaching a gold step (McNemar each), step F1 (paired difference), the share of right
    equations and equations per problem, correct answers with right arithmetic, and the
    overlap of the solved problems."""
    if [r["idx"] for r in a.records] != [r["idx"] for r in b.records]:
        raise ValueError("the two evaluations are not on the same problems")
    f1_a, f1_b = step_scores(a, dataset), step_scores(b, dataset)
    out: dict[str, Any] = {
        "accuracy": paired_mcnemar(a, b, "correct"),
        "format": paired_mcnemar(a, b, "formatted"),
        "reached_step": mcnemar_test([f > 0 for f in f1_a], [f > 0 for f in f1_b]),
        "step_f1": paired_difference(f1_a, f1_b),
        "overlap": solved_overlap(a, b),
    }
    equations = {}
    for tag, result, f1 in (("a", a, f1_a), ("b", b, f1_b)):
        checks = [arithmetic_check(r["completion"]) for r in result.records]
        right, wrong = sum(c[0] for c in checks), sum(c[1] for c in checks)
        equations[tag] = [float(sum(c)) for c in checks]
        out[tag] = {"reached_step": sum(f > 0 for f in f1) / len(f1), "step_f1": sum(f1) / len(f1),
                    "right_equation_share": right / (right + wrong) if right + wrong else None,
                    "equations_per_problem": (right + wrong) / len(checks),
                    "format": result.format_rate,
                    "correct": result.correct,
                    "earned": sum(earned(r) for r in result.records)}
    out["equations"] = paired_difference(equations["a"], equations["b"])
    return out


def churn_reading(changes: dict[str, Any]) -> str:
    """What the overlap of two models' solved problems says (:func:`phase_changes`' ``overlap``):
    nothing where one solved none or fewer than 5, else whether they share more solved problems than
    two unrelated guessers with the same accuracies would (more than one above that count)."""
    a, b = changes["a"]["correct"], changes["b"]["correct"]
    both, expected = changes["overlap"]["both"], changes["overlap"]["expected_if_unrelated"]
    if b == 0:
        return "after GRPO it solved none of these problems, so there is no overlap to read"
    if a == 0:
        return "the warm start solved none of them, so there is no overlap to read"
    if min(a, b) < 5:
        return f"too few problems were solved ({a} and {b}) for the overlap to say anything"
    if both <= expected + 1:
        return ("they share no more solved problems than unrelated guessers would: the solved problems were "
                "reshuffled by GRPO's change of the weights, so the accuracy test above compares two small, "
                "mostly lucky counts")
    return ("they share more solved problems than unrelated guessers would: part of what the warm start "
            "solved survived GRPO's change of the weights")


#: what a phase must show on a held-out slice to count as teaching gold steps without farming
#: them (issue 42): step F1 up, gold step reached up, at most 10 % more equations per answer,
#: a right-equation share at most 2 points lower, and format at or above 95 %
NO_FARMING_BARS = {"alpha": 0.05, "max_equation_growth": 0.10, "max_right_share_drop": 0.02,
                   "min_format": 0.95}


def farming_checks(changes: dict[str, Any], bars: dict[str, float] = NO_FARMING_BARS
                   ) -> dict[str, bool]:
    """Each bar of :data:`NO_FARMING_BARS` passed or not by :func:`phase_changes`' ``changes``
    (A the start, B after the phase)."""
    a, b, reached = changes["a"], changes["b"], changes["reached_step"]
    share_a, share_b = a["right_equation_share"] or 0.0, b["right_equation_share"] or 0.0
    return {
        "step_f1_up": changes["step_f1"]["lo"] > 0,
        "gold_step_up": reached["b_only"] > reached["a_only"] and reached["p_value"] < bars["alpha"],
        "equations_not_inflated": (b["equations_per_problem"]
                                   <= (1 + bars["max_equation_growth"]) * a["equations_per_problem"]),
        "right_share_kept": share_b >= share_a - bars["max_right_share_drop"],
        "format_kept": b["format"] >= bars["min_format"],
    }


def held_out_rewards(result: EvalResult, dataset, weights: dict[str, float]) -> list[float]:
    """Each evaluated answer's reward under ``weights`` (a recipe's ``reward_weights``), scored
    against its problem's gold answer and solution: the trained reward, on problems it never
    trained on."""
    rows = list(dataset)
    if len(rows) != len(result.records):
        raise ValueError(f"{len(result.records)} answers for {len(rows)} problems")
    scores = score_completions([r["completion"] for r in result.records],
                               [row["answer"] for row in rows], names=list(weights),
                               solutions=[row.get("solution") for row in rows])
    return weighted_sum(scores, weights)


def changes_table(changes: dict[str, Any], reward: dict[str, float] | None = None,
                  chance: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One row per measure of :func:`phase_changes`' ``changes`` (A the start, B after): both
    values, the change, and its test (a 95 % interval of a paired difference, or McNemar's p).
    ``reward``: the :func:`paired_difference` of :func:`held_out_rewards`; ``chance``:
    :func:`chance_baseline`, shown beside accuracy."""
    a, b = changes["a"], changes["b"]

    def paired(name, d, scale=1.0):
        return {"measure": name, "start": scale * d["mean_a"], "after": scale * d["mean_b"],
                "change": scale * d["difference"],
                "test": f"95 % CI [{scale * d['lo']:+.3f}, {scale * d['hi']:+.3f}]"}

    def mcnemar(name, key, share_a, share_b):
        t = changes[key]
        return {"measure": name, "start": 100 * share_a, "after": 100 * share_b,
                "change": 100 * (share_b - share_a),
                "test": f"McNemar +{t['b_only']} / -{t['a_only']}, p = {p_text(t['p_value'])}"}

    n = changes["step_f1"]["n"]
    rows = [paired("the recipe's reward (mean)", reward)] if reward is not None else []
    share_a, share_b = a["right_equation_share"] or 0.0, b["right_equation_share"] or 0.0
    rows += [
        mcnemar("format (%)", "format", a["format"], b["format"]),
        mcnemar("reaches a gold step (%)", "reached_step", a["reached_step"], b["reached_step"]),
        paired("step F1 (mean)", changes["step_f1"]),
        {"measure": "right equations (% of equations)", "start": 100 * share_a,
         "after": 100 * share_b, "change": 100 * (share_b - share_a), "test": "(no pairing)"},
        paired("equations per answer", changes["equations"]),
        {"measure": "correct with only right equations", "start": a["earned"],
         "after": b["earned"], "change": b["earned"] - a["earned"], "test": "(counts)"},
        mcnemar("accuracy (%)", "accuracy", a["correct"] / n, b["correct"] / n),
    ]
    if chance is not None:
        guess = 100 * chance["uniform_guess_accuracy"]
        rows.append({"measure": "accuracy of a chance guesser (%)", "start": guess,
                     "after": guess, "change": 0.0,
                     "test": "one operation on two numbers of the question"})
    return rows


#: what each bar of :func:`farming_checks` asks, in words
BAR_WORDS = {"step_f1_up": "step F1 up (95 % interval above 0)",
             "gold_step_up": "more answers reaching a gold step (McNemar p < 0.05)",
             "equations_not_inflated": "at most 10 % more equations per answer",
             "right_share_kept": "a right-equation share at most 2 points lower",
             "format_kept": "format at least 95 %"}


def failed_bars(checks: dict[str, bool]) -> str:
    """:func:`farming_checks`' verdict in words: "passes every bar", or the bars it misses."""
    missed = [BAR_WORDS[k] for k, ok in checks.items() if not ok]
    if not missed:
        return "passes every bar"
    return f"misses {len(missed)} of {len(checks)} bars, those asking for " + "; ".join(missed)


def test_rows(part: str) -> str:
    """A benchmark's slice key (``"512:1024"``, Python's end-exclusive slice) as the pages write test
    rows: ``512–1023``."""
    lo, hi = part.split(":")
    return f"{lo}–{int(hi) - 1}"


def recipe_rows(bench: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """``bench/recipes.py``'s result as table rows (one per slice and recipe: the warm start's
    value, the recipe's, and each paired test) and one verdict sentence per recipe, ending with
    the recipes that pass every bar on every slice."""
    rows, verdicts, clean = [], [], []
    for name, recipe in bench["recipes"].items():
        parts = []
        for part, held in recipe["held_out"].items():
            vs, checks = held["vs_warm_start"], held["checks"]
            a, b = vs["a"], vs["b"]
            rows.append({
                "slice": test_rows(part), "recipe": name, "steps": recipe["steps"],
                "gold step % (warm)": 100 * a["reached_step"], "gold step %": 100 * b["reached_step"],
                "gold step p": vs["reached_step"]["p_value"],
                "step F1 change": vs["step_f1"]["difference"], "step F1 lo": vs["step_f1"]["lo"],
                "equations (warm)": a["equations_per_problem"], "equations": b["equations_per_problem"],
                "right eq. % (warm)": 100 * (a["right_equation_share"] or 0.0),
                "right eq. %": 100 * (b["right_equation_share"] or 0.0),
                "format %": 100 * held["format"], "accuracy % (warm)": 100 * a["correct"] / vs["step_f1"]["n"],
                "accuracy %": 100 * held["accuracy"], "accuracy p": vs["accuracy"]["p_value"],
                "bars passed": f"{sum(checks.values())}/{len(checks)}"})
            step_p = vs["reached_step"]["p_value"]
            parts.append(f"on rows {test_rows(part)} it {failed_bars(checks)} (gold step "
                         f"{100 * a['reached_step']:.0f} → {100 * b['reached_step']:.0f} %: "
                         f"{reading(b['reached_step'] - a['reached_step'], step_p)}, McNemar p = {p_text(step_p)}; "
                         f"equations per answer {a['equations_per_problem']:.1f} → "
                         f"{b['equations_per_problem']:.1f})")
        if all(all(h["checks"].values()) for h in recipe["held_out"].values()):
            clean.append(name)
        # one sentence a slice: both slices in one ran past 60 words
        verdicts.append(as_sentences([f"{name}: {parts[0]}", *parts[1:]]))
    verdicts.append("recipes that pass every bar on every slice: " +
                    (", ".join(clean) if clean else "none"))
    return rows, verdicts


# ---------------------------------------------------------------- the lever benchmark (page 3b)
#: bench/levers.py's variants in words
LEVERS = {"plain": "the plain trainer", "intermediate_results": "the dense reward",
          "dynamic_sampling": "dynamic sampling", "G=8": "G = 8", "easy_first": "easy-first prompts",
          "num_iterations=2": "two updates per batch", "mask_truncated": "masked truncation",
          "profile": "the profile's recipe"}


def lever_rows(variants: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per variant of ``bench/levers.py`` (``data/levers.json``'s ``variants``): the groups
    it sampled, the share that were informative (rewards not all equal) with its Wilson 95 %
    interval, the steps that trained on one, the time, and what the completions did. The
    correctness reward is chapter 2's tiers (-1 ... 3), a mean, not a share."""
    rows = []
    for name, v in variants.items():
        if "groups_sampled" in v:                   # counted by the bench
            groups, informative = v["groups_sampled"], v["informative_groups_sampled"]
        else:                                       # an older record: counts from its per-step means
            groups = round(v["steps"] * v["prompts_sampled_per_step"])
            informative = round(v["informative_share_sampled"] * groups)
        lo, hi = wilson_interval(informative, groups)
        rows.append({"variant": LEVERS.get(name, name), "groups sampled": groups,
                     "informative groups %": 100 * informative / groups,
                     "95 % CI": f"{100 * lo:.0f}-{100 * hi:.0f}", "lo": lo, "hi": hi,
                     "steps with signal %": 100 * v["steps_with_signal"], "s per step": v["s_per_step"],
                     "correctness reward (-1 ... 3)": v["correctness"],
                     "mean length (tokens)": v["completion_length"], "cut off %": 100 * v["truncated_share"],
                     "clipped tokens %": 100 * v["clip_ratio"]})
    return rows


def lever_sentence(variants: dict[str, dict[str, Any]]) -> str:
    """The lever benchmark in a few sentences: the plain trainer's informative share, the lever
    with the most, whether their intervals separate them, and the profile's correctness reward."""
    rows = {r["variant"]: r for r in lever_rows(variants)}
    plain, profile = rows.pop(LEVERS["plain"]), rows.pop(LEVERS["profile"], None)
    top = max(r["informative groups %"] for r in rows.values())
    best = [r for r in rows.values() if r["informative groups %"] == top]       # ties all named
    apart = all(r["lo"] > plain["hi"] or r["hi"] < plain["lo"] for r in best)
    said = (f"{plain['informative groups %']:.0f} % of the plain trainer's {plain['groups sampled']} sampled "
            f"groups were informative (95 % CI {plain['95 % CI']} %). The most with one lever: "
            + " and ".join(f"{r['variant']}, {r['informative groups %']:.0f} % of {r['groups sampled']} "
                           f"({r['95 % CI']} %) at {r['s per step']:.0f} s per step" for r in best)
            + f", against {plain['s per step']:.0f} s plain. "
            + ("The intervals do not overlap" if apart else
               "The intervals overlap, so these few groups do not separate them"))
    if profile:
        said += (f". The profile's recipe: mean correctness reward {profile['correctness reward (-1 ... 3)']:.2f} "
                 f"against {plain['correctness reward (-1 ... 3)']:.2f} plain (chapter 2's tiers, -1 to 3: "
                 f"a mean reward, not a share of right answers)")
    return said


def length_change(history: list[dict[str, Any]], config, window: int) -> dict[str, Any]:
    """The completion length over a run (``history``: its metrics rows) in words: the mean over its
    first and last ``window`` steps, its direction read from the 95 % interval of the per-step slope
    (``longer``, ``shorter``, ``about as long``; ``too few steps to tell`` below 3 steps), what in
    ``config`` pushes GRPO toward shorter answers, and what the direction says about those pushes."""
    lengths = [float(r["completion_length"]) for r in history]
    trend = linear_trend(lengths)
    word = ("too few steps to tell" if trend["n"] < 3 else
            interval_words(trend["lo"], trend["hi"], "longer", "shorter", "about as long"))
    pushes = ["a correctness reward of −1 for a missing answer (a cut-off answer has none)"]
    if not config.mask_truncated_completions:
        pushes.append("cut-off answers kept in the loss")
    if config.loss_type == "grpo":
        pushes.append("`grpo`'s per-completion mean, under which each token of a short completion weighs more")
    means = lambda part: sum(part) / len(part) if part else float("nan")
    return {"first": means(lengths[:window]), "last": means(lengths[-window:]), "trend": trend,
            "verdict": word, "pushes": "; ".join(pushes),
            "reading": {"shorter": "a shorter answer can mean a policy that learned to stop or one that learned "
                                   "to say less; the held-out tests below tell which",
                        "longer": "the answers grew longer all the same, so these pushes did not decide the "
                                  "length in this run",
                        "too few steps to tell": "a run this short cannot show whether they did",
                        }.get(word, "the length on its training prompts did not move detectably, so these "
                                    "pushes did not show there (the held-out answers' length is measured "
                                    "below)")}
