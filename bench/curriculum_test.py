"""The curriculum run's tests on whole problems, fixed before it trained
(:mod:`grpo_course.measure.whole_problems`), on this machine.

    python bench/curriculum_test.py                # data/runs/curriculum -> data/curriculum_test.json
    python bench/curriculum_test.py --run DIR --reference data/runs/reference

(a) greedy accuracy on all 1,319 GSM8K test problems, whole, with McNemar's test; (b) sampled
pass@1 with 4 samples at temperature 1 on whole test problems, rows 0-511, paired per problem;
each the run against its own warm start (``sft/``). It passes where both rise with p < 0.05 and
the run's format rate is at least 95 % in both. Beside them: the same tests of the reference run,
one line left (the run against its warm start and against the reference run, on the reference
test's first slice), pass@K, entropy, and what the greedy answers do against the chance baseline.
Every model's answers are cached, so a bench stopped part way (hours on 2 cores) resumes where it
stopped. Prints one JSON line.
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
from grpo_course.measure.whole_problems import (
    CURRICULUM_RUN,
    DESIGN,
    REFERENCE_RUN,
    one_line_left,
    whole_problem_tests,
)


def finished(parser, flag: str, run: Path) -> None:
    """A one-line error unless ``run`` is a finished run folder (an adapter and its ``sft/``)."""
    if not finished_run(run):
        parser.error(f"{flag} {str(run)!r} is not a finished run folder (an adapter and sft/): "
                     f"train it first (make curriculum-run, make reference-run)")


def main(argv: list[str] | None = None) -> int:
    parser = OneLineArgumentParser(prog="python bench/curriculum_test.py", description=__doc__)
    parser.add_argument("--run", default=str(CURRICULUM_RUN), help="the run tested (with sft/)")
    parser.add_argument("--reference", default=str(REFERENCE_RUN),
                        help="the run at one line left it is compared with (with sft/)")
    parser.add_argument("--out", default=str(ROOT / "data" / "curriculum_test.json"))
    args = parser.parse_args(argv)
    run, reference = Path(args.run), Path(args.reference)
    finished(parser, "--run", run)
    finished(parser, "--reference", reference)
    if Path(args.out).is_dir() or not Path(args.out).parent.is_dir():
        parser.error(f"--out {args.out!r} must name a file in an existing folder")
    start = time.perf_counter()
    try:
        quiet_loading()
        out = {"bench": "curriculum_test", **bench_facts(), "date": time.strftime("%Y-%m-%d"), "design": DESIGN,
               "run": whole_problem_tests(run), "reference": whole_problem_tests(reference),
               "one_line_left": one_line_left(run, reference)}
    except (ValueError, RuntimeError, OSError) as exc:
        return report(exc)
    out["passed"] = out["run"]["verdict"]["passed"]
    out["minutes"] = round((time.perf_counter() - start) / 60, 1)
    write_json_atomic(args.out, out, indent=1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
