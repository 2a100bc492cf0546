"""A shipped GRPO run: train a recipe on this machine, resumably, then ship its folder.

    python bench/shipped_run.py                    # make reference-run: recipes/reference_run.yaml
    python bench/shipped_run.py --recipe recipes/curriculum_run.yaml \
        --warm_start data/runs/reference/sft       # make curriculum-run
    python bench/shipped_run.py --export-only      # export a finished run again
    python bench/shipped_run.py --recipe recipes/calculator_sft_run.yaml \
        --out data/runs/calculator/sft             # make sft-run: a warm-up alone (max_steps 0)
    python bench/shipped_run.py --recipe recipes/calculator_sft_run.yaml \
        --out data/runs/calculator/sft --export-only --sft_step 218   # a kept warm-up adapter
    python bench/shipped_run.py --recipe recipes/calculator_run.yaml \
        --warm_start data/runs/calculator/sft       # make calculator-run

A recipe ``recipes/<name>_run.yaml`` trains with the train CLI (``python -m grpo_course.core.train
--resume``; words this script does not know, such as ``--warm_start``, go to it) in a work folder
outside the checkout (``$GRPO_COURSE_CACHE/runs/<name>``): stopped at any point (Ctrl-C, a closed
laptop), the same command continues from its last checkpoint and ends where an uninterrupted run
would. When the run has all its steps, its folder is exported to ``data/runs/<name>/`` in the
train CLI's layout: the final adapter at the top, the warm start it began from in ``sft/`` (with
its own ``run.json``, ``config.yaml`` and ``metrics.jsonl`` where it is a shipped warm-up) and
the snapshots a recipe's ``snapshot_every`` kept in ``steps/<step>/`` (all with bf16 weights: the
learning curve validates them), ``config.yaml``, ``metrics.jsonl``, ``pool.json`` (the screened
prompts), and ``run.json``: the machine, the hours of training and the commit that trained it.
``--sft_step N`` exports a warm-up alone at its adapter kept at step N (``sft_save_every``): at a
constant learning rate and a shuffled order that does not depend on the number of steps, it is the
warm-up of ``sft_steps: N`` (its metrics and hours those of its first N steps). Prints one JSON line.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpo_course.config import RECIPES_DIR, ConfigError
from grpo_course.core.checkpoints import POOL_FILE, SNAPSHOTS
from grpo_course.core.pool import pool_record
from grpo_course.core.runs import METRICS_FILE, RUN_CONFIG_FILE, read_metrics
from grpo_course.core.sft import SFT_SNAPSHOTS
from grpo_course.infra.atomic import atomic_write, write_json_atomic
from grpo_course.infra.errors import OneLineArgumentParser, report
from grpo_course.infra.hardware import bench_facts
from grpo_course.infra.paths import cache_dir

RECIPE = RECIPES_DIR / "reference_run.yaml"     # the default: the reference run
#: an adapter folder as load_model reads it (the tokenizer is the base model's)
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
STARTED = "started.json"          # in the work folder: the commit and time of the first start
#: a shipped warm-up's own record, kept in the sft/ of a run that starts from it
WARM_START_RECORD = (RUN_CONFIG_FILE, METRICS_FILE, "run.json")


def commit() -> str:
    """This checkout's commit (with ``-dirty`` when tracked files differ from it)."""
    out = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if out.returncode != 0:
        return "unknown"
    head = out.stdout.strip()
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=ROOT).returncode != 0
    return head + ("-dirty" if dirty else "")


def copy_adapter(src: Path, dst: Path) -> None:
    """The adapter folder ``src`` into ``dst``, its floating-point weights stored as bf16."""
    import torch
    from safetensors.torch import load_file, save_file

    dst.mkdir(parents=True, exist_ok=True)
    for name in ADAPTER_FILES:
        if (src / name).is_file() and name != "adapter_model.safetensors":
            shutil.copy2(src / name, dst / name)
    weights = load_file(src / "adapter_model.safetensors")
    save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in weights.items()},
              dst / "adapter_model.safetensors", metadata={"format": "pt"})


def run_name(recipe: Path) -> str:
    """The run's name: its recipe's, less ``_run`` (``reference_run.yaml`` -> ``reference``)."""
    return recipe.stem.removesuffix("_run")


def kept_warm_up(work: Path, step: int) -> tuple[Path, str, list[dict]]:
    """The warm-up adapter kept at ``step`` in ``work``, the config of a warm-up of that many
    steps and its metrics rows: what a run with ``sft_steps: step`` trains (constant rate)."""
    folder = work / SFT_SNAPSHOTS / str(step)
    if not (folder / "adapter_config.json").is_file():
        kept = sorted(int(p.name) for p in (work / SFT_SNAPSHOTS).glob("*") if p.name.isdigit())
        raise ConfigError(f"--sft_step {step}: no adapter kept at that step (kept: {kept or 'none'})")
    config = (work / RUN_CONFIG_FILE).read_text()
    if re.search(r"^max_steps: 0$", config, re.M) is None:
        raise ConfigError(f"--sft_step {step}: {work} is not a warm-up alone (max_steps 0)")
    config = re.sub(r"^sft_steps: \d+$", f"sft_steps: {step}", config, flags=re.M)
    rows = [r for r in read_metrics(work) if r.get("phase") == "sft" and r.get("sft_step", 0) < step]
    return folder, config, rows


def export(work: Path, out: Path, recipe: Path = RECIPE, reproduce: str = "make reference-run",
           warm_start: str | None = None, sft_step: int | None = None) -> dict:
    """Write the finished run in ``work`` to ``out`` (atomically, as one folder); ``sft_step``:
    a warm-up alone, at the adapter it kept at that step."""
    adapter, config, rows = work, (work / RUN_CONFIG_FILE).read_text(), read_metrics(work)
    if sft_step is not None:
        adapter, config, rows = kept_warm_up(work, sft_step)
    grpo = [r for r in rows if r.get("phase") == "grpo"]
    pool = pool_record(json.loads((work / POOL_FILE).read_text())) \
        if (work / POOL_FILE).is_file() else {}
    started = json.loads((work / STARTED).read_text())
    seconds = sum(r.get("step_seconds", 0.0) for r in rows) + pool.get("seconds", 0.0)
    info = {"recipe": f"recipes/{recipe.name}", "commit": started["commit"],
            "exported_at_commit": commit(),     # a resumed run may have ended under a later one
            "started": started["time"], "grpo_steps": len(grpo),
            "sft_steps": sum(r.get("phase") == "sft" for r in rows),
            "hours": round(seconds / 3600, 3), "machine": bench_facts(),
            "reproduce": reproduce}
    if warm_start:          # GRPO began from this adapter: its warm-up's hours are not counted here
        info["warm_start"] = warm_start

    # the snapshots a learning curve validates (bench/learning_curve.py), less the final step's,
    # which is the adapter at the top
    snapshots = sorted((p for p in (work / SNAPSHOTS).glob("*")
                        if p.name.isdigit() and int(p.name) != len(grpo)
                        and (p / "adapter_config.json").is_file()), key=lambda p: int(p.name))
    if snapshots:
        info["snapshots"] = [int(p.name) for p in snapshots]

    def write(tmp: Path) -> None:
        copy_adapter(adapter, tmp)
        if grpo:            # a warm-up alone (max_steps 0) is the adapter at the top
            copy_adapter(work / "sft", tmp / "sft")
            # a shipped warm start keeps its own record beside it (make sft-run's run.json, ...)
            for name in WARM_START_RECORD:
                if warm_start and (Path(warm_start) / name).is_file():
                    shutil.copy2(Path(warm_start) / name, tmp / "sft" / name)
        for folder in snapshots:
            copy_adapter(folder, tmp / SNAPSHOTS / folder.name)
        (tmp / RUN_CONFIG_FILE).write_text(config)
        if sft_step is None:
            shutil.copy2(work / METRICS_FILE, tmp / METRICS_FILE)
        else:               # the first sft_step steps' rows
            (tmp / METRICS_FILE).write_text("".join(json.dumps(r) + "\n" for r in rows))
        if pool:
            (tmp / POOL_FILE).write_text(json.dumps(pool) + "\n")
        (tmp / "run.json").write_text(json.dumps(info, indent=2) + "\n")
    atomic_write(out, write, folder=True)
    return info


def main(argv: list[str] | None = None) -> int:
    parser = OneLineArgumentParser(prog="python bench/shipped_run.py", description=__doc__)
    parser.add_argument("--recipe", default=str(RECIPE),
                        help="the run's recipe, recipes/<name>_run.yaml (default: the reference run's)")
    parser.add_argument("--work", default=None,
                        help="where the run trains (default $GRPO_COURSE_CACHE/runs/<name>)")
    parser.add_argument("--out", default=None,
                        help="where the finished run is exported (default data/runs/<name>)")
    parser.add_argument("--export-only", action="store_true", help="only export a finished run")
    parser.add_argument("--sft_step", type=int, default=None,
                        help="with --export-only: export the warm-up adapter kept at this step")
    args, extra = parser.parse_known_args(argv)     # more words go to the train CLI
    recipe = Path(args.recipe)
    if args.sft_step is not None and not (args.export_only and args.sft_step > 0):
        parser.error(f"--sft_step {args.sft_step}: a positive step, with --export-only")
    if not recipe.is_file():
        parser.error(f"--recipe {args.recipe!r} is not a file (recipes/*_run.yaml)")
    name = run_name(recipe)
    work = Path(args.work) if args.work else cache_dir() / "runs" / name
    out = Path(args.out) if args.out else ROOT / "data" / "runs" / name
    known = {"reference": "make reference-run", "curriculum": "make curriculum-run",
             "calculator_sft": "make sft-run", "calculator": "make calculator-run"}
    reproduce = known.get(name, f"python bench/shipped_run.py --recipe {args.recipe} {' '.join(extra)}".strip())
    warm = next((extra[i + 1] for i, w in enumerate(extra[:-1]) if w in ("--warm_start", "--warm-start")),
                None)
    try:
        if not args.export_only:
            if not (work / STARTED).is_file():
                write_json_atomic(work / STARTED, {"commit": commit(),
                                                   "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
            from grpo_course.core.train import main as train
            code = train(["--profile", "full", "--config", str(recipe), "--out", str(work),
                          "--resume", *extra])
            if code:
                return code
        if not (work / "adapter_model.safetensors").is_file():
            raise ConfigError(f"{work} holds no finished run: run python bench/shipped_run.py "
                              f"--recipe {args.recipe}")
        info = export(work, out, recipe, reproduce, warm, args.sft_step)
    except (ValueError, RuntimeError, OSError) as exc:
        return report(exc)
    print(json.dumps({"out": str(out), **info}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
