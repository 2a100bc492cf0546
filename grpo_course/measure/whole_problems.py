"""The curriculum run's tests on whole GSM8K problems, fixed before the run trained.

A GSM8K problem is the whole problem, with no gold line given, and there the reference run (one
line left) showed no gain. The curriculum run (``recipes/curriculum_run.yaml``, ``make
curriculum-run``, ``data/runs/curriculum/``) is tested against the warm start it began from (its
``sft/``, the reference run's) by two tests, both fixed here before it trained:

* **(a) greedy**: accuracy on all 1,319 GSM8K test problems, whole, with McNemar's exact test;
* **(b) sampled**: pass@1 with :data:`SAMPLES` samples a problem at temperature 1 on whole test
  problems, rows 0-511, paired per problem.

It passes where both rise with p < :data:`ALPHA` and the run's format rate is at least
:data:`MIN_FORMAT` in both (:func:`whole_verdict`). Beside them, the bench reports the same tests
for the reference run (does the mix beat training at one line left on whole problems?), pass@K
and the entropy of the samples, what the greedy answers do (right equations per answer, answers
earned by right arithmetic, against the chance baseline of :mod:`~grpo_course.measure.attribution`,
so a format gain is not read as reasoning), and one line left (does the mix keep the reference
run's gain?). Each model's samples and greedy answers are cached, so a bench stopped part way
resumes where it stopped.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from grpo_course.config import START_BUDGETS
from grpo_course.infra.paths import project_root, shown_path
from grpo_course.measure.attribution import chance_baseline
from grpo_course.measure.evaluate import (
    held_out_rows,
)
from grpo_course.measure.paired import (
    BATCH_PROMPTS,
    greedy_answers,
    greedy_test,
    sampled_pair,
    sampled_test,
)
from grpo_course.measure.stats import (
    as_sentences,
    describe_difference,
    format_share_words,
    interval_words,
    p_text,
    reading,
    wilson_interval,
)

#: the committed runs (the train CLI's layout: the final adapter, and ``sft/``)
CURRICULUM_RUN = project_root() / "data" / "runs" / "curriculum"
REFERENCE_RUN = project_root() / "data" / "runs" / "reference"

# ---- the tests, fixed before the curriculum run trained (never change them after a result)
GREEDY_ROWS = (0, 1319)          # (a): every GSM8K test problem, whole
SAMPLED_ROWS = (0, 512)          # (b): whole test problems, rows 0-511...
SAMPLES, TEMPERATURE = 4, 1.0    # ...K = 4 samples each at T = 1
SEED = 4321                      # the samples' seed: the same for every model
WHOLE_BUDGET = 200               # new tokens a whole answer may take (the full profile's evaluation)
ALPHA, MIN_FORMAT = 0.05, 0.95
#: one line left: the reference run's first slice, samples and seed (grpo_course.measure.reference)
ONE_LINE_ROWS, ONE_LINE_SAMPLES, ONE_LINE_SEED = (512, 768), 8, 1234
DESIGN = {"greedy": {"split": "test", "rows": list(GREEDY_ROWS), "start": "whole",
                     "test": "McNemar's exact test, run vs its warm start"},
          "sampled": {"split": "test", "rows": list(SAMPLED_ROWS), "start": "whole",
                      "samples": SAMPLES, "temperature": TEMPERATURE, "seed": SEED,
                      "test": "paired difference of pass@1 per problem, run vs its warm start"},
          "max_new_tokens": WHOLE_BUDGET,
          "passes_when": f"both rise with p < {ALPHA} and the run's format rate is >= "
                         f"{MIN_FORMAT:.0%} in both",
          "fixed_at": "before the curriculum run trained (grpo_course/measure/whole_problems.py)"}


def budget(lines_left: int | None = None) -> int:
    """New tokens an answer may take: :data:`WHOLE_BUDGET` for whole problems, or the
    reverse-curriculum start's (``config.START_BUDGETS``)."""
    return WHOLE_BUDGET if lines_left is None else START_BUDGETS[lines_left]


def greedy(folder: str | Path, rows, lines_left: int | None = None, progress: bool = True,
           calculator: bool = False, max_new_tokens: int | None = None):
    """Greedy answers of the adapter in ``folder`` to ``rows`` at the start's budget, or
    ``max_new_tokens`` (cached; ``calculator``: with GSM8K's calculator)."""
    return greedy_answers(str(folder), rows, max_new_tokens or budget(lines_left), progress, calculator)


def whole_verdict(greedy_result: dict[str, Any], sampled_result: dict[str, Any]) -> dict[str, Any]:
    """Whether the fixed test passed: greedy accuracy (a) and sampled pass@1 (b) both rose with
    p < :data:`ALPHA`, and the run's format rate is at least :data:`MIN_FORMAT` in both."""
    m = greedy_result["mcnemar"]
    d = sampled_result["pass_at_1"]
    greedy_rose = greedy_result["after"] > greedy_result["before"] and m["p_value"] < ALPHA
    sampled_rose = d["difference"] > 0 and d["p_value"] < ALPHA
    formats = [greedy_result["format_after"], sampled_result["after"]["format_rate"]]
    format_ok = all(f >= MIN_FORMAT for f in formats)
    return {"passed": greedy_rose and sampled_rose and format_ok, "greedy_rose": greedy_rose,
            "sampled_rose": sampled_rose, "format_ok": format_ok}


def whole_problem_tests(run: str | Path, progress: bool = True) -> dict[str, Any]:
    """Tests (a) and (b) of ``run`` against its warm start (``run/sft``), and the verdict."""
    run = Path(run)
    before, after = run / "sft", run
    lo, hi = GREEDY_ROWS
    greedy_rows = held_out_rows("test", hi - lo, lo)
    lo, hi = SAMPLED_ROWS
    sampled_rows = held_out_rows("test", hi - lo, lo)
    out = {"run": shown_path(run),
           "greedy": {"rows": list(GREEDY_ROWS),
                      **greedy_test(before, after, greedy_rows, budget(), progress, answers=True)},
           "sampled": {"rows": list(SAMPLED_ROWS),
                       **sampled_test(before, after, sampled_rows, SAMPLES, SEED, budget(), progress)}}
    out["verdict"] = whole_verdict(out["greedy"], out["sampled"])
    out["chance"] = chance_baseline(greedy_rows)
    return out


def one_line_left(run: str | Path, reference: str | Path, progress: bool = True) -> dict[str, Any]:
    """One line left, on the reference run's first test slice with its samples and seed: the run
    against its warm start, and against the reference run (does the mix keep its gain?)."""
    lo, hi = ONE_LINE_ROWS
    rows = held_out_rows("test", hi - lo, lo, lines_left=1)
    run, reference = Path(run), Path(reference)
    args = (rows, ONE_LINE_SAMPLES, ONE_LINE_SEED, budget(1), progress)
    return {"rows": list(ONE_LINE_ROWS), "samples": ONE_LINE_SAMPLES,
            "vs_warm_start": sampled_test(run / "sft", run, *args),
            "vs_reference": sampled_test(reference, run, *args)}


# ---- the record in words and tables (chapter 5 reads data/curriculum_test.json through these)
def result_rows(tests: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """Tests (a) and (b) of one run (``whole_problem_tests``' record) as table rows: the warm
    start's and the run's value, the change, its interval or the problems gained and lost, p,
    and the reading."""
    g, s = tests["greedy"], tests["sampled"]
    m, d = g["mcnemar"], s["pass_at_1"]
    # beside each accuracy: its format rate (a gain there is not reasoning) and what a guesser that
    # combines two numbers of the question scores (the chance baseline), where the record has them
    guess = tests.get("chance", {}).get("uniform_guess_accuracy")
    beside = lambda fmt_a, fmt_b: {
        "format % (warm start → run)": "–" if fmt_a is None or fmt_b is None else f"{100 * fmt_a:.0f} → {100 * fmt_b:.0f}",
        "guesser %": "–" if guess is None else f"{100 * guess:.1f}"}
    return [{"run": name, "test": f"(a) greedy accuracy, all {g['n']} test problems",
             "warm start %": 100 * g["before"], "run %": 100 * g["after"],
             "change (points)": 100 * (g["after"] - g["before"]),
             "interval or pairs": f"{m['b_only']} gained, {m['a_only']} lost", "p": m["p_value"],
             "reading": reading(g["after"] - g["before"], m["p_value"], ALPHA),
             **beside(g.get("format_before"), g.get("format_after"))},
            {"run": name, "test": f"(b) sampled pass@1, K = {s['after']['samples']}, "
                                  f"rows {s['rows'][0]}-{s['rows'][1] - 1}",
             "warm start %": 100 * d["mean_a"], "run %": 100 * d["mean_b"],
             "change (points)": 100 * d["difference"],
             "interval or pairs": f"95 % CI {100 * d['lo']:+.1f} to {100 * d['hi']:+.1f}",
             "p": d["p_value"], "reading": reading(d["difference"], d["p_value"], ALPHA),
             **beside(s.get("before", {}).get("format_rate"), s["after"].get("format_rate"))}]


def verdict_sentence(tests: dict[str, Any], name: str = "the curriculum run", fixed_before: bool = True) -> str:
    """Whether ``name`` passed the tests, and which part decided it. ``fixed_before``: the tests were
    written before it trained (the curriculum run); else the same tests applied after (the
    reference run, trained before they were written)."""
    v, g, s = tests["verdict"], tests["greedy"], tests["sampled"]
    test = "the test fixed before it trained" if fixed_before else "the same test, applied after it trained"
    if v["passed"]:
        return (f"{name} passed {test}: on whole problems both greedy "
                f"accuracy and sampled pass@1 rose (p = {p_text(g['mcnemar']['p_value'])} and "
                f"{p_text(s['pass_at_1']['p_value'])}) with a format rate of at least {MIN_FORMAT:.0%}")
    parts = (("greedy accuracy", v["greedy_rose"], g["after"] - g["before"], g["mcnemar"]["p_value"]),
             ("sampled pass@1", v["sampled_rose"], s["pass_at_1"]["difference"], s["pass_at_1"]["p_value"]))
    failed = [f"{what} {'fell' if change < 0 and p < ALPHA else 'did not rise significantly'} (p = {p_text(p)})"
              for what, ok, change, p in parts if not ok]
    if not v["format_ok"]:
        failed.append(f"the format rate fell below {MIN_FORMAT:.0%}")
    held = [f"{what} rose (p = {p_text(p)})" for what, ok, change, p in parts if ok]
    return (f"{name} did not pass {test}: {'; '.join(failed)}"
            + (f", while {' and '.join(held)}" if held else ""))


# ---- chapter 5's reading of the run: its starts during training, and the live re-check
def start_table(rows: list[dict[str, Any]], starts: list[str]) -> list[dict[str, Any]]:
    """Each start of a mixed run, from its GRPO rows (``metrics.jsonl``): the groups sampled and
    trained, and the share of right answers among the completions sampled at that start over the
    first and the last quarter of the steps (training prompts drawn again and again from the pool:
    what the run practised, not a held-out test)."""
    quarter = max(1, len(rows) // 4)

    def right_share(name: str, part: list[dict[str, Any]]) -> float:
        groups = sum(r.get(f"starts/{name}/groups", 0) for r in part)
        right = sum(r.get(f"starts/{name}/correct", 0.0) * r.get(f"starts/{name}/groups", 0) for r in part)
        return 100 * right / groups if groups else float("nan")

    return [{"start": name,
             "groups sampled": sum(r.get(f"starts/{name}/groups", 0) for r in rows),
             "groups trained": sum(r.get(f"starts/{name}/trained", 0) for r in rows),
             f"right %, first {quarter} steps": right_share(name, rows[:quarter]),
             f"right %, last {quarter} steps": right_share(name, rows[-quarter:])} for name in starts]


def live_recheck(run: str | Path, problems: int, progress: bool = True) -> dict[str, Any]:
    """Test (b) again, now: its first ``problems`` rows (whole sampling blocks), the run's warm
    start and the run, with the bench's seed and blocks, so that the same kind of machine draws
    the same answers. One model in memory at a time."""
    if problems <= 0 or problems % BATCH_PROMPTS:
        raise ValueError(f"problems={problems}: must be a positive multiple of {BATCH_PROMPTS} "
                         f"(whole sampling blocks, so the seeds match the bench's)")
    lo, _ = SAMPLED_ROWS
    rows = held_out_rows("test", problems, lo)
    a, b = sampled_pair(Path(run) / "sft", Path(run), rows, SAMPLES, budget(), progress, temperature=TEMPERATURE,
                        seed=SEED, batch_prompts=BATCH_PROMPTS, sampling_dtype="auto")
    return {"before": a.summary(), "after": b.summary()}


def right_equations_per_answer(side: dict[str, Any]) -> float:
    """Right equations per greedy answer: the share of an answer's equations that are right,
    times the equations it writes (one side of ``tests["greedy"]["answers"]``)."""
    return (side["right_equation_share"] or 0.0) * side["equations_per_problem"]


def answers_sentence(tests: dict[str, Any]) -> str:
    """What the run's greedy answers do on whole problems, beside the chance baseline: problems
    gained and lost, format, right equations per answer, answers earned by right arithmetic
    (:func:`~grpo_course.measure.attribution.phase_changes`), and what a guesser would score."""
    g, chance = tests["greedy"], tests["chance"]
    m, a, b = g["mcnemar"], g["answers"]["a"], g["answers"]["b"]
    return (f"greedy accuracy {100 * g['before']:.1f} → {100 * g['after']:.1f} % (n = {g['n']}; "
            f"{m['b_only']} problems gained, {m['a_only']} lost, McNemar p = {p_text(m['p_value'])}); "
            f"format {100 * g['format_before']:.0f} → {100 * g['format_after']:.0f} %; right equations "
            f"per answer {right_equations_per_answer(a):.2f} → {right_equations_per_answer(b):.2f}; right "
            f"answers earned by right arithmetic {a['earned']} → {b['earned']} problems; a guesser that "
            f"combines two numbers of the question at random would score {100 * chance['uniform_guess_accuracy']:.1f} %")


def format_reading(tests: dict[str, Any], label: str) -> str:
    """One sentence on a run's greedy answers: its format rate (a change where the two rates'
    Wilson intervals do not overlap: unpaired, so cautious) beside its share of right equations and
    its equations per answer (means over answers, untested: no direction word for them, and no
    reading of form against arithmetic from them)."""
    g = tests["greedy"]
    (b_lo, b_hi), (a_lo, a_hi) = (wilson_interval(round(g[k] * g["n"]), g["n"]) for k in ("format_before", "format_after"))
    fmt = interval_words(a_lo - b_hi, a_hi - b_lo, "rose", "fell", "did not change detectably")
    a, b = g["answers"]["a"], g["answers"]["b"]
    share = lambda side: "–" if side["right_equation_share"] is None else f"{100 * side['right_equation_share']:.0f} %"
    return (f"{label}'s format {fmt} ({100 * g['format_before']:.0f} → {100 * g['format_after']:.0f} %, "
            f"n = {g['n']}); its share of right equations went from {share(a)} to {share(b)} and its "
            f"equations per answer from {a['equations_per_problem']:.2f} to {b['equations_per_problem']:.2f} "
            f"(both untested).")


def format_share_sentence(tests: dict[str, Any]) -> str:
    """How much of each test's change the format explains (:func:`~grpo_course.measure.stats.format_share`:
    a decomposition of point estimates, untested): (a) greedy accuracy and (b) sampled pass@1."""
    g, s = tests["greedy"], tests["sampled"]
    return as_sentences([
        f"greedy accuracy: {format_share_words(g['before'], g['format_before'], g['after'], g['format_after'])}",
        f"sampled pass@1: {format_share_words(s['pass_at_1']['mean_a'], s['before']['format_rate'], s['pass_at_1']['mean_b'], s['after']['format_rate'])}"])


# ---- what the course shows on whole problems, from the shipped records (the intro, page 3b)
def shipped_rows(reference_fixed: dict[str, Any] | None, curriculum: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Every shipped test on whole GSM8K test problems as :func:`result_rows`' rows: the reference
    run's transfer test (``data/reference_test.json``) and, where the bench has run, both runs' fixed
    tests (``data/curriculum_test.json``)."""
    rows = []
    whole = (reference_fixed or {}).get("transfer", {}).get("whole_problems")
    if whole:
        m = whole["mcnemar"]
        rows.append({"run": "reference run", "test": f"greedy accuracy, test rows {whole['rows'][0]}-"
                                                     f"{whole['rows'][1] - 1}",
                     "warm start %": 100 * whole["before"], "run %": 100 * whole["after"],
                     "change (points)": 100 * (whole["after"] - whole["before"]),
                     "interval or pairs": f"{m['b_only']} gained, {m['a_only']} lost", "p": m["p_value"],
                     "reading": reading(whole["after"] - whole["before"], m["p_value"], ALPHA),
                     "format % (warm start → run)": "–", "guesser %": "–"})   # not in that record
    if curriculum:
        rows += result_rows(curriculum["run"], "curriculum run") + result_rows(curriculum["reference"],
                                                                               "reference run")
    return rows


def shipped_sentence(reference_fixed: dict[str, Any] | None, curriculum: dict[str, Any] | None,
                     detail: bool = True) -> str:
    """What the shipped runs show on whole problems, in words from :func:`shipped_rows`' readings:
    how many tests rose, each test's numbers (``detail``), and the curriculum run's verdict."""
    rows = shipped_rows(reference_fixed, curriculum)
    if not rows:
        return "no test on whole problems has been run yet (make reference-run; python bench/curriculum_test.py)"
    # one sentence a test: a list of five tests in one sentence is past what a reader holds
    said = [f"{r['run']}, {r['test']}: {r['warm start %']:.1f} → {r['run %']:.1f} % "
            f"({r['interval or pairs']}, p = {p_text(r['p'])}: {r['reading']})" for r in rows]
    rose, fell = (sum(r["reading"] == word for r in rows) for word in ("rose", "fell"))
    if len(rows) == 1:
        word = rows[0]["reading"]
        head = "the one shipped test " + (word if word in ("rose", "fell") else "shows no detectable change")
    elif rose or fell:
        moved = " and ".join(f"{k} {word}" for k, word in ((rose, "rose"), (fell, "fell")) if k)
        head = f"of the {len(rows)} shipped tests {moved}" + (
            ", the rest show no detectable change" if rose + fell < len(rows) else "")
    else:
        head = f"none of the {len(rows)} shipped tests shows a detectable change"
    verdict = (verdict_sentence(curriculum["run"]) if curriculum else
               "the curriculum run's tests, fixed before it trained, have not run yet (python bench/curriculum_test.py)")
    return f"on whole GSM8K test problems, {head}. " + as_sentences([*(said if detail else []), verdict])


def whole_step_change(points: list[dict[str, Any]], point: dict[str, Any]) -> dict[str, Any] | None:
    """One kept step's greedy test on whole problems against step 0 (``points[0]``), as chapter 5's
    sentence and its result box both read it: accuracy before and after (%), the problems gained
    and lost, McNemar's p and the reading it decides; None where the step has no such test."""
    whole = point.get("whole_greedy") or {}
    if "vs_step_0" not in whole:
        return None
    t, first = whole["vs_step_0"], points[0]["whole_greedy"]["accuracy"]
    return {"step": point["step"], "n": whole.get("n"), "before": 100 * first, "after": 100 * whole["accuracy"],
            "gained": t["b_only"], "lost": t["a_only"], "p_value": t["p_value"],
            "reading": reading(whole["accuracy"] - first, t["p_value"])}


def candidate_steps(curves: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every candidate run's kept steps on validation (``bench/learning_curve.py``'s ``curves``,
    from one file or several with the same rows), one row per step after step 0 that has a
    greedy test on whole problems: the run, its learning rate, starts and pool,
    :func:`whole_step_change`'s fields, and the change of sampled pass@1 at one line left (points,
    with its p). :func:`chosen_candidate` applies the rule to them."""
    rows = []
    for curve in curves:
        recipe = curve.get("recipe") or {}
        for point in curve["points"][1:]:
            change = whole_step_change(curve["points"], point)
            if change:
                rows.append({"run": Path(curve["run"]).name, "learning_rate": recipe.get("learning_rate"),
                             "starts": " ".join(map(str, recipe.get("start_mix") or ()))
                             or ("whole" if recipe.get("lines_left") is None else f"{recipe['lines_left']} left"),
                             "pool": recipe.get("pool_prompts"), **change,
                             **_one_line_left_change(point)})
    return rows


def _one_line_left_change(point: Mapping[str, Any]) -> dict[str, Any]:
    """A step's sampled pass@1 at one line left against step 0: the change in points and its p."""
    d = (point.get("vs_step_0") or {}).get("pass_at_1")
    return {"one_line_left": 100 * d["difference"], "one_line_left_p": d["p_value"]} if d else {}


def chosen_candidate(rows: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The rule fixed before the candidates trained (``recipes/curriculum_lr2x_run.yaml``): among
    the (run, step) rows whose whole-problem test against step 0 reads "rose" (McNemar p < 0.05),
    the one with the highest greedy accuracy; None where none rose, and then no test rows are
    spent on any."""
    risen = [r for r in rows if r["reading"] == "rose"]
    return max(risen, key=lambda r: r["after"]) if risen else None


def validation_sentence(points: list[dict[str, Any]], samples: int) -> str:
    """A run's learning curve on validation rows (``bench/learning_curve.py``'s points) in words:
    at each kept step, greedy accuracy on whole problems (McNemar against step 0) and sampled
    pass@1 at one line left (the paired interval against step 0), then which step, if any,
    validation can choose for whole problems. Every direction word comes from its test."""
    parts, risen = [], []             # risen: the steps whose whole-problem test reads "rose"
    for p in points:
        whole, p1 = p.get("whole_greedy") or {}, p["pass_at_1"]
        text = f"step {p['step']}: "
        if whole:
            lo, hi = whole["ci95"]
            text += f"whole problems {100 * whole['accuracy']:.1f} % [{100 * lo:.1f}, {100 * hi:.1f}]"
            change = whole_step_change(points, p)
            if change:
                risen += [p["step"]] if change["reading"] == "rose" else []
                text += (f" ({change['gained']} gained, {change['lost']} lost, McNemar p = "
                         f"{p_text(change['p_value'])}: {change['reading']})")
            text += ", "
        text += f"one line left pass@1 {100 * p1['mean']:.1f} %" + ("" if parts else f" ({samples} samples a problem)")
        if "vs_step_0" in p:
            d = p["vs_step_0"]["pass_at_1"]
            text += f", {describe_difference(d)}: {reading(d['difference'], d['p_value'])}"
        else:
            text += ", the warm start"
        parts.append(text)
    if not any(p.get("whole_greedy") for p in points):
        return as_sentences([*parts, "whole problems were not tested on this curve (its --whole_n was 0)"])
    verdict = ("on whole problems no kept step beat the warm start detectably: validation gives "
               "no step to choose there" if not risen else
               f"on whole problems step{'s' if len(risen) > 1 else ''} "
               f"{' and '.join(map(str, risen))} beat the warm start detectably")
    return as_sentences([*parts, "so " + verdict])
