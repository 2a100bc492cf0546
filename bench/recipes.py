"""What whole GRPO recipes teach on held-out problems, each given the same minutes of training.

    python bench/recipes.py                      # one JSON line; also written to data/recipes.json
    python bench/recipes.py --minutes 3 --only profile,grounded --slices 512:768,768:1024

Every recipe starts from the shared warm start (:func:`grpo_course.core.warmstart.warm_start` of the
full profile), trains GRPO until its steps have taken ``--minutes`` of wall time, and is evaluated
greedily on each of the disjoint held-out GSM8K test slices ``--slices`` (by default rows
512-1023 and 1024-1318, whole problems: never the first 512 that chapter 3's evaluation reports on.
Page 3c's live run tests the first problems of rows 512 and 768 at its start, and those lie in the
first slice). On every slice each recipe is
compared with the warm start by :func:`grpo_course.measure.attribution.phase_changes` (accuracy, format
and reaching a gold intermediate result by McNemar, step F1 and equations per answer by paired
difference, arithmetic, solved overlap) and held to the bars of
:func:`grpo_course.measure.attribution.farming_checks`: a gain in gold steps that comes with more
equations per answer is the dense reward being farmed, not learned. The recipes:

* ``format_led`` - the course's earlier recipe: ``grpo`` loss, dynamic sampling on the total
  reward, two prompts a round, mu = 2 with clip-higher, the dense reward at weight 1;
* ``correctness_filter`` - DAPO's filter on the correctness reward's tiers, 8 prompts sampled a
  round, the ``dapo`` loss, mu = 2;
* ``profile`` - the full profile's recipe (``recipes/grpo_levers.yaml``): groups kept when their
  completions reach different gold steps, 8 prompts sampled a round and 4 trained, the dense
  ``intermediate_results`` reward (step F1) at weight 2, the ``dapo`` loss, mu = 1;
* ``grounded`` - the profile with ``grounded_steps`` in place of ``intermediate_results`` (as
  reward and as filter): credit only for gold values that a right equation computes, divided by
  the equations written, so repeating or padding steps lowers it.
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

RECIPES = {
    "format_led": dict(loss_type="grpo", dynamic_sampling_reward=None, generation_batch_size=None,
                       per_step_completions=16, num_iterations=2,
                       reward_weights={"correctness": 1.0, "exact_format": 0.5,
                                       "number_extraction": 0.5, "intermediate_results": 1.0}),
    "correctness_filter": dict(dynamic_sampling_reward="correctness", generation_batch_size=64,
                               per_step_completions=16, num_iterations=2,
                               reward_weights={"correctness": 1.0, "exact_format": 0.5,
                                               "number_extraction": 0.5,
                                               "intermediate_results": 1.0}),
    "profile": {},
    "grounded": dict(dynamic_sampling_reward="grounded_steps",
                     reward_weights={"correctness": 1.0, "exact_format": 0.5,
                                     "number_extraction": 0.5, "grounded_steps": 2.0}),
}


def train_for(cfg, warm_dir, train, seconds: float) -> tuple[object, list[dict]]:
    """A trainer started from ``warm_dir`` after as many GRPO steps as fit in ``seconds``."""
    from tqdm.auto import tqdm

    from grpo_course.core.loading import load_model
    from grpo_course.core.train import CourseTrainer

    model, tok = load_model(cfg.model)
    trainer = CourseTrainer(model, tok, cfg, train).start_from(warm_dir)
    rows, spent = [], 0.0
    with tqdm(desc="grpo", unit="step") as bar:
        while spent < seconds:
            rows.append(trainer.step())
            spent += rows[-1]["step_seconds"]
            bar.update(1)
    return trainer, rows


def run_recipe(name: str, a, warm_dir, train, slices: list[dict]) -> dict:
    """Train recipe ``name`` from the warm start, then compare it with the warm start on every
    held-out slice (``slices``: rows, dataset and the warm start's evaluation of them)."""
    from grpo_course.config import get_profile
    from grpo_course.measure.attribution import farming_checks, phase_changes
    from grpo_course.measure.evaluate import evaluate_model

    cfg = dataclasses.replace(get_profile("full").grpo, **RECIPES[name])
    trainer, rows = train_for(cfg, warm_dir, train, 60 * a.minutes)
    trainer.model.eval()
    held_out = {}
    for part in slices:
        after = evaluate_model(trainer.model, trainer.tokenizer, part["test"], batch_size=32,
                               max_new_tokens=a.max_new_tokens, cache=True, name=name)
        held_out[part["name"]] = {
            "accuracy": after.accuracy, "format": after.format_rate,
            "mean_tokens": after.summary()["mean_completion_tokens"],
            "vs_warm_start": phase_changes(part["warm"], after, part["test"])}
        held_out[part["name"]]["checks"] = farming_checks(held_out[part["name"]]["vs_warm_start"])
    return {"changes": RECIPES[name] or "full profile", "steps": len(rows),
            "train_seconds": sum(r["step_seconds"] for r in rows),
            "completions_sampled": sum(r["prompts_sampled"] for r in rows) * cfg.num_generations,
            "correct_completions": sum(r["correct_completions"] for r in rows),
            "trained_groups": sum(r["informative_groups"] for r in rows),
            "completion_length_last5": statistics.fmean(r["completion_length"] for r in rows[-5:]),
            "held_out": held_out}


DEFAULT_SLICES = "512:1024,1024:1319"


def parse_slices(text: str) -> list[tuple[int, int]]:
    """``"512:1024,1024:1319"`` -> [(512, 1024), (1024, 1319)]: disjoint, non-empty row ranges."""
    out = []
    for part in text.split(","):
        lo, sep, hi = part.strip().partition(":")
        if not sep or not lo.isdigit() or not hi.isdigit() or int(hi) <= int(lo):
            raise ValueError(f"--slices part {part.strip()!r} is not START:END with END > START")
        out.append((int(lo), int(hi)))
    out.sort()
    for (_, end), (start, _) in zip(out, out[1:], strict=False):
        if start < end:
            raise ValueError(f"--slices {text!r} overlap: every slice must be disjoint")
    return out


def check_slices_and_out(parser, a) -> None:
    """``a.slices`` parsed into row ranges and ``a.out`` checked; a bad one is one line and exit 2."""
    try:
        a.slices = parse_slices(a.slices)
    except ValueError as exc:
        parser.error(str(exc))
    if Path(a.out).is_dir() or not Path(a.out).parent.is_dir():
        parser.error(f"--out {a.out!r} must name a file in an existing folder")


def main(argv: list[str] | None = None) -> int:
    p = OneLineArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=8.0, help="GRPO wall time per recipe")
    p.add_argument("--only", default=None, help=f"comma-separated recipes (default: {', '.join(RECIPES)})")
    p.add_argument("--slices", default=DEFAULT_SLICES,
                   help="held-out GSM8K test rows START:END, comma-separated and disjoint")
    p.add_argument("--max_new_tokens", type=int, default=200, help="greedy budget of the evaluation")
    p.add_argument("--out", default=str(ROOT / "data" / "recipes.json"))
    a = p.parse_args(argv)
    names = [n.strip() for n in a.only.split(",")] if a.only else list(RECIPES)
    unknown = [n for n in names if n not in RECIPES]
    if unknown:
        p.error(f"unknown recipe(s) {unknown}; choose from {', '.join(RECIPES)}")
    if a.minutes <= 0 or a.max_new_tokens <= 0:
        p.error("--minutes and --max_new_tokens must be > 0")
    check_slices_and_out(p, a)
    try:
        return _run(a, names)
    except (CourseError, OSError) as exc:      # data, model, config, a full disk
        return report(exc)


def _run(a, names: list[str]) -> int:
    import torch

    from grpo_course.config import get_profile
    from grpo_course.core.data import load_gsm8k
    from grpo_course.core.loading import load_model
    from grpo_course.core.warmstart import warm_start
    from grpo_course.infra.atomic import write_json_atomic
    from grpo_course.measure.attribution import chance_baseline
    from grpo_course.measure.evaluate import evaluate_model

    train = load_gsm8k("train")
    slices = []
    for lo, hi in a.slices:
        test = load_gsm8k("test", offset=lo, limit=hi - lo)
        if len(test) < hi - lo:
            raise CourseError(f"--slices {lo}:{hi} runs past the {lo + len(test)} GSM8K test rows")
        slices.append({"name": f"{lo}:{hi}", "rows": [lo, hi], "test": test})
    warm_dir = warm_start(get_profile("full").grpo, train)
    sft_model, tok = load_model(warm_dir)
    for part in slices:
        part["warm"] = evaluate_model(sft_model, tok, part["test"], batch_size=32,
                                      max_new_tokens=a.max_new_tokens, cache=True,
                                      name="warm start")
    del sft_model
    result = {"machine": {**bench_facts(), "threads": torch.get_num_threads()},
              "minutes_per_recipe": a.minutes,
              "slices": {part["name"]: {
                  "rows": part["rows"], "chance": chance_baseline(part["test"]),
                  "warm_start": {"accuracy": part["warm"].accuracy,
                                 "format": part["warm"].format_rate,
                                 "mean_tokens": part["warm"].summary()["mean_completion_tokens"]}}
                  for part in slices},
              "recipes": {}}
    for name in names:
        start = time.perf_counter()
        result["recipes"][name] = run_recipe(name, a, warm_dir, train, slices)
        print(f"{name}: {time.perf_counter() - start:.0f} s", file=sys.stderr)
        write_json_atomic(a.out, result, indent=2)      # after every recipe: a cut run keeps them
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
