"""The warm-up's SFT step: one pass over prompt + solution against two (the prompt with a key/value
cache, then the solution), the same rows, interleaved.

    python bench/sft_step.py                # one JSON line; also written to data/sft_step.json
    python bench/sft_step.py --steps 4 --out /tmp/sft.json

Both ways run :meth:`~grpo_course.core.sft.SFTWarmup.sft_step` of the full profile's recipe (its
batch size, precision and AdamW, at learning rate 0 so that every step sees the same weights) on the
warm-up's own first rows. The course takes one pass where a prompt has one completion
(:func:`~grpo_course.core.policy.completion_hidden_states`); the two-pass way is the path it takes
for a group of G > 1 completions. Recorded: the median seconds per step of each, their ratio, the
largest difference of their losses, and the CPU flags, torch version and threads.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpo_course.infra.errors import CourseError, OneLineArgumentParser, report
from grpo_course.infra.hardware import bench_facts


def main(argv: list[str] | None = None) -> int:
    p = OneLineArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=12, help="timed SFT steps per way (after one untimed)")
    p.add_argument("--out", default=str(ROOT / "data" / "sft_step.json"))
    a = p.parse_args(argv)
    if a.steps < 1:
        p.error(f"--steps must be >= 1; got {a.steps}")
    if Path(a.out).is_dir() or not Path(a.out).parent.is_dir():
        p.error(f"--out {a.out!r} must name a file in an existing folder")
    try:
        return _run(a)
    except (CourseError, OSError) as exc:      # data, model, config, a full disk
        return report(exc)


def _run(a) -> int:
    import torch

    from grpo_course.config import get_profile
    from grpo_course.core import policy
    from grpo_course.core.data import load_gsm8k, sft_text
    from grpo_course.core.loading import load_model
    from grpo_course.core.train import CourseTrainer
    from grpo_course.infra.atomic import write_json_atomic
    from grpo_course.infra.hardware import set_threads

    set_threads()
    config = dataclasses.replace(get_profile("full").grpo, max_steps=0)
    model, tokenizer = load_model(config.model)
    trainer = CourseTrainer(model, tokenizer, config, load_gsm8k("train"))
    optimizer = torch.optim.AdamW([q for q in trainer.model.parameters() if q.requires_grad], lr=0.0)

    def two_passes(model_, prompt_ids, prompt_mask, completion_ids, completion_mask):
        return policy._hidden_with_shared_prompt(model_.get_decoder(), prompt_ids,
                                                 prompt_mask.to(completion_mask.dtype),
                                                 completion_ids, completion_mask, 1)

    ways = {"one_pass": contextlib.nullcontext,
            "two_passes": lambda: mock.patch.object(policy, "completion_hidden_states", two_passes)}
    seconds = {w: [] for w in ways}
    losses = {w: [] for w in ways}
    tokens = []
    with trainer.sft_kernels():               # as SFTWarmup.sft runs its steps
        for step in range(a.steps + 1):
            picked = trainer._sft_rows(step)
            rows = {k: [r[k] for r in picked] for k in picked[0]}
            tokens.append(sum(len(tokenizer(text, add_special_tokens=False)["input_ids"])
                              for q, sol in zip(rows["question"], rows["solution"], strict=True)
                              for text in sft_text(q, sol, tokenizer)))
            order = list(ways) if step % 2 else list(ways)[::-1]   # neither way always first
            for way in order:
                with ways[way]():
                    start = time.perf_counter()
                    row = trainer.sft_step(rows, optimizer)
                    elapsed = time.perf_counter() - start
                if step:                       # the first step of each way warms up
                    seconds[way].append(elapsed)
                    losses[way].append(row["loss"])
            print(f"step {step}: " + ", ".join(f"{w} {s[-1]:.2f} s" for w, s in seconds.items() if s),
                  file=sys.stderr)
    med = {w: statistics.median(s) for w, s in seconds.items()}
    result = {"machine": {**bench_facts(), "threads": torch.get_num_threads()},
              "recipe": {"sft_batch_size": config.sft_batch_size, "sft_dtype": config.sft_dtype,
                         "lora_r": config.lora_r, "timed_steps": a.steps,
                         "mean_tokens_per_step": statistics.fmean(tokens[1:])},   # prompts + solutions
              **{f"{w}_s_per_step": med[w] for w in ways},
              "step_seconds": seconds,
              "speedup": med["two_passes"] / med["one_pass"],
              "max_loss_difference": max(abs(x - y) for x, y in zip(losses["one_pass"],
                                                                    losses["two_passes"], strict=True))}
    write_json_atomic(a.out, result, indent=2)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
