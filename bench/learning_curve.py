"""Learning per minute: a GRPO run's sampled accuracy on validation problems, step by step.

    python bench/learning_curve.py                      # the reference run (make reference-run)
    python bench/learning_curve.py --run DIR --steps 0,20,40 --val_n 128

A run trained with ``snapshot_every`` keeps its adapter every few steps (``DIR/steps/<step>``,
``DIR/sft`` at step 0). Each chosen step's adapter samples ``--samples`` answers (temperature 1)
to each of ``--val_n`` **validation** problems: GSM8K *train* rows ``0 .. val_n - 1`` at the run's
start, which the run never trains on (its ``train_offset`` must lie past them; the warm-up and
the pool draw from rows after it) and which are not the test slices, so choosing the steps,
the pool and the learning rate here leaves the held-out tests honest. For each step it records
pass@1 with its 95 % interval, pass@K, the format rate, and the paired difference of pass@1
from step 0 (95 % CI, p). From the run's log it records the seconds per step and the groups with
right and wrong answers trained per minute, and from its pool the share of screened prompts
that were mixed (without the pool) beside the share of sampled groups that were (with it).
Prints one JSON line and writes ``data/learning_curve.json``.
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpo_course.config import START_BUDGETS, ConfigError
from grpo_course.core.checkpoints import POOL_FILE, SNAPSHOTS
from grpo_course.core.loading import quiet_loading
from grpo_course.core.pool import pool_summary
from grpo_course.core.runs import load_run_config, read_metrics
from grpo_course.infra.atomic import write_json_atomic
from grpo_course.infra.errors import OneLineArgumentParser, report
from grpo_course.infra.hardware import bench_facts
from grpo_course.infra.paths import cache_dir
from grpo_course.measure.evaluate import compare_sampled, evaluate_sampled, held_out_rows

SEED = 20250   # the validation samples' seed: the same for every step, so the steps are paired


def snapshot(run: Path, step: int) -> Path:
    """The adapter folder of ``run`` at GRPO step ``step`` (0: the warm start, ``sft/``)."""
    folder = run / "sft" if step == 0 else run / SNAPSHOTS / str(step)
    if not (folder / "adapter_config.json").is_file():
        kept = sorted(int(p.name) for p in (run / SNAPSHOTS).glob("*") if p.name.isdigit())
        raise ConfigError(f"--steps {step}: {run} has no adapter at that step (kept: 0 and "
                          f"{', '.join(map(str, kept)) or 'none'})")
    return folder


def training_rates(run: Path) -> dict:
    """Seconds per GRPO step and the mixed groups sampled and trained, per minute, from the log;
    the pool's screening (the mixed share without the pool)."""
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


def main(argv: list[str] | None = None) -> int:
    parser = OneLineArgumentParser(prog="python bench/learning_curve.py", description=__doc__)
    parser.add_argument("--run", default=None,
                        help="a run folder with snapshots (default: the reference run's, "
                             "$GRPO_COURSE_CACHE/runs/reference)")
    parser.add_argument("--steps", default="0,20,40,60",
                        help="GRPO steps to test, comma-separated (0: the warm start)")
    parser.add_argument("--val_n", type=int, default=256, help="validation problems (train rows)")
    parser.add_argument("--samples", type=int, default=8, help="samples per problem")
    parser.add_argument("--out", default=str(ROOT / "data" / "learning_curve.json"))
    args = parser.parse_args(argv)
    run = Path(args.run) if args.run else cache_dir() / "runs" / "reference"
    try:
        steps = sorted({int(s) for s in args.steps.split(",")})
    except ValueError:
        parser.error(f"--steps must be whole numbers separated by commas; got {args.steps!r}")
    if args.val_n < 2 or args.samples < 1 or steps[0] < 0:
        parser.error(f"--val_n must be >= 2, --samples >= 1 and --steps >= 0; got {args.val_n}, "
                     f"{args.samples} and {args.steps}")
    try:
        config = load_run_config(run)
        if config is None:
            raise ConfigError(f"--run {str(run)!r} is not a run folder (no config.yaml)")
        if config.get("train_offset", 0) < args.val_n:
            raise ConfigError(f"--val_n {args.val_n}: the run trains on train rows from "
                              f"{config.get('train_offset', 0)} on, so validation rows 0-"
                              f"{args.val_n - 1} would overlap them")
        folders = {s: snapshot(run, s) for s in steps}
        if 0 not in folders:
            folders = {0: snapshot(run, 0), **folders}
        lines_left = config.get("lines_left")
        budget = START_BUDGETS.get(lines_left, config["max_completion_length"])
        quiet_loading()
        rows = held_out_rows("train", args.val_n, 0, lines_left=lines_left)
        results = {s: evaluate_sampled(str(f), rows, args.samples, budget, seed=SEED)
                   for s, f in sorted(folders.items())}
        rates = training_rates(run)
    except (ValueError, RuntimeError, OSError) as exc:
        return report(exc)
    points = []
    for step, result in results.items():
        summary = result.summary()
        point = {"step": step, "pass_at_1": summary["pass_at_1"],
                 f"pass_at_{args.samples}": summary[f"pass_at_{args.samples}"],
                 "format_rate": summary["format_rate"], "seconds": summary["seconds"]}
        if step:
            point["vs_step_0"] = compare_sampled(results[0], result)
        points.append(point)
    out = {"bench": "learning_curve", **bench_facts(), "run": str(run),
           "recipe": {k: config.get(k) for k in ("learning_rate", "lines_left", "prompt_pool",
                                                  "pool_prompts", "num_generations",
                                                  "per_step_completions", "generation_batch_size",
                                                  "max_steps", "train_offset")},
           "validation": {"split": "train", "rows": [0, args.val_n], "n": len(rows),
                          "lines_left": lines_left, "samples": args.samples,
                          "max_new_tokens": budget, "temperature": 1.0},
           "points": points, "training": rates}
    write_json_atomic(args.out, out, indent=1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
