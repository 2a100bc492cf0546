"""GRPO's mathematics, in the algorithm's order: advantages, per-token log-probs, the loss.

1. :func:`group_advantages` turns the rewards of G completions per prompt into
   advantages: reward minus the group's mean, divided by a spread.
2. :func:`grpo_course.core.policy.per_token_logps` scores the sampled completion tokens under
   the policy (logits only for completion positions; each prompt is processed once and shared
   by its G completions through the key/value cache): the one step that needs the model.
3. :func:`grpo_loss` is the clipped surrogate with the k3 KL, aggregated exactly as
   TRL's ``GRPOTrainer`` does for ``loss_type`` grpo, bnpo, dr_grpo and dapo.

It imports nothing from the package but the names of its options (``config.LOSS_TYPES`` and
``config.SCALES``, where ``GRPOConfig`` checks them): the functions take and return tensors. The training loop
that calls them lives in :mod:`grpo_course.core.train`; the log-probs, and how a transformers model is
made to give them fast (the shared prompt cache, the chunked head, the attention and bf16 casts of
the training pass), live in :mod:`grpo_course.core.policy`.
"""
from __future__ import annotations

import torch

from grpo_course.config import LOSS_TYPES, SCALES


# ---------------------------------------------------------------- 1. advantages
def group_advantages(rewards: torch.Tensor, group_size: int, scale: str = "group",
                     eps: float = 1e-4) -> torch.Tensor:
    """Advantages of ``rewards`` ([B], G = ``group_size`` contiguous completions per prompt).

    ``A_i = (r_i - mean(group)) / (std + eps)`` where std is the group's (``"group"``),
    the whole batch's (``"batch"``) or no division at all (``"none"``, Dr. GRPO). Stds are
    unbiased (Bessel), as in TRL. A group whose rewards are all equal gets zero advantage.
    """
    rewards = torch.as_tensor(rewards, dtype=torch.float32)
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    grouped = rewards.view(-1, group_size)
    centred = (grouped - grouped.mean(1, keepdim=True)).view(-1)
    if scale == "none":
        return centred
    if scale == "group":
        std = grouped.std(1, keepdim=True).expand_as(grouped).reshape(-1) \
            if group_size > 1 and rewards.numel() else torch.zeros_like(rewards)
    else:
        std = rewards.std().expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
    return centred / (std + eps)


def zero_std_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """[P] True where all G rewards of a prompt are equal (no learning signal)."""
    grouped = torch.as_tensor(rewards, dtype=torch.float32).view(-1, group_size)
    return (grouped.max(1).values - grouped.min(1).values).abs() < 1e-8


# ---------------------------------------------------------------- 2. log-probs
# per_token_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask) scores the
# sampled tokens under the policy; it needs the model's insides, so it lives in
# grpo_course.core.policy, and this module stays the mathematics on tensors alone.


# ---------------------------------------------------------------- 3. the loss
def kl_k3(per_token_logps: torch.Tensor, ref_per_token_logps: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(policy || ref) per token: e^(r-p) - (r-p) - 1 >= 0."""
    d = ref_per_token_logps - per_token_logps
    return torch.exp(d) - d - 1


def clipped_surrogate(per_token_logps: torch.Tensor, old_per_token_logps: torch.Tensor,
                      advantages: torch.Tensor, epsilon_low: float = 0.2,
                      epsilon_high: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate per token, as a loss: ``-min(rho * A, clip(rho) * A)`` with
    ``rho = exp(logp - old_logp)``. ``advantages`` is [B, 1] (one per completion) or [B, T].
    Returns the per-token loss [B, T] and the ratio rho [B, T]."""
    epsilon_high = epsilon_low if epsilon_high is None else epsilon_high
    ratio = torch.exp(per_token_logps - old_per_token_logps)              # [B, T], 1 at first
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    return -torch.min(ratio * advantages, clipped * advantages), ratio


def aggregate_loss(per_token_loss: torch.Tensor, completion_mask: torch.Tensor,
                   loss_type: str = "grpo", max_completion_length: int | None = None,
                   num_items_in_batch: float | None = None) -> torch.Tensor:
    """Average ``per_token_loss`` [B, T] over the real tokens (``completion_mask``) the way
    ``loss_type`` says: this choice is each token's weight, and hence any length bias."""
    mask = completion_mask.to(per_token_loss.dtype)
    if loss_type == "grpo":      # each sequence's token mean, then the mean over sequences
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "bnpo":      # every real token of the batch alike
        return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":   # a constant denominator: no length bias
        if max_completion_length is None:
            raise ValueError("loss_type='dr_grpo' needs max_completion_length")
        return (per_token_loss * mask).sum() / (per_token_loss.size(0) * max_completion_length)
    if loss_type == "dapo":      # every real token of the whole generation batch alike
        n = mask.sum() if num_items_in_batch is None else torch.as_tensor(float(num_items_in_batch))
        return (per_token_loss * mask).sum() / n.clamp(min=1.0)
    raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")


def grpo_loss(per_token_logps: torch.Tensor, old_per_token_logps: torch.Tensor,
              advantages: torch.Tensor, completion_mask: torch.Tensor, *,
              ref_per_token_logps: torch.Tensor | None = None, beta: float = 0.0,
              epsilon_low: float = 0.2, epsilon_high: float | None = None,
              loss_type: str = "grpo", max_completion_length: int | None = None,
              num_items_in_batch: float | None = None) -> tuple[torch.Tensor, dict]:
    """The clipped GRPO surrogate (+ beta * k3 KL), aggregated as TRL 1.16 does.

    Per token: ``-min(rho * A, clip(rho, 1-eps_low, 1+eps_high) * A) + beta * KL`` with
    ``rho = exp(logp - old_logp)``. Aggregations over the real tokens (``mask``):

    * ``grpo``: mean over each sequence's tokens, then mean over sequences;
    * ``bnpo``: sum over all tokens / number of real tokens in the batch;
    * ``dr_grpo``: sum / (B * max_completion_length) — a constant, no length bias;
    * ``dapo``: sum / ``num_items_in_batch`` (real tokens in the whole generation batch;
      defaults to this batch's, which makes it equal to ``bnpo`` for one batch).
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    if per_token_logps.shape != old_per_token_logps.shape or \
            per_token_logps.shape != completion_mask.shape:
        raise ValueError("per_token_logps, old_per_token_logps and completion_mask must share "
                         f"one shape [B, T]; got {tuple(per_token_logps.shape)}, "
                         f"{tuple(old_per_token_logps.shape)}, {tuple(completion_mask.shape)}")
    if beta != 0.0 and ref_per_token_logps is None:
        raise ValueError("beta > 0 needs ref_per_token_logps")
    epsilon_high = epsilon_low if epsilon_high is None else epsilon_high
    mask = completion_mask.to(per_token_logps.dtype)
    adv = advantages[:, None] if advantages.dim() == 1 else advantages

    per_token_loss, ratio = clipped_surrogate(per_token_logps, old_per_token_logps, adv,
                                              epsilon_low, epsilon_high)
    kl = None
    if beta != 0.0:
        kl = kl_k3(per_token_logps, ref_per_token_logps)
        per_token_loss = per_token_loss + beta * kl
    loss = aggregate_loss(per_token_loss, mask, loss_type, max_completion_length,
                          num_items_in_batch)

    with torch.no_grad():
        n_tok = mask.sum().clamp(min=1.0)
        low = ((ratio < 1 - epsilon_low) & (adv < 0)).to(mask.dtype)
        high = ((ratio > 1 + epsilon_high) & (adv > 0)).to(mask.dtype)
        metrics = {
            "clip_ratio/low_mean": float((low * mask).sum() / n_tok),
            "clip_ratio/high_mean": float((high * mask).sum() / n_tok),
            "clip_ratio/region_mean": float((((low + high) > 0).to(mask.dtype) * mask).sum() / n_tok),
            "kl": float((kl * mask).sum() / n_tok) if kl is not None else 0.0,
            "policy_loss": float(loss.detach()),
        }
    return loss, metrics


def dropped_groups_scale(loss_type: str, rows_kept: torch.Tensor,
                         completion_mask: torch.Tensor) -> float:
    """Factor that turns a loss computed on the rows ``rows_kept`` alone into their share of the
    whole batch's loss: the ``grpo`` and ``dr_grpo`` means divide by the number of sequences,
    ``bnpo``/``dapo`` by real tokens. Used for groups left out because they contribute exactly
    0 (advantage 0, beta 0), and for each forward/backward pass of ``train_micro_batch``."""
    if loss_type in ("grpo", "dr_grpo"):
        return float(rows_kept.sum()) / rows_kept.numel()
    return float(completion_mask[rows_kept].sum()) / max(float(completion_mask.sum()), 1.0)


def pass_means(sums: dict[str, float], loss_type: str, rows_kept: torch.Tensor,
               completion_mask: torch.Tensor) -> dict[str, float]:
    """One update's metrics from the sums of its forward/backward passes: token means of the
    clip ratios, KL, entropy and sampler gap, and the policy loss of the kept groups alone."""
    n_tok = max(sums["tokens"], 1.0)
    metrics = {name: sums[name] / n_tok
               for name in ("clip_ratio/low_mean", "clip_ratio/high_mean",
                            "clip_ratio/region_mean", "kl", "entropy", "sampler_logp_gap")}
    kept_share = dropped_groups_scale(loss_type, rows_kept, completion_mask)
    metrics["policy_loss"] = sums["loss"] / kept_share if kept_share else 0.0
    return metrics


def reinforce_loss(per_token_logps: torch.Tensor, advantages: torch.Tensor,
                   completion_mask: torch.Tensor) -> torch.Tensor:
    """REINFORCE with the group baseline, token-mean per sequence: the gradient GRPO's
    ``grpo`` loss has when ``rho = 1`` and ``beta = 0`` (used in the tests and chapter 3)."""
    mask = completion_mask.to(per_token_logps.dtype)
    return (-(advantages[:, None] * per_token_logps * mask).sum(-1)
            / mask.sum(-1).clamp(min=1.0)).mean()
