"""Learning per minute: a GRPO run's sampled accuracy on validation problems, step by step.

    python bench/learning_curve.py                      # the reference run (make reference-run)
    python bench/learning_curve.py --run DIR --steps 0,20,40 --val_n 128
    python bench/learning_curve.py --run A --run B --steps 0,20,40,60   # e.g. two learning rates
    python bench/learning_curve.py --run REF --run MIX --val_n 512 --whole_n 512   # e.g. two mixes of starts

A run trained with ``snapshot_every`` keeps its adapter every few steps (``DIR/steps/<step>``,
``DIR/sft`` at step 0). Each chosen step's adapter samples ``--samples`` answers (temperature 1)
to each of ``--val_n`` **validation** problems: GSM8K *train* rows ``0 .. val_n - 1`` at the run's
start (one line left for a run that mixes starts), and answers greedily the first ``--whole_n`` of
those rows as whole problems, which is where GSM8K is judged. The run never trains on them (its ``train_offset`` must lie past them; the warm-up and
the pool draw from rows after it) and which are not the test slices, so choosing the steps,
the pool and the learning rate here leaves the held-out tests honest. For each step it records
pass@1 with its 95 % interval, pass@K, the format rate, and the paired difference of pass@1
from step 0 (95 % CI, p). From the run's log it records the seconds per step and the groups with
right and wrong answers trained per minute, and from its pool the share of screened prompts
that were mixed (without the pool) beside the share of sampled groups that were (with it).
With more than one ``--run`` (the same recipe and warm start at other learning rates), each run
is tested at the steps it kept, on the same problems with the same seed, so that its points pair
with another run's by problem (``right``), and ``best`` names the run and step with the highest
mean pass@1 on validation, ``best_whole`` the one with the highest greedy accuracy on whole
problems: where the learning rate, the mix of starts and the steps are chosen. Runs compared so
must share every config field but those in :data:`MAY_DIFFER`, and the warm start's bytes; one
run a learning rate and start. Prints one JSON line and writes ``data/learning_curve.json``. Each step's
samples are kept in the cache (``$GRPO_COURSE_CACHE/validation/``, keyed by the adapter's bytes,
the rows, the sampling and the code of :mod:`grpo_course.measure.evaluate` with all it imports),
so a bench stopped part way resumes at the first step it has not tested, as long as that code is
unchanged.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpo_course.config import START_BUDGETS, ConfigError
from grpo_course.core.checkpoints import SNAPSHOTS
from grpo_course.core.loading import quiet_loading
from grpo_course.core.runs import load_run_config
from grpo_course.infra.atomic import write_json_atomic
from grpo_course.infra.errors import OneLineArgumentParser, report
from grpo_course.infra.fingerprint import file_hash
from grpo_course.infra.hardware import bench_facts
from grpo_course.infra.paths import cache_dir, shown_path
from grpo_course.measure.attribution import paired_mcnemar
from grpo_course.measure.evaluate import SampledResult, compare_sampled, held_out_rows
from grpo_course.measure.paired import cached_samples
from grpo_course.measure.reference import training_rates
from grpo_course.measure.whole_problems import budget as budget_whole
from grpo_course.measure.whole_problems import greedy

SEED = 20250   # the validation samples' seed: the same for every step, so the steps are paired
#: the only config fields in which runs compared on one curve may differ (they share the rest and
#: the warm start): the learning rate, the steps, and how often a run logs and keeps its state
MAY_DIFFER = ("learning_rate", "max_steps", "log_every", "save_every", "snapshot_every",
              "report_to", "profile", "lines_left", "start_mix", "max_completion_length",
              "pool_prompts")    # a mix of starts is chosen with the pool it is screened from


def final_step(run: Path) -> int | None:
    """The step of the finished adapter at the top of ``run`` (a shipped run, ``data/runs/<name>``,
    keeps it there, not among its snapshots): its ``run.json``'s GRPO steps, else its config's
    ``max_steps``; ``None`` where the top holds no adapter."""
    if not (run / "adapter_config.json").is_file():
        return None
    if (run / "run.json").is_file():
        return json.loads((run / "run.json").read_text()).get("grpo_steps")
    return (load_run_config(run) or {}).get("max_steps")


def snapshot(run: Path, step: int) -> Path:
    """The adapter folder of ``run`` at GRPO step ``step`` (0: the warm start, ``sft/``; the last
    step: the finished adapter at the top, where no snapshot holds it)."""
    folder = run / "sft" if step == 0 else run / SNAPSHOTS / str(step)
    if step and not (folder / "adapter_config.json").is_file() and step == final_step(run):
        folder = run
    if not (folder / "adapter_config.json").is_file():
        kept = sorted(int(p.name) for p in (run / SNAPSHOTS).glob("*") if p.name.isdigit())
        raise ConfigError(f"--steps {step}: {run} has no adapter at that step (kept: 0 and "
                          f"{', '.join(map(str, kept)) or 'none'})")
    return folder


def validation_samples(folder: Path, rows, samples: int, budget: int) -> SampledResult:
    """The adapter in ``folder`` sampled on the validation ``rows`` (``samples`` answers each at
    temperature 1, seed :data:`SEED`), cached (:func:`~grpo_course.measure.paired.cached_samples`)."""
    return cached_samples(folder, rows, samples, budget, SEED, kind="validation")


def same_warm_start(a: Path, b: Path) -> bool:
    """Whether two adapter folders hold the same weights: the same bytes, or the same values in
    bf16 (a run started with ``--warm_start`` from a shipped ``sft/``, stored in bf16, holds that
    adapter's values in fp32)."""
    if file_hash(a / "adapter_model.safetensors") == file_hash(b / "adapter_model.safetensors"):
        return True
    import torch
    from safetensors.torch import load_file
    x, y = load_file(a / "adapter_model.safetensors"), load_file(b / "adapter_model.safetensors")
    bf16 = lambda t: t.to(torch.bfloat16) if t.is_floating_point() else t
    return x.keys() == y.keys() and all(torch.equal(bf16(x[k]), bf16(y[k])) for k in x)


def kept_steps(run: Path, steps: list[int]) -> dict[int, Path]:
    """The adapters of ``run`` at those of ``steps`` it kept (step 0, its warm start, always); a
    :class:`ConfigError` naming the steps it kept where it kept none of the later ones asked."""
    folders = {s: snapshot(run, s) for s in steps
               if s == 0 or s == final_step(run) or (run / SNAPSHOTS / str(s) / "adapter_config.json").is_file()}
    if len(folders) == 1 and len(steps) > 1:
        snapshot(run, steps[1])         # raises, naming the steps it kept
    if len(folders) < len(steps):
        print(f"{run}: no adapter at step {', '.join(str(s) for s in steps if s not in folders)}; "
              f"tested at {', '.join(map(str, folders))}", file=sys.stderr)
    return folders


RECIPE_KEYS = ("learning_rate", "max_steps", "lines_left", "start_mix", "prompt_pool", "pool_prompts", "num_generations",
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


def whole_point(result, first) -> dict:
    """A step's greedy answers to whole validation problems: accuracy (95 % interval), format,
    which were right (for pairing), and McNemar's test against step 0's (``first``)."""
    point = {"n": result.n, "accuracy": result.accuracy, "ci95": list(result.accuracy_ci95),
             "format_rate": result.format_rate, "correct": [int(r["correct"]) for r in result.records]}
    if first is not result:
        point["vs_step_0"] = paired_mcnemar(first, result, "correct")
    return point


def curve_points(results: dict[int, SampledResult], samples: int, whole: dict | None = None) -> list[dict]:
    """One point a tested step: pass@1 (95 % interval), pass@K, the format rate, the right answers
    per problem (for pairing with another run's at the same step) and the paired change from
    step 0; with ``whole`` (greedy results by step) the step's accuracy on whole problems."""
    points = []
    for step, result in sorted(results.items()):
        summary = result.summary()
        point = {"step": step, "pass_at_1": summary["pass_at_1"],
                 f"pass_at_{samples}": summary[f"pass_at_{samples}"],
                 "format_rate": summary["format_rate"], "seconds": summary["seconds"],
                 "right": summary["right"]}
        if step:
            point["vs_step_0"] = compare_sampled(results[0], result)
        if whole:
            point["whole_greedy"] = whole_point(whole[step], whole[0])
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
    parser.add_argument("--whole_n", type=int, default=0,
                        help="validation rows also answered greedily as whole problems (0: none)")
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
    if not 0 <= args.whole_n <= args.val_n:
        parser.error(f"--whole_n must be between 0 and --val_n ({args.val_n}); got {args.whole_n}")
    try:
        configs = [run_config(run, args.val_n) for run in runs]
        for run, config in zip(runs[1:], configs[1:], strict=True):
            differ = sorted(k for k in {*config, *configs[0]} - set(MAY_DIFFER)
                            if config.get(k) != configs[0].get(k))
            if differ:
                raise ConfigError(f"--run {run}: its recipe differs from {runs[0]}'s in "
                                  f"{', '.join(differ)}; compare runs that differ in the "
                                  f"learning rate, the start, the pool and the steps alone")
            if not same_warm_start(snapshot(run, 0), snapshot(runs[0], 0)):
                raise ConfigError(f"--run {run}: its warm start (sft/) is not {runs[0]}'s; "
                                  f"compare runs from the same warm start")
        arms = [(c.get("learning_rate"), c.get("lines_left"), tuple(c.get("start_mix") or ()),
                 c.get("pool_prompts")) for c in configs]
        for i, (run, arm) in enumerate(zip(runs, arms, strict=True)):
            if arms.index(arm) < i:
                raise ConfigError(f"--run {run}: it trains at {runs[arms.index(arm)]}'s learning "
                                  f"rate, start and pool ({arm[0]}); give one run each")
        folders = [kept_steps(run, steps) for run in runs]
        # sampled at the runs' one start; at one line left where the first run mixes starts
        lines_left = configs[0].get("lines_left") or (1 if configs[0].get("start_mix") else None)
        budget = START_BUDGETS.get(lines_left, configs[0]["max_completion_length"])
        quiet_loading()
        rows = held_out_rows("train", args.val_n, 0, lines_left=lines_left)
        results = [{s: validation_samples(f, rows, args.samples, budget) for s, f in run_folders.items()}
                   for run_folders in folders]
        whole_rows = held_out_rows("train", args.whole_n, 0) if args.whole_n else None
        wholes = [{s: greedy(f, whole_rows) for s, f in run_folders.items()} if whole_rows else None
                  for run_folders in folders]
        rates = [training_rates(run) for run in runs]
    except (ValueError, RuntimeError, OSError) as exc:
        return report(exc)
    curves = [{"run": shown_path(run), "recipe": {k: config.get(k) for k in RECIPE_KEYS},
               "points": curve_points(result, args.samples, whole), "training": rate}
              for run, config, result, whole, rate in zip(runs, configs, results, wholes, rates, strict=True)]
    best_curve, best = max(((c, p) for c in curves for p in c["points"]),
                           key=lambda cp: cp[1]["pass_at_1"]["mean"])
    out = {"bench": "learning_curve", **bench_facts(), "date": time.strftime("%Y-%m-%d"),
           "validation": {"split": "train", "rows": [0, args.val_n], "n": len(rows),
                          "lines_left": lines_left, "samples": args.samples,
                          "max_new_tokens": budget, "temperature": 1.0},
           "curves": curves,
           "best": {"run": best_curve["run"], "learning_rate": best_curve["recipe"]["learning_rate"],
                    "step": best["step"], "pass_at_1": best["pass_at_1"]["mean"]}}
    if whole_rows:
        out["validation"]["whole_greedy"] = {"split": "train", "rows": [0, args.whole_n],
                                             "n": len(whole_rows), "max_new_tokens": budget_whole()}
        whole_curve, whole_best = max(((c, p) for c in curves for p in c["points"]),
                                      key=lambda cp: cp[1]["whole_greedy"]["accuracy"])
        out["best_whole"] = {"run": whole_curve["run"], "recipe": whole_curve["recipe"],
                             "step": whole_best["step"],
                             "accuracy": whole_best["whole_greedy"]["accuracy"]}
    write_json_atomic(args.out, out, indent=1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
