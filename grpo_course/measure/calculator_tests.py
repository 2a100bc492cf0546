"""The calculator run's tests on whole GSM8K problems, fixed before the run trained.

The calculator run (``recipes/calculator_run.yaml``, ``make calculator-run``,
``data/runs/calculator/``) trains GRPO on whole problems with GSM8K's calculator in the sampler,
from a warm start that learned the annotations on the train split (``make sft-run``, its
``sft/``). It is tested against that warm start, **with the calculator**, by two tests fixed here
before it trained (never change them after a result):

* **(a) greedy**: accuracy on all 1,319 GSM8K test problems, whole, McNemar's exact test;
* **(b) sampled**: pass@1 with :data:`SAMPLES` samples a problem at temperature 1 on whole test
  problems, rows 0-511, paired per problem.

It passes where both rise with p < :data:`ALPHA` and the run's format rate is at least
:data:`MIN_FORMAT` in both (:func:`~grpo_course.measure.whole_problems.whole_verdict`, the
curriculum run's rule). Beside them: the same two tests without the calculator (the model writes
its own results), pass@K and the samples' entropy, what the greedy answers do (their own
equations, the annotations taken out, against the chance baseline), and the credit of each phase
on (a)'s problems: the old warm start (``data/runs/reference/sft``, 210 solutions, no annotations)
-> the new warm start without the tool (SFT on the train split) -> with the tool -> GRPO, so that
no SFT gain is read as GRPO's. Every model's answers are cached, so the bench resumes where it
stopped.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from grpo_course.infra.paths import project_root, shown_path
from grpo_course.measure.attribution import chance_baseline
from grpo_course.measure.evaluate import held_out_rows
from grpo_course.measure.paired import BATCH_PROMPTS, greedy_summary, greedy_test, sampled_pair, sampled_test
from grpo_course.measure.stats import as_sentences, p_text, reading, wilson_interval
from grpo_course.measure.whole_problems import REFERENCE_RUN, greedy, whole_verdict

#: the committed run (the train CLI's layout: the final adapter, and ``sft/``, its warm start)
CALCULATOR_RUN = project_root() / "data" / "runs" / "calculator"
#: the warm start every earlier run began from: 210 solutions without annotations
OLD_WARM_START = REFERENCE_RUN / "sft"

# ---- the tests, fixed before the calculator run trained (never change them after a result)
GREEDY_ROWS = (0, 1319)          # (a): every GSM8K test problem, whole
SAMPLED_ROWS = (0, 512)          # (b): whole test problems, rows 0-511...
SAMPLES, TEMPERATURE = 4, 1.0    # ...K = 4 samples each at T = 1
SEED = 4321                      # the samples' seed: the same for every model
BUDGET = 256                     # new tokens an answer may take (nanochat's; annotations add length)
ALPHA, MIN_FORMAT = 0.05, 0.95
DESIGN = {"greedy": {"split": "test", "rows": list(GREEDY_ROWS), "start": "whole", "calculator": True,
                     "test": "McNemar's exact test, run vs its warm start"},
          "sampled": {"split": "test", "rows": list(SAMPLED_ROWS), "start": "whole", "calculator": True,
                      "samples": SAMPLES, "temperature": TEMPERATURE, "seed": SEED,
                      "test": "paired difference of pass@1 per problem, run vs its warm start"},
          "max_new_tokens": BUDGET,
          "passes_when": f"both rise with p < {ALPHA} and the run's format rate is >= "
                         f"{MIN_FORMAT:.0%} in both",
          "beside": "the same without the calculator; pass@K and entropy; the answers' own "
                    "equations against the chance baseline; each phase's credit on (a)'s problems",
          "fixed_at": "before the calculator run trained (grpo_course/measure/calculator_tests.py)"}


def both_tests(run: Path, calculator: bool, progress: bool = True) -> dict[str, Any]:
    """(a) and (b) of ``run`` against its ``sft/``, with or without the calculator."""
    lo, hi = GREEDY_ROWS
    greedy_rows = held_out_rows("test", hi - lo, lo)
    lo, hi = SAMPLED_ROWS
    sampled_rows = held_out_rows("test", hi - lo, lo)
    return {"greedy": {"rows": list(GREEDY_ROWS),
                       **greedy_test(run / "sft", run, greedy_rows, BUDGET, progress, calculator, answers=True)},
            "sampled": {"rows": list(SAMPLED_ROWS),
                        **sampled_test(run / "sft", run, sampled_rows, SAMPLES, SEED, BUDGET, progress,
                                       calculator)}}


def phase_credit(run: Path, old: Path = OLD_WARM_START, progress: bool = True) -> dict[str, Any]:
    """Greedy accuracy on (a)'s problems at each phase, and McNemar's test of each step: the old
    warm start (its own way, no tool) -> the new warm start without the tool (the SFT data) ->
    with the tool -> the GRPO run with the tool."""
    lo, hi = GREEDY_ROWS
    rows = held_out_rows("test", hi - lo, lo)
    phases = {"old_warm_start": greedy(old, rows, progress=progress, max_new_tokens=BUDGET),
              "new_warm_start": greedy(run / "sft", rows, progress=progress, max_new_tokens=BUDGET),
              "new_warm_start_tool": greedy(run / "sft", rows, progress=progress, calculator=True,
                                            max_new_tokens=BUDGET),
              "grpo_tool": greedy(run, rows, progress=progress, calculator=True, max_new_tokens=BUDGET)}
    names = list(phases)
    steps = {f"{a} -> {b}": greedy_summary(phases[a], phases[b]) for a, b in zip(names, names[1:], strict=False)}
    steps["old_warm_start -> grpo_tool"] = greedy_summary(phases["old_warm_start"], phases["grpo_tool"])
    return {"n": hi - lo, "accuracy": {k: v.accuracy for k, v in phases.items()},
            "format": {k: v.format_rate for k, v in phases.items()},
            "tool_results_per_answer": {k: v.summary()["tool_results_per_answer"] for k, v in phases.items()},
            "steps": steps}


def calculator_tests(run: str | Path = CALCULATOR_RUN, old: str | Path = OLD_WARM_START,
                     progress: bool = True) -> dict[str, Any]:
    """The fixed tests of ``run`` with the calculator, the verdict, and what stands beside them."""
    run = Path(run)
    with_tool = both_tests(run, True, progress)
    out = {"run": shown_path(run), "old_warm_start": shown_path(old),
           "with_calculator": with_tool,
           "verdict": whole_verdict(with_tool["greedy"], with_tool["sampled"]),
           "without_calculator": both_tests(run, False, progress),
           "phases": phase_credit(run, Path(old), progress)}
    lo, hi = GREEDY_ROWS
    out["chance"] = chance_baseline(held_out_rows("test", hi - lo, lo))
    return out


def live_recheck(run: str | Path, problems: int, progress: bool = True) -> dict[str, Any]:
    """Test (b) again, now, with the calculator: its first ``problems`` rows (whole sampling
    blocks), the run's warm start and the run, with the bench's seed and blocks, so that the same
    kind of machine draws the same answers. One model in memory at a time."""
    if problems <= 0 or problems % BATCH_PROMPTS:
        raise ValueError(f"problems={problems}: must be a positive multiple of {BATCH_PROMPTS} "
                         f"(whole sampling blocks, so the seeds match the bench's)")
    rows = held_out_rows("test", problems, SAMPLED_ROWS[0])
    a, b = sampled_pair(Path(run) / "sft", Path(run), rows, SAMPLES, BUDGET, progress, temperature=TEMPERATURE,
                        seed=SEED, batch_prompts=BATCH_PROMPTS, sampling_dtype="auto", calculator=True)
    return {"before": a.summary(), "after": b.summary()}


# ---- the record in words and tables (the tool page reads data/calculator_test.json and
# data/calculator_sft_curve.json through these)
PHASE_NAMES = {"old_warm_start": "old warm start (210 solutions, no tool)",
               "new_warm_start": "new warm start, without the tool",
               "new_warm_start_tool": "new warm start, with the tool",
               "grpo_tool": "after GRPO, with the tool"}


def phase_rows(tests: dict[str, Any]) -> list[dict[str, Any]]:
    """Each phase's greedy accuracy on (a)'s problems, its format rate and the tool's results per
    answer, with the paired change from the phase before (McNemar: problems gained and lost, p)."""
    ph = tests["phases"]
    rows, before = [], None
    for key, name in PHASE_NAMES.items():
        row = {"phase": name, "accuracy %": 100 * ph["accuracy"][key], "format %": 100 * ph["format"][key],
               "tool results per answer": ph["tool_results_per_answer"][key]}
        step = ph["steps"].get(f"{before} -> {key}") if before else None
        if step:
            m = step["mcnemar"]
            row.update({"change (points)": 100 * (step["after"] - step["before"]),
                        "gained, lost": f"{m['b_only']}, {m['a_only']}", "p": m["p_value"],
                        "reading": reading(step["after"] - step["before"], m["p_value"], ALPHA)})
        else:
            row.update({"change (points)": None, "gained, lost": "–", "p": None, "reading": "–"})
        rows.append(row)
        before = key
    return rows


def sft_curve_rows(curve: dict[str, Any]) -> list[dict[str, Any]]:
    """``bench/sft_curve.py``'s record as a table: each kept adapter's greedy accuracy on the
    validation rows with the calculator, against the old warm start (McNemar)."""
    n = curve["rows"][2] - curve["rows"][1]
    return [{"SFT step": p["step"], "epochs": p["epochs"], "solved (with the tool)": p["solved_tool"],
             "accuracy %": 100 * p["accuracy_tool"], "format %": 100 * p["format_tool"],
             "tool results per answer": p["tool_results_per_answer"],
             "vs the old warm start": f"{p['vs_old_tool']['b_only']} gained, {p['vs_old_tool']['a_only']} lost",
             "p": p["vs_old_tool"]["p_value"], "n": n} for p in curve["points"]]


def sft_curve_sentence(curve: dict[str, Any]) -> str:
    """What the validation curve chose and whether it clears issue 106's bar (twice the old warm
    start's problems, McNemar p < 0.05), in words decided by the record's numbers."""
    n = curve["rows"][2] - curve["rows"][1]
    old = curve["old_warm_start"]
    best = next(p for p in curve["points"] if p["step"] == curve["best"])
    lo, hi = wilson_interval(best["solved_tool"], n)
    m = best["vs_old_tool"]
    bar = ("that is at least twice the old warm start's, with p < 0.05: the bar it had to clear"
           if curve["twice_the_old"] else
           "that is not twice the old warm start's with p < 0.05, the bar it had to clear")
    said = [f"with the calculator, the warm-up's adapter at step {best['step']} ({best['epochs']} epochs) "
            f"solved the most validation problems: {best['solved_tool']} of {n} greedily "
            f"({100 * best['accuracy_tool']:.1f} %, 95 % CI {100 * lo:.1f} to {100 * hi:.1f})",
            f"the old warm start solved {old['solved']} ({100 * old['accuracy']:.1f} %), so the new one "
            f"{reading(best['accuracy_tool'] - old['accuracy'], m['p_value'], ALPHA)} "
            f"({m['b_only']} problems gained, {m['a_only']} lost, McNemar p = {p_text(m['p_value'])}), and {bar}"]
    if "solved_own" in best:
        t = best["tool_vs_own"]
        word = reading(best["accuracy_tool"] - best["accuracy_own"], t["p_value"], ALPHA)
        effect = {"rose": "accuracy rose with the tool", "fell": "accuracy fell with the tool"}.get(
            word, "the tool made no detectable change")
        said.append(f"the same weights writing every result themselves solved {best['solved_own']} "
                    f"(format {100 * best['format_own']:.0f} %): {effect} (McNemar p = {p_text(t['p_value'])})")
    return as_sentences(said)
