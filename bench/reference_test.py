"""The reference run's tests, fixed in advance (:mod:`grpo_course.measure.reference`), on this machine.

    python bench/reference_test.py                 # data/runs/reference -> data/reference_test.json
    python bench/reference_test.py --run DIR --no-transfer

The primary test: sampled pass@1 (8 samples a problem, temperature 1) at one line left on test
rows 512-767 and 768-1023, the run against its own warm start (``sft/``), paired over problems;
it passes where both slices rise with p < 0.05 and the run's format rate is at least 95 %.
Beside it: greedy accuracy (McNemar), pass@8 and the policy's entropy on the same problems, and
the greedy transfer to two lines left and to whole problems. Prints one JSON line.
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
from grpo_course.measure.reference import REFERENCE_RUN, SAMPLES, reference_tests


def main(argv: list[str] | None = None) -> int:
    parser = OneLineArgumentParser(prog="python bench/reference_test.py", description=__doc__)
    parser.add_argument("--run", default=str(REFERENCE_RUN), help="the run folder (with sft/)")
    parser.add_argument("--samples", type=int, default=SAMPLES, help="samples per problem")
    parser.add_argument("--no-transfer", action="store_true", help="skip the transfer tests")
    parser.add_argument("--out", default=str(ROOT / "data" / "reference_test.json"))
    args = parser.parse_args(argv)
    run = Path(args.run)
    if not finished_run(run):
        parser.error(f"--run {args.run!r} is not a finished run folder (an adapter and sft/): "
                     f"run make reference-run")
    if args.samples < 2:
        parser.error(f"--samples must be >= 2; got {args.samples}")
    start = time.perf_counter()
    try:
        quiet_loading()
        result = reference_tests(run, samples=args.samples, transfer=not args.no_transfer)
    except (ValueError, RuntimeError, OSError) as exc:
        return report(exc)
    out = {"bench": "reference_test", **bench_facts(), "date": time.strftime("%Y-%m-%d"), **result,
           "minutes": round((time.perf_counter() - start) / 60, 1)}
    write_json_atomic(args.out, out, indent=1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
