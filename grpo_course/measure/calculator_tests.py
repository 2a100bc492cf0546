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
from grpo_course.measure.paired import greedy_summary, greedy_test, sampled_test
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
