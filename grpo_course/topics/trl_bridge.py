"""The course config in TRL's terms: ``GRPOConfig``, LoRA, the dataset, rewards, a run (chapter 4).

The course trainer (:mod:`grpo_course.core.train`) and ``trl.GRPOTrainer`` run the same
algorithm; this module translates :class:`grpo_course.config.GRPOConfig` into TRL's
objects so the two can be compared on the same prompts and rewards:

* :func:`grpo_config_from_course` -> ``trl.GRPOConfig`` (CPU, fp32 unless asked for bf16);
* :func:`lora_config_from_course` -> ``peft.LoraConfig``;
* :func:`trl_dataset` -> a ``datasets.Dataset`` with a conversational ``prompt`` and ``answer``;
* :func:`reward_funcs_from_course` -> reward functions and their weights;
* :func:`train_with_trl` -> a finished run (trainer, log history, wall time);
* :func:`main` -> ``python -m grpo_course.topics.trl_bridge``, the same flags as ``grpo_course.core.train``,
  data-parallel under ``accelerate launch`` (``configs/accelerate/``: 2 CPU processes, 8 GPUs,
  ZeRO-2), with TRL's batch rule checked before anything starts (:func:`per_device_batch`).

``prompt_order`` maps to ``shuffle_dataset``: ``sequential`` (the data set's order) is
``shuffle_dataset=False``, so both trainers draw the same prompts step by step; ``random`` and
``easy_first`` shuffle (TRL has no difficulty order). Not translated (the course trainer's own
lever, chapter 3): ``dynamic_sampling`` has no TRL field, and TRL runs ``num_iterations=1`` here
because TRL counts each reuse of a batch as an optimizer step of its own.
"""
from __future__ import annotations

import gc
import hashlib
import importlib.util
import json
import logging
import math
import os
import shlex
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from grpo_course.config import ConfigError, GRPOConfig
from grpo_course.core.cli import RunArguments, parse_train_args, run_folder
from grpo_course.core.data import SYSTEM_PROMPT, chat_messages, load_gsm8k
from grpo_course.core.loading import load_model, quiet_loading, quiet_torchao
from grpo_course.core.rewards import REWARD_FUNCTIONS, check_reward_names
from grpo_course.core.runs import TRACKIO_PROJECT, Tracker, write_run
from grpo_course.core.sampling import sample_completions
from grpo_course.core.warmstart import warm_start
from grpo_course.infra.atomic import write_text_atomic
from grpo_course.infra.errors import CourseError, report
from grpo_course.infra.hardware import set_threads, share_cores
from grpo_course.infra.memory import trim_heap

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
    "report_to": "report_to",
    "gradient_checkpointing": "gradient_checkpointing",
    "prompt_order": "shuffle_dataset",                  # sequential -> False
}
#: Fields the bridge always sets, whatever the course config says.
FIXED_TRL_FIELDS: dict[str, Any] = {
    "use_cpu": True, "bf16": False, "fp16": False, "gradient_accumulation_steps": 1,
    "num_iterations": 1, "use_bias_correction_kl": False, "lr_scheduler_type": "constant",
    "save_strategy": "no",
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
    """Silence the progress bars and INFO/WARNING chatter of transformers, datasets and TRL, and
    torchao's start-up lines (:func:`grpo_course.core.loading.quiet_torchao`: TRL and peft import it)."""
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
    quiet_torchao()


# ---------------------------------------------------------------- config
def reward_names(cfg: GRPOConfig) -> list[str]:
    """The reward functions the course config weights, in its order."""

    if not cfg.reward_weights:
        raise ConfigError("reward_weights is empty: name at least one reward of "
                          "grpo_course.core.rewards.REWARD_FUNCTIONS")
    return check_reward_names(cfg.reward_weights)


def grpo_config_from_course(cfg: GRPOConfig, output_dir: str | os.PathLike,
                            micro_batch: int | None = None, **overrides: Any):
    """``trl.GRPOConfig`` for the course config ``cfg``: CPU, fp32, LoRA-friendly.

    One optimizer step = ``per_device_train_batch_size`` completions =
    ``cfg.per_step_completions`` (G per prompt), generated once and used for one
    update (``num_iterations=1``, no gradient accumulation), as in the course trainer.
    With ``micro_batch`` the step's completions are still generated at once and make one
    update, but pass through the model ``micro_batch`` at a time (TRL's gradient accumulation:
    ``per_device_train_batch_size=micro_batch``); the loss is the same, the memory of the
    backward pass shrinks with the micro-batch (the binder profile: ``Profile.trl.micro_batch``).
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
        # TRL turns activation checkpointing on by default: it saves memory by running the forward
        # twice. The course config decides (off, but on the binder profile's 2 GB); whether it costs
        # or saves time on a CPU is bench/throughput.py's to measure (it times TRL's fastest mode
        # both ways)
        gradient_checkpointing=cfg.gradient_checkpointing,
        reward_weights=[float(cfg.reward_weights[n]) for n in reward_names(cfg)],
        # the optimizer
        learning_rate=cfg.learning_rate, max_steps=cfg.max_steps, warmup_steps=0,
        max_grad_norm=cfg.max_grad_norm, weight_decay=cfg.weight_decay,
        seed=cfg.seed, data_seed=cfg.seed,
        # the data set's own order (the course's prompt_order="sequential") or a seeded shuffle
        shuffle_dataset=cfg.prompt_order != "sequential",
        # logging: every step, quietly; to trackio too with report_to="trackio"
        logging_steps=max(1, cfg.log_every), disable_tqdm=True, log_completions=False,
        **trackio_fields(cfg),
        dataloader_num_workers=0, dataloader_pin_memory=False,
    )
    if micro_batch is not None:
        if micro_batch < 1 or cfg.per_step_completions % micro_batch:
            raise ConfigError(f"micro_batch ({micro_batch}) must divide per_step_completions "
                              f"({cfg.per_step_completions})")
        kwargs.update(per_device_train_batch_size=micro_batch,
                      gradient_accumulation_steps=cfg.per_step_completions // micro_batch)

    known = {f.name for f in fields(TRLConfig)}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ConfigError(f"trl.GRPOConfig has no field(s) {unknown}; see "
                          "help(trl.GRPOConfig) for the names")
    kwargs.update(overrides)
    return TRLConfig(**kwargs)


def trackio_fields(cfg: GRPOConfig) -> dict[str, Any]:
    """TRL's logging fields for ``cfg.report_to``: trackio in the course's project, or none."""

    if cfg.report_to == "none":
        return {"report_to": "none"}
    Tracker.check(cfg)                                   # one clear line if trackio is missing
    return {"report_to": cfg.report_to, "project": TRACKIO_PROJECT}


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
    "gradient_checkpointing": "the course config's: off, except on the binder profile (made for 2 GB); "
                              "the throughput benchmark times TRL's fastest mode with it on too",
    "beta": "the course config's KL weight",
    "num_generations": "the course config's G",
    "learning_rate": "LoRA takes a larger step than TRL's full-model default",
    "use_bias_correction_kl": "the course's k3 KL, without TRL's ratio weighting",
    "shuffle_dataset": "the course config's prompt_order: sequential (chapter 4) gives TRL and the "
                       "course trainer the same prompts at every step",
}


def trl_default_rows(trl_cfg) -> list[dict[str, Any]]:
    """TRL's own default and the bridge's value for the fields of :data:`DEFAULT_CHANGES`
    (``bf16=None`` in TRL's dataclass means True unless fp16 is set)."""

    from trl import GRPOConfig as TRLConfig

    defaults = {f.name: f.default for f in fields(TRLConfig)}
    defaults["bf16"] = True if defaults["bf16"] is None else defaults["bf16"]
    return [{"field": name, "trl_default": defaults[name], "bridge": getattr(trl_cfg, name),
             "changed": defaults[name] != getattr(trl_cfg, name),
             "why": why if defaults[name] != getattr(trl_cfg, name) else ""}
            for name, why in DEFAULT_CHANGES.items()]


def trl_config_differences(a, b) -> dict[str, tuple[Any, Any]]:
    """The fields of two ``trl.GRPOConfig`` objects whose values differ: ``{field: (a's, b's)}``
    (empty when the two configs would train alike)."""
    da, db = a.to_dict(), b.to_dict()
    return {k: (da.get(k), db.get(k)) for k in sorted(set(da) | set(db)) if da.get(k) != db.get(k)}


def mapping_rows(cfg: GRPOConfig, trl_cfg=None) -> list[dict[str, Any]]:
    """One row per translated field: course name and value, TRL name and value. Where TRL splits
    a step's completions into passes (``gradient_accumulation_steps`` > 1), the step's row names
    both fields and shows ``batch × passes``, which multiply to the course's value."""
    rows = []
    for course, trl_name in COURSE_TO_TRL.items():
        value = getattr(trl_cfg, trl_name) if trl_cfg is not None else None
        passes = getattr(trl_cfg, "gradient_accumulation_steps", 1) if trl_cfg is not None else 1
        if trl_name == "per_device_train_batch_size" and passes > 1:
            trl_name, value = f"{trl_name} × gradient_accumulation_steps", f"{value} × {passes}"
        rows.append({"course": course, "course_value": getattr(cfg, course), "trl": trl_name, "trl_value": value})
    return rows


#: one GRPO step, in TRL's methods and the course trainer's, in the order they run
STEP_METHODS = ("_generate_and_score_completions", "_prepare_inputs", "compute_loss", "_compute_loss")


def _dict_keys(source: str, name: str) -> list[str]:
    """The string keys a function's source puts into the dict ``name`` (``name = {"k": ...}``
    and ``name["k"] = ...``), in order of appearance."""
    import re

    start = source.rfind(f"{name} = {{")
    literal = source[start:source.index("}", start)] if start >= 0 else ""
    keys = re.findall(r'"(\w+)":', literal) + re.findall(rf'{name}\["(\w+)"\] =', source)
    return list(dict.fromkeys(keys))


def data_flow_rows(trl_trainer_cls, course_trainer_cls) -> list[dict[str, Any]]:
    """The step's data flow side by side, read from both trainers' code: each method of
    :data:`STEP_METHODS` with its signature in each (``-`` where a trainer has none), then the
    keys of the ``inputs`` dict that ``_generate_and_score_completions`` returns: one row per key
    both hold, then one row each for the keys only TRL holds (images, tools, vLLM) and those only
    the course holds (what its log row reads)."""
    import inspect

    def signature(cls, name: str) -> str:
        return f"{name}{inspect.signature(getattr(cls, name))}" if hasattr(cls, name) else "-"

    rows = [{"what": "method", "TRL": signature(trl_trainer_cls, m),
             "course": signature(course_trainer_cls, m)} for m in STEP_METHODS]
    trl_keys = _dict_keys(inspect.getsource(trl_trainer_cls._generate_and_score_completions), "output")
    course_keys = _dict_keys(inspect.getsource(course_trainer_cls._inputs), "inputs")
    rows += [{"what": "inputs key", "TRL": key, "course": key} for key in trl_keys if key in course_keys]
    rows.append({"what": "inputs keys of TRL only",
                 "TRL": ", ".join(k for k in trl_keys if k not in course_keys) or "-", "course": "-"})
    rows.append({"what": "inputs keys of the course only", "TRL": "-",
                 "course": ", ".join(k for k in course_keys if k not in trl_keys) or "-"})
    return rows


# ---------------------------------------------------------------- data and rewards
def trl_dataset(split: str = "train", n: int | None = None, offset: int = 0,
                data_dir: str | None = None, system_prompt: str | None = None):
    """GSM8K rows as TRL wants them: ``prompt`` (system + user messages), ``answer`` and
    ``solution``.

    TRL applies the chat template itself and passes ``answer`` and ``solution`` (each
    repeated G times) to every reward function as keywords.
    """

    rows = load_gsm8k(split, data_dir=data_dir, limit=n, offset=offset)
    system = SYSTEM_PROMPT if system_prompt is None else system_prompt
    keep = {"answer", "solution", "difficulty", "idx"}   # rewards read answer and solution
    return rows.map(lambda r: {"prompt": chat_messages(r["question"], system)},
                    remove_columns=[c for c in rows.column_names if c not in keep])


def reward_funcs_from_course(cfg: GRPOConfig) -> tuple[list[Callable[..., list[float]]], list[float]]:
    """(reward functions, weights) from ``cfg.reward_weights``; TRL logs each as
    ``rewards/<name>/mean`` and sums them with the weights before the advantages."""

    names = reward_names(cfg)
    return [REWARD_FUNCTIONS[n] for n in names], [float(cfg.reward_weights[n]) for n in names]


# ---------------------------------------------------------------- a run
@dataclass
class TRLRun:
    """A finished ``GRPOTrainer`` run."""

    trainer: Any
    log_history: list[dict[str, Any]] = field(repr=False)
    seconds: float = 0.0

    def release(self) -> None:
        """Let go of the finished run's model, optimizer and accelerator state (its args, state
        and log stay), so that its memory is reclaimed before the next model loads (the binder
        profile's 2 GB). Call it after the last use of ``trainer.model``."""

        t = self.trainer
        t.accelerator.free_memory()
        t.model = t.model_wrapped = t.optimizer = t.lr_scheduler = None
        t.callback_handler.model = t.callback_handler.optimizer = None
        gc.collect()

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
                 "loss": "loss", "grad_norm": "grad_norm", "frac_reward_zero_std": "frac_reward_zero_std",
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
        args = self.trainer.args
        per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps
        secs = sum(e["step_time"] for e in steps)
        tokens = sum(per_step * e.get("completions/mean_length", 0.0) for e in steps)
        return {"steps": len(steps), "s_per_step": secs / len(steps),
                "completions_per_s": per_step * len(steps) / secs, "tokens_per_s": tokens / secs}


def trim_heap_callback():
    """A ``TrainerCallback`` that hands the heap's free pages back after every optimizer step
    (:func:`grpo_course.infra.memory.trim_heap`; a no-op where freed memory is not given back)."""
    from transformers import TrainerCallback

    class TrimHeap(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            trim_heap()

    return TrimHeap()


def calculator_rollout(prompts: list, trainer) -> dict[str, list]:
    """TRL's ``rollout_func`` with GSM8K's calculator: one completion per prompt TRL passes (its
    sampler repeats each prompt G times, together), drawn from the course sampler with the tool on
    (:mod:`grpo_course.core.calculator`), a prompt's G drawn as one group (its prompt run once).

    Returns ``prompt_ids`` and ``completion_ids`` (one list of ids per completion), the sampler's
    ``logprobs`` and ``env_mask``: TRL's name for the tool mask in a
    rollout (1 where the model chose the token, 0 where the calculator wrote it). TRL multiplies
    it into the loss mask (``completion_mask * tool_mask``), as the course trainer does, so the
    tool's tokens are read by the forward pass and trained on by nothing. The seed follows the
    trainer's step, so a resumed run samples what an uninterrupted one does."""
    tok, args = trainer.processing_class, trainer.args
    texts = [p if isinstance(p, str) else
             tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    G = trainer.num_generations
    grouped = len(texts) % G == 0 and all(t == texts[i - i % G] for i, t in enumerate(texts))
    texts, G = (texts[::G], G) if grouped else (texts, 1)
    batch = sample_completions(trainer.model, tok, texts, G, args.max_completion_length,
                               args.temperature, args.top_p,
                               seed=args.seed * 1_000_003 + trainer.state.global_step,
                               sampling_dtype="auto", calculator=True)
    out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": []}
    for row in range(len(texts) * G):
        prompt = batch.prompt_ids[row // G][batch.prompt_mask[row // G].bool()]
        n = int(batch.completion_mask[row].sum())
        out["prompt_ids"].append(prompt.tolist())
        out["completion_ids"].append(batch.completion_ids[row, :n].tolist())
        out["logprobs"].append(batch.sampling_logps[row, :n].tolist())
        out["env_mask"].append(batch.tool_mask[row, :n].tolist())
    return out


def train_with_trl(cfg: GRPOConfig, output_dir: str | os.PathLike, model=None, tokenizer=None,
                   train_dataset=None, n_prompts: int | None = None, callbacks=None,
                   quiet: bool = True, **overrides: Any) -> TRLRun:
    """Train with ``trl.GRPOTrainer`` from the course config and return the run.

    ``model``/``tokenizer`` default to :func:`grpo_course.core.loading.load_model` (``cfg.model``);
    ``train_dataset`` defaults to :func:`trl_dataset` with just enough prompts for
    ``cfg.max_steps`` (or ``n_prompts``). With ``cfg.use_lora`` the model is wrapped
    by peft inside the trainer (``trainer.model`` is then a ``PeftModel``). With
    ``cfg.calculator`` TRL samples through :func:`calculator_rollout` (GSM8K's calculator in the
    sampler, its tokens out of TRL's loss by ``env_mask``).
    """
    from trl import GRPOTrainer

    if quiet:
        quiet_trl()
    args = grpo_config_from_course(cfg, output_dir, **overrides)
    if model is None:

        model, loaded_tok = load_model(cfg.model)
        tokenizer = tokenizer or loaded_tok
    if tokenizer is None:
        raise ConfigError("pass the tokenizer that goes with the model you pass")
    if train_dataset is None:
        n = n_prompts or max(1, args.max_steps) * cfg.prompts_per_step
        train_dataset = trl_dataset("train", n=n, offset=cfg.train_offset)
    funcs, _ = reward_funcs_from_course(cfg)
    model.train()
    # where freed memory is given back (every notebook; grpo_course.infra.memory.give_back_freed_memory)
    # the heap is trimmed after each step, as the course trainer does; elsewhere it does nothing
    callbacks = [*(callbacks or []), trim_heap_callback()]
    trainer = GRPOTrainer(model=model, reward_funcs=funcs, args=args,
                          train_dataset=train_dataset, processing_class=tokenizer,
                          peft_config=lora_config_from_course(cfg) if cfg.use_lora else None,
                          callbacks=callbacks,
                          rollout_func=calculator_rollout if cfg.calculator else None)
    if quiet:  # with disable_tqdm, transformers prints every log dict; the history keeps them
        from transformers.trainer_callback import PrinterCallback

        trainer.remove_callback(PrinterCallback)
    start = time.perf_counter()
    trainer.train()
    return TRLRun(trainer=trainer, log_history=list(trainer.state.log_history),
                  seconds=time.perf_counter() - start)


def save_adapter(run: TRLRun, adapter_dir: str | os.PathLike) -> Path:
    """Save the run's LoRA adapter (a few MB) to ``adapter_dir``; :func:`merge_adapter` puts it back
    on the weights the run started from."""
    model = run.trainer.model
    if not hasattr(model, "merge_and_unload"):
        raise ConfigError("this run trained the full model (no LoRA adapter to save and merge)")
    model.save_pretrained(str(adapter_dir))
    return Path(adapter_dir)


def merge_adapter(model, adapter_dir: str | os.PathLike):
    """``model`` with the adapter saved in ``adapter_dir`` merged into its weights (eval mode)."""
    from peft import PeftModel

    merged = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    merged.eval()
    return merged


# ----------------------------------------------------------------------------- the command line
#: the ``accelerate launch`` configs (package data): 2 CPU processes, 8 GPUs, DeepSpeed ZeRO-2
ACCELERATE_DIR = Path(str(resources.files("grpo_course") / "accelerate"))

VLLM_MODES = ("colocate", "server")


@dataclass
class TRLRunArguments(RunArguments):
    """``python -m grpo_course.topics.trl_bridge``'s run options (the GRPOConfig fields follow them)."""

    out: str | None = field(default=None, metadata={
        "help": "Run folder (required): the adapter, metrics.jsonl, config.yaml, and "
                "ranks/rank<R>.json (one per process: its steps and a digest of its adapter)."})
    warm_start: bool = field(default=False, metadata={
        "help": "Start from the shared SFT warm start (trained once and cached, as in chapters "
                "3-5) instead of the base model."})
    micro_batch: int | None = field(default=None, metadata={
        "help": "Completions each process passes through the model at a time (TRL's gradient "
                "accumulation): the same step in less memory. Must divide the process's share of "
                "per_step_completions. Default: its whole share at once."})
    bf16: bool = field(default=False, metadata={
        "help": "TRL's default precision: the model's weights in bf16 and bf16=True (on a CPU, "
                "fast only where bf16 is native: AVX512-BF16 or AMX). Default: fp32."})
    vllm_mode: str | None = field(default=None, metadata={
        "help": "colocate | server: generate with vLLM (TRL's use_vllm; a CUDA GPU and the vllm "
                "package). Default: transformers' generate."})


def distributed_world() -> tuple[int, int, int]:
    """``(rank, local_rank, world_size)`` of this process as ``accelerate launch`` (or
    ``torchrun``) sets them; ``(0, 0, 1)`` when run as a plain command."""
    env = os.environ
    return (int(env.get("RANK", 0)), int(env.get("LOCAL_RANK", 0)), int(env.get("WORLD_SIZE", 1)))


def per_device_batch(cfg: GRPOConfig, processes: int, accumulation: int = 1) -> int:
    """Completions each process trains on per micro-step, so that all processes together train
    ``cfg.per_step_completions`` per optimizer step (the course's step), checked before anything
    starts. TRL's batch rule (per-device batch x processes x accumulation divisible by G) then
    holds, because the course config already requires ``per_step_completions`` divisible by G."""
    if processes < 1 or accumulation < 1:
        raise ConfigError(f"processes and accumulation must be >= 1; got {processes}, {accumulation}")
    if cfg.per_step_completions % (processes * accumulation):
        raise ConfigError(f"per_step_completions {cfg.per_step_completions} does not split over "
                          f"{processes} processes x {accumulation} accumulation steps; use a "
                          f"multiple of {math.lcm(processes * accumulation, cfg.num_generations)}")
    return cfg.per_step_completions // (processes * accumulation)


def vllm_overrides(mode: str | None) -> dict[str, Any]:
    """TRL's vLLM fields for ``--vllm_mode`` (none without it); a clear error where it cannot run."""
    if mode is None:
        return {}
    if mode not in VLLM_MODES:
        raise ConfigError(f"--vllm_mode {mode!r}: choose one of {', '.join(VLLM_MODES)}")

    if not torch.cuda.is_available():
        raise ConfigError(f"--vllm_mode {mode}: vLLM generation needs a CUDA GPU; this machine has none")
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(f"--vllm_mode {mode}: the vllm package is not installed (pip install vllm)")
    return {"use_vllm": True, "vllm_mode": mode, "use_cpu": False}


def device_overrides() -> dict[str, Any]:
    """On a CUDA machine, TRL's own device and precision (GPU, bf16 where the GPU has it) instead
    of the CPU settings of :data:`FIXED_TRL_FIELDS`; nothing on a CPU."""

    if not torch.cuda.is_available():
        return {}
    return {"use_cpu": False, "bf16": torch.cuda.is_bf16_supported()}


def adapter_digest(model) -> str:
    """sha256 of the trainable weights (names and bytes): equal on every data-parallel rank."""

    h = hashlib.sha256()
    for name, p in sorted((n, p) for n, p in model.named_parameters() if p.requires_grad):
        h.update(name.encode())
        h.update(p.detach().float().contiguous().numpy().tobytes())
    return h.hexdigest()


def launch_command(processes: int, out: str | os.PathLike, *flags: str,
                   accelerate_config: str | os.PathLike | None = None) -> list[str]:
    """The command line that trains with TRL on ``processes`` processes: ``python -m
    grpo_course.topics.trl_bridge`` for one, ``accelerate launch --config_file ...`` for more (the
    course's 2-process CPU config unless ``accelerate_config`` names another)."""

    if processes < 1:
        raise ConfigError(f"processes must be >= 1; got {processes}")
    script = ["-m", "grpo_course.topics.trl_bridge", "--out", str(out), *flags]
    if processes == 1:
        return [sys.executable, *script]
    config = accelerate_config or ACCELERATE_DIR / "cpu_2proc.yaml"
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config),
            "--num_processes", str(processes), *script]


def shell_line(command: Sequence[str]) -> str:
    """A :func:`launch_command` as a student types it (``python -m ...``, ``accelerate launch ...``)."""

    words = [str(w) for w in command[1:]]
    if words[:2] == ["-m", "accelerate.commands.launch"]:
        words = ["accelerate", "launch", *words[2:]]
    else:
        words = ["python", *words]
    return " ".join(shlex.quote(w) for w in words)


def launch(command: Sequence[str], cwd: str | os.PathLike | None = None) -> dict[str, Any]:
    """Run a :func:`launch_command`, passing its progress bar and messages through to stderr, and
    return its JSON line; a failed run raises a ``RuntimeError`` with the end of its output."""

    # the children's datasets bars (TRL maps its data set in every process) are noise beside TRL's own
    env = {**os.environ, "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}
    with tempfile.TemporaryFile("w+") as stdout:
        proc = subprocess.Popen(list(command), stdout=stdout, stderr=subprocess.PIPE, text=True, cwd=cwd,
                                env=env)
        tail = ""
        for chunk in iter(lambda: proc.stderr.read(256), ""):
            sys.stderr.write(chunk)
            tail = (tail + chunk)[-2000:]
        if proc.wait() != 0:
            raise RuntimeError(f"{' '.join(map(str, command))} failed with status {proc.returncode}: "
                               + " ".join(tail.split()[-60:]))
        stdout.seek(0)
        return json.loads(stdout.read().strip().splitlines()[-1])


def process_overrides(cfg: GRPOConfig, args, world: int) -> dict[str, Any]:
    """The ``GRPOConfig`` arguments of this process: the device's and vLLM's settings, and its
    share of each step's completions in micro-batches of ``--micro_batch`` (gradient
    accumulation over them gives the same step)."""
    overrides: dict[str, Any] = {**device_overrides(), **vllm_overrides(args.vllm_mode)}
    if args.bf16:
        overrides["bf16"] = True
    share = per_device_batch(cfg, world)
    micro = args.micro_batch or share
    if micro < 1 or share % micro:
        raise ConfigError(f"--micro_batch {args.micro_batch} must divide this process's "
                          f"{share} completions per step")
    overrides["per_device_train_batch_size"] = micro
    overrides["gradient_accumulation_steps"] = share // micro
    overrides["disable_tqdm"] = False                # TRL's progress bar (the main process's)
    overrides["ddp_find_unused_parameters"] = False  # LoRA: every trainable weight gets a gradient
    return overrides


def main(argv: list[str] | None = None) -> int:
    """``python -m grpo_course.topics.trl_bridge``: train with ``trl.GRPOTrainer`` from the course config.

    The same flags as ``python -m grpo_course.core.train`` (every GRPOConfig field, ``--profile``,
    ``--config``), plus ``--warm_start``, ``--micro_batch``, ``--bf16`` and ``--vllm_mode``. Under ``accelerate launch
    --num_processes N`` it trains data-parallel (gloo on a CPU): each process takes its share of
    the cores and of each step's completions. Ends with one JSON line (rank 0)."""
    rank, local_rank, world = distributed_world()
    try:
        args, cfg, profile = parse_train_args(argv, TRLRunArguments, "python -m grpo_course.topics.trl_bridge")
        out = run_folder(args.out)
        overrides = process_overrides(cfg, args, world)
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        threads = set_threads(share_cores(local_rank, local_world))   # its own cores, one thread each
        quiet_loading()
        train_dataset = trl_dataset("train", n=max(1, cfg.max_steps) * cfg.prompts_per_step,
                                    offset=cfg.train_offset)
        if args.warm_start:
            from accelerate import PartialState

            # the main process trains the warm start once (or finds it cached); the others wait
            with PartialState(cpu=overrides.get("use_cpu", True)).main_process_first():
                source = warm_start(cfg, load_gsm8k("train"), verbose=rank == 0)
        else:
            source = cfg.model
        model, tokenizer = load_model(source, dtype=torch.bfloat16 if args.bf16 else torch.float32)
    except (ValueError, RuntimeError, OSError) as exc:   # ConfigError, DataError, ModelError
        return report(exc)
    try:
        run = train_with_trl(cfg, out, model=model, tokenizer=tokenizer,
                             train_dataset=train_dataset, **overrides)
        steps = run.trainer.state.global_step
        backend = (torch.distributed.get_backend() if torch.distributed.is_initialized() else "none")
        record = {"rank": rank, "world_size": world, "backend": backend, "threads": threads, "steps": steps,
                  "seconds": run.seconds, "adapter_sha256": adapter_digest(run.trainer.model)}
        write_text_atomic(out / "ranks" / f"rank{rank}.json", json.dumps(record) + "\n")
        run.trainer.save_model(str(out))                 # every rank calls it; the main one writes
        if rank == 0:
            write_run(out, cfg, run.metrics_rows(), profile, trainer="trl")
    except (CourseError, OSError) as exc:
        return report(exc)
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
        return 130
    if rank == 0:
        completions = steps * cfg.per_step_completions
        print(json.dumps({"out": str(out), "trainer": "trl", "steps": steps, "world_size": world,
                          "backend": backend, "device": str(run.trainer.args.device),
                          "threads_per_process": threads, "seconds": round(run.seconds, 2),
                          "completions_per_s": round(completions / run.seconds, 4),
                          "per_process_completions_per_s": round(completions / world / run.seconds, 4),
                          # TRL's own time of each step (the run's set-up left out)
                          "step_seconds": [round(e["step_time"], 3) for e in run.steps if e.get("step_time")],
                          "adapter_sha256": record["adapter_sha256"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
