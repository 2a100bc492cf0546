"""Learning per minute: a GRPO run's sampled accuracy on validation problems, step by step.

    python bench/learning_curve.py                      # the reference run (make reference-run)
    python bench/learning_curve.py --run DIR --steps 0,20,40 --val_n 128
    python bench/learning_curve.py --run A --run B --steps 0,20,40,60   # e.g. two learning rates

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
With more than one ``--run`` (the same recipe and warm start at other learning rates), each run
is tested at the steps it kept, on the same problems with the same seed, so that its points pair
with another run's by problem (``right``), and ``best`` names the run and step with the highest
mean pass@1 on validation: where the learning rate and the steps are chosen. Runs compared so
must share every config field but those in :data:`MAY_DIFFER`, and the warm start's bytes; one
run a learning rate. Prints one JSON line and writes ``data/learning_curve.json``. Each step's
samples are kept in the cache (``$GRPO_COURSE_CACHE/validation/``, keyed by the adapter's bytes,
the rows, the sampling and the code of :mod:`grpo_course.measure.evaluate` with all it imports),
so a bench stopped part way resumes at the first step it has not tested, as long as that code is
unchanged.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpo_course.config import START_BUDGETS, ConfigError
from grpo_course.core.checkpoints import SNAPSHOTS
from grpo_course.core.loading import quiet_loading
from grpo_course.core.runs import load_run_config
from grpo_course.core.sampling import resolve_sampling_dtype
from grpo_course.infra.atomic import write_json_atomic
from grpo_course.infra.errors import OneLineArgumentParser, report
from grpo_course.infra.fingerprint import code_fingerprint, data_hash, file_hash
from grpo_course.infra.hardware import bench_facts
from grpo_course.infra.paths import cache_dir, keyed_cache_file, read_cached
from grpo_course.measure.evaluate import SampledResult, compare_sampled, evaluate_sampled, held_out_rows
from grpo_course.measure.reference import training_rates

SEED = 20250   # the validation samples' seed: the same for every step, so the steps are paired
BATCH_PROMPTS = 4   # problems sampled together (a block's seed is SEED + its first row)
#: the only config fields in which runs compared on one curve may differ (they share the rest and
#: the warm start): the learning rate, the steps, and how often a run logs and keeps its state
MAY_DIFFER = ("learning_rate", "max_steps", "log_every", "save_every", "snapshot_every",
              "report_to", "profile")


def snapshot(run: Path, step: int) -> Path:
    """The adapter folder of ``run`` at GRPO step ``step`` (0: the warm start, ``sft/``)."""
    folder = run / "sft" if step == 0 else run / SNAPSHOTS / str(step)
    if not (folder / "adapter_config.json").is_file():
        kept = sorted(int(p.name) for p in (run / SNAPSHOTS).glob("*") if p.name.isdigit())
        raise ConfigError(f"--steps {step}: {run} has no adapter at that step (kept: 0 and "
                          f"{', '.join(map(str, kept)) or 'none'})")
    return folder


def adapter_settings(folder: Path) -> dict:
    """The adapter's ``adapter_config.json`` with its target modules sorted: PEFT writes them in a
    set's order, which differs between processes, so two copies of one adapter may differ in that
    order alone."""
    config = json.loads((folder / "adapter_config.json").read_text())
    if isinstance(config.get("target_modules"), list):
        config["target_modules"] = sorted(config["target_modules"])
    return config


def validation_samples(folder: Path, rows, samples: int, budget: int) -> SampledResult:
    """The adapter in ``folder`` sampled on the validation ``rows`` (``samples`` answers each at
    temperature 1, seed :data:`SEED`): read from the cache when the same adapter sampled the same
    rows with the same code before, else sampled and stored there (atomically)."""
    key = {"adapter": file_hash(folder / "adapter_model.safetensors"),
           "adapter_config": adapter_settings(folder), "rows": data_hash(rows),
           "start": [r.get("start") for r in rows], "samples": samples, "max_new_tokens": budget,
           "temperature": 1.0, "seed": SEED, "batch_prompts": BATCH_PROMPTS,
           "dtype": str(resolve_sampling_dtype("auto") or "float32"),     # bf16 where native
           "code": code_fingerprint("grpo_course.measure.evaluate")}
    path = keyed_cache_file("validation", key)
    stored = read_cached(path, lambda s: s["key"] == key and isinstance(s["records"], list))
    if stored is not None:
        return SampledResult(samples, stored["records"], stored["seconds"], str(folder))
    result = evaluate_sampled(str(folder), rows, samples, budget, temperature=1.0, seed=SEED,
                              batch_prompts=BATCH_PROMPTS, sampling_dtype="auto")
    write_json_atomic(path, {"key": key, "records": result.records, "seconds": result.seconds})
    return result


def kept_steps(run: Path, steps: list[int]) -> dict[int, Path]:
    """The adapters of ``run`` at those of ``steps`` it kept (step 0, its warm start, always); a
    :class:`ConfigError` naming the steps it kept where it kept none of the later ones asked."""
    folders = {s: snapshot(run, s) for s in steps
               if s == 0 or (run / SNAPSHOTS / str(s) / "adapter_config.json").is_file()}
    if len(folders) == 1 and len(steps) > 1:
        snapshot(run, steps[1])         # raises, naming the steps it kept
    if len(folders) < len(steps):
        print(f"{run}: no adapter at step {', '.join(str(s) for s in steps if s not in folders)}; "
              f"tested at {', '.join(map(str, folders))}", file=sys.stderr)
    return folders


RECIPE_KEYS = ("learning_rate", "max_steps", "lines_left", "prompt_pool", "pool_prompts", "num_generations",
               "per_step_completions", "generation_batch_size", "train_offset")


def run_config(run: Path, val_n: int) -> dict:
    """The run's config, checked: a run folder whose training rows lie past the validation rows."""
    config = load_run_config(run)
    if config is None:
        raise ConfigError(f"--run {str(run)!r} is not a run folder (no config.yaml)")
    if config.get("train_offset", 0) < val_n:
        raise ConfigError(f"--val_n {val_n}: the run {run} trains on train rows from "
                          f"{config.get('train_offset', 0)} on, so validation rows 0-"
                          f"{val_n - 1} would overlap them")
    return config


def curve_points(results: dict[int, SampledResult], samples: int) -> list[dict]:
    """One point a tested step: pass@1 (95 % interval), pass@K, the format rate, the right answers
    per problem (for pairing with another run's at the same step) and the paired change from
    step 0."""
    points = []
    for step, result in sorted(results.items()):
        summary = result.summary()
        point = {"step": step, "pass_at_1": summary["pass_at_1"],
                 f"pass_at_{samples}": summary[f"pass_at_{samples}"],
                 "format_rate": summary["format_rate"], "seconds": summary["seconds"],
                 "right": summary["right"]}
        if step:
            point["vs_step_0"] = compare_sampled(results[0], result)
        points.append(point)
    return points


def main(argv: list[str] | None = None) -> int:
    parser = OneLineArgumentParser(prog="python bench/learning_curve.py", description=__doc__)
    parser.add_argument("--run", action="append", default=None,
                        help="a run folder with snapshots; give it again for runs to compare on "
                             "the same rows, e.g. two learning rates (default: the reference "
                             "run's, $GRPO_COURSE_CACHE/runs/reference)")
    parser.add_argument("--steps", default="0,20,40,60",
                        help="GRPO steps to test, comma-separated (0: the warm start)")
    parser.add_argument("--val_n", type=int, default=256, help="validation problems (train rows)")
    parser.add_argument("--samples", type=int, default=8, help="samples per problem")
    parser.add_argument("--out", default=str(ROOT / "data" / "learning_curve.json"))
    args = parser.parse_args(argv)
    runs = [Path(r) for r in args.run] if args.run else [cache_dir() / "runs" / "reference"]
    try:
        steps = sorted({0, *(int(s) for s in args.steps.split(","))})
    except ValueError:
        parser.error(f"--steps must be whole numbers separated by commas; got {args.steps!r}")
    if args.val_n < 2 or args.samples < 1 or steps[0] < 0:
        parser.error(f"--val_n must be >= 2, --samples >= 1 and --steps >= 0; got {args.val_n}, "
                     f"{args.samples} and {args.steps}")
    try:
        configs = [run_config(run, args.val_n) for run in runs]
        for run, config in zip(runs[1:], configs[1:], strict=True):
            differ = sorted(k for k in {*config, *configs[0]} - set(MAY_DIFFER)
                            if config.get(k) != configs[0].get(k))
            if differ:
                raise ConfigError(f"--run {run}: its recipe differs from {runs[0]}'s in "
                                  f"{', '.join(differ)}; compare runs that differ in the "
                                  f"learning rate and the steps alone")
            if file_hash(snapshot(run, 0) / "adapter_model.safetensors") != \
                    file_hash(snapshot(runs[0], 0) / "adapter_model.safetensors"):
                raise ConfigError(f"--run {run}: its warm start (sft/) is not {runs[0]}'s; "
                                  f"compare runs from the same warm start")
        lrs = [config.get("learning_rate") for config in configs]
        for i, (run, rate) in enumerate(zip(runs, lrs, strict=True)):
            if lrs.index(rate) < i:
                raise ConfigError(f"--run {run}: it trains at {runs[lrs.index(rate)]}'s learning "
                                  f"rate ({rate}); give one run a learning rate")
        folders = [kept_steps(run, steps) for run in runs]
        lines_left = configs[0].get("lines_left")
        budget = START_BUDGETS.get(lines_left, configs[0]["max_completion_length"])
        quiet_loading()
        rows = held_out_rows("train", args.val_n, 0, lines_left=lines_left)
        results = [{s: validation_samples(f, rows, args.samples, budget) for s, f in run_folders.items()}
                   for run_folders in folders]
        rates = [training_rates(run) for run in runs]
    except (ValueError, RuntimeError, OSError) as exc:
        return report(exc)
    curves = [{"run": str(run), "recipe": {k: config.get(k) for k in RECIPE_KEYS},
               "points": curve_points(result, args.samples), "training": rate}
              for run, config, result, rate in zip(runs, configs, results, rates, strict=True)]
    best_curve, best = max(((c, p) for c in curves for p in c["points"]),
                           key=lambda cp: cp[1]["pass_at_1"]["mean"])
    out = {"bench": "learning_curve", **bench_facts(),
           "validation": {"split": "train", "rows": [0, args.val_n], "n": len(rows),
                          "lines_left": lines_left, "samples": args.samples,
                          "max_new_tokens": budget, "temperature": 1.0},
           "curves": curves,
           "best": {"run": best_curve["run"], "learning_rate": best_curve["recipe"]["learning_rate"],
                    "step": best["step"], "pass_at_1": best["pass_at_1"]["mean"]}}
    write_json_atomic(args.out, out, indent=1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
