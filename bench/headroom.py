"""Where GRPO can learn: the warm start's greedy accuracy, pass@k and mixed groups at each start.

    python bench/headroom.py                     # one JSON line; also written to data/headroom.json
    python bench/headroom.py --slices 512:768 --samples 8 --group_size 4

GRPO's correctness reward teaches only in groups that hold right and wrong answers both, and RL
raises pass@1 toward what the model already reaches in k samples, not beyond (Yue et al. 2025,
arXiv 2504.13837). So before choosing where to train, measure the warm start (the full
profile's shared SFT adapter) at each start of the reverse curriculum (R3, arXiv 2402.05808):
the answer begins with the gold solution's work lines but the last ``lines_left`` (1, 2, or the
whole problem), on each held-out GSM8K test slice ``--slices``. For every slice, start and
stratum (and all strata together) it records

* greedy accuracy, with its Wilson interval;
* pass@k for k = 1, 2, 4, ..., ``--samples`` by the unbiased estimator from ``--samples``
  samples per problem at temperature 1 (pass@1 is the mean sampled accuracy), each with a 95 %
  interval over problems (the first ``--sample_problems`` of each slice; ``n`` of pass@k says how
  many of a stratum were sampled);
* the share of mixed groups of ``--group_size`` completions (the full profile's G).

Each start has its own completion budget (:data:`BUDGETS`), as the training at it has.

``choice`` names the start with the most mixed groups over both slices: the start the profile
trains on (``GRPOConfig.lines_left``). Choosing it here looks only at the warm start, never at a
trained model, so the paired tests of training at that start stay honest.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.recipes import check_slices_and_out
from grpo_course.config import START_BUDGETS, get_profile
from grpo_course.infra.errors import CourseError, OneLineArgumentParser, report
from grpo_course.infra.hardware import bench_facts
from grpo_course.topics.curriculum import start_key

DEFAULT_SLICES = "512:768,768:1024"
#: the starts (lines_left; None: the whole problem) and each one's completion budget: the
#: training budget at a start (config.START_BUDGETS), the whole problem at the held-out evaluation's
BUDGETS = {**START_BUDGETS, None: get_profile("full").eval.max_new_tokens}


def measure(model, tok, test, lines_left, a) -> dict:
    """Greedy and sampled measurements of one start on one slice, by stratum and for all."""
    from grpo_course.core.data import STRATA, gold_starts
    from grpo_course.core.pool import correct_counts
    from grpo_course.measure.evaluate import evaluate_model, pass_at_k_curve
    from grpo_course.measure.stats import wilson_interval

    rows = gold_starts(test, lines_left)
    budget = BUDGETS[lines_left]
    greedy = evaluate_model(model, tok, rows, batch_size=32, max_new_tokens=budget,
                            cache=True, name=f"warm start, {start_key(lines_left)}")
    sampled = rows.select(range(min(a.sample_problems, len(rows))))
    counts = correct_counts(model, tok, sampled, a.samples, budget, temperature=1.0,
                            seed=a.seed, batch_prompts=a.batch_prompts,
                            desc=f"{a.samples} samples, {start_key(lines_left)}")
    out = {"skipped": len(test) - len(rows), "max_new_tokens": budget}
    for stratum in ("all", *STRATA):
        keep = [i for i, r in enumerate(rows) if stratum == "all" or r["difficulty"] == stratum]
        drawn = [counts[i] for i in keep if i < len(counts)]
        if len(drawn) < 2:
            continue
        right = sum(greedy.records[i]["correct"] for i in keep)
        out[stratum] = {       # n: the problems sampled; greedy's n: every problem of the stratum
            "greedy": {"n": len(keep), "accuracy": right / len(keep),
                       "ci95": wilson_interval(right, len(keep)),
                       "format": sum(greedy.records[i]["formatted"] for i in keep) / len(keep)},
            **pass_at_k_curve(drawn, a.samples, group_size=a.group_size)}
    return out


def choose(slices: dict) -> dict:
    """The start whose mixed-group share on every stratum together, averaged over the slices, is
    the largest: where GRPO's correctness reward has the most to teach. (Every stratum: a
    held-out test at the start needs all of a slice's problems for its n.)"""
    scores: dict[str, list[float]] = {}
    for part in slices.values():
        for start, by_stratum in part["starts"].items():
            scores.setdefault(start, []).append(by_stratum["all"]["mixed_groups"]["mean"])
    start, shares = max(scores.items(), key=lambda kv: sum(kv[1]) / len(kv[1]))
    return {"start": start, "stratum": "all", "mixed_groups": sum(shares) / len(shares),
            "rule": "the most mixed groups on every stratum together, averaged over the slices"}


def main(argv: list[str] | None = None) -> int:
    p = OneLineArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--slices", default=DEFAULT_SLICES,
                   help="held-out GSM8K test rows START:END, comma-separated and disjoint")
    p.add_argument("--samples", type=int, default=16, help="samples per problem (the largest k)")
    p.add_argument("--group_size", type=int, default=8, help="G of the mixed-group share")
    p.add_argument("--batch_prompts", type=int, default=8, help="problems sampled at once")
    p.add_argument("--sample_problems", type=int, default=256,
                   help="first problems of each slice that are sampled (greedy: every problem)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(ROOT / "data" / "headroom.json"))
    a = p.parse_args(argv)
    for flag, value, low in (("--samples", a.samples, 2), ("--batch_prompts", a.batch_prompts, 1),
                             ("--group_size", a.group_size, 2), ("--sample_problems", a.sample_problems, 2)):
        if value < low:
            p.error(f"{flag} must be >= {low}; got {value}")
    if a.group_size > a.samples:
        p.error(f"--group_size ({a.group_size}) must be at most --samples ({a.samples})")
    check_slices_and_out(p, a)
    try:
        return _run(a)
    except (CourseError, OSError) as exc:      # data, model, config, a full disk
        return report(exc)


def _run(a) -> int:
    import torch

    from grpo_course.core.data import load_gsm8k
    from grpo_course.core.loading import load_model
    from grpo_course.core.warmstart import warm_start
    from grpo_course.infra.atomic import write_json_atomic

    cfg = get_profile("full").grpo
    warm_dir = warm_start(cfg, load_gsm8k("train"))
    model, tok = load_model(warm_dir)
    model.eval()
    result = {"machine": {**bench_facts(), "threads": torch.get_num_threads(), "date": time.strftime("%Y-%m-%d")},
              "model": "warm start of the full profile", "samples": a.samples,
              "group_size": a.group_size, "temperature": 1.0, "sample_problems": a.sample_problems,
              "slices": {}}
    started = time.perf_counter()
    for lo, hi in a.slices:
        test = load_gsm8k("test", offset=lo, limit=hi - lo)
        if len(test) < hi - lo:
            raise CourseError(f"--slices {lo}:{hi} runs past the {lo + len(test)} GSM8K test rows")
        part = result["slices"][f"{lo}:{hi}"] = {"rows": [lo, hi], "starts": {}}
        for lines_left in BUDGETS:
            part["starts"][start_key(lines_left)] = measure(model, tok, test, lines_left, a)
            print(f"{lo}:{hi} {start_key(lines_left)}: {time.perf_counter() - started:.0f} s",
                  file=sys.stderr)
    result["choice"] = choose(result["slices"])
    result["seconds"] = time.perf_counter() - started
    write_json_atomic(a.out, result, indent=2)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
