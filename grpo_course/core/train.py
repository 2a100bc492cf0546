"""The from-scratch GRPO trainer: sample -> reward -> advantages -> loss -> step.

:class:`CourseTrainer` strings together :mod:`~grpo_course.core.sampling`, :mod:`~grpo_course.core.rewards`
and :mod:`~grpo_course.core.grpo` with TRL's names and TRL's data flow. :meth:`~CourseTrainer.step` reads
in the algorithm's order: :meth:`~CourseTrainer._generate_and_score_completions` samples and scores G
completions per prompt (resampling with ``dynamic_sampling``) and returns one ``inputs`` dict with TRL's
keys (completions, masks, advantages, old and reference log-probs); :meth:`~CourseTrainer._prepare_inputs`
splits it into forward/backward passes; ``num_iterations`` updates each run
:meth:`~CourseTrainer.compute_loss` ``(model, inputs)`` per pass; then the log row
(:func:`~grpo_course.core.step_log.step_log`). The CPU devices sit in named helpers beside it. LoRA by
default; no reference model when ``beta == 0`` (else the same weights, adapter off). A sampler at the
policy's precision gives the ``old_per_token_logps``; one in bf16 (TRL's choice when each batch is
used once) leaves the policy's own, detached (ratio 1), and logs the gap as ``sampler_logp_gap``.

The warm-up is :mod:`~grpo_course.core.sft`'s; the loop, pool, checkpoints and resuming are
:mod:`~grpo_course.core.checkpoints`' (mixed in). CLI: ``python -m grpo_course.core.train --out DIR``
saves an adapter folder, the warm-up's in ``DIR/sft`` and the config in ``DIR/config.yaml``
(every :class:`GRPOConfig` field is a flag and a recipe key: :mod:`~grpo_course.core.cli`).
"""
from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from grpo_course.config import ConfigError, GRPOConfig
from grpo_course.core.checkpoints import TrainingRun
from grpo_course.core.cli import CHECKPOINT, parse_train_args, run_folder
from grpo_course.core.data import (
    load_gsm8k,
    mixed_starts,
    prompt_order,
    select_columns,
    start_names,
    start_prompts,
)
from grpo_course.core.grpo import (
    dropped_groups_scale,
    group_advantages,
    grpo_loss,
    pass_means,
    zero_std_groups,
)
from grpo_course.core.loading import load_model, quiet_loading
from grpo_course.core.policy import (
    adapter_disabled,
    add_lora,
    course_attention,
    enable_activation_checkpointing,
    norms_cast_once,
    per_token_logps,
)
from grpo_course.core.precision import frozen_linear_weights_as, hold_frozen_weights_in, reuses_sampler_logps
from grpo_course.core.rewards import correct_mixed_groups, run_rewards, score_groups
from grpo_course.core.runs import trim_metrics
from grpo_course.core.sampling import concat_batches, resolve_sampling_dtype, sample_completions
from grpo_course.core.sft import SFTWarmup
from grpo_course.core.step_log import step_log
from grpo_course.infra.errors import CourseError, report
from grpo_course.infra.memory import low_memory, trim_heap


class CourseTrainer(SFTWarmup, TrainingRun):
    """GRPO on ``train_dataset`` (rows with ``question`` and ``answer``).

    With LoRA, where both the warm-up and the GRPO training pass run in bf16 (``sft_dtype`` and
    ``train_dtype``; by default on CPUs with native bf16), the frozen base weights of ``model``
    are converted to bf16 in place (:func:`grpo_course.core.precision.hold_frozen_weights_in`)."""

    def __init__(self, model, tokenizer, config: GRPOConfig, train_dataset,
                 reward_funcs: dict[str, Callable] | None = None, out_dir=None,
                 penalty: Callable | None = None, timer=None, skip_zero_variance: bool = True,
                 profile: str | None = None):
        if len(train_dataset) == 0:
            raise ConfigError("train_dataset is empty")
        self.config, self.tokenizer, self.dataset = config, tokenizer, train_dataset
        torch.manual_seed(config.seed)
        self.model = add_lora(model, config) if config.use_lora else model
        if self._train_in_bf16() and self._sft_in_bf16():
            # every pass that trains runs under bf16 autocast: hold the frozen base in bf16 for
            # good (half its bytes; TRL's bf16 weights), not in fp32 plus a bf16 copy per step
            hold_frozen_weights_in(self.model, torch.bfloat16)
        if config.gradient_checkpointing:    # only in train mode: the sampler (eval mode) keeps its cache
            enable_activation_checkpointing(self.model)
        self.reward_funcs = run_rewards(config, reward_funcs)
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.penalty, self.timer = penalty, timer
        self.profile = profile      # the profile's name, recorded in out_dir/config.yaml
        # a batch whose advantages are all 0 has no gradient: skip its backward (False: always run it)
        self.skip_zero_variance = skip_zero_variance
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=config.learning_rate,
                                           weight_decay=config.weight_decay)
        self.order = self._shuffled(len(train_dataset))      # the warm-up draws its problems here
        self.grpo_dataset, self.prompt_order = self._grpo_prompts(train_dataset)
        self.global_step = 0        # GRPO steps done
        self.sft_done = 0           # SFT steps done
        self.prompts_used = 0       # GRPO prompts drawn so far (dynamic sampling draws extra)
        self.pool: dict[str, Any] | None = None   # the mixed pool's screening (prompt_pool)
        self.history: list[dict[str, Any]] = []
        self.tracker = None          # a runs.Tracker while train() runs (report_to="trackio")
        self.sft_optimizer = None   # the warm-up's own AdamW (made by sft(), kept in checkpoints)
        self.warm_started = False   # start_from() loaded a warm start instead of the warm-up
        self._mark_step_boundary()

    # ------------------------------------------------------------ helpers
    def _shuffled(self, n: int) -> list[int]:
        """``0 .. n - 1`` shuffled by the config's seed (the same order on every resume)."""
        return torch.randperm(n, generator=torch.Generator().manual_seed(self.config.seed)).tolist()

    def _grpo_prompts(self, train_dataset) -> tuple[Any, list[int]]:
        """GRPO's prompts and their order (``prompt_order``'s rule): the problems, at
        ``lines_left``'s start, in the warm-up's shuffle; or with ``start_mix`` every (problem,
        start) pair (R3's mix, :func:`~grpo_course.core.data.mixed_starts`) in one shuffle."""
        cfg = self.config
        if not cfg.start_mix:
            return train_dataset, prompt_order(train_dataset, self.order, cfg.prompt_order)
        pairs = mixed_starts(train_dataset, cfg.starts, cfg.calculator)
        return pairs, prompt_order(pairs, self._shuffled(len(pairs)), cfg.prompt_order)

    def _phase(self, name: str):
        return self.timer.phase(name) if self.timer is not None else contextlib.nullcontext()

    def _rows(self, index: int, size: int) -> dict[str, list]:
        """Rows ``index * size`` .. of GRPO's prompt order (block ``index`` of ``size``)."""
        order = self.prompt_order
        return select_columns(self.grpo_dataset, [order[(index * size + i) % len(order)] for i in range(size)])

    def _next_rows(self, size: int) -> dict[str, list]:
        """The next ``size`` prompts of GRPO's order (the cursor is saved in checkpoints)."""
        order = self.prompt_order
        ids = [order[(self.prompts_used + i) % len(order)] for i in range(size)]
        self.prompts_used += size
        return select_columns(self.grpo_dataset, ids)

    # ------------------------------------------------------------ GRPO
    def _score(self, batch, rows: dict[str, list]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Weighted reward [B] and each function's rewards of a sampled batch; every dataset
        column reaches the rewards as a keyword list, repeated G times (as in TRL)."""
        return score_groups(batch.completions, rows, self.reward_funcs,
                            self.config.reward_weights, self.config.num_generations)

    def sampling_seed(self, round_: int = 0) -> int:
        """The sampler's seed for this step's ``round_``-th sampling round (a function of the
        config's seed and the step count, so a resumed run samples what an uninterrupted one does)."""
        return self.config.seed * 1_000_003 + self.global_step * 101 + round_

    def prompts(self, rows: dict[str, list]) -> list[str]:
        """The prompt texts of ``rows``, at their ``start`` (``start_mix``) or ``config.lines_left``'s gold start
        (:func:`grpo_course.core.data.start_prompts`)."""
        return start_prompts(rows, self.tokenizer, lines_left=self.config.lines_left,
                             calculator=self.config.calculator)

    def _generate_and_score_completions(self, rows: dict[str, list]) -> dict[str, Any]:
        """Sample G completions per prompt of ``rows``, score them, and return TRL's ``inputs``:
        what :meth:`compute_loss` reads (:meth:`_inputs`). With ``dynamic_sampling`` (DAPO)
        groups whose rewards (``dynamic_sampling_reward``'s, if named) tie are set aside and
        ``prompts_per_round`` more prompts sampled, up to ``max_sampling_rounds`` rounds, until the
        step holds ``prompts_per_step`` informative groups."""
        cfg, G = self.config, self.config.num_generations
        need = len(rows["question"]) if cfg.generation_batch_size is None else cfg.prompts_per_step
        kept, sampled_rewards, sampled_funcs, prompts_sampled, rounds = [], [], [], 0, 0
        lengths, truncated, tools, starts_sampled, starts_kept = [], [], [], [], []
        while True:
            with self._phase("sampling"):
                batch = sample_completions(
                    self.model, self.tokenizer, self.prompts(rows), G,
                    cfg.max_completion_length, cfg.temperature, cfg.top_p,
                    seed=self.sampling_seed(rounds),
                    sampling_dtype=cfg.sampling_dtype, calculator=cfg.calculator)
            with self._phase("rewards"):
                rewards, per_func = self._score(batch, rows)
            rounds += 1
            prompts_sampled += len(rows["question"])
            sampled_rewards.append(rewards)
            sampled_funcs.append(per_func)
            lengths.append(batch.completion_lengths.float())
            truncated.append(batch.truncated.float())
            tools.append((batch.completion_mask - batch.model_mask).sum(1).float())   # the tool's tokens
            names = start_names(rows) if cfg.start_mix else []     # each group's start (R3's mix)
            starts_sampled += names
            if not cfg.dynamic_sampling:
                kept.append((batch, rewards, per_func.get("correctness")))
                starts_kept += names
                break
            signal = rewards if cfg.dynamic_sampling_reward is None else \
                per_func[cfg.dynamic_sampling_reward]
            informative = ~zero_std_groups(signal, G)
            room = need - sum(len(r) // G for _, r, _ in kept)
            take = informative & (informative.cumsum(0) <= room)
            if take.any():
                rows_taken, correct = take.repeat_interleave(G), per_func.get("correctness")
                kept.append((batch.select_groups(take), rewards[rows_taken],
                             None if correct is None else correct[rows_taken]))
                starts_kept += [n for n, t in zip(names, take.tolist(), strict=False) if t]
            if room - int(take.sum()) == 0 or rounds == cfg.max_sampling_rounds:
                break
            rows = self._next_rows(cfg.prompts_per_round)
        if not kept:               # dynamic sampling found no informative group: train on none
            none = torch.zeros(len(rewards) // G, dtype=torch.bool)
            kept.append((batch.select_groups(none), rewards[:0], rewards[:0]))
        all_rewards = torch.cat(sampled_rewards)
        info = {"rewards": all_rewards,
                "per_func": {n: torch.cat([f[n] for f in sampled_funcs]) for n in sampled_funcs[0]},
                "frac_reward_zero_std": float(zero_std_groups(all_rewards, G).float().mean()),
                "sampling_rounds": rounds, "prompts_sampled": prompts_sampled,
                "completion_length": float(torch.cat(lengths).mean()),
                "clipped_ratio": float(torch.cat(truncated).mean())}
        if cfg.calculator:        # tokens the calculator wrote, per sampled completion
            info["tool_tokens"] = float(torch.cat(tools).mean())
        if cfg.start_mix:         # which starts were sampled and trained (R3's mix)
            info["starts"] = {"sampled": starts_sampled, "batch": starts_kept}
        correct = {"correctness": torch.cat([c for _, _, c in kept])} if "correctness" in per_func else {}
        info["trained_correct_mixed"] = correct_mixed_groups(correct, G)   # of the trained groups
        return self._inputs(concat_batches([b for b, _, _ in kept]), torch.cat([r for _, r, _ in kept]), info)

    def _inputs(self, batch, rewards: torch.Tensor, info: dict[str, Any]) -> dict[str, Any]:
        """TRL's ``inputs`` of one step, with TRL's keys: the prompts (one row per group: its G
        completions share it), the completions and the mask the loss counts, the group-relative
        ``advantages``, the sampler's log-probs, and the ``old_per_token_logps`` where they are
        needed (``ref_per_token_logps``: :meth:`_prepare_inputs` fills it). Beside them: the groups the updates
        pass through the model, the batch's ``rewards``, and what every sampled completion
        scored (``sampled``, for the log row)."""
        cfg = self.config
        inputs = {"prompt_ids": batch.prompt_ids, "prompt_mask": batch.prompt_mask,     # [P, Lp]
                  "completion_ids": batch.completion_ids,                            # [P*G, T]
                  "completion_mask": self._loss_mask(batch),
                  # 0 on the calculator's tokens: attended to, but no part of the loss (TRL's key)
                  "tool_mask": batch.tool_mask if batch.tool_mask is not None
                  else torch.ones_like(batch.completion_mask),
                  "advantages": group_advantages(rewards, cfg.num_generations, cfg.scale_rewards),
                  "sampling_per_token_logps": batch.sampling_logps,
                  # the sampler's, where it drew at the training pass's precision; else None:
                  # the first update's forward gives the policy's own (TRL's choice, no extra pass)
                  "old_per_token_logps": batch.sampling_logps
                  if reuses_sampler_logps(self._train_in_bf16(), batch.sampling_dtype) else None,
                  "ref_per_token_logps": None,
                  "groups_to_train": self._groups_to_train(rewards),
                  "rewards": rewards, "sampled": info,
                  "sampled_tokens": int(batch.completion_mask.sum())}
        return inputs

    def _ref_per_token_logps(self, inputs: dict[str, Any]) -> torch.Tensor:
        """The reference policy's log-probs of the completions (beta > 0): the same weights with
        the adapter off, in the training pass's model state, attention and precision (bf16
        autocast where the pass runs in bf16: its frozen weights are bf16 copies), without a
        graph."""
        bf16 = self._train_in_bf16()
        with self._phase("logprobs"), torch.no_grad(), \
                adapter_disabled(self.model), self.training_attention(), \
                torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            return per_token_logps(self.model, inputs["prompt_ids"], inputs["prompt_mask"],
                                   inputs["completion_ids"], inputs["completion_mask"],
                                   self.config.temperature)

    def _train_in_bf16(self) -> bool:
        """Whether the GRPO training pass runs under bf16 autocast (``train_dtype``, resolved)."""
        return resolve_sampling_dtype(self.config.train_dtype) == torch.bfloat16

    def step(self, rows: dict[str, list] | None = None) -> dict[str, Any]:
        """One GRPO step, in the algorithm's order: sample and score G completions per prompt with
        their group-relative advantages (TRL's ``inputs``), ``num_iterations`` updates of the
        clipped loss over them, the log row. ``rows`` (columns ``question``, ``answer``, ...) are
        the step's prompts; by default the next ones in ``prompt_order``."""
        cfg = self.config
        trim_heap()                     # low-memory mode only: what the last step freed goes back
        start = time.perf_counter()
        if rows is None:
            rows = self._next_rows(cfg.prompts_per_round if cfg.dynamic_sampling else cfg.prompts_per_step)
        inputs = self._generate_and_score_completions(rows)     # 1. sample, score, advantages
        sampled = time.perf_counter()
        updates = []
        with self._training_pass():     # one model state (and one set of bf16 copies) for 2 and 3
            micro_batches = self._prepare_inputs(inputs)        # 2. reference, the passes
            for _ in range(cfg.num_iterations):                 # 3. the updates
                updates.append(self._update(inputs, micro_batches))
                trim_heap()             # low-memory mode only: the update's freed blocks go back
        row = step_log(self.global_step, updates, inputs, cfg.num_generations,   # 4. the log row
                       self._train_in_bf16(), start, sampled)
        self.global_step += 1
        return row

    def _loss_mask(self, batch) -> torch.Tensor:
        """The completion tokens the loss counts: all, or with ``mask_truncated_completions`` none
        of a completion cut off at the budget (it teaches nothing either way)."""
        if not self.config.mask_truncated_completions:
            return batch.completion_mask
        return batch.completion_mask * (~batch.truncated).long()[:, None]

    def _groups_to_train(self, rewards: torch.Tensor) -> torch.Tensor:
        """The groups [B / G] the updates pass through the model. With beta = 0 a group whose
        rewards all tie has advantage 0 on every token, so it adds exactly 0 to the loss and its
        gradient: it is left out (``skip_zero_variance``; saves its forward and backward) and
        :func:`~grpo_course.core.grpo.dropped_groups_scale` keeps the update unchanged."""
        zero = zero_std_groups(rewards, self.config.num_generations)
        skip = self.skip_zero_variance and self.config.beta == 0.0
        return ~zero if skip else torch.ones_like(zero)

    @contextlib.contextmanager
    def _training_pass(self):
        """The model in train mode for one step's updates, with bf16 copies of the frozen base
        made once for the step where the pass runs in bf16 and the base is not held in bf16
        already (saves a cast of every frozen weight at each use; not in low-memory mode, where
        autocast casts each weight as it is used and no second copy of the model exists)."""
        self.model.train()
        bf16 = self._train_in_bf16() and not low_memory()
        with frozen_linear_weights_as(self.model, torch.bfloat16 if bf16 else None):
            yield

    def _prepare_inputs(self, inputs: dict[str, Any]) -> list[dict[str, Any]]:
        """With beta > 0, the reference's log-probs into ``inputs`` first (inside the step's
        :meth:`_training_pass`, as TRL's ``_prepare_inputs`` computes them before it splits).
        Then the trained groups of ``inputs`` split into the forward/backward passes of
        ``train_micro_batch // G`` groups each (at least one; all at once by default), as TRL
        splits its generation batch: one pass's activations in memory at a time. Each pass
        holds its rows of the inputs, cut to its longest completion, and ``loss_scale``, its
        share of the whole batch's loss (TRL's ``num_items_in_batch``; groups left out count 0)."""
        G, micro = self.config.num_generations, self.config.train_micro_batch
        if self.config.beta != 0.0 and inputs["groups_to_train"].any():
            inputs["ref_per_token_logps"] = self._ref_per_token_logps(inputs)
        groups = inputs["groups_to_train"].nonzero().squeeze(1)
        per_pass = len(groups) if micro is None else micro // G
        passes = []
        for chunk in (groups.split(max(per_pass, 1)) if len(groups) else []):
            in_pass = torch.zeros_like(inputs["groups_to_train"])
            in_pass[chunk] = True
            rows = in_pass.repeat_interleave(G)
            T = max(int(inputs["completion_mask"][rows].sum(1).max()), 1)
            micro = {key: inputs[key][in_pass] for key in ("prompt_ids", "prompt_mask")}
            micro.update({key: None if inputs[key] is None else inputs[key][rows, :T]
                          for key in ("completion_ids", "completion_mask", "tool_mask",
                                      "sampling_per_token_logps", "old_per_token_logps",
                                      "ref_per_token_logps")})
            micro["advantages"] = inputs["advantages"][rows]
            micro["loss_scale"] = dropped_groups_scale(self.config.loss_type, rows, loss_mask(inputs))
            passes.append(micro)
        return passes

    def _update(self, inputs: dict[str, Any], micro_batches: list[dict[str, Any]]) -> dict[str, Any]:
        """One optimizer update: :meth:`compute_loss` and its backward for each pass of
        ``micro_batches``, the metrics over the passes (``pass_means``), the penalty, the
        optimizer step. Returns its metrics."""
        cfg, bf16 = self.config, self._train_in_bf16()
        metrics: dict[str, Any] = {"kl": 0.0, "entropy": float("nan"), "loss": 0.0,
                                   "clip_ratio/low_mean": 0.0, "clip_ratio/high_mean": 0.0,
                                   "clip_ratio/region_mean": 0.0}
        loss = None
        self._metrics: dict[str, float] = {}      # the passes' token sums (TRL's self._metrics)
        # (the CPU kernels stay on through the backward: activation checkpointing recomputes there)
        with self._phase("forward_backward"), self._cpu_kernels(bf16):
            for micro_batch in micro_batches:
                part = self.compute_loss(self.model, micro_batch)
                if part.requires_grad:
                    part.backward()
            if micro_batches:
                rows_trained = inputs["groups_to_train"].repeat_interleave(cfg.num_generations)
                metrics.update(pass_means(self._metrics, cfg.loss_type, rows_trained,
                                          loss_mask(inputs)))
                loss = torch.tensor(self._metrics["loss"])
            if self.penalty is not None:
                extra = self.penalty(self.model)
                metrics["penalty"] = float(extra.detach())
                loss = extra if loss is None else loss + extra
            if loss is not None:
                if loss.requires_grad:
                    loss.backward()
                metrics["loss"] = float(loss.detach())
        with self._phase("optimizer"):
            metrics["grad_norm"] = self._optimizer_step()
        metrics["skipped"] = loss is None
        return metrics

    def compute_loss(self, model, inputs: dict[str, Any]) -> torch.Tensor:
        """The loss of one forward/backward pass (``inputs``: one of :meth:`_prepare_inputs`),
        weighed by its share of the batch, as TRL's ``compute_loss``; :meth:`_update` runs its
        backward. Adds the pass's token sums to ``self._metrics``: the weighed loss, the real
        tokens, the entropy, the sampler's log-prob gap and the loss's metrics."""
        cfg = self.config
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self._train_in_bf16()):
            logps, entropy = per_token_logps(model, inputs["prompt_ids"], inputs["prompt_mask"],
                                             inputs["completion_ids"], inputs["completion_mask"],
                                             cfg.temperature, return_entropy=True)
        # the tokens the model chose: the calculator's are attended to above, and leave the loss,
        # the KL, the clip and entropy statistics here (TRL: completion_mask * tool_mask)
        mask = loss_mask(inputs)
        if inputs["old_per_token_logps"] is None:
            # the policy before this batch's first update: kept for the batch's later updates
            inputs["old_per_token_logps"] = logps.detach()
        loss, loss_metrics = grpo_loss(
            logps, inputs["old_per_token_logps"], inputs["advantages"], mask,
            ref_per_token_logps=inputs["ref_per_token_logps"],
            beta=cfg.beta, epsilon_low=cfg.epsilon_low, epsilon_high=cfg.epsilon_high,
            loss_type=cfg.loss_type, max_completion_length=cfg.max_completion_length)
        loss = loss * inputs["loss_scale"]
        n_tok = float(mask.sum())
        gap = (logps.detach() - inputs["sampling_per_token_logps"]).abs() * mask
        sums = {"loss": float(loss.detach()), "tokens": n_tok,
                "entropy": float((entropy * mask).sum()), "sampler_logp_gap": float(gap.sum())}
        sums.update({k: v * n_tok for k, v in loss_metrics.items() if k != "policy_loss"})
        for name, value in sums.items():
            self._metrics[name] = self._metrics.get(name, 0.0) + value
        return loss

    def _optimizer_step(self) -> float:
        """Clip the gradient's norm and take one optimizer step (a skipped backward is a zero
        gradient: AdamW still steps, as TRL's does); returns the norm before clipping."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        norm = float(torch.nn.utils.clip_grad_norm_(params, self.config.max_grad_norm))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def training_attention(self):
        """The attention layers of the training pass, for a while: written out
        (:func:`grpo_course.core.policy.course_attention`), except in low-memory mode, where the fused
        kernel keeps less for the backward pass."""
        return course_attention(self.model, not low_memory())

    @contextlib.contextmanager
    def _cpu_kernels(self, bf16: bool):
        """The training pass's CPU kernels: the written-out attention (:meth:`training_attention`)
        and, under bf16, each norm's output cast once (saves a cast at every later use)."""
        with self.training_attention(), norms_cast_once(self.model, bf16):
            yield


def loss_mask(inputs: dict[str, Any]) -> torch.Tensor:
    """The tokens the loss counts: ``completion_mask`` times ``tool_mask`` (where there is one)."""
    tool = inputs.get("tool_mask")
    return inputs["completion_mask"] if tool is None else inputs["completion_mask"] * tool


def main(argv: list[str] | None = None) -> int:
    """``python -m grpo_course.core.train``: options in :mod:`grpo_course.core.cli` (``--help``)."""

    try:
        args, config, profile = parse_train_args(argv)
        out = run_folder(args.out)
        if config.train_offset < 0:
            raise ConfigError(f"train_offset must be >= 0; got {config.train_offset}")
        quiet_loading()
        dataset = load_gsm8k("train", offset=config.train_offset)
        if len(dataset) == 0:
            raise ConfigError(f"no GSM8K train rows from train_offset {config.train_offset} on: "
                              f"the file is empty or train_offset is past its end")
        model, tokenizer = load_model(config.model)
        if args.resume and (out / CHECKPOINT).is_dir():
            trainer = CourseTrainer.resume(out / CHECKPOINT, model, tokenizer, dataset,
                                           config=config, out_dir=out, profile=profile)
        else:
            # a fresh start logs from its first row: a run stopped before its first checkpoint
            # left rows in out/metrics.jsonl that would otherwise count twice
            trim_metrics(out, 0, 0)
            trainer = CourseTrainer(model, tokenizer, config, dataset, out_dir=out,
                                    profile=profile)
            if args.warm_start:
                trainer.start_from(args.warm_start)
    except (ValueError, RuntimeError, OSError) as exc:   # ConfigError, DataError, ModelError
        return report(exc)
    try:
        trainer.train()          # config.max_steps: on --resume too, a flag wins over the checkpoint
        trainer.save_model(out)
        trainer.save_checkpoint(out / CHECKPOINT)
    except (CourseError, OSError) as exc:                # RewardError, a full disk, ...
        return report(exc)
    except KeyboardInterrupt:                            # Ctrl-C: train() saved a checkpoint
        print(f"stopped: continue with --resume --out {out}", file=sys.stderr)
        return 130
    print(json.dumps({"model": str(out), "steps": trainer.global_step,
                      "sft_steps": trainer.sft_done}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
