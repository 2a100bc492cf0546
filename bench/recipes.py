"""What whole GRPO recipes teach on held-out problems, each given the same minutes of training.

    python bench/recipes.py                      # one JSON line; also written to data/recipes.json
    python bench/recipes.py --minutes 3 --only profile

Every recipe starts from the shared warm start (:func:`grpo_course.warmstart.warm_start` of the
full profile), trains GRPO until its steps have taken ``--minutes`` of wall time, and is evaluated
greedily on held-out GSM8K test problems ``--eval_offset`` .. ``+ --eval_n`` (by default rows
512-1023: not the first 512 that chapter 3 reports, so that choosing a recipe here does not peek
at the problems the chapter tests it on). Each is compared with the warm start on the same
problems by :func:`grpo_course.attribution.phase_changes`: accuracy, format and reaching a gold
intermediate result (McNemar), step F1 (paired difference), arithmetic, and the overlap of the
solved problems. The recipes:

* ``format_led`` - the course's earlier recipe: ``grpo`` loss, dynamic sampling on the total
  reward, two prompts a round, mu = 2 with clip-higher, the dense reward at weight 1;
* ``correctness_filter`` - DAPO's filter on the correctness reward's tiers, 8 prompts sampled a
  round, the ``dapo`` loss, mu = 2;
* ``profile`` - the full profile's recipe (``recipes/grpo_levers.yaml``): groups kept when their
  completions reach different gold steps, 8 prompts sampled a round and 4 trained, the dense
  reward at weight 2, the ``dapo`` loss, mu = 1.
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

from grpo_course.errors import CourseError, OneLineArgumentParser, report  # noqa: E402
from grpo_course.hardware import bench_facts  # noqa: E402

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
}


def train_for(cfg, warm_dir, train, seconds: float) -> tuple[object, list[dict]]:
    """A trainer started from ``warm_dir`` after as many GRPO steps as fit in ``seconds``."""
    from tqdm.auto import tqdm

    from grpo_course.models import load_model
    from grpo_course.train import CourseTrainer

    model, tok = load_model(cfg.model)
    trainer = CourseTrainer(model, tok, cfg, train).start_from(warm_dir)
    rows, spent = [], 0.0
    with tqdm(desc="grpo", unit="step") as bar:
        while spent < seconds:
            rows.append(trainer.step())
            spent += rows[-1]["step_seconds"]
            bar.update(1)
    return trainer, rows


def run_recipe(name: str, a, warm_dir, train, test, sft_result) -> dict:
    from grpo_course.attribution import phase_changes
    from grpo_course.config import get_profile
    from grpo_course.evaluate import evaluate_model

    cfg = dataclasses.replace(get_profile("full").grpo, **RECIPES[name])
    trainer, rows = train_for(cfg, warm_dir, train, 60 * a.minutes)
    trainer.model.eval()
    after = evaluate_model(trainer.model, trainer.tokenizer, test, batch_size=32,
                           max_new_tokens=a.max_new_tokens, cache=True, name=name)
    changes = phase_changes(sft_result, after, test)
    return {"changes": RECIPES[name] or "full profile", "steps": len(rows),
            "train_seconds": sum(r["step_seconds"] for r in rows),
            "completions_sampled": sum(r["prompts_sampled"] for r in rows) * cfg.num_generations,
            "correct_completions": sum(r["correct_completions"] for r in rows),
            "trained_groups": sum(r["informative_groups"] for r in rows),
            "completion_length_last5": statistics.fmean(r["completion_length"] for r in rows[-5:]),
            "held_out": {"accuracy": after.accuracy, "format": after.format_rate,
                         "mean_tokens": after.summary()["mean_completion_tokens"]},
            "vs_warm_start": changes}


def main(argv: list[str] | None = None) -> int:
    p = OneLineArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minutes", type=float, default=9.0, help="GRPO wall time per recipe")
    p.add_argument("--only", default=None, help=f"comma-separated recipes (default: {', '.join(RECIPES)})")
    p.add_argument("--eval_offset", type=int, default=512, help="first held-out test row")
    p.add_argument("--eval_n", type=int, default=512, help="held-out test problems")
    p.add_argument("--max_new_tokens", type=int, default=200, help="greedy budget of the evaluation")
    p.add_argument("--out", default=str(ROOT / "data" / "recipes.json"))
    a = p.parse_args(argv)
    names = [n.strip() for n in a.only.split(",")] if a.only else list(RECIPES)
    unknown = [n for n in names if n not in RECIPES]
    if unknown:
        p.error(f"unknown recipe(s) {unknown}; choose from {', '.join(RECIPES)}")
    if a.minutes <= 0 or a.eval_n <= 0 or a.eval_offset < 0 or a.max_new_tokens <= 0:
        p.error("--minutes, --eval_n and --max_new_tokens must be > 0 and --eval_offset >= 0")
    if Path(a.out).is_dir() or not Path(a.out).parent.is_dir():
        p.error(f"--out {a.out!r} must name a file in an existing folder")
    try:
        return _run(a, names)
    except (CourseError, OSError) as exc:      # data, model, config, a full disk
        return report(exc)


def _run(a, names: list[str]) -> int:
    import torch

    from grpo_course.attribution import chance_baseline
    from grpo_course.atomic import write_json_atomic
    from grpo_course.config import get_profile
    from grpo_course.data import load_gsm8k
    from grpo_course.evaluate import evaluate_model
    from grpo_course.models import load_model
    from grpo_course.warmstart import warm_start

    train = load_gsm8k("train")
    test = load_gsm8k("test", offset=a.eval_offset, limit=a.eval_n)
    if len(test) < a.eval_n:
        raise CourseError(f"--eval_offset {a.eval_offset} + --eval_n {a.eval_n} runs past the "
                          f"{a.eval_offset + len(test)} GSM8K test rows")
    warm_dir = warm_start(get_profile("full").grpo, train)
    sft_model, tok = load_model(warm_dir)
    sft = evaluate_model(sft_model, tok, test, batch_size=32, max_new_tokens=a.max_new_tokens,
                         cache=True, name="warm start")
    del sft_model
    result = {"machine": {**bench_facts(), "threads": torch.get_num_threads()},
              "minutes_per_recipe": a.minutes,
              "held_out_rows": [a.eval_offset, a.eval_offset + a.eval_n],
              "warm_start": {"accuracy": sft.accuracy, "format": sft.format_rate,
                             "mean_tokens": sft.summary()["mean_completion_tokens"]},
              "chance": chance_baseline(test), "recipes": {}}
    for name in names:
        start = time.perf_counter()
        result["recipes"][name] = run_recipe(name, a, warm_dir, train, test, sft)
        print(f"{name}: {time.perf_counter() - start:.0f} s", file=sys.stderr)
        write_json_atomic(a.out, result, indent=2)      # after every recipe: a cut run keeps them
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
