"""The calculator run's tests on whole problems, fixed before it trained
(:mod:`grpo_course.measure.calculator_tests`), on this machine.

    python bench/calculator_test.py                # data/runs/calculator -> data/calculator_test.json
    python bench/calculator_test.py --run DIR --old data/runs/reference/sft

(a) greedy accuracy on all 1,319 GSM8K test problems, whole, with McNemar's test; (b) sampled
pass@1 with 4 samples at temperature 1 on whole test problems, rows 0-511, paired per problem;
each the run against its own warm start (``sft/``), both with GSM8K's calculator in the sampler.
It passes where both rise with p < 0.05 and the run's format rate is at least 95 % in both.
Beside them: the same without the calculator, pass@K, entropy, the answers' own equations against
the chance baseline, and the credit of each phase (old warm start -> new warm start, without and
with the tool -> GRPO). Every model's answers are cached, so a bench stopped part way (hours on 2
cores) resumes where it stopped. Prints one JSON line.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpo_course.core.loading import quiet_loading
from grpo_course.core.runs import finished_run
from grpo_course.infra.atomic import write_json_atomic
from grpo_course.infra.errors import OneLineArgumentParser, report
from grpo_course.infra.hardware import bench_facts
from grpo_course.measure.calculator_tests import CALCULATOR_RUN, DESIGN, OLD_WARM_START, calculator_tests


def main(argv: list[str] | None = None) -> int:
    parser = OneLineArgumentParser(prog="python bench/calculator_test.py", description=__doc__)
    parser.add_argument("--run", default=str(CALCULATOR_RUN), help="the run tested (with sft/)")
    parser.add_argument("--old", default=str(OLD_WARM_START),
                        help="the warm start the earlier runs began from (an adapter folder)")
    parser.add_argument("--out", default=str(ROOT / "data" / "calculator_test.json"))
    args = parser.parse_args(argv)
    run, old = Path(args.run), Path(args.old)
    if not finished_run(run):
        parser.error(f"--run {args.run!r} is not a finished run folder (an adapter and sft/): "
                     f"train it first (make sft-run, then make calculator-run)")
    if not (old / "adapter_config.json").is_file():
        parser.error(f"--old {args.old!r} holds no adapter")
    if Path(args.out).is_dir() or not Path(args.out).parent.is_dir():
        parser.error(f"--out {args.out!r} must name a file in an existing folder")
    start = time.perf_counter()
    try:
        quiet_loading()
        out = {"bench": "calculator_test", **bench_facts(), "date": time.strftime("%Y-%m-%d"),
               "design": DESIGN, **calculator_tests(run, old)}
    except (ValueError, RuntimeError, OSError) as exc:
        return report(exc)
    out["passed"] = out["verdict"]["passed"]
    out["minutes"] = round((time.perf_counter() - start) / 60, 1)
    write_json_atomic(args.out, out, indent=1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
