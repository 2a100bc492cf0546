"""The from-scratch GRPO trainer: sample -> reward -> advantages -> loss -> step.

:class:`CourseTrainer` strings together :mod:`grpo_course.sampling`,
:mod:`grpo_course.rewards` and :mod:`grpo_course.grpo`. It trains LoRA adapters
(``peft``) by default, keeps no reference model when ``beta == 0`` (with ``beta > 0``
the reference is the same weights with the adapter switched off), reuses the
sampler's log-probs as ``old_per_token_logps`` (one update per batch) when it samples
at the policy's precision, logs one
JSON row per step, and writes checkpoints atomically.

When the sampler decodes in bf16 (``sampling_dtype``, the default on CPUs with native
bf16), its log-probs differ slightly from the fp32 policy's; then, as TRL does when each
batch is used once, ``old_per_token_logps`` is the policy's own log-probs detached (ratio
1, no extra forward pass either), and the gap is logged as ``sampler_logp_gap``.

CLI: ``python -m grpo_course.train --profile full --out DIR`` trains and saves an
adapter folder that :func:`grpo_course.models.load_model` loads, and the adapter at the end of
the warm-up in ``DIR/sft`` (so ``evaluate --model DIR/sft --compare DIR`` tests what GRPO added).
Every :class:`GRPOConfig` field is a flag (``--num_generations 8``), a YAML recipe sets any of
them (``--config recipes/dr_grpo.yaml``; :mod:`grpo_course.cli`), and ``DIR/config.yaml``
keeps the resolved config of the run.

One GRPO step (:meth:`CourseTrainer.step`) samples G completions per prompt and scores them
(:meth:`CourseTrainer.generate_and_score`; with ``dynamic_sampling`` it resamples until the
step holds enough groups with unequal rewards), then runs ``num_iterations`` updates
(:meth:`CourseTrainer._update`) of the clipped loss on that batch.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import random
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from tqdm.auto import tqdm

from .atomic import atomic_write
from .cli import CHECKPOINT, parse_train_args, run_folder
from .config import ConfigError, GRPOConfig
from .data import STRATA, gold_start, load_gsm8k, sft_text, start_prompts
from .errors import CourseError, RewardError, report
from .grpo import (
    course_attention,
    group_advantages,
    grpo_loss,
    norms_cast_once,
    per_token_logps,
    zero_std_groups,
)
from .memory import low_memory, trim_heap
from .models import load_model, quiet_loading
from .precision import frozen_linear_weights_as, hold_frozen_weights_in
from .rewards import EXACT_REWARD, REWARD_FUNCTIONS, weighted_sum
from .runs import METRICS_FILE, Tracker, save_run_config
from .sampling import concat_batches, resolve_sampling_dtype, sample_completions

PHASES = ("sampling", "rewards", "logprobs", "forward_backward", "optimizer")
SFT_MAX_TOKENS = 256
SFT_SORT_WINDOW = 8      # SFT steps whose rows are sorted by length together (less padding)


def _default_rewards(weights: dict[str, float]) -> dict[str, Callable]:
    unknown = [n for n in weights if n not in REWARD_FUNCTIONS]
    if unknown:
        raise ConfigError(f"reward_weights names unknown reward(s) {unknown}; "
                          f"choose from {', '.join(REWARD_FUNCTIONS)}")
    return {n: REWARD_FUNCTIONS[n] for n in weights}


def checked_rewards(name: str, values, expected: int) -> torch.Tensor:
    """Reward function ``name``'s output as a float64 tensor (the values as given), or
    :class:`RewardError` naming the function when it is not ``expected`` finite numbers (one
    per completion)."""
    try:
        rewards = torch.as_tensor(values, dtype=torch.float64).reshape(-1)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise RewardError(f"reward function {name!r} returned {type(values).__name__}, not "
                          f"{expected} numbers ({exc})") from None
    if rewards.numel() != expected:
        raise RewardError(f"reward function {name!r} returned {rewards.numel()} rewards for "
                          f"{expected} completions")
    bad = (~torch.isfinite(rewards)).nonzero().flatten().tolist()
    if bad:
        raise RewardError(f"reward function {name!r} returned {rewards[bad[0]].item()} for "
                          f"completion {bad[0]} (rewards must be finite numbers)")
    return rewards


def score_groups(completions: list, rows: dict[str, list], reward_funcs: dict[str, Callable],
                 weights: dict[str, float], G: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Weighted reward [B] and each function's rewards of ``completions`` (G per prompt of
    ``rows``); every column but ``question`` reaches the rewards as a keyword list, repeated G
    times (as in TRL). A function left out of ``weights`` is scored with weight 0.

    The weighted sum is :func:`grpo_course.rewards.weighted_sum`'s, of the values as the
    functions returned them, rounded to float32 once: the very rewards of a step written out
    with ``score_completions`` and ``weighted_sum`` (chapter 3). One float32 ulp apart, the two
    steps' advantages differ in the last float32 place, and a frozen base held in bf16 turns that
    into different bf16 roundings and visibly different gradients."""
    columns = {k: [v for v in values for _ in range(G)] for k, values in rows.items()
               if k != "question"}
    per_func = {n: checked_rewards(n, fn(completions, **columns), len(completions))
                for n, fn in reward_funcs.items()}
    total = weighted_sum({n: r.tolist() for n, r in per_func.items()}, weights)
    return (torch.tensor(total, dtype=torch.float32),
            {n: r.float() for n, r in per_func.items()})


def correct_completions(per_func: dict[str, torch.Tensor]) -> int | None:
    """How many sampled completions the ``correctness`` reward scored as exactly right (its top
    tier), or ``None`` when the run has no ``correctness`` reward."""
    scores = per_func.get("correctness")
    return None if scores is None else int((scores >= EXACT_REWARD).sum())


def dropped_groups_scale(loss_type: str, rows_kept: torch.Tensor,
                         completion_mask: torch.Tensor) -> float:
    """Factor that turns a loss computed on the rows ``rows_kept`` alone into their share of the
    whole batch's loss: the ``grpo`` and ``dr_grpo`` means divide by the number of sequences,
    ``bnpo``/``dapo`` by real tokens. Used for groups left out because they contribute exactly
    0 (advantage 0, beta 0), and for each forward/backward pass of ``train_micro_batch``."""
    if loss_type in ("grpo", "dr_grpo"):
        return float(rows_kept.sum()) / rows_kept.numel()
    return float(completion_mask[rows_kept].sum()) / max(float(completion_mask.sum()), 1.0)


def add_lora(model, config: GRPOConfig):
    """Wrap ``model`` with fresh LoRA adapters (a no-op for a model that has them)."""
    from peft import LoraConfig, get_peft_model
    if hasattr(model, "peft_config"):
        return model
    lora = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha,
                      lora_dropout=config.lora_dropout,
                      target_modules=list(config.lora_target_modules), task_type="CAUSAL_LM")
    with warnings.catch_warnings():     # peft 0.21 still asks transformers 5 by the old name
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*",
                                category=FutureWarning)
        return get_peft_model(model, lora)


#: the warm start's trainable (LoRA) weights, saved beside its adapter
STATE_FILE = "trainable.pt"


def load_adapter_state(model, folder) -> None:
    """Set ``model``'s trainable (LoRA) weights to those saved in the warm start ``folder``."""
    state = torch.load(Path(folder) / STATE_FILE, weights_only=True)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in state.items():
            params[name].copy_(value)


def enable_activation_checkpointing(model) -> None:
    """Recompute each layer's activations in the backward pass instead of keeping them (the
    binder profile's ``gradient_checkpointing``); it acts in train mode only, so the sampler
    (eval mode) keeps its cache."""
    if hasattr(model, "activation_checkpointing_enable"):     # transformers 5's name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


@contextlib.contextmanager
def activation_checkpointing(model, on: bool = True):
    """Activation checkpointing on ``model`` for a while (in train mode, where it acts), as it was
    after: chapter 3's loop recomputes each layer's activations in its backward pass instead of
    keeping them, and hands the policy back to the fast trainer as it found it."""
    was_on, was_training = bool(getattr(model, "is_gradient_checkpointing", False)), model.training
    if on and not was_on:
        enable_activation_checkpointing(model)
        model.train()
    try:
        yield model
    finally:
        if on and not was_on:
            if hasattr(model, "activation_checkpointing_disable"):     # transformers 5's name
                model.activation_checkpointing_disable()
            else:
                model.gradient_checkpointing_disable()
            model.train(was_training)


def _atomic_dir(path: Path, write: Callable[[Path], None]) -> Path:
    """Run ``write(tmp)`` into a temporary folder beside ``path``, then rename it into place
    (:func:`grpo_course.atomic.atomic_write`: the old folder survives any failure)."""
    return atomic_write(path, write, folder=True)


class CourseTrainer:
    """GRPO on ``train_dataset`` (rows with ``question`` and ``answer``).

    With LoRA, where both the warm-up and the GRPO training pass run in bf16 (``sft_dtype`` and
    ``train_dtype``; by default on CPUs with native bf16), the frozen base weights of ``model``
    are converted to bf16 in place (:func:`grpo_course.precision.hold_frozen_weights_in`)."""

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
        self.reward_funcs = dict(reward_funcs or _default_rewards(config.reward_weights))
        name = config.dynamic_sampling_reward
        if name is not None and name not in self.reward_funcs:   # scored for the filter, weight 0
            if name not in REWARD_FUNCTIONS:
                raise ConfigError(f"dynamic_sampling_reward {name!r} is neither one of the run's "
                                  f"rewards ({', '.join(self.reward_funcs)}) nor a course reward "
                                  f"({', '.join(REWARD_FUNCTIONS)}); or none")
            self.reward_funcs[name] = REWARD_FUNCTIONS[name]
        missing = [n for n in config.reward_weights if n not in self.reward_funcs]
        if missing:
            raise ConfigError(f"reward_weights names {missing}, absent from reward_funcs")
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.penalty, self.timer = penalty, timer
        self.profile = profile      # the profile's name, recorded in out_dir/config.yaml
        # a batch whose advantages are all 0 has no gradient: skip its backward (False: always run it)
        self.skip_zero_variance = skip_zero_variance
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=config.learning_rate,
                                           weight_decay=config.weight_decay)
        self.order = torch.randperm(len(train_dataset),
                                    generator=torch.Generator().manual_seed(config.seed)).tolist()
        self.prompt_order = self._prompt_order()
        self.global_step = 0        # GRPO steps done
        self.sft_done = 0           # SFT steps done
        self.prompts_used = 0       # GRPO prompts drawn so far (dynamic sampling draws extra)
        self.history: list[dict[str, Any]] = []
        self.tracker = None          # a runs.Tracker while train() runs (report_to="trackio")
        self.sft_optimizer = None   # the warm-up's own AdamW (made by sft(), kept in checkpoints)
        self._mark_step_boundary()

    # ------------------------------------------------------------ helpers
    def _mark_step_boundary(self) -> None:
        """Remember the random states between two steps: a checkpoint holds these (not those
        of a step that an interrupt cut short), so a resumed run draws what an uninterrupted
        one draws (LoRA dropout in SFT and GRPO)."""
        self._rng_at_boundary = {"torch": torch.get_rng_state(), "python": random.getstate()}

    def _make_sft_optimizer(self):
        return torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad],
                                 lr=self.config.sft_learning_rate)

    def _phase(self, name: str):
        return self.timer.phase(name) if self.timer is not None else contextlib.nullcontext()

    def _prompt_order(self) -> list[int]:
        """GRPO's prompt order: the shuffled rows, or (``easy_first``) the same shuffle sorted
        by difficulty stratum, basic first (a stable sort keeps the shuffle within a stratum).
        GRPO draws from the front of the order and the SFT warm-up from the back of the
        shuffle, so the two see different problems. ``sequential`` keeps the data set's own
        order, as TRL does with ``shuffle_dataset=False``: the two trainers then draw the same
        prompts step by step (chapter 4)."""
        if self.config.prompt_order == "random":
            return self.order
        if self.config.prompt_order == "sequential":
            return list(range(len(self.dataset)))
        column = self.dataset["difficulty"] if hasattr(self.dataset, "column_names") else \
            [r["difficulty"] for r in self.dataset]
        rank = {s: k for k, s in enumerate(STRATA)}
        return sorted(self.order, key=lambda i: rank.get(column[i], len(STRATA)))

    def _select(self, ids: list[int]) -> dict[str, list]:
        picked = self.dataset.select(ids) if hasattr(self.dataset, "select") else \
            [self.dataset[i] for i in ids]
        rows = list(picked)
        return {k: [r[k] for r in rows] for k in rows[0]}

    def _rows(self, index: int, size: int) -> dict[str, list]:
        """Rows ``index * size`` .. of GRPO's prompt order (block ``index`` of ``size``)."""
        order = self.prompt_order
        return self._select([order[(index * size + i) % len(order)] for i in range(size)])

    def _next_rows(self, size: int) -> dict[str, list]:
        """The next ``size`` prompts of GRPO's order (the cursor is saved in checkpoints)."""
        order = self.prompt_order
        ids = [order[(self.prompts_used + i) % len(order)] for i in range(size)]
        self.prompts_used += size
        return self._select(ids)

    def _log(self, row: dict[str, Any]) -> None:
        self.history.append(row)
        if self.tracker is not None:
            self.tracker.log(row)
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            with open(self.out_dir / METRICS_FILE, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(row) + "\n")

    # ------------------------------------------------------------ SFT warm-up
    def sft_step(self, rows: dict[str, list], optimizer) -> dict[str, Any]:
        """One supervised step on GSM8K solutions (loss on the solution tokens only)."""
        start = time.perf_counter()
        pairs = [sft_text(q, s, self.tokenizer) for q, s in zip(rows["question"], rows["solution"], strict=False)]
        self.tokenizer.padding_side = "left"
        enc = self.tokenizer([p for p, _ in pairs], return_tensors="pt", padding=True,
                             add_special_tokens=False)
        self.tokenizer.padding_side = "right"
        tgt = self.tokenizer([t for _, t in pairs], return_tensors="pt", padding=True,
                             add_special_tokens=False, truncation=True, max_length=SFT_MAX_TOKENS)
        self.tokenizer.padding_side = "left"
        self.model.train()
        # bf16 autocast (``sft_dtype``): matmuls in bf16, weights, log-softmax and AdamW in fp32
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self._sft_in_bf16()):
            logps = per_token_logps(self.model, enc["input_ids"], enc["attention_mask"],
                                    tgt["input_ids"], tgt["attention_mask"])
        mask = tgt["attention_mask"].float()
        loss = -(logps * mask).sum() / mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        trim_heap()                     # low-memory mode only: the step's freed blocks go back
        return {"phase": "sft", "sft_step": self.sft_done, "loss": float(loss.detach()),
                "step_seconds": time.perf_counter() - start}

    def _sft_in_bf16(self) -> bool:
        """Whether the warm-up's matrix products run in bf16 (``sft_dtype``, resolved)."""
        return resolve_sampling_dtype(self.config.sft_dtype) == torch.bfloat16

    def _sft_rows(self, step: int, window: int = SFT_SORT_WINDOW) -> list[dict]:
        """The rows of SFT step ``step``. SFT draws from the end of the shuffled order (GRPO
        from the start), ``window`` steps' rows at a time, sorted by length and cut into batches:
        rows of similar length share a batch, so little of it is padding."""
        bs, first = self.config.sft_batch_size, (step // window) * window
        ids = [self.order[-1 - ((first * bs + i) % len(self.order))] for i in range(window * bs)]
        rows = list(self.dataset.select(ids)) if hasattr(self.dataset, "select") \
            else [self.dataset[i] for i in ids]
        rows.sort(key=lambda r: len(r["question"]) + len(r["solution"]))
        k = step - first
        return rows[k * bs:(k + 1) * bs]

    def sft(self, steps: int | None = None) -> list[dict]:
        """The supervised warm-up (``config.sft_steps`` steps, resumable)."""
        steps = self.config.sft_steps if steps is None else steps
        if self.sft_done >= steps:
            return []
        if self.sft_optimizer is None:
            self.sft_optimizer = self._make_sft_optimizer()
        optimizer = self.sft_optimizer
        rows_out = []
        # Two speed-ups for short sequences on a CPU (bench/throughput.py times the steps):
        # the frozen base weights cast to bf16 once instead of on every product, and the
        # plain ("math") attention kernel, whose backward beats the flash kernel's at ~200 tokens.
        with frozen_linear_weights_as(self.model, torch.bfloat16 if self._sft_in_bf16() else None), \
                sdpa_kernel(SDPBackend.MATH):
            for _ in tqdm(range(self.sft_done, steps), desc="sft", leave=False):
                picked = self._sft_rows(self.sft_done)
                row = self.sft_step({k: [r[k] for r in picked] for k in picked[0]}, optimizer)
                self.sft_done += 1
                self._log(row)
                self._mark_step_boundary()
                rows_out.append(row)
        return rows_out

    def start_from(self, warm_dir) -> CourseTrainer:
        """Load the adapter weights of a warm start (:func:`grpo_course.warmstart.warm_start`)
        and count its SFT steps as done, so :meth:`train` goes straight to GRPO."""
        load_adapter_state(self.model, warm_dir)
        self.sft_done = self.config.sft_steps
        return self

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
        """The prompt texts of ``rows``: each chat prompt, continued by the row's ``start`` column
        where the data set has one, else by the gold start of ``config.lines_left`` (a problem
        with that many lines or fewer starts whole)."""
        K = self.config.lines_left
        if K is not None and "start" not in rows:
            rows = {**rows, "start": [gold_start(s, K) or "" for s in rows["solution"]]}
        return start_prompts(rows, self.tokenizer)

    def generate_and_score(self, rows: dict[str, list]):
        """Sample G completions per prompt of ``rows`` and score them. With ``dynamic_sampling``
        (DAPO) groups whose rewards all tie (judged on ``dynamic_sampling_reward`` when it names
        one) are set aside and further prompts are sampled, ``prompts_per_round`` at a time, up to
        ``max_sampling_rounds`` rounds, until the step holds ``prompts_per_step`` informative
        groups. Returns the training batch, its rewards, and what every sampled completion
        scored (the policy's reward, informative or not) with the sampling counts."""
        cfg, G = self.config, self.config.num_generations
        need = len(rows["question"]) if cfg.generation_batch_size is None else cfg.prompts_per_step
        kept, sampled_rewards, sampled_funcs, prompts_sampled, rounds = [], [], [], 0, 0
        lengths, truncated = [], []
        while True:
            with self._phase("sampling"):
                batch = sample_completions(
                    self.model, self.tokenizer, self.prompts(rows), G,
                    cfg.max_completion_length, cfg.temperature, cfg.top_p,
                    seed=self.sampling_seed(rounds),
                    sampling_dtype=cfg.sampling_dtype)
            with self._phase("rewards"):
                rewards, per_func = self._score(batch, rows)
            rounds += 1
            prompts_sampled += len(rows["question"])
            sampled_rewards.append(rewards)
            sampled_funcs.append(per_func)
            lengths.append(batch.completion_lengths.float())
            truncated.append(batch.truncated.float())
            if not cfg.dynamic_sampling:
                kept.append((batch, rewards))
                break
            signal = rewards if cfg.dynamic_sampling_reward is None else \
                per_func[cfg.dynamic_sampling_reward]
            informative = ~zero_std_groups(signal, G)
            room = need - sum(len(r) // G for _, r in kept)
            take = informative & (informative.cumsum(0) <= room)
            if take.any():
                kept.append((batch.select_groups(take), rewards[take.repeat_interleave(G)]))
            if room - int(take.sum()) == 0 or rounds == cfg.max_sampling_rounds:
                break
            rows = self._next_rows(cfg.prompts_per_round)
        if not kept:               # dynamic sampling found no informative group: train on none
            none = torch.zeros(len(rewards) // G, dtype=torch.bool)
            kept.append((batch.select_groups(none), rewards[:0]))
        all_rewards = torch.cat(sampled_rewards)
        info = {"rewards": all_rewards,
                "per_func": {n: torch.cat([f[n] for f in sampled_funcs]) for n in sampled_funcs[0]},
                "frac_reward_zero_std": float(zero_std_groups(all_rewards, G).float().mean()),
                "sampling_rounds": rounds, "prompts_sampled": prompts_sampled,
                "completion_length": float(torch.cat(lengths).mean()),
                "clipped_ratio": float(torch.cat(truncated).mean())}
        return concat_batches([b for b, _ in kept]), torch.cat([r for _, r in kept]), info

    def _train_in_bf16(self) -> bool:
        """Whether the GRPO training pass runs under bf16 autocast (``train_dtype``, resolved)."""
        return resolve_sampling_dtype(self.config.train_dtype) == torch.bfloat16

    def step(self, rows: dict[str, list] | None = None) -> dict[str, Any]:
        """One GRPO step: sample and score (:meth:`generate_and_score`), then
        ``num_iterations`` optimizer updates on that batch. ``rows`` (columns ``question``,
        ``answer``, ...) are the step's prompts; by default the next ones in ``prompt_order``."""
        cfg, G = self.config, self.config.num_generations
        trim_heap()                     # low-memory mode only: what the last step freed goes back
        start = time.perf_counter()
        if rows is None:
            rows = self._next_rows(cfg.prompts_per_round if cfg.dynamic_sampling
                                   else cfg.prompts_per_step)
        batch, rewards, info = self.generate_and_score(rows)
        sampled = time.perf_counter()
        advantages = group_advantages(rewards, G, cfg.scale_rewards)
        mask = batch.completion_mask
        if cfg.mask_truncated_completions:       # a cut-off completion teaches nothing either way
            mask = mask * (~batch.truncated).long()[:, None]
        # With beta = 0 a group whose rewards are all equal has advantage 0 on every token, so its
        # completions add exactly 0 to the loss and its gradient: leave them out of the forward
        # and backward (``skip_zero_variance``) and rescale the loss so the update is unchanged.
        zero = zero_std_groups(rewards, G)
        keep = ~zero if (self.skip_zero_variance and cfg.beta == 0.0) else torch.ones_like(zero)
        rows_kept = keep.repeat_interleave(G)
        bf16 = self._train_in_bf16()
        self.model.train()
        updates = []
        # where the base is not held in bf16 already (the warm-up in fp32, the GRPO pass in bf16):
        # bf16 copies of the frozen weights, made once per step (not in low-memory mode: there
        # autocast casts each weight as it is used, and no second copy of the model exists at once)
        with frozen_linear_weights_as(self.model, torch.bfloat16 if bf16 and not low_memory() else None):
            old = None
            for _ in range(cfg.num_iterations):
                metrics, old = self._update(batch, mask, advantages, keep, rows_kept, old, bf16)
                updates.append(metrics)
                trim_heap()             # low-memory mode only: the update's freed blocks go back
        metrics = {k: float(sum(u[k] for u in updates) / len(updates)) for k in updates[0]
                   if k != "skipped"}
        learn = not updates[0]["skipped"]
        seconds = time.perf_counter() - start
        n_tokens = int(batch.completion_mask.sum())
        n_groups = info["prompts_sampled"]
        informative = n_groups - round(info["frac_reward_zero_std"] * n_groups)
        all_rewards = info["rewards"]
        row = {"phase": "grpo", "step": self.global_step, **metrics,
               "reward": float(all_rewards.mean()), "reward_std": float(all_rewards.std()),
               **{f"rewards/{n}": float(r.mean()) for n, r in info["per_func"].items()},
               "frac_reward_zero_std": info["frac_reward_zero_std"],
               "frac_groups_dropped": float((~keep).float().mean()) if len(keep) else 1.0,
               "informative_groups": int((~zero).sum()),
               "sampling_rounds": info["sampling_rounds"], "prompts_sampled": n_groups,
               "prompts_per_informative_group": n_groups / informative if informative else None,
               "completion_length": info["completion_length"],   # every sampled completion
               "clipped_ratio": info["clipped_ratio"],
               # completions whose answer is the gold number: the only ones that can teach correctness
               "correct_completions": correct_completions(info["per_func"]),
               "train_dtype": "bfloat16" if bf16 else "float32",
               "skipped": not learn, "step_seconds": seconds, "sampling_seconds": sampled - start,
               "sampled_tokens": n_tokens, "tokens_per_s": n_tokens / seconds}
        self.global_step += 1
        return row

    def _update(self, batch, mask, advantages, keep, rows_kept, old, bf16: bool):
        """One optimizer update on the kept groups of ``batch``: the loss of each pass
        (:meth:`_pass_loss`, backward included), the metrics reduced over the passes
        (:meth:`_reduce_metrics`), the penalty, and the optimizer step (:meth:`_optimizer_step`).
        Returns its metrics and the ``old_per_token_logps`` for the batch's later updates (one
        tensor per pass)."""
        cfg, G = self.config, self.config.num_generations
        metrics: dict[str, Any] = {"kl": 0.0, "entropy": float("nan"), "loss": 0.0,
                                   "clip_ratio/low_mean": 0.0, "clip_ratio/high_mean": 0.0,
                                   "clip_ratio/region_mean": 0.0}
        loss = ref = None
        with self._phase("logprobs"):
            if cfg.beta != 0.0 and keep.any():
                with torch.no_grad(), self._reference(), self.training_attention():
                    ref = per_token_logps(self.model, batch.prompt_ids, batch.prompt_mask,
                                          batch.completion_ids, mask, cfg.temperature)
        # (the attention stays on through the backward pass: activation checkpointing recomputes
        # the forward there)
        with self._phase("forward_backward"), self.training_attention(), \
                norms_cast_once(self.model, bf16):
            # the kept groups, ``train_micro_batch // G`` (at least one) per forward/backward pass,
            # all at once by default: each pass's loss is weighed by its share of the batch and its
            # backward runs before the next pass, so one pass's activations are in memory at a time
            groups = keep.nonzero().squeeze(1)
            per_pass = len(groups) if cfg.train_micro_batch is None else cfg.train_micro_batch // G
            passes = list(groups.split(max(per_pass, 1))) if len(groups) else []
            olds = old if old is not None else [None] * len(passes)
            old, sums = [], {}
            for chunk, chunk_old in zip(passes, olds, strict=True):
                in_pass = torch.zeros_like(keep)
                in_pass[chunk] = True
                chunk_old, part_sums = self._pass_loss(batch, mask, advantages, in_pass, chunk_old,
                                                       ref, bf16)
                old.append(chunk_old)
                for name, value in part_sums.items():
                    sums[name] = sums.get(name, 0.0) + value
            if passes:
                metrics.update(self._reduce_metrics(sums, rows_kept, mask))
                loss = torch.tensor(sums["loss"])
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
        return metrics, old

    def _pass_loss(self, batch, mask, advantages, in_pass, old, ref, bf16: bool):
        """The loss of one forward/backward pass over the groups ``in_pass`` (TRL's
        ``compute_loss``), weighed by its share of the batch, and its backward. Returns the
        pass's ``old_per_token_logps`` and its sums: the weighed loss, the real tokens, and the
        token sums of the entropy, the sampler's log-prob gap and the loss's metrics."""
        cfg, G = self.config, self.config.num_generations
        rows = in_pass.repeat_interleave(G)
        T = max(int(batch.completion_mask[rows].sum(1).max()), 1)
        sub_mask = mask[rows][:, :T]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logps, entropy = per_token_logps(self.model, batch.prompt_ids[in_pass],
                                             batch.prompt_mask[in_pass],
                                             batch.completion_ids[rows, :T], sub_mask,
                                             cfg.temperature, return_entropy=True)
        sampler_logps = batch.sampling_logps[rows, :T]
        if old is None:
            # the sampler's log-probs are the old policy's only if it sampled at the training
            # pass's precision; else the policy's own, before this batch's first update (TRL's
            # choice: ratio 1 on the first update, no extra forward pass)
            exact = not bf16 and batch.sampling_dtype == torch.float32
            old = sampler_logps if exact else logps.detach()
        part, part_metrics = grpo_loss(
            logps, old, advantages[rows], sub_mask,
            ref_per_token_logps=None if ref is None else ref[rows, :T],
            beta=cfg.beta, epsilon_low=cfg.epsilon_low, epsilon_high=cfg.epsilon_high,
            loss_type=cfg.loss_type, max_completion_length=cfg.max_completion_length)
        part = part * dropped_groups_scale(cfg.loss_type, rows, mask)
        if part.requires_grad:
            part.backward()
        n_tok = float(sub_mask.sum())
        gap = (logps.detach() - sampler_logps).abs() * sub_mask
        sums = {"loss": float(part.detach()), "tokens": n_tok,
                "entropy": float((entropy * sub_mask).sum()), "sampler_logp_gap": float(gap.sum())}
        sums.update({k: v * n_tok for k, v in part_metrics.items() if k != "policy_loss"})
        return old, sums

    def _reduce_metrics(self, sums: dict[str, float], rows_kept, mask) -> dict[str, float]:
        """Token means over all passes of one update, and the policy loss of the kept groups."""
        n_tok = max(sums["tokens"], 1.0)
        metrics = {name: sums[name] / n_tok
                   for name in ("clip_ratio/low_mean", "clip_ratio/high_mean",
                                "clip_ratio/region_mean", "kl", "entropy", "sampler_logp_gap")}
        kept_share = dropped_groups_scale(self.config.loss_type, rows_kept, mask)
        metrics["policy_loss"] = sums["loss"] / kept_share if kept_share else 0.0
        return metrics

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
        (:func:`grpo_course.grpo.course_attention`), except in low-memory mode, where the fused
        kernel keeps less for the backward pass."""
        return course_attention(self.model, not low_memory())

    def _reference(self):
        if hasattr(self.model, "disable_adapter"):
            return self.model.disable_adapter()
        raise ConfigError("beta > 0 needs a reference: train with use_lora=True "
                          "(the reference is the model with its adapter disabled)")

    def train(self, max_steps: int | None = None) -> list[dict]:
        """SFT warm-up (if configured and not done), then GRPO up to ``max_steps``."""
        cfg = self.config
        max_steps = cfg.max_steps if max_steps is None else max_steps
        rows_out: list[dict] = []
        if self.out_dir is not None:       # the resolved config beside the metrics
            save_run_config(self.out_dir, dataclasses.replace(cfg, max_steps=max_steps), self.profile)
        self.tracker = Tracker(cfg, name=self.out_dir.name if self.out_dir is not None else "course")
        try:
            rows_out += self.sft()
            if self.out_dir is not None and cfg.sft_steps and self.global_step == 0 \
                    and not (self.out_dir / "sft" / "adapter_config.json").is_file():
                self.save_model(self.out_dir / "sft")     # the warm-up alone, for attribution
            bar = tqdm(range(self.global_step, max_steps), desc="grpo", leave=False)
            for _ in bar:
                row = self.step()
                self._log(row)
                self._mark_step_boundary()
                rows_out.append(row)
                bar.set_postfix(reward=f"{row['reward']:.2f}", s=f"{row['step_seconds']:.1f}")
                if cfg.save_every and self.out_dir is not None and \
                        self.global_step % cfg.save_every == 0:
                    self.save_checkpoint(self.out_dir / "checkpoint")
        except KeyboardInterrupt:
            if self.out_dir is not None:
                self.save_checkpoint(self.out_dir / "checkpoint")
                print(f"interrupted: checkpoint saved to {self.out_dir / 'checkpoint'}")
            raise
        finally:
            self.tracker.finish()
            self.tracker = None
        return rows_out

    # ------------------------------------------------------------ persistence
    def fork(self) -> CourseTrainer:
        """A deep copy that shares the frozen base weights with this trainer (they never change):
        a second trainer for the price of its adapters and optimizer state, not of a second model.
        Both can then train on their own (chapter 3 checks its hand-written step this way)."""

        frozen = {id(p): p for p in self.model.parameters() if not p.requires_grad}
        return copy.deepcopy(self, memo=frozen)

    def save_model(self, path) -> Path:
        """Write an evaluable adapter (base recorded as ``config.model``) or full model into
        ``path`` (other files there are kept). The folder is swapped as a whole
        (:func:`grpo_course.atomic.atomic_write`): an interrupted save leaves the old one."""

        def write(tmp: Path) -> None:
            self.model.save_pretrained(tmp)
            self.tokenizer.save_pretrained(tmp)
            adapter = tmp / "adapter_config.json"
            if adapter.is_file():
                meta = json.loads(adapter.read_text())
                meta["base_model_name_or_path"] = self.config.model
                adapter.write_text(json.dumps(meta, indent=2))
        return atomic_write(path, write, folder=True, keep=True)

    def save_checkpoint(self, path) -> Path:
        """Trainable weights, both optimizers (GRPO's and the SFT warm-up's), the random states
        at the last step boundary, counters and config, written atomically. The data order is
        a function of ``config.seed`` and the counters (``sft_done``, ``prompts_used``)."""
        trainable = {n: p.detach().clone() for n, p in self.model.named_parameters()
                     if p.requires_grad}

        def write(tmp: Path) -> None:
            torch.save({"trainable": trainable, "optimizer": self.optimizer.state_dict(),
                        "sft_optimizer": None if self.sft_optimizer is None
                        else self.sft_optimizer.state_dict(),
                        "rng": self._rng_at_boundary}, tmp / "state.pt")
            cfg = dataclasses.asdict(self.config)
            (tmp / "trainer.json").write_text(json.dumps(
                {"global_step": self.global_step, "sft_done": self.sft_done,
                 "prompts_used": self.prompts_used, "config": cfg},
                indent=2))
        return _atomic_dir(Path(path), write)

    @classmethod
    def resume(cls, path, model, tokenizer, train_dataset, config: GRPOConfig | None = None,
               **kwargs) -> CourseTrainer:
        """A trainer that continues the run saved at ``path`` (``model`` = the fresh base), with
        the config saved there or ``config`` (the CLI's: saved < recipe < flags)."""
        path = Path(path)
        try:
            meta = json.loads((path / "trainer.json").read_text())
            if config is None:
                cfg = meta["config"]
                cfg["lora_target_modules"] = tuple(cfg["lora_target_modules"])
                config = GRPOConfig(**cfg)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f"{path / 'trainer.json'} is not a readable checkpoint "
                              f"({type(exc).__name__}: {exc})") from None
        trainer = cls(model, tokenizer, config, train_dataset, **kwargs)
        try:
            state = torch.load(path / "state.pt", weights_only=True)
            params = dict(trainer.model.named_parameters())
            with torch.no_grad():
                for name, value in state["trainable"].items():
                    params[name].copy_(value)
            trainer.optimizer.load_state_dict(state["optimizer"])
            if state.get("sft_optimizer") is not None:
                trainer.sft_optimizer = trainer._make_sft_optimizer()
                trainer.sft_optimizer.load_state_dict(state["sft_optimizer"])
            if state.get("rng") is not None:
                torch.set_rng_state(state["rng"]["torch"])
                random.setstate(state["rng"]["python"])
                trainer._mark_step_boundary()
        except Exception as exc:  # cut short, or another model's: torch's own errors
            raise ConfigError(f"{path / 'state.pt'} is not a readable checkpoint for this model "
                              f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]})") from None
        trainer.global_step, trainer.sft_done = meta["global_step"], meta["sft_done"]
        trainer.prompts_used = meta.get("prompts_used", trainer.global_step * trainer.config.prompts_per_step)
        return trainer


def main(argv: list[str] | None = None) -> int:
    """``python -m grpo_course.train``: options in :mod:`grpo_course.cli` (``--help``)."""

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
            trainer = CourseTrainer(model, tokenizer, config, dataset, out_dir=out,
                                    profile=profile)
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
