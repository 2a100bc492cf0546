"""The reference GRPO run's tests, fixed before its result was seen.

The reference run (``recipes/reference_run.yaml``, trained by ``make reference-run`` into
``data/runs/reference/``) is tested against the warm start it began from (its ``sft/``):

* **the primary test**: sampled pass@1 with :data:`SAMPLES` samples per problem at temperature 1,
  at one line left, on test rows 512-767 and 768-1023 (n = 256 each), paired over problems. It
  passes where both slices rise with p < 0.05 and the trained policy's format rate is at least
  95 % on both (:func:`primary_verdict`);
* beside it, on the same problems: greedy accuracy with McNemar's test, pass@K from the same
  samples, and the policy's entropy (the mean negative log-probability of its sampled tokens),
  which together tell sharpening (pass@1 up, pass@K flat, entropy down) from new solutions (at
  K = 8 only roughly: sharpening alone can raise pass@8 on problems solved in fewer than 1 sample
  in 8; large K separates the two);
* the transfer to two lines left and to whole problems (greedy, the first slice), reported
  whatever it shows.

Its learning rate and steps are chosen on validation instead (train rows no run trains on):
:func:`curve_sentences` reads ``bench/learning_curve.py``'s curves and says what they chose.
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from grpo_course.config import PROFILES, START_BUDGETS, ConfigError
from grpo_course.core.checkpoints import POOL_FILE
from grpo_course.core.pool import pool_summary
from grpo_course.core.runs import read_metrics
from grpo_course.infra.paths import project_root, shown_path
from grpo_course.measure.evaluate import held_out_rows
from grpo_course.measure.paired import greedy_test, sampled_test
from grpo_course.measure.stats import (
    as_sentences,
    describe_difference,
    format_share_words,
    p_text,
    paired_difference,
    reading,
)

#: the committed reference run (the train CLI's layout: the final adapter, and ``sft/``)
REFERENCE_RUN = project_root() / "data" / "runs" / "reference"
#: the test fixed in advance: the full profile's sizes (``config.ReferenceSizes``)
SLICES, SAMPLES = PROFILES["full"].ref.slices, PROFILES["full"].ref.samples
TRANSFER = PROFILES["full"].ref.transfer
LINES_LEFT = 1              # the start the run trained at
ALPHA, MIN_FORMAT = 0.05, 0.95
SEED = 1234                 # the samples' seed: the same for both models, every slice
#: new tokens an answer may take, by lines left (None: the whole problem, the full profile's evaluation)
BUDGETS = {**START_BUDGETS, None: PROFILES["full"].eval.max_new_tokens}


def primary_verdict(slices: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether the primary test passed: pass@1 rose with p < :data:`ALPHA` on every slice and the
    trained policy kept a format rate of at least :data:`MIN_FORMAT` on each."""
    rose = [s["sampled"]["pass_at_1"]["difference"] > 0 and
            s["sampled"]["pass_at_1"]["p_value"] < ALPHA for s in slices]
    formatted = [s["sampled"]["after"]["format_rate"] >= MIN_FORMAT for s in slices]
    return {"passed": all(rose) and all(formatted), "rose": rose, "format_ok": formatted}


def reference_tests(run: str | Path = REFERENCE_RUN, slices=SLICES, samples: int = SAMPLES,
                    transfer: bool = TRANSFER, progress: bool = True,
                    greedy: bool = True) -> dict[str, Any]:
    """Every test of the module docstring on ``run`` against ``run/sft``; with ``greedy=False``
    each slice's sampled test alone (a re-check of the samples, as page 3d makes)."""
    run = Path(run)
    before, after = str(run / "sft"), str(run)
    out: dict[str, Any] = {"run": shown_path(run), "samples": samples, "lines_left": LINES_LEFT,
                           "slices": []}
    for lo, hi in slices:
        rows = held_out_rows("test", hi - lo, lo, lines_left=LINES_LEFT)
        tested = {"rows": [lo, hi], "n": len(rows),
                  "sampled": sampled_test(before, after, rows, samples, SEED, BUDGETS[LINES_LEFT],
                                          progress, cached=False)}
        if greedy:
            tested["greedy"] = greedy_test(before, after, rows, BUDGETS[LINES_LEFT], progress)
        out["slices"].append(tested)
    out["verdict"] = primary_verdict(out["slices"])
    if transfer:
        lo, hi = slices[0]
        out["transfer"] = {
            name: {"rows": [lo, hi], **greedy_test(before, after,
                                                   held_out_rows("test", hi - lo, lo, lines_left=k),
                                                   BUDGETS[k], progress)}
            for name, k in (("two_lines_left", LINES_LEFT + 1), ("whole_problems", None))}
    return out


def training_rates(run: str | Path) -> dict[str, Any]:
    """Seconds per GRPO step and the mixed groups sampled and trained, per minute, from the log;
    the pool's screening (the mixed share without the pool)."""
    run = Path(run)
    rows = [r for r in read_metrics(run) if r.get("phase") == "grpo"]
    if not rows:
        raise ConfigError(f"{run} has no GRPO step in its metrics.jsonl")
    seconds = [r["step_seconds"] for r in rows]
    minutes = sum(seconds) / 60
    sampled = sum(r["prompts_sampled"] for r in rows)
    mixed = sum(r.get("correct_mixed_groups") or 0 for r in rows)
    trained_mixed = sum(r.get("trained_correct_mixed") or 0 for r in rows)
    trained = sum(r["informative_groups"] for r in rows)
    out = {"steps": len(rows), "minutes": round(minutes, 2),
           "seconds_per_step": {"mean": statistics.fmean(seconds), "median": statistics.median(seconds)},
           "groups_sampled": sampled, "groups_trained": trained,
           "share_sampled_mixed_with_pool": mixed / sampled if sampled else None,
           "share_trained_mixed": trained_mixed / trained if trained else None,
           "mixed_groups_trained_per_minute": trained_mixed / minutes if minutes else None,
           "train_dtype": rows[0].get("train_dtype")}
    if (run / POOL_FILE).is_file():
        pool = json.loads((run / POOL_FILE).read_text())
        out["pool"] = {**pool_summary(pool), "seconds": pool.get("seconds")}
    return out


def recipe_curve(curve: dict[str, Any] | None, recipe: dict[str, Any]) -> dict[str, Any] | None:
    """Of the learning curve's runs (``data/learning_curve.json``), the one at ``recipe``'s learning
    rate and start (``lines_left``, ``start_mix``, where ``recipe`` names them); ``None`` when
    there is none."""
    runs = curve["curves"] if curve else []
    keys = [k for k in ("learning_rate", "lines_left", "start_mix") if k in recipe]
    arm = lambda r: [list(r.get(k) or []) if k == "start_mix" else r.get(k) for k in keys]
    return next((c for c in runs if arm(c["recipe"]) == arm(recipe)), None)


def curve_table(curve: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per learning rate and step tested: pass@1, pass@K, format, the paired change from
    step 0 and its p."""
    k = curve["validation"]["samples"]
    return [{"learning rate": f"{c['recipe']['learning_rate']:g}", "step": p["step"],
             "pass@1 %": 100 * p["pass_at_1"]["mean"], f"pass@{k} %": 100 * p[f"pass_at_{k}"]["mean"],
             "format %": 100 * p["format_rate"],
             "change vs step 0 (points)": 100 * p["vs_step_0"]["pass_at_1"]["difference"] if p["step"] else 0.0,
             "p": p["vs_step_0"]["pass_at_1"]["p_value"] if p["step"] else None}
            for c in curve["curves"] for p in c["points"]]


def curve_sentences(curve: dict[str, Any] | None, recipe: dict[str, Any]) -> dict[str, str]:
    """``curve_sentence`` (the validation curve at ``recipe``'s learning rate, first step to last,
    and at the step the recipe stops) and ``choice_sentence`` (whether the learning rate and the
    steps were chosen there: the best mean pass@1; each other learning rate paired by problem
    against the recipe's at the last step both runs kept; and, where the recipe stops before the
    best step of its own run, that step paired against the recipe's)."""
    mine = recipe_curve(curve, recipe)
    if not mine or len(mine["points"]) < 2:
        return {"curve_sentence": "no learning curve of the reference recipe yet: run `python bench/learning_curve.py`",
                "choice_sentence": "nothing has been chosen on validation yet"}
    val, k = curve["validation"], curve["validation"]["samples"]
    pts, t, lr = mine["points"], mine["training"], recipe["learning_rate"]
    by_step = {p["step"]: p for p in pts}
    last, stop = pts[-1], by_step.get(recipe.get("max_steps"))

    def paired(a: dict[str, Any], b: dict[str, Any]) -> str:       # b's pass@1 minus a's, by problem
        return describe_difference(paired_difference([x / k for x in a["right"]], [y / k for y in b["right"]]))

    at_stop = (f" It was {100 * stop['pass_at_1']['mean']:.1f} % at step {stop['step']}, where the recipe stops."
               if stop and stop is not last and stop["step"] else "")
    out = {"curve_sentence": (
        f"on {val['n']} validation problems, sampled pass@1 at the reference recipe's learning rate went from "
        f"{100 * pts[0]['pass_at_1']['mean']:.1f} % at step 0 to {100 * last['pass_at_1']['mean']:.1f} % at "
        f"step {last['step']}, a paired change of {describe_difference(last['vs_step_0']['pass_at_1'])}.{at_stop} "
        f"The curve's run at that learning rate (trained for the curve, not the shipped run) took "
        f"{t['seconds_per_step']['median']:.0f} s per step and trained "
        f"{t['mixed_groups_trained_per_minute']:.1f} groups with right and wrong answers per minute")}
    best = curve["best"]
    best_run = next(c for c in curve["curves"] if c["run"] == best["run"])
    last_kept = (" It is the last step its run was tested at, so more steps may still pay."
                 if best["step"] == best_run["points"][-1]["step"] else "")
    matches = (best["learning_rate"], best["step"]) == (lr, recipe.get("max_steps"))
    beyond = (f"; on the recipe's run, step {best['step']} against step {stop['step']}, paired by problem: "
              f"{paired(stop, by_step[best['step']])}" if best_run is mine and stop and not matches else "")
    verdict = (f"The reference recipe trains {recipe.get('max_steps')} steps at {lr:g}, "
               f"{'that point' if matches else 'not that point'}{beyond}")
    if len(curve["curves"]) == 1:
        out["choice_sentence"] = (
            f"only one learning rate ({lr:g}) has been tested on validation, so the learning rate was not "
            f"chosen there; along its steps ({', '.join(str(p['step']) for p in pts)}) the highest mean pass@1 "
            f"was at step {best['step']} ({100 * best['pass_at_1']:.1f} %).{last_kept} {verdict}")
        return out
    pairs = []
    for c in curve["curves"]:
        if c is mine:
            continue
        at = {p["step"]: p for p in c["points"]}
        step = max(s for s in at if s in by_step)      # the last step both kept
        pairs.append(f"learning rate {c['recipe']['learning_rate']:g} against {lr:g} at step {step}: "
                     f"{paired(by_step[step], at[step])}")
    out["choice_sentence"] = (
        f"{len(curve['curves'])} learning rates were tested on the same problems; the highest mean pass@1 was "
        f"learning rate {best['learning_rate']:g} at step {best['step']} ({100 * best['pass_at_1']:.1f} %)."
        f"{last_kept} Paired by problem, {'; '.join(pairs)}. {verdict}")
    return out


# ---------------------------------------------------------------- the fixed test in words (page 3d)
def fixed_test_table(fixed: dict[str, Any]) -> list[dict[str, Any]]:
    """``bench/reference_test.py``'s record (``data/reference_test.json``), one row a slice: sampled
    pass@1 and its paired change, pass@K, entropy, format and greedy accuracy."""
    k, rows = fixed["samples"], []
    for s in fixed["slices"]:
        sm, gr = s["sampled"], s["greedy"]
        rows.append({"test rows": f"{s['rows'][0]}-{s['rows'][1] - 1}", "n": s["n"],
                     "pass@1 before %": 100 * sm["before"]["pass_at_1"]["mean"],
                     "pass@1 after %": 100 * sm["after"]["pass_at_1"]["mean"],
                     "change (points)": 100 * sm["pass_at_1"]["difference"],
                     "95 % CI": f"[{100 * sm['pass_at_1']['lo']:+.1f}, {100 * sm['pass_at_1']['hi']:+.1f}]",
                     "p": sm["pass_at_1"]["p_value"], "up / down": f"{sm['up']} / {sm['down']}",
                     f"pass@{k} before %": 100 * sm["before"][f"pass_at_{k}"]["mean"],
                     f"pass@{k} after %": 100 * sm["after"][f"pass_at_{k}"]["mean"],
                     "entropy before": sm["before"]["entropy"], "entropy after": sm["after"]["entropy"],
                     "format after %": 100 * sm["after"]["format_rate"],
                     "greedy before %": 100 * gr["before"], "greedy after %": 100 * gr["after"],
                     "McNemar p": gr["mcnemar"]["p_value"]})
    return rows


def fixed_test_sentences(fixed: dict[str, Any]) -> dict[str, str]:
    """The record in short sentences, every direction word from its number: the verdict
    (``ref_verdict``), each slice (``ref_table``), the transfer (``ref_transfer``), the paired change
    of pass@K (``ref_passk_change``), the pattern by the rule fixed before the run (``ref_pattern``),
    greedy accuracy (``ref_greedy``) and how much of pass@1's change the format explains
    (``ref_format_share``)."""
    table, k, verdict = fixed_test_table(fixed), fixed["samples"], fixed["verdict"]
    # added after the result was seen (the fixed test reports pass@K per model, not paired): the
    # paired change of pass@K, a problem counted when at least one of its K samples is right
    passk = [paired_difference([c > 0 for c in s["sampled"]["before"]["right"]],
                               [c > 0 for c in s["sampled"]["after"]["right"]]) for s in fixed["slices"]]
    n = len(table)
    p1_up = sum(t["p"] < ALPHA and t["change (points)"] > 0 for t in table)
    pk_up = sum(d["lo"] > 0 for d in passk)
    ent_down = sum(t["entropy after"] < t["entropy before"] for t in table)
    return {
        "ref_verdict": ("it passed: sampled pass@1 rose with p < 0.05 on both slices, and its format rate after the run was at least 95 %"
                        if verdict["passed"] else
                        f"it did not pass: pass@1 rose with p < 0.05 on {sum(verdict['rose'])} of "
                        f"{len(verdict['rose'])} slices, and the format held on {sum(verdict['format_ok'])}"),
        "ref_table": "; ".join(
            f"rows {t['test rows']}: pass@1 {t['pass@1 before %']:.1f} → {t['pass@1 after %']:.1f} % "
            f"({t['change (points)']:+.1f} points, 95 % CI {t['95 % CI']}, p = {p_text(t['p'])}), "
            f"pass@{k} {t[f'pass@{k} before %']:.1f} → {t[f'pass@{k} after %']:.1f} %, entropy "
            f"{t['entropy before']:.2f} → {t['entropy after']:.2f} nats/token" for t in table),
        "ref_transfer": "; ".join(
            f"{name.replace('_', ' ')}: greedy {100 * t['before']:.1f} → {100 * t['after']:.1f} % (n = {t['n']}, "
            f"McNemar p = {p_text(t['mcnemar']['p_value'])}: {reading(t['after'] - t['before'], t['mcnemar']['p_value'])})"
            for name, t in fixed.get("transfer", {}).items()) or "not run",
        "ref_passk_change": "; ".join(f"rows {s['rows'][0]}-{s['rows'][1] - 1}: {describe_difference(d)}"
                                      for s, d in zip(fixed["slices"], passk, strict=True)),
        "ref_pattern": (f"pass@1 rose significantly on {p1_up} of {n} slices, pass@{k} rose on {pk_up} of {n} "
                        f"(paired interval above 0) and the entropy was lower after on {ent_down} of {n} "
                        "(untested): "
                        + (f"at k = {k} sharpening alone can raise pass@{k} (the caveat above), so this test "
                           "cannot tell sharpening from new solutions" if pk_up
                           else "by the rule above, sharpening")),
        "ref_greedy": "; ".join(
            f"on rows {t['test rows']}, {reading(t['greedy after %'] - t['greedy before %'], t['McNemar p'])} "
            f"({t['greedy before %']:.1f} → {t['greedy after %']:.1f} %, McNemar p = {p_text(t['McNemar p'])})"
            for t in table),
        # how much of each slice's change of pass@1 the format explains (a decomposition, untested)
        "ref_format_share": as_sentences([
            f"rows {s['rows'][0]}-{s['rows'][1] - 1}: "
            + format_share_words(s["sampled"]["pass_at_1"]["mean_a"], s["sampled"]["before"]["format_rate"],
                                 s["sampled"]["pass_at_1"]["mean_b"], s["sampled"]["after"]["format_rate"])
            for s in fixed["slices"]])}
