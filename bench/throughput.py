"""Throughput: the course trainer vs TRL's GRPOTrainer on the same work, TRL at its fastest.

    python bench/throughput.py            # one JSON line: ours, trl, ratio, sampling tok/s
    python bench/throughput.py --sweep    # also the cost curve against G and completion length
    python bench/throughput.py --only ours --steps 2
    python bench/throughput.py --train-micro-batch all   # ours: every group in one pass

Each trainer runs in its own subprocess (so peak RSS is its own): one warm-up step,
then ``--steps`` timed steps on the same GSM8K train prompts, with the same model
(bundled, fp32), LoRA, G, completions per step, completion budget and rewards.
``ours`` is the trainer as shipped: with beta = 0 it leaves groups whose rewards are all
equal out of the training pass (their gradient is exactly 0; the update is unchanged).
``ours_all_groups`` runs the training pass on every group, i.e. the same FLOPs as TRL;
the sweep (cost curve) uses that mode. The course trainer runs one group per forward/backward
pass, as chapter 3's full profile does (``--train-micro-batch all``: every group of the step in
one pass, as TRL does; faster, with twice the activations in memory). Each trainer uses its
own precision: the course trainer's ``auto`` (bf16 sampling and training pass where the CPU
has native bf16, fp32 elsewhere). TRL is timed in every precision mode of ``TRL_MODES`` (fp32,
bf16 autocast, bf16 weights + autocast) where the CPU has native bf16 (else in fp32: emulated
bf16 is no candidate for its fastest) without activation checkpointing, then its fastest
mode again with checkpointing (TRL's default); ``trl_best`` is the fastest of them all and
``ratio_vs_best`` compares against it (``trl``, the fp32 run, is kept for the old ratio). The
JSON line records the CPU flags, torch version and every setting. Results are also written to
``data/throughput.json`` (merged with the file's other keys only when they were measured on the
same kind of machine) for chapter 3's plots.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpo_course.infra.atomic import write_json_atomic
from grpo_course.infra.errors import OneLineArgumentParser
from grpo_course.infra.hardware import available_cores, bench_facts, peak_rss_mib

#: ``--train-micro-batch``: the completions each forward/backward pass of the course trainer takes
#: (``GRPOConfig.train_micro_batch``: G, or None for all); the update is the same either way
MICRO_BATCHES = {"group": "G (one group per forward/backward pass)",
                 "all": "all (every group in one forward/backward pass)"}


def bench_config(G: int, completions: int, length: int, micro: str = "group"):
    """The course trainer's settings: its defaults, with one group per forward/backward pass as
    chapter 3's full profile trains (the same update; the activations of G completions in memory
    at a time, not of the whole step's), or with ``micro="all"`` every group in one pass."""
    from grpo_course.config import GRPOConfig
    return GRPOConfig(num_generations=G, per_step_completions=completions,
                      max_completion_length=length, sft_steps=0, max_steps=1, seed=0,
                      train_micro_batch={"group": G, "all": None}[micro])


def summarize(seconds: list[float], tokens: list[int], completions: int) -> dict:
    med = statistics.median(seconds)
    return {"s_per_step": med, "completions_per_s": completions / med,
            "sampled_tokens_per_s": sum(tokens) / sum(seconds), "steps": len(seconds),
            "step_seconds": seconds, "peak_rss_mib": peak_rss_mib()}


def worker_ours(G: int, completions: int, length: int, steps: int, all_groups: bool,
                micro: str = "group") -> dict:
    from grpo_course.core.data import load_gsm8k
    from grpo_course.core.loading import load_model
    from grpo_course.core.train import CourseTrainer

    cfg = bench_config(G, completions, length, micro)
    model, tok = load_model(cfg.model)
    P = cfg.prompts_per_step
    data = load_gsm8k("train", limit=P * (steps + 1))
    # all_groups: the same training pass as TRL, even for groups with no reward variance;
    # else the trainer's default, which leaves them out (the update is the same, see train.py)
    trainer = CourseTrainer(model, tok, cfg, data, skip_zero_variance=not all_groups)
    secs, toks, dropped = [], [], []
    for i in range(steps + 1):
        rows = data.select(range(i * P, (i + 1) * P))
        row = trainer.step({k: rows[k] for k in ("question", "answer")})
        if i:  # step 0 is the warm-up
            secs.append(row["step_seconds"])
            toks.append(row["sampled_tokens"])
            dropped.append(row["frac_groups_dropped"])
    return {**summarize(secs, toks, completions),
            "frac_groups_dropped": sum(dropped) / len(dropped)}


def worker_sampling(sequences: int, length: int, dtype: str = "auto") -> dict:
    """Decode speed at ``sequences`` rows (8 prompts x G), temperature 1, no EOS stop bias,
    with the sampler's weights in ``dtype`` (``auto`` = what the trainer uses). Records the
    setting ``asked`` and the dtype it resolved to (``sampling_dtype``)."""
    from grpo_course.core.data import chat_prompts, load_gsm8k
    from grpo_course.core.loading import load_model
    from grpo_course.core.sampling import sample_completions

    model, tok = load_model()
    prompts = chat_prompts(load_gsm8k("train", limit=8)["question"], tok)
    G = sequences // len(prompts)
    sample_completions(model, tok, prompts, G, 8, seed=0, sampling_dtype=dtype)  # warm-up
    start = time.perf_counter()
    s = sample_completions(model, tok, prompts, G, length, seed=1, sampling_dtype=dtype)
    secs = time.perf_counter() - start
    resolved = str(s.sampling_dtype).removeprefix("torch.")      # what "auto" chose on this CPU
    return {"sequences": sequences, "asked": dtype, "sampling_dtype": resolved,
            "decode_steps": s.completion_ids.shape[1], "seconds": secs,
            "tokens_per_s": float(s.completion_mask.sum()) / secs,
            "slot_tokens_per_s": sequences * s.completion_ids.shape[1] / secs}


#: TRL's precision modes: ``trl.GRPOConfig`` fields, and the dtype of the loaded weights
TRL_MODES = {"fp32": ({"bf16": False}, "float32"),
             "bf16_autocast": ({"bf16": True}, "float32"),
             "bf16_weights": ({"bf16": True}, "bfloat16")}


def worker_trl(G: int, completions: int, length: int, steps: int, mode: str = "fp32",
               checkpointing: bool = False) -> dict:
    import torch
    from transformers import TrainerCallback

    from grpo_course.core.loading import load_model
    from grpo_course.topics.trl_bridge import train_with_trl

    class Timer(TrainerCallback):
        def __init__(self):
            self.seconds, self.t0 = [], 0.0

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.seconds.append(time.perf_counter() - self.t0)

    cfg = replace(bench_config(G, completions, length), max_steps=steps + 1)
    timer = Timer()
    fields, weights = TRL_MODES[mode]
    model, tok = load_model(cfg.model)
    if weights == "bfloat16":
        model = model.to(torch.bfloat16)
    run = train_with_trl(cfg, "/tmp/grpo_bench_trl", model=model, tokenizer=tok, callbacks=[timer],
                         gradient_checkpointing=checkpointing, **fields)
    lengths = run.series("completions/mean_length")
    toks = [int(completions * n) for n in lengths[1:]]
    return {**summarize(timer.seconds[1:], toks, completions), "mode": mode,
            "gradient_checkpointing": checkpointing, "weights": weights, **fields}


def fastest_run(runs: dict[str, dict]) -> str | None:
    """The name of the run with the fewest seconds per step, among those that did not fail."""
    good = {m: r for m, r in runs.items() if "error" not in r}
    return min(good, key=lambda m: good[m]["s_per_step"]) if good else None


def settings(micro: str = "group") -> dict:
    """Every setting of both trainers that the benchmark does not vary."""
    from grpo_course.config import GRPOConfig
    from grpo_course.core.sampling import resolve_sampling_dtype
    from grpo_course.infra.memory import ONEDNN_CACHES
    from grpo_course.topics.trl_bridge import FIXED_TRL_FIELDS

    cfg = GRPOConfig()
    resolved = lambda name: str(resolve_sampling_dtype(name) or "torch.float32")
    train_dtype = resolved(cfg.train_dtype)
    return {"ours": {"sampling_dtype": resolved(cfg.sampling_dtype),
                     "train_dtype": train_dtype, "use_lora": cfg.use_lora,
                     # a bf16 training pass holds the frozen base in bf16 (grpo_course.core.precision)
                     "frozen_base_dtype": train_dtype,
                     "train_micro_batch": MICRO_BATCHES[micro],
                     "lora_r": cfg.lora_r, "loss_type": cfg.loss_type, "beta": cfg.beta,
                     "num_iterations": 1, "learning_rate": cfg.learning_rate},
            "trl": {k: v for k, v in FIXED_TRL_FIELDS.items() if not callable(v)},
            # both workers import grpo_course, which caps oneDNN's kernel caches in their process
            "both": {name: os.environ.get(name) for name in ONEDNN_CACHES}}


def same_machine(a: dict, b: dict) -> bool:
    """Whether two ``measured`` records name the same kind of machine (the date aside)."""
    drop = lambda m: {k: v for k, v in m.items() if k != "date"}
    return drop(a) == drop(b)


def spawn(args: list[str], timeout: float) -> dict:
    """Run this file as a worker in a fresh process; its last stdout line is JSON."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True,
                         env=env, timeout=timeout, cwd=ROOT)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "failed"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = OneLineArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--num-generations", "-G", type=int, default=4)
    p.add_argument("--completions", type=int, default=8, help="completions per step")
    p.add_argument("--length", type=int, default=128, help="max completion tokens")
    p.add_argument("--steps", type=int, default=5, help="timed steps after one warm-up")
    p.add_argument("--trl-modes", default=None,
                   help=f"TRL precision modes to time, comma-separated ({', '.join(TRL_MODES)}); "
                        f"default: all where the CPU has native bf16, else fp32 (emulated bf16 "
                        f"products are several times slower than fp32)")
    p.add_argument("--only", choices=["ours", "trl", "sampling"], default=None)
    p.add_argument("--train-micro-batch", choices=list(MICRO_BATCHES), default="group",
                   help="completions per forward/backward pass of the course trainer: one group "
                        "(G, as chapter 3 trains) or all of the step's (default: group)")
    p.add_argument("--sweep", action="store_true", help="cost curve against G and length")
    p.add_argument("--out", default=str(ROOT / "data" / "throughput.json"))
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--worker", choices=["ours", "trl", "sampling"], help=argparse.SUPPRESS)
    p.add_argument("--dtype", default="auto", help=argparse.SUPPRESS)
    p.add_argument("--all-groups", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--trl-mode", default="fp32", help=argparse.SUPPRESS)
    p.add_argument("--checkpointing", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    for flag, value in (("--num-generations", a.num_generations), ("--completions", a.completions),
                        ("--length", a.length), ("--steps", a.steps), ("--timeout", a.timeout)):
        if value <= 0:
            p.error(f"{flag} must be > 0; got {value}")
    from grpo_course.infra.hardware import native_bf16
    if a.trl_modes is None:
        a.trl_modes = ",".join(TRL_MODES) if native_bf16() else "fp32"
    modes = [m.strip() for m in a.trl_modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in TRL_MODES]
    if bad or not modes:
        p.error(f"--trl-modes {a.trl_modes!r}: choose from {', '.join(TRL_MODES)}")
    if a.completions % a.num_generations:
        p.error(f"--completions {a.completions} is not divisible by --num-generations "
                f"{a.num_generations}")
    if not a.worker and (Path(a.out).is_dir() or not Path(a.out).parent.is_dir()):
        p.error(f"--out {a.out!r} must name a file in an existing folder")
    if a.worker:  # inside a subprocess
        from grpo_course.infra.hardware import set_threads
        set_threads()
        if a.worker == "ours":
            res = worker_ours(a.num_generations, a.completions, a.length, a.steps, a.all_groups,
                              a.train_micro_batch)
        elif a.worker == "trl":
            res = worker_trl(a.num_generations, a.completions, a.length, a.steps, a.trl_mode,
                             a.checkpointing)
        else:
            res = worker_sampling(a.completions, a.length, a.dtype)
        print(json.dumps(res))
        return 0

    base = ["-G", str(a.num_generations), "--completions", str(a.completions),
            "--length", str(a.length), "--steps", str(a.steps)]
    result: dict = {"config": {"num_generations": a.num_generations,
                               "completions_per_step": a.completions,
                               "max_completion_length": a.length, "timed_steps": a.steps,
                               "threads": available_cores(),
                               "train_micro_batch": a.train_micro_batch},
                     "measured": {"date": time.strftime("%Y-%m-%d"), "machine": platform.machine(),
                                  "cpus": os.cpu_count(), **bench_facts()},
                     "settings": settings(a.train_micro_batch)}
    micro = ["--train-micro-batch", a.train_micro_batch]     # the course trainer's workers
    if a.only in (None, "ours"):
        result["ours"] = spawn(["--worker", "ours", *micro, *base], a.timeout)
        result["ours_all_groups"] = spawn(["--worker", "ours", "--all-groups", *micro, *base],
                                          a.timeout)
    if a.only in (None, "trl"):
        runs = {m: spawn(["--worker", "trl", "--trl-mode", m, *base], a.timeout) for m in modes}
        fastest = fastest_run(runs)
        if fastest:   # TRL's own default turns activation checkpointing on: time its fastest mode so
            runs[fastest + "+checkpointing"] = spawn(
                ["--worker", "trl", "--trl-mode", fastest, "--checkpointing", *base], a.timeout)
        result["trl_modes"] = runs
        result["trl"] = runs.get("fp32", next(iter(runs.values())))
        best = fastest_run(runs)
        if best:
            result["trl_best"] = {"mode": best, **{k: runs[best][k] for k in
                                  ("s_per_step", "completions_per_s", "peak_rss_mib")}}
    if "ours" in result and "trl" in result and "error" not in result["ours"] \
            and "error" not in result["trl"]:
        for suffix in ("", "_all_groups"):
            ours = result["ours" + suffix]
            result["ratio" + suffix] = ours["completions_per_s"] / result["trl"]["completions_per_s"]
            result["rss_ratio" + suffix] = ours["peak_rss_mib"] / result["trl"]["peak_rss_mib"]
        if "trl_best" in result:
            best = result["trl_best"]
            result["ratio_vs_best"] = result["ours"]["completions_per_s"] / best["completions_per_s"]
            every = result["ours_all_groups"]
            result["ratio_all_groups_vs_best"] = every["completions_per_s"] / best["completions_per_s"]
            result["rss_ratio_all_groups_vs_best"] = every["peak_rss_mib"] / best["peak_rss_mib"]
    if a.only in (None, "sampling"):
        for key, dtype in (("sampling_32", "auto"), ("sampling_32_fp32", "float32")):
            result[key] = spawn(["--worker", "sampling", "--completions", "32",
                                 "--length", str(a.length), "--dtype", dtype], a.timeout)
    if a.sweep:
        sweep = []
        for G, length in [(2, 128), (4, 128), (8, 128), (4, 32), (4, 64), (4, 256)]:
            res = spawn(["--worker", "ours", "--all-groups", *micro, "-G", str(G), "--completions",
                         str(2 * G), "--length", str(length), "--steps", "2"], a.timeout)
            sweep.append({"num_generations": G, "completions": 2 * G, "length": length, **res})
        result["sweep"] = sweep
    errors = [k for k, v in result.items() if isinstance(v, dict) and "error" in v]
    errors += [f"trl {m}" for m, v in result.get("trl_modes", {}).items() if "error" in v]
    errors += [f"sweep G={r['num_generations']} length={r['length']}"
               for r in result.get("sweep", []) if "error" in r]
    if errors:  # keep the last good file; say what failed
        print(json.dumps(result))
        print(f"benchmark failed ({', '.join(errors)}); {a.out} left unchanged", file=sys.stderr)
        return 1
    out = Path(a.out)
    previous = json.loads(out.read_text()) if out.is_file() else {}
    if not same_machine(previous.get("measured", {}), result["measured"]):
        previous = {}    # keep no part of a run on another kind of machine beside this one
    write_json_atomic(out, {**previous, **result}, indent=2)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
