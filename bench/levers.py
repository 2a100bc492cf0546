"""What each lever does to GRPO's learning signal, measured from the shared warm start.

    python bench/levers.py                 # one JSON line; also written to data/levers.json
    python bench/levers.py --steps 3 --only plain,dynamic_sampling

Every variant starts from the same SFT-warmed adapter (:func:`grpo_course.core.warmstart.warm_start`
of the full profile) and runs ``--steps`` GRPO steps on GSM8K train prompts. ``plain`` is the
trainer without levers (G = 4, 8 completions per step, random prompt order, one update per
batch, the format + correctness rewards); each other variant adds one lever to it, and
``profile`` is the full profile's recipe. Recorded per variant: the share of steps that trained
on at least one informative group (rewards not all equal), the informative share of all sampled
groups, prompts sampled per step, the mean correctness reward and completion length, the clipped
share of tokens, and the median seconds per step, with the CPU flags and torch version.
No held-out evaluation here: chapter 3 evaluates the profile's recipe on held-out problems.
"""
from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpo_course.infra.errors import CourseError, OneLineArgumentParser, report
from grpo_course.infra.hardware import bench_facts

PLAIN = dict(num_generations=4, per_step_completions=8, prompt_order="random",
             dynamic_sampling=False, num_iterations=1, epsilon_high=None,
             mask_truncated_completions=False,
             reward_weights={"correctness": 1.0, "exact_format": 0.5, "number_extraction": 0.5})
LEVERS = {
    "plain": {},
    "G=8": dict(num_generations=8, per_step_completions=16),
    "easy_first": dict(prompt_order="easy_first"),
    "dynamic_sampling": dict(dynamic_sampling=True),
    "intermediate_results": dict(reward_weights={**PLAIN["reward_weights"],
                                                 "intermediate_results": 1.0}),
    "num_iterations=2": dict(num_iterations=2, epsilon_high=0.28),
    "mask_truncated": dict(mask_truncated_completions=True),
}


def run_variant(name: str, changes: dict, steps: int, warm_dir, train) -> dict:
    from grpo_course.config import get_profile
    from grpo_course.core.loading import load_model
    from grpo_course.core.train import CourseTrainer

    base = get_profile("full").grpo
    cfg = base if name == "profile" else dataclasses.replace(base, **{**PLAIN, **changes})
    model, tok = load_model(cfg.model)
    trainer = CourseTrainer(model, tok, cfg, train).start_from(warm_dir)
    rows = [trainer.step() for _ in range(steps)]
    mean = lambda k: statistics.fmean(r[k] for r in rows)
    groups = cfg.per_step_completions // cfg.num_generations
    return {"changes": {k: v for k, v in changes.items()} if name != "profile" else "full profile",
            "steps": steps, "num_generations": cfg.num_generations,
            "steps_with_signal": statistics.fmean(r["informative_groups"] > 0 for r in rows),
            "trained_group_share": statistics.fmean(r["informative_groups"] / groups for r in rows),
            "informative_share_sampled": 1 - mean("frac_reward_zero_std"),
            "prompts_sampled_per_step": mean("prompts_sampled"),
            # exact counts for the intervals (under dynamic sampling a step samples more groups)
            "groups_sampled": sum(int(r["prompts_sampled"]) for r in rows),
            "informative_groups_sampled": sum(round(r["prompts_sampled"] * (1 - r["frac_reward_zero_std"]))
                                              for r in rows),
            "correctness": mean("rewards/correctness"),
            "completion_length": mean("completion_length"),
            "truncated_share": mean("clipped_ratio"),
            "clip_ratio": mean("clip_ratio/region_mean"),
            "s_per_step": statistics.median(r["step_seconds"] for r in rows)}


def main(argv: list[str] | None = None) -> int:
    p = OneLineArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=5, help="GRPO steps per variant")
    p.add_argument("--only", default=None, help="comma-separated variants (default: all + profile)")
    p.add_argument("--out", default=str(ROOT / "data" / "levers.json"))
    a = p.parse_args(argv)
    names = list(LEVERS) + ["profile"]
    if a.only:
        names = [n.strip() for n in a.only.split(",")]
        unknown = [n for n in names if n not in LEVERS and n != "profile"]
        if unknown:
            p.error(f"unknown variant(s) {unknown}; choose from {', '.join(list(LEVERS) + ['profile'])}")
    if a.steps < 1:
        p.error(f"--steps must be >= 1; got {a.steps}")
    if Path(a.out).is_dir() or not Path(a.out).parent.is_dir():
        p.error(f"--out {a.out!r} must name a file in an existing folder")
    try:
        return _run(a, names)
    except (CourseError, OSError) as exc:      # data, model, config, a full disk
        return report(exc)


def _run(a, names: list[str]) -> int:
    import torch

    from grpo_course.config import get_profile
    from grpo_course.core.data import load_gsm8k
    from grpo_course.core.warmstart import warm_start
    from grpo_course.infra.atomic import write_json_atomic

    train = load_gsm8k("train")
    warm_dir = warm_start(get_profile("full").grpo, train)
    result = {"machine": {**bench_facts(), "threads": torch.get_num_threads()},
              "variants": {}}
    for name in names:
        start = time.perf_counter()
        result["variants"][name] = run_variant(name, LEVERS.get(name, {}), a.steps, warm_dir, train)
        print(f"{name}: {time.perf_counter() - start:.0f} s", file=sys.stderr)
    write_json_atomic(a.out, result, indent=2)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
