"""One GRPO step written out against :meth:`CourseTrainer.step`: the same update?

Chapter 3 writes a GRPO step in plain code (``grpo_step``) and then hands over to
:class:`~grpo_course.core.train.CourseTrainer`, the same step made fast. :func:`compare_steps` runs
both from one trainer's state, on the same prompts and sampling seed, and measures how far apart
their losses, gradients and updates are; :func:`assert_same_step` holds them to the chapter's
tolerances. The chapter and ``tests/test_step_check.py`` call these two functions, so the
check a student sees is the check the tests run.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

#: the chapter's tolerances: loss (relative), gradient norm (relative), gradients entry-wise
#: (largest difference over the largest entry) and the two updates' cosine similarity. The
#: written-out step computes its log-probs with one plain forward of prompt and completion, the
#: trainer with a shared prompt cache and its own backward: the same math in fp32 summed in a
#: different order, which moves single gradient entries more than it moves the loss or the norm.
LOSS_RTOL, GRAD_NORM_RTOL, GRAD_GAP, MIN_COSINE = 1e-4, 1e-3, 5e-4, 0.999


def simple_config(config):
    """``config`` as the written-out step runs it: one update per batch, no dynamic sampling, an
    fp32 training pass (the frozen base may still be held in bf16, see
    :mod:`grpo_course.core.precision`)."""
    return dataclasses.replace(config, num_iterations=1, dynamic_sampling=False,
                               train_dtype="float32")


def _trainable(trainer) -> list[torch.Tensor]:
    return [p for p in trainer.model.parameters() if p.requires_grad]


def compare_steps(trainer, step_fn: Callable, rows: dict[str, list],
                  config=None) -> dict[str, Any]:
    """Run ``step_fn(model, tokenizer, optimizer, rows, config, seed)`` (a step written out) and
    ``CourseTrainer.step(rows)`` on two forks of ``trainer`` (its run is left untouched), with the
    same prompts, seed and ``config`` (default: :func:`simple_config` of the trainer's).

    The written-out step runs with the trainer's attention layers (``training_attention``).
    Returns both losses and gradient norms (each the mean over the step's updates), ``grad_gap``
    (the largest entry-wise difference of AdamW's first moments over the largest entry: after one
    update the first moment is 0.1 x the clipped gradient, after several a fixed mix of the
    updates' gradients), ``cosine`` (of the two updates), ``moved`` (the largest change of a
    trained weight), the two clipped gradients of a one-update step (``gradients``, flat) and
    each step's own return value (``hand``, ``trainer``)."""
    config = simple_config(trainer.config) if config is None else config
    by_hand, by_trainer = trainer.fork(), trainer.fork()
    by_hand.config = by_trainer.config = config
    with by_hand.training_attention():
        hand = step_fn(by_hand.model, by_hand.tokenizer, by_hand.optimizer, rows, config,
                       seed=by_hand.sampling_seed())
    theirs = by_trainer.step(rows)

    def flat(t):
        return torch.cat([p.detach().flatten() for p in _trainable(t)]).double()

    def moment(t):
        return torch.cat([t.optimizer.state[p]["exp_avg"].flatten()
                          for p in _trainable(t)]).double()

    start, w_hand, w_trainer = flat(trainer), flat(by_hand), flat(by_trainer)
    g_hand, g_trainer = moment(by_hand), moment(by_trainer)
    u, v = w_hand - start, w_trainer - start
    result = {
        "loss_hand": float(hand["loss"]), "loss_trainer": float(theirs["loss"]),
        "grad_norm_hand": float(hand["grad_norm"]), "grad_norm_trainer": float(theirs["grad_norm"]),
        "grad_gap": relative_gap(g_hand, g_trainer),
        "cosine": float(u @ v / (u.norm() * v.norm()).clamp(min=1e-300)),
        "moved": float(v.abs().max()), "hand": hand, "trainer": theirs,
        "gradients": (g_hand * 10, g_trainer * 10),      # one update: the clipped gradients
    }
    del by_hand, by_trainer
    return result


def relative_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest entry-wise difference of ``a`` and ``b`` over the largest entry of ``b``."""
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


def step_differences(result: dict[str, Any]) -> list[str]:
    """What in ``result`` (:func:`compare_steps`) lies outside the chapter's tolerances; empty
    when the two steps agree. A step that moved no weight (every group tied) is compared by loss
    and gradient norm alone."""
    out = []
    loss, ref = result["loss_hand"], result["loss_trainer"]
    if abs(loss - ref) > LOSS_RTOL * max(1.0, abs(ref)):
        out.append(f"loss {loss:+.6f} by hand vs {ref:+.6f} (tolerance {LOSS_RTOL:g} relative)")
    norm, ref = result["grad_norm_hand"], result["grad_norm_trainer"]
    if abs(norm - ref) > GRAD_NORM_RTOL * max(1.0, ref):
        out.append(f"gradient norm {norm:.6f} by hand vs {ref:.6f} "
                   f"(tolerance {GRAD_NORM_RTOL:g} relative)")
    if result["moved"] > 0:
        if result["grad_gap"] > GRAD_GAP:
            out.append(f"gradients differ by {result['grad_gap']:.1e} of the largest entry "
                       f"(tolerance {GRAD_GAP:g})")
        if result["cosine"] < MIN_COSINE:
            out.append(f"updates have cosine similarity {result['cosine']:.6f} "
                       f"(at least {MIN_COSINE} needed)")
    return out


def assert_same_step(result: dict[str, Any]) -> None:
    """Raise ``AssertionError`` naming every measure of ``result`` outside the tolerances."""
    problems = step_differences(result)
    assert not problems, "the two steps differ: " + "; ".join(problems)
