"""The calculator's warm start on validation problems, adapter by adapter: where the epochs are chosen.

    python bench/sft_curve.py          # the sft-run's kept adapters -> data/calculator_sft_curve.json
    python bench/sft_curve.py --work DIR --val_n 256

``make sft-run`` keeps its adapter every quarter epoch (``sft_steps/<step>`` in its work folder,
``$GRPO_COURSE_CACHE/runs/calculator_sft``; at a constant learning rate each is what a warm-up of
that many steps gives). Each answers the first ``--val_n`` GSM8K **train** rows greedily as whole
problems with the calculator: rows the warm-up never trained on (its ``train_offset`` lies past
them) and which are not the test split, so choosing here leaves the held-out tests honest. Beside
them, the old warm start (210 solutions, no annotations, ``data/runs/reference/sft``) on the same
rows, and McNemar's exact test of each adapter with the calculator against it. ``best`` is the
adapter with the most problems solved with the calculator (the earliest on a tie); it alone is
decoded once more without the calculator (the model writing its own results), which the choice
does not read, so the bench stays within a session. ``twice_the_old`` says whether ``best`` solves
at least twice the old warm start's problems with p < 0.05 (issue 106's bar for a warm start
worth training from). Answers are cached, so the bench resumes where it stopped. Prints one JSON
line.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpo_course.core.data import load_gsm8k
from grpo_course.core.loading import quiet_loading
from grpo_course.core.runs import load_run_config
from grpo_course.core.sft import SFT_SNAPSHOTS
from grpo_course.infra.atomic import write_json_atomic
from grpo_course.infra.errors import OneLineArgumentParser, report
from grpo_course.infra.hardware import bench_facts
from grpo_course.infra.paths import cache_dir, shown_path
from grpo_course.measure.attribution import paired_mcnemar
from grpo_course.measure.calculator_tests import BUDGET, OLD_WARM_START
from grpo_course.measure.evaluate import held_out_rows
from grpo_course.measure.whole_problems import greedy

ALPHA = 0.05


def adapters(work: Path) -> list[tuple[int, Path]]:
    """The kept adapters of the warm-up in ``work`` by step, and its final one (the run's top)."""
    kept = [(int(p.name), p) for p in (work / SFT_SNAPSHOTS).glob("*")
            if p.name.isdigit() and (p / "adapter_config.json").is_file()]
    if (work / "adapter_config.json").is_file():
        kept.append(((load_run_config(work) or {}).get("sft_steps", 0), work))
    return sorted(kept)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineArgumentParser(prog="python bench/sft_curve.py", description=__doc__)
    parser.add_argument("--work", default=None,
                        help="the warm-up's work folder (default $GRPO_COURSE_CACHE/runs/calculator_sft)")
    parser.add_argument("--old", default=str(OLD_WARM_START), help="the old warm start (adapter folder)")
    parser.add_argument("--val_n", type=int, default=512, help="validation problems (train rows 0..N-1)")
    parser.add_argument("--out", default=str(ROOT / "data" / "calculator_sft_curve.json"))
    args = parser.parse_args(argv)
    work = Path(args.work) if args.work else cache_dir() / "runs" / "calculator_sft"
    if not 2 <= args.val_n <= 512:
        parser.error(f"--val_n must be between 2 and 512 (the rows no run trains on); got {args.val_n}")
    if Path(args.out).is_dir() or not Path(args.out).parent.is_dir():
        parser.error(f"--out {args.out!r} must name a file in an existing folder")
    found = adapters(work)
    if not found:
        parser.error(f"--work {str(work)!r} holds no kept adapter: run make sft-run first")
    offset = (load_run_config(work) or {}).get("train_offset", 0)
    if offset < args.val_n:
        parser.error(f"--val_n {args.val_n}: the warm-up trained on train rows from {offset} on, "
                     f"which overlap the validation rows 0-{args.val_n - 1}")
    start = time.perf_counter()
    try:
        quiet_loading()
        config = load_run_config(work) or {}
        rows = held_out_rows("train", args.val_n, 0)
        old = greedy(args.old, rows, max_new_tokens=BUDGET)
        trained = len(load_gsm8k("train", offset=config.get("train_offset", 0)))
        per_epoch = trained / config.get("sft_batch_size", 16)      # steps in one pass of its rows
        points, tools = [], {}
        for step, folder in found:
            tool = tools[step] = greedy(folder, rows, calculator=True, max_new_tokens=BUDGET)
            points.append({"step": step, "epochs": round(step / per_epoch, 2),
                           "accuracy_tool": tool.accuracy, "solved_tool": tool.correct,
                           "format_tool": tool.format_rate,
                           "tool_results_per_answer": tool.summary()["tool_results_per_answer"],
                           "vs_old_tool": paired_mcnemar(old, tool, "correct")})
        best = max(points, key=lambda p: (p["solved_tool"], -p["step"]))
        # The same weights writing every result themselves: what the tool adds (read, not chosen on).
        own = greedy(dict(found)[best["step"]], rows, max_new_tokens=BUDGET)
        best.update({"accuracy_own": own.accuracy, "solved_own": own.correct, "format_own": own.format_rate,
                     "tool_vs_own": paired_mcnemar(own, tools[best["step"]], "correct")})
    except (ValueError, RuntimeError, OSError) as exc:
        return report(exc)
    out = {"bench": "sft_curve", **bench_facts(), "date": time.strftime("%Y-%m-%d"),
           "rows": ["train", 0, args.val_n], "max_new_tokens": BUDGET, "recipe": "recipes/calculator_sft_run.yaml",
           "old_warm_start": {"folder": shown_path(args.old), "accuracy": old.accuracy, "solved": old.correct,
                              "format": old.format_rate},
           "points": points, "best": best["step"],
           "twice_the_old": best["solved_tool"] >= 2 * old.correct
           and best["vs_old_tool"]["p_value"] < ALPHA,
           "minutes": round((time.perf_counter() - start) / 60, 1)}
    write_json_atomic(args.out, out, indent=1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
