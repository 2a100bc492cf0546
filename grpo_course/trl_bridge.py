"""The course config in TRL's terms: ``GRPOConfig``, LoRA, the dataset, rewards, a run (chapter 4).

The course trainer (:mod:`grpo_course.train`) and ``trl.GRPOTrainer`` run the same
algorithm; this module translates :class:`grpo_course.config.GRPOConfig` into TRL's
objects so the two can be compared on the same prompts and rewards:

* :func:`grpo_config_from_course` -> ``trl.GRPOConfig`` (CPU, fp32, no bf16);
* :func:`lora_config_from_course` -> ``peft.LoraConfig``;
* :func:`trl_dataset` -> a ``datasets.Dataset`` with a conversational ``prompt`` and ``answer``;
* :func:`reward_funcs_from_course` -> reward functions and their weights;
* :func:`train_with_trl` -> a finished run (trainer, log history, wall time).

Not translated (the course trainer's own levers, chapter 3): ``dynamic_sampling`` and
``prompt_order`` have no TRL field, and TRL runs ``num_iterations=1`` here because TRL counts
each reuse of a batch as an optimizer step of its own.
"""
from __future__ import annotations

import logging
import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

from grpo_course.config import ConfigError, GRPOConfig

#: course field -> ``trl.GRPOConfig`` field (the fields that change name or meaning).
COURSE_TO_TRL: dict[str, str] = {
    "num_generations": "num_generations",
    "per_step_completions": "per_device_train_batch_size",
    "max_completion_length": "max_completion_length",
    "max_steps": "max_steps",
    "learning_rate": "learning_rate",
    "beta": "beta",
    "epsilon_low": "epsilon",
    "epsilon_high": "epsilon_high",
    "loss_type": "loss_type",
    "scale_rewards": "scale_rewards",
    "temperature": "temperature",
    "top_p": "top_p",
    "max_grad_norm": "max_grad_norm",
    "weight_decay": "weight_decay",
    "mask_truncated_completions": "mask_truncated_completions",
    "reward_weights": "reward_weights",
    "seed": "seed",
    "log_every": "logging_steps",
}
#: Fields the bridge always sets, whatever the course config says.
FIXED_TRL_FIELDS: dict[str, Any] = {
    "use_cpu": True, "bf16": False, "fp16": False, "gradient_accumulation_steps": 1,
    "num_iterations": 1, "use_bias_correction_kl": False, "lr_scheduler_type": "constant",
    "report_to": "none", "save_strategy": "no",
    # TRL turns activation checkpointing on by default: it saves memory by running the
    # forward twice. A 135M model fits a CPU's memory easily, so we keep the time.
    "gradient_checkpointing": False,
}

#: The same knobs on AWS Trainium through optimum-neuron (documented, not run here):
#: ``NeuronGRPOConfig`` subclasses both ``NeuronTrainingArguments`` and ``trl.GRPOConfig``,
#: so every TRL name above is accepted unchanged; these are the ones that differ.
NEURON_NOTES: dict[str, str] = {
    "config class": "optimum.neuron.NeuronGRPOConfig (NeuronTrainingArguments + trl.GRPOConfig)",
    "trainer class": "optimum.neuron.NeuronGRPOTrainer",
    "device / precision": "no use_cpu; bf16=True (Trainium computes in bf16)",
    "model sharding": "tensor_parallel_size=N (shards each matmul over N Neuron cores)",
    "batch rule": "per_device_train_batch_size * data-parallel size divisible by num_generations",
    "shapes": "fixed shapes: pad_to_multiple_of (auto = 128 on Neuron) to bound recompilations",
}


def quiet_trl() -> None:
    """Silence the progress bars and INFO/WARNING chatter of transformers, datasets and TRL."""
    import datasets
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    datasets.disable_progress_bars()
    for name in ("trl", "accelerate", "peft", "torchao", "torch._dynamo"):
        logging.getLogger(name).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module=r"(trl|transformers|peft)")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# ---------------------------------------------------------------- config
def reward_names(cfg: GRPOConfig) -> list[str]:
    """The reward functions the course config weights, in its order."""
    from grpo_course.rewards import check_reward_names

    if not cfg.reward_weights:
        raise ConfigError("reward_weights is empty: name at least one reward of "
                          "grpo_course.rewards.REWARD_FUNCTIONS")
    return check_reward_names(cfg.reward_weights)


def grpo_config_from_course(cfg: GRPOConfig, output_dir: str | os.PathLike,
                            **overrides: Any):
    """``trl.GRPOConfig`` for the course config ``cfg``: CPU, fp32, LoRA-friendly.

    One optimizer step = ``per_device_train_batch_size`` completions =
    ``cfg.per_step_completions`` (G per prompt), generated once and used for one
    update (``num_iterations=1``, no gradient accumulation), as in the course trainer.
    ``overrides`` replace any ``trl.GRPOConfig`` field (TRL's own checks then apply).
    """
    from trl import GRPOConfig as TRLConfig

    kwargs: dict[str, Any] = dict(
        output_dir=str(output_dir),
        # CPU + fp32 (TRL defaults bf16=True), one generation and one update per step,
        # the KL without TRL's ratio weighting (the course's loss), no checkpoints
        **FIXED_TRL_FIELDS,
        # batch: completions per step, G per prompt
        num_generations=cfg.num_generations,
        per_device_train_batch_size=cfg.per_step_completions,
        max_completion_length=cfg.max_completion_length,
        temperature=cfg.temperature, top_p=cfg.top_p,
        # the objective
        beta=cfg.beta, epsilon=cfg.epsilon_low,
        epsilon_high=cfg.epsilon_low if cfg.epsilon_high is None else cfg.epsilon_high,
        loss_type=cfg.loss_type, scale_rewards=cfg.scale_rewards,
        mask_truncated_completions=cfg.mask_truncated_completions,
        reward_weights=[float(cfg.reward_weights[n]) for n in reward_names(cfg)],
        # the optimizer
        learning_rate=cfg.learning_rate, max_steps=cfg.max_steps, warmup_steps=0,
        max_grad_norm=cfg.max_grad_norm, weight_decay=cfg.weight_decay,
        seed=cfg.seed, data_seed=cfg.seed,
        # logging: every step, quietly
        logging_steps=max(1, cfg.log_every), disable_tqdm=True, log_completions=False,
        dataloader_num_workers=0, dataloader_pin_memory=False,
    )
    from dataclasses import fields

    known = {f.name for f in fields(TRLConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ConfigError(f"trl.GRPOConfig has no field(s) {unknown}; see "
                          "help(trl.GRPOConfig) for the names")
    kwargs.update(overrides)
    return TRLConfig(**kwargs)


def lora_config_from_course(cfg: GRPOConfig):
    """``peft.LoraConfig`` with the course's rank, alpha, dropout and target modules."""
    from peft import LoraConfig

    if not cfg.use_lora:
        raise ConfigError("cfg.use_lora is False: train the full model (pass peft_config=None)")
    return LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                      target_modules=list(cfg.lora_target_modules), bias="none",
                      task_type="CAUSAL_LM")


#: Why the bridge departs from TRL's defaults (fields a TRL user meets first).
DEFAULT_CHANGES: dict[str, str] = {
    "loss_type": "the course config's loss (chapter 3 compares grpo, bnpo, dapo, dr_grpo)",
    "bf16": "fp32 unless the CPU has native bf16 (AVX512-BF16/AMX); emulated bf16 is slower",
    "gradient_checkpointing": "a 135M model fits in memory: no second forward to save it",
    "beta": "the course config's KL weight",
    "num_generations": "the course config's G",
    "learning_rate": "LoRA takes a larger step than TRL's full-model default",
    "use_bias_correction_kl": "the course's k3 KL, without TRL's ratio weighting",
}


def trl_default_rows(trl_cfg) -> list[dict[str, Any]]:
    """TRL's own default and the bridge's value for the fields of :data:`DEFAULT_CHANGES`
    (``bf16=None`` in TRL's dataclass means True unless fp16 is set)."""
    from dataclasses import fields

    from trl import GRPOConfig as TRLConfig

    defaults = {f.name: f.default for f in fields(TRLConfig)}
    defaults["bf16"] = True if defaults["bf16"] is None else defaults["bf16"]
    return [{"field": name, "trl_default": defaults[name], "bridge": getattr(trl_cfg, name),
             "changed": defaults[name] != getattr(trl_cfg, name),
             "why": why if defaults[name] != getattr(trl_cfg, name) else ""}
            for name, why in DEFAULT_CHANGES.items()]


def mapping_rows(cfg: GRPOConfig, trl_cfg=None) -> list[dict[str, Any]]:
    """One row per translated field: course name and value, TRL name and value."""
    rows = []
    for course, trl_name in COURSE_TO_TRL.items():
        rows.append({"course": course, "course_value": getattr(cfg, course),
                     "trl": trl_name,
                     "trl_value": getattr(trl_cfg, trl_name) if trl_cfg is not None else None})
    return rows


# ---------------------------------------------------------------- data and rewards
def trl_dataset(split: str = "train", n: int | None = None, offset: int = 0,
                data_dir: str | None = None, system_prompt: str | None = None):
    """GSM8K rows as TRL wants them: ``prompt`` (system + user messages), ``answer`` and
    ``solution``.

    TRL applies the chat template itself and passes ``answer`` and ``solution`` (each
    repeated G times) to every reward function as keywords.
    """
    from grpo_course.data import SYSTEM_PROMPT, chat_messages, load_gsm8k

    rows = load_gsm8k(split, data_dir=data_dir, limit=n, offset=offset)
    system = SYSTEM_PROMPT if system_prompt is None else system_prompt
    keep = {"answer", "solution", "difficulty", "idx"}   # rewards read answer and solution
    return rows.map(lambda r: {"prompt": chat_messages(r["question"], system)},
                    remove_columns=[c for c in rows.column_names if c not in keep])


def reward_funcs_from_course(cfg: GRPOConfig) -> tuple[list[Callable[..., list[float]]], list[float]]:
    """(reward functions, weights) from ``cfg.reward_weights``; TRL logs each as
    ``rewards/<name>/mean`` and sums them with the weights before the advantages."""
    from grpo_course.rewards import REWARD_FUNCTIONS

    names = reward_names(cfg)
    return [REWARD_FUNCTIONS[n] for n in names], [float(cfg.reward_weights[n]) for n in names]


# ---------------------------------------------------------------- a run
@dataclass
class TRLRun:
    """A finished ``GRPOTrainer`` run."""

    trainer: Any
    log_history: list[dict[str, Any]] = field(repr=False)
    seconds: float = 0.0

    @property
    def steps(self) -> list[dict[str, Any]]:
        """The per-step log entries (those with a reward)."""
        return [e for e in self.log_history if "reward" in e]

    def series(self, key: str) -> list[float]:
        """One logged metric over the steps (``nan`` where a step did not log it)."""
        return [float(e.get(key, float("nan"))) for e in self.steps]

    def metrics_rows(self) -> list[dict[str, Any]]:
        """TRL's log in the course trainer's ``metrics.jsonl`` names (for ``plot_metrics``)."""
        names = {"reward": "reward", "reward_std": "reward_std", "kl": "kl", "entropy": "entropy",
                 "loss": "loss", "frac_reward_zero_std": "frac_reward_zero_std",
                 "completions/mean_length": "completion_length", "step_time": "step_seconds"}
        names.update({k: k[: -len("/mean")] for e in self.steps for k in e
                      if k.startswith("rewards/") and k.endswith("/mean")})
        return [{"phase": "grpo", "step": i, **{ours: float(e[theirs])
                                                for theirs, ours in names.items() if theirs in e}}
                for i, e in enumerate(self.steps)]

    def throughput(self) -> dict[str, float]:
        """Completions and completion tokens per second, from TRL's own ``step_time``."""
        steps = [e for e in self.steps if e.get("step_time")]
        if not steps:
            return {"steps": 0, "s_per_step": float("nan"), "completions_per_s": float("nan"),
                    "tokens_per_s": float("nan")}
        per_step = self.trainer.args.per_device_train_batch_size
        secs = sum(e["step_time"] for e in steps)
        tokens = sum(per_step * e.get("completions/mean_length", 0.0) for e in steps)
        return {"steps": len(steps), "s_per_step": secs / len(steps),
                "completions_per_s": per_step * len(steps) / secs, "tokens_per_s": tokens / secs}


def train_with_trl(cfg: GRPOConfig, output_dir: str | os.PathLike, model=None, tokenizer=None,
                   train_dataset=None, n_prompts: int | None = None, callbacks=None,
                   quiet: bool = True, **overrides: Any) -> TRLRun:
    """Train with ``trl.GRPOTrainer`` from the course config and return the run.

    ``model``/``tokenizer`` default to :func:`grpo_course.models.load_model` (``cfg.model``);
    ``train_dataset`` defaults to :func:`trl_dataset` with just enough prompts for
    ``cfg.max_steps`` (or ``n_prompts``). With ``cfg.use_lora`` the model is wrapped
    by peft inside the trainer (``trainer.model`` is then a ``PeftModel``).
    """
    from trl import GRPOTrainer

    if quiet:
        quiet_trl()
    args = grpo_config_from_course(cfg, output_dir, **overrides)
    if model is None:
        from grpo_course.models import load_model

        model, loaded_tok = load_model(cfg.model)
        tokenizer = tokenizer or loaded_tok
    if tokenizer is None:
        raise ConfigError("pass the tokenizer that goes with the model you pass")
    if train_dataset is None:
        n = n_prompts or max(1, args.max_steps) * cfg.prompts_per_step
        train_dataset = trl_dataset("train", n=n, offset=cfg.train_offset)
    funcs, _ = reward_funcs_from_course(cfg)
    model.train()
    trainer = GRPOTrainer(model=model, reward_funcs=funcs, args=args,
                          train_dataset=train_dataset, processing_class=tokenizer,
                          peft_config=lora_config_from_course(cfg) if cfg.use_lora else None,
                          callbacks=callbacks)
    if quiet:  # with disable_tqdm, transformers prints every log dict; the history keeps them
        from transformers.trainer_callback import PrinterCallback

        trainer.remove_callback(PrinterCallback)
    start = time.perf_counter()
    trainer.train()
    return TRLRun(trainer=trainer, log_history=list(trainer.state.log_history),
                  seconds=time.perf_counter() - start)


def save_and_merge(run: TRLRun, adapter_dir: str | os.PathLike):
    """Save the LoRA adapter to ``adapter_dir`` and return the merged plain model (eval mode)."""
    model = run.trainer.model
    if not hasattr(model, "merge_and_unload"):
        raise ConfigError("this run trained the full model (no LoRA adapter to save and merge)")
    model.save_pretrained(str(adapter_dir))
    merged = model.merge_and_unload()
    merged.eval()
    return merged
