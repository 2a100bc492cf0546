"""The GRPO step's log row, one dict a step (a line of ``metrics.jsonl``), with TRL's metric names
where TRL has one (``reward``, ``rewards/<name>``, ``frac_reward_zero_std``, ``clip_ratio/...``,
``completion_length``, ``entropy``, ``kl``, ``grad_norm``)."""
from __future__ import annotations

import time
from typing import Any

import torch

from grpo_course.core.grpo import zero_std_groups
from grpo_course.core.rewards import EXACT_REWARD, correct_completions, correct_mixed_groups


def step_log(step: int, updates: list[dict[str, Any]], inputs: dict[str, Any], G: int, bf16: bool,
             start: float, sampled: float, end: float | None = None) -> dict[str, Any]:
    """The row of GRPO step ``step``: the updates' metrics averaged, what every sampled completion
    scored (``inputs["sampled"]``, from ``_generate_and_score_completions``), the training batch's
    ``rewards`` and ``groups_to_train``, and the step's times (``time.perf_counter()`` at its
    start, after sampling and, by default, now)."""
    info, rewards, trained = inputs["sampled"], inputs["rewards"], inputs["groups_to_train"]
    metrics = {k: float(sum(u[k] for u in updates) / len(updates)) for k in updates[0] if k != "skipped"}
    seconds = (time.perf_counter() if end is None else end) - start
    n_tokens = inputs["sampled_tokens"]
    n_groups = info["prompts_sampled"]
    informative = n_groups - round(info["frac_reward_zero_std"] * n_groups)
    all_rewards = info["rewards"]
    return {"phase": "grpo", "step": step, **metrics,
            "reward": float(all_rewards.mean()), "reward_std": float(all_rewards.std()),
            **{f"rewards/{n}": float(r.mean()) for n, r in info["per_func"].items()},
            "frac_reward_zero_std": info["frac_reward_zero_std"],
            "frac_groups_dropped": float((~trained).float().mean()) if len(trained) else 1.0,
            "informative_groups": int((~zero_std_groups(rewards, G)).sum()),
            "sampling_rounds": info["sampling_rounds"], "prompts_sampled": n_groups,
            "prompts_per_informative_group": n_groups / informative if informative else None,
            "completion_length": info["completion_length"],   # every sampled completion
            "clipped_ratio": info["clipped_ratio"],
            **({"tool_tokens": info["tool_tokens"]} if "tool_tokens" in info else {}),   # calculator
            "correct_completions": correct_completions(info["per_func"]),
            "correct_mixed_groups": correct_mixed_groups(info["per_func"], G),   # sampled
            "trained_correct_mixed": info["trained_correct_mixed"],   # of informative_groups
            "train_dtype": "bfloat16" if bf16 else "float32",
            "skipped": updates[0]["skipped"], "step_seconds": seconds,
            "sampling_seconds": sampled - start,
            "sampled_tokens": n_tokens, "tokens_per_s": n_tokens / seconds,
            # the completion tokens the training pass ran over: the trained groups' only
            "trained_tokens": int(inputs["completion_mask"][trained.repeat_interleave(G)].sum()),
            **start_metrics(info, G, trained)}


def start_metrics(info: dict[str, Any], G: int, trained: torch.Tensor) -> dict[str, Any]:
    """With a mix of starts (``info["starts"]``): at each start, the groups sampled
    (``starts/<name>/groups``), the share of their completions exactly right
    (``starts/<name>/correct``) and the groups of the training batch the update trained
    (``starts/<name>/trained``: ``trained`` is the batch's mask)."""
    starts = info.get("starts")
    scores = info["per_func"].get("correctness")
    if not starts or not starts["sampled"]:
        return {}
    out: dict[str, Any] = {}
    right = None if scores is None else (scores >= EXACT_REWARD).float().view(-1, G).mean(1)
    for name in sorted(set(starts["sampled"]), key=lambda n: (n != "whole", n)):
        at = torch.tensor([n == name for n in starts["sampled"]])
        out[f"starts/{name}/groups"] = int(at.sum())
        if right is not None:
            out[f"starts/{name}/correct"] = float(right[at].mean())
        out[f"starts/{name}/trained"] = sum(n == name and t for n, t in
                                            zip(starts["batch"], trained.tolist(), strict=True))
    return out
