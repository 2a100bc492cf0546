"""Configs and the three run profiles (``smoke`` for CI, ``full`` for students, ``binder``).

Every size a notebook uses comes from :func:`get_profile`, chosen by the
environment variable ``GRPO_COURSE_PROFILE`` (``smoke`` | ``full`` | ``binder``, default
``full``, or ``binder`` under 4 GiB). Notebooks never edit sizes in cells.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin, get_type_hints

import yaml

from grpo_course.infra import hardware
from grpo_course.infra.errors import CourseError

PROFILE_ENV = "GRPO_COURSE_PROFILE"
PROFILE_NAMES = ("smoke", "full", "binder")
DEFAULT_MODEL = "smollm2-135m-instruct"
SAMPLING_DTYPES = ("auto", "float32", "bfloat16")   # GRPOConfig.sampling_dtype (see sampling)
WHOLE = "whole"          # GRPOConfig.start_mix: the whole problem (no gold line given)
PROMPT_ORDERS = ("random", "easy_first", "sequential")   # GRPOConfig.prompt_order
PROMPT_POOLS = ("all", "mixed")                          # GRPOConfig.prompt_pool
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")         # GRPOConfig.loss_type (core.grpo computes each)
SCALES = ("group", "batch", "none")                      # GRPOConfig.scale_rewards


class ConfigError(CourseError, ValueError):
    """A configuration that cannot work (raised with one readable message)."""


@dataclass(frozen=True)
class EvalConfig:
    """Held-out evaluation sizes."""

    n: int = 256                # held-out test problems
    batch_size: int = 32        # prompts decoded together
    max_new_tokens: int = 256   # greedy completion budget
    sampling_dtype: str = "auto"  # decoder weights: auto (bf16 on bf16-capable CPUs) | float32 | bfloat16

    def __post_init__(self) -> None:
        if self.n <= 0 or self.batch_size <= 0 or self.max_new_tokens <= 0:
            raise ConfigError(f"EvalConfig sizes must be positive, got {self}")
        if self.sampling_dtype not in SAMPLING_DTYPES:
            raise ConfigError(f"sampling_dtype must be one of {', '.join(SAMPLING_DTYPES)}; "
                              f"got {self.sampling_dtype!r}")


@dataclass(frozen=True)
class GRPOConfig:
    """The from-scratch trainer's hyper-parameters, with TRL's names where TRL has the field.

    Each field is a flag of ``python -m grpo_course.core.train`` and a key of a YAML recipe, and its
    ``help`` is the reference: what it does, where it comes from (a paper or TRL's docs) and the
    value recommended there. The fields are grouped by topic, as in TRL's ``GRPOConfig``:

    > The model and its adapters
    > The algorithm (GRPO: Shao et al. 2024, arXiv 2402.03300)
    > Sampling
    > The course's levers (each a field of chapter 3's recipes)
    > The CPU's precision and memory
    > The supervised warm-up (the course trainer only)
    > The run and its logs

    ``loss_type`` decides how the token losses are averaged, and with it a length bias: ``grpo``
    averages each completion's tokens, then the completions, so a token of a short completion weighs
    more (short right answers are pushed hardest, long wrong ones least: Dr. GRPO, Liu et al. 2025,
    arXiv 2503.20783); ``bnpo`` and ``dapo`` average over every token of the batch or the step, each
    token alike (TRL's default is ``dapo``); ``dr_grpo`` divides the sum by the constant
    B × ``max_completion_length``. :mod:`grpo_course.core.grpo` computes each.
    """

    _argument_group_name = "GRPOConfig (TRL's names; each a flag and a YAML key)"  # for --help

    # ---------------------------------------------------------------- the model and its adapters
    model: str = field(default=DEFAULT_MODEL, metadata={
        "help": "Policy to train: the bundled name, a model or adapter folder, or a hub id."})
    use_lora: bool = field(default=True, metadata={
        "help": "Train LoRA adapters (peft; Hu et al. 2022, arXiv 2106.09685) instead of every "
                "weight: the optimizer keeps state for the adapters alone."})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank."})
    lora_alpha: int = field(default=32, metadata={
        "help": "LoRA scaling numerator (scale = alpha / r)."})
    lora_dropout: float = field(default=0.0, metadata={"help": "Dropout on the LoRA input."})
    lora_target_modules: tuple[str, ...] = field(
        default=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        metadata={"help": "Modules that get adapters (space-separated names): every linear layer "
                          "of attention and MLP, as the QLoRA paper recommends (arXiv 2305.14314)."})

    # ---------------------------------------------------------------- the algorithm
    num_generations: int = field(default=4, metadata={
        "help": "G: completions sampled per prompt (the group whose mean reward is the baseline). "
                "DeepSeekMath sampled 64; TRL's default is 8."})
    per_step_completions: int = field(default=8, metadata={
        "help": "B: completions per optimizer step; prompts per step = B / G."})
    max_steps: int = field(default=40, metadata={"help": "GRPO optimizer steps of the run."})
    learning_rate: float = field(default=2e-4, metadata={
        "help": "AdamW learning rate of GRPO. TRL's default, 1e-6, is a full fine-tune's; LoRA's "
                "best rate is about ten times a full fine-tune's (Schulman et al. 2025, \"LoRA "
                "Without Regret\")."})
    beta: float = field(default=0.0, metadata={
        "help": "KL weight; 0 keeps no reference model in memory. TRL's default is 0, as in DAPO "
                "and Dr. GRPO; DeepSeek-R1 used 0.001, DeepSeekMath 0.04."})
    epsilon_low: float = field(default=0.2, metadata={
        "help": "Lower clipping bound of the ratio (1 - epsilon_low); TRL's epsilon, 0.2 as in PPO."})
    epsilon_high: float | None = field(default=None, metadata={
        "help": "Upper clipping bound of the ratio (1 + epsilon_high); none: same as epsilon_low. "
                "DAPO's clip-higher recommends 0.28 (arXiv 2503.14476)."})
    loss_type: str = field(default="grpo", metadata={
        "help": f"How token losses are averaged: {' | '.join(LOSS_TYPES)} (the length bias of each: "
                f"the class docstring). TRL's default is dapo."})
    scale_rewards: str = field(default="group", metadata={
        "help": f"Advantage scaling by the reward std: {' | '.join(SCALES)}. group is GRPO's; Dr. "
                f"GRPO recommends none (dividing by a group's std weighs too-easy and too-hard "
                f"questions up)."})
    num_iterations: int = field(default=1, metadata={
        "help": "mu: optimizer updates per sampled batch (the ratio leaves 1 after the first). "
                "GRPO's and TRL's default is 1."})
    max_grad_norm: float = field(default=1.0, metadata={"help": "Gradient clipping norm (TRL's default)."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay."})
    reward_weights: dict[str, float] = field(default_factory=lambda: {
        "correctness": 1.0, "exact_format": 0.5, "number_extraction": 0.5}, metadata={
        "help": "Reward functions and their weights; a JSON object on the command line, "
                "e.g. '{\"correctness\": 1.0}'."})

    # ---------------------------------------------------------------- sampling
    max_completion_length: int = field(default=128, metadata={
        "help": "Most new tokens sampled per completion."})
    temperature: float = field(default=1.0, metadata={
        "help": "Sampling temperature (TRL's default, 1.0: the policy's own distribution, which the "
                "ratio assumes)."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling: keep this much probability mass."})
    calculator: bool = field(default=False, metadata={
        "help": "GSM8K's calculator (Cobbe et al. 2021; nanochat): SFT targets and gold starts keep "
                "the <<48/2=24>> annotations, and every sampler call of the run (training, pool "
                "screening) lets the tool write the result where an annotation reaches '='. The "
                "tool's tokens leave the loss (TRL's tool_mask), in SFT and in GRPO."})
    generation_batch_size: int | None = field(default=None, metadata={
        "help": "Completions sampled per sampling round (a multiple of G); none: "
                "per_step_completions. With dynamic sampling, more than a step trains on: "
                "sampling is cheaper than the training pass, so sample wide and train on the "
                "informative groups."})

    # ---------------------------------------------------------------- the course's levers
    mask_truncated_completions: bool = field(default=False, metadata={
        "help": "Completions cut off by max_completion_length add no loss (DAPO's overlong "
                "filtering, which it recommends for stability; TRL's default is off)."})
    dynamic_sampling: bool = field(default=False, metadata={
        "help": "DAPO: resample until the step holds enough groups with unequal rewards."})
    max_sampling_rounds: int = field(default=4, metadata={
        "help": "Cap on dynamic sampling's rounds per step."})
    dynamic_sampling_reward: str | None = field(default=None, metadata={
        "help": "Dynamic sampling keeps a group when this reward function's values differ in it "
                "(DAPO filters on accuracy: 'correctness'); computed with weight 0 when "
                "reward_weights leaves it out; none: the weighted total reward."})
    prompt_order: str = field(default="random", metadata={
        "help": f"{' | '.join(PROMPT_ORDERS)}: easy_first (basic -> intermediate -> advanced, "
                f"chapter 1's strata) is a curriculum (Bengio et al. 2009); sequential is the data "
                f"set's own order (TRL's shuffle_dataset=False)."})
    lines_left: int | None = field(default=None, metadata={
        "help": "Reverse-curriculum start (R3): each GRPO prompt's answer begins with its gold "
                "solution's work lines but the last K, and the model writes those K lines and "
                "the '#### N' line; a problem with K or fewer lines starts whole; none: whole "
                "problems."})
    start_mix: tuple[str, ...] = field(default=(), metadata={
        "help": "R3's mix of starts (arXiv 2402.05808): GRPO's prompts are every training "
                "problem at each of these starts, shuffled into one order: 'whole' (no gold line "
                "given) or K (the gold work lines but the last K given), e.g. whole 1 2 3; a start "
                "a problem has not (too few lines, or the same text as another) is left out. "
                "Empty: every prompt at lines_left's start. max_completion_length must leave "
                "room for the longest start (whole problems)."})
    prompt_pool: str = field(default="all", metadata={
        "help": f"{' | '.join(PROMPT_POOLS)}: mixed is a balanced prompt pool (arXiv 2504.03380). "
                f"Once, at the run's start, the warm start samples pool_samples answers to each of "
                f"the first pool_prompts prompts of GRPO's order, and GRPO then trains only on the "
                f"prompts it solved sometimes (a right-answer rate strictly between 0 and 1), whose "
                f"groups are the ones whose correctness reward teaches."})
    pool_prompts: int = field(default=512, metadata={
        "help": "Prompts the mixed pool screens (the first of GRPO's order; the warm-up draws "
                "its rows from the order's other end)."})
    pool_samples: int | None = field(default=None, metadata={
        "help": "Samples per screened prompt; none: num_generations."})

    # ---------------------------------------------------------------- the CPU's precision and memory
    # (the course trainer only, but gradient_checkpointing: the TRL bridge runs TRL in fp32)
    sampling_dtype: str = field(default="auto", metadata={
        "help": "Sampler weights: auto (bf16 on bf16-capable CPUs) | float32 | bfloat16."})
    train_dtype: str = field(default="auto", metadata={
        "help": "GRPO training pass: auto (bf16 autocast on bf16-capable CPUs) | float32 | bfloat16."})
    train_micro_batch: int | None = field(default=None, metadata={
        "help": "Completions per forward/backward pass of the GRPO training pass, in whole "
                "groups (rounded down to a multiple of G, at least one group); none: every "
                "trained completion at once. The same update "
                "(the loss of each pass is weighed by its share of the batch), with the "
                "activations of fewer rows in memory at a time. TRL's gradient accumulation."})
    gradient_checkpointing: bool = field(default=False, metadata={
        "help": "Activation checkpointing in the training pass: keep only each layer's input and "
                "recompute the rest in the backward pass (less memory, one more forward). Both "
                "trainers; TRL's default is on."})

    # ---------------------------------------------------------------- the supervised warm-up
    # (the course trainer only)
    sft_steps: int = field(default=0, metadata={
        "help": "Supervised warm-up steps on GSM8K train solutions before GRPO."})
    sft_batch_size: int = field(default=8, metadata={"help": "Solutions per warm-up step."})
    sft_save_every: int = field(default=0, metadata={
        "help": "Warm-up steps between a checkpoint and a kept adapter snapshot, DIR/sft_steps/<step> "
                "(a long warm-up resumes from the last; validation chooses among them); 0: none."})
    sft_learning_rate: float = field(default=5e-4, metadata={"help": "AdamW learning rate of the warm-up."})
    sft_dtype: str = field(default="auto", metadata={
        "help": "Warm-up matmuls: auto (bf16 autocast on bf16-capable CPUs) | float32 | bfloat16."})

    # ---------------------------------------------------------------- the run and its logs
    train_offset: int = field(default=0, metadata={"help": "First GSM8K train row used."})
    seed: int = field(default=0, metadata={"help": "Seed of the prompt order, LoRA init and sampling."})
    save_every: int = field(default=0, metadata={
        "help": "Steps between checkpoints; 0: only at the end (and on Ctrl-C)."})
    snapshot_every: int = field(default=0, metadata={
        "help": "Steps between kept adapter snapshots, DIR/steps/<step> (a learning curve tests "
                "them); 0: none."})
    report_to: str = field(default="none", metadata={
        "help": "none | trackio: also log every step to trackio, offline (pip install trackio; "
                "open the dashboard with `trackio show`). TRL's name."})
    log_every: int = field(default=1, metadata={
        "help": "The TRL bridge only: steps between TRL's logged rows (its logging_steps). The "
                "course trainer logs every step."})

    def __post_init__(self) -> None:
        check_group_config(self.num_generations, self.per_step_completions)
        if self.max_completion_length <= 0:
            raise ConfigError(
                f"max_completion_length must be > 0, got {self.max_completion_length}")
        if self.loss_type not in LOSS_TYPES:
            raise ConfigError(f"loss_type must be one of {', '.join(LOSS_TYPES)}; got {self.loss_type!r}")
        if self.scale_rewards not in SCALES:
            raise ConfigError(f"scale_rewards must be one of {', '.join(SCALES)}; got {self.scale_rewards!r}")
        for name in ("sampling_dtype", "sft_dtype", "train_dtype"):
            if getattr(self, name) not in SAMPLING_DTYPES:
                raise ConfigError(f"{name} must be one of {', '.join(SAMPLING_DTYPES)}; "
                                  f"got {getattr(self, name)!r}")
        if self.sft_save_every < 0:
            raise ConfigError(f"sft_save_every must be >= 0; got {self.sft_save_every}")
        if self.max_steps < 0 or self.sft_steps < 0:
            raise ConfigError(f"max_steps and sft_steps must be >= 0; got max_steps="
                              f"{self.max_steps}, sft_steps={self.sft_steps}")
        if self.num_iterations < 1 or self.max_sampling_rounds < 1:
            raise ConfigError(f"num_iterations and max_sampling_rounds must be >= 1; got "
                              f"{self.num_iterations} and {self.max_sampling_rounds}")
        if self.prompt_order not in PROMPT_ORDERS:
            raise ConfigError(f"prompt_order must be one of {', '.join(PROMPT_ORDERS)}; "
                              f"got {self.prompt_order!r}")
        if self.generation_batch_size is not None:
            check_group_config(self.num_generations, self.generation_batch_size)
            if self.generation_batch_size < self.per_step_completions:
                raise ConfigError(f"generation_batch_size ({self.generation_batch_size}) must be at "
                                  f"least per_step_completions ({self.per_step_completions})")
        if self.train_micro_batch is not None and self.train_micro_batch < 1:
            raise ConfigError(f"train_micro_batch must be >= 1 (or none); got {self.train_micro_batch}")
        if self.lines_left is not None and self.lines_left < 1:
            raise ConfigError(f"lines_left must be >= 1 (or none: whole problems); got {self.lines_left}")
        if self.start_mix:
            bad = [s for s in self.start_mix
                   if s != WHOLE and not (isinstance(s, str) and s.isdigit() and int(s) >= 1)]
            if bad:
                raise ConfigError(f"start_mix entries must be '{WHOLE}' or a whole number of lines "
                                  f"left >= 1; got {bad[0]!r}")
            if len(set(self.start_mix)) < len(self.start_mix):
                raise ConfigError(f"start_mix names a start twice: {' '.join(self.start_mix)}")
            if self.lines_left is not None:
                raise ConfigError(f"start_mix ({' '.join(self.start_mix)}) and lines_left "
                                  f"({self.lines_left}) both set the start: set one")
        if self.prompt_pool not in PROMPT_POOLS:
            raise ConfigError(f"prompt_pool must be one of {', '.join(PROMPT_POOLS)}; "
                              f"got {self.prompt_pool!r}")
        if self.pool_prompts < 1 or (self.pool_samples is not None and self.pool_samples < 2):
            raise ConfigError(f"pool_prompts must be >= 1 and pool_samples >= 2 (or none); got "
                              f"{self.pool_prompts} and {self.pool_samples}")
        if self.save_every < 0 or self.snapshot_every < 0:
            raise ConfigError(f"save_every and snapshot_every must be >= 0; got {self.save_every} "
                              f"and {self.snapshot_every}")
        if self.report_to not in ("none", "trackio"):
            raise ConfigError(f"report_to must be none or trackio; got {self.report_to!r}")

    @property
    def starts(self) -> list[int | None]:
        """The starts GRPO trains at, as ``lines_left`` values (``None``: the whole problem)."""
        if not self.start_mix:
            return [self.lines_left]
        return [None if s == WHOLE else int(s) for s in self.start_mix]

    @property
    def prompts_per_step(self) -> int:
        return self.per_step_completions // self.num_generations

    @property
    def prompts_per_round(self) -> int:
        """Prompts sampled per sampling round (``generation_batch_size / G``)."""
        return (self.generation_batch_size or self.per_step_completions) // self.num_generations


def check_group_config(num_generations: int, batch_completions: int) -> None:
    """Raise :class:`ConfigError` unless ``batch_completions`` splits into groups of G >= 2."""
    if num_generations < 2:
        raise ConfigError(
            f"num_generations (G) must be >= 2: GRPO's baseline is the mean of a group, "
            f"and a group of {num_generations} has no spread; got {num_generations}")
    if batch_completions <= 0 or batch_completions % num_generations:
        raise ConfigError(
            f"the batch of {batch_completions} completions is not divisible by "
            f"num_generations={num_generations}; use a multiple of {num_generations}")


# ---------------------------------------------------------------- recipes and run configs
#: the recipes (package data; ``recipes/`` at the top of the checkout points here)
RECIPES_DIR = Path(str(resources.files("grpo_course") / "recipes"))
_TRUE, _FALSE = ("true", "yes", "y", "1"), ("false", "no", "n", "0")


def _describe(kind: Any) -> str:
    """A field type in words, for error messages."""
    if get_origin(kind) in (Union, UnionType):
        inner = [a for a in get_args(kind) if a is not type(None)]
        return f"{_describe(inner[0])} or none"
    if get_origin(kind) is tuple:
        return "a list of strings"
    if get_origin(kind) is dict:
        return "a mapping of names to numbers (a JSON object on the command line)"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}[kind]


def _coerce(kind: Any, value: Any) -> Any:
    """``value`` as type ``kind``; ValueError when it is not one."""
    origin = get_origin(kind)
    if origin in (Union, UnionType):
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None
        return _coerce(next(a for a in get_args(kind) if a is not type(None)), value)
    if origin is tuple:
        # YAML reads "[whole, 1, 2]" with numbers: words and whole numbers are all names here
        if isinstance(value, (list, tuple)) and all(
                isinstance(v, str) or (isinstance(v, int) and not isinstance(v, bool)) for v in value):
            return tuple(str(v) for v in value)
        raise ValueError
    if origin is dict:
        value = json.loads(value) if isinstance(value, str) else value
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise ValueError
        return {k: _coerce(float, v) for k, v in value.items()}
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
            return value.lower() in _TRUE
        raise ValueError
    if isinstance(value, bool):             # YAML's true is no integer here
        raise ValueError
    if kind is int and isinstance(value, (int, str)):
        return int(value)
    if kind is float and isinstance(value, (int, float, str)):
        return float(value)
    if kind is str and isinstance(value, str):
        return value
    raise ValueError


def coerce_field(name: str, value: Any) -> Any:
    """``value`` (from YAML, JSON or a flag) as the type of GRPOConfig field ``name``: YAML's
    ``1e-4`` string becomes a float, a list of modules a tuple, a JSON object a dict."""
    kinds = get_type_hints(GRPOConfig)
    if name not in kinds:
        raise ConfigError(f"unknown GRPOConfig field {name!r} "
                          f"(python -m grpo_course.core.train --help lists them)")
    try:
        return _coerce(kinds[name], value)
    except (ValueError, TypeError):
        raise ConfigError(f"{name} must be {_describe(kinds[name])}; got {value!r}") from None


def load_recipe(path: str | os.PathLike, extra_keys: tuple[str, ...] = ()) -> dict[str, Any]:
    """The GRPOConfig fields of a YAML recipe, typed (keys in ``extra_keys`` pass unchanged).
    ``recipes/<name>.yaml`` that is not a file here names the course's own recipe (the checkout's
    ``recipes/`` is ``grpo_course/recipes/``), so the commands a page prints run from any folder."""
    path = Path(path)
    if not path.is_file() and path.parent == Path("recipes") and (RECIPES_DIR / path.name).is_file():
        path = RECIPES_DIR / path.name
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"recipe {str(path)!r} cannot be read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise ConfigError(f"recipe {str(path)!r} is not valid YAML{where}: {problem}") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"recipe {str(path)!r} must be a mapping of GRPOConfig fields to "
                          f"values; got {type(raw).__name__}")
    try:
        return {k: v if k in extra_keys else coerce_field(str(k), v) for k, v in raw.items()}
    except ConfigError as exc:
        raise ConfigError(f"recipe {str(path)!r}: {exc}") from None


def config_to_dict(config: GRPOConfig) -> dict[str, Any]:
    """Every field of ``config`` as plain YAML/JSON values (tuples become lists)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(config).items()}


@dataclass(frozen=True)
class DataSizes:
    """Chapter 1 (GSM8K prep)."""
    n_inspect: int = 2000            # rows for the length histograms
    n_demo: int = 3                  # problems answered live


@dataclass(frozen=True)
class RewardSizes:
    """Chapter 2 (rewards): the samples behind the reward distributions (G = grpo.num_generations)."""
    prompts: int = 8                 # prompts sampled
    max_new_tokens: int = 160        # completion budget of those samples


@dataclass(frozen=True)
class LoopSizes:
    """Chapter 3: your GRPO loop (written out in the notebook),
    run twice from the warm start: as the profile's recipe runs (beta = 0, one update per batch)
    and with a KL term and batch reuse."""
    steps: int = 6                   # steps of the first run (the profile's beta and mu)
    kl_steps: int = 4                # steps of the second run (beta > 0, mu > 1)
    prompts: int = 1                 # prompts per step (G completions each)
    pool: int = 8                    # basic training problems the loop cycles through
    beta: float = 0.04               # the second run's beta (DeepSeekMath's)
    num_iterations: int = 2          # the second run's updates per batch (mu)
    changes: dict[str, Any] = field(default_factory=dict)   # GRPOConfig changes for the loop


@dataclass(frozen=True)
class TRLSizes:
    """Chapter 4 (TRL's GRPOTrainer); the rest of the run uses ``grpo`` and ``eval``."""
    max_steps: int = 12              # optimizer steps of each trainer (the page's 15 minutes hold
                                     # both trainers' runs, the 2-process run and the evaluations)
    eval_n: int = 128                # held-out problems per model (the warm start's are reused
                                     # from chapter 3's cached evaluation)
    ddp_steps: int = 3               # steps of the 2-process TRL run (0: skipped)
    dtype: str = "auto"              # TRL's weights: auto: bf16 weights and bf16=True (TRL's
                                     # default precision) where the CPU has native bf16, else
                                     # fp32; or float32 (and bf16=False)
    micro_batch: int | None = None   # completions per forward/backward pass of TRL's step
                                     # (gradient accumulation; None: the whole step at once),
                                     # like GRPOConfig.train_micro_batch


#: what chapter 5's stages take from the main run's start (:attr:`Profile.curriculum_run`): its
#: rewards, DAPO's filter and its order of prompts. A field the main run gains stays out until it
#: is named here (its start, budget and pool never come in: each stage has its own).
CURRICULUM_TAKES = ("reward_weights", "mask_truncated_completions", "dynamic_sampling_reward",
                    "max_sampling_rounds", "prompt_order")


@dataclass(frozen=True)
class CurriculumSizes:
    """Chapter 5: R3's reverse curriculum (its stages each tested on their own start), a shuffled
    control and EWC. GRPO steps: :attr:`Profile.curriculum_run`."""
    steps_per_stage: int = 3                     # GRPO steps per stage
    learning_rate: float = 1e-3                  # a larger step than chapter 3's recipe: short
                                                 # stages must move the policy (the chapter tests it)
    max_completion_length: int = 96             # completion budget while training
    stage_problems: int = 32                     # training problems (the same at every start)
    eval_offset: int = 512                       # held-out test problems from this row...
    eval_n: int = 64                             # ... this many, each stage's task (paired): two
                                                 # batches of the evaluation's 32, as nine evaluations
                                                 # and eight stages fit the page's 15 minutes
    budgets: tuple[int, ...] = (64, 112, 200)    # greedy budget at each start (1, 2 lines, whole)
    fisher_prompts: int = 8                      # stage-1 problems for the Fisher
    lam: float = 1e4                             # EWC strength
    live_problems: int = 8                       # the curriculum run's sampled test (b): first rows
                                                 # sampled again live, a multiple of 4 (0: none)


@dataclass(frozen=True)
class QuantSizes:
    """Chapter 6 (INT8): logits agreement, decode timing, held-out evaluation of each variant."""
    agreement_prompts: int = 16          # GSM8K test prompts for fp32-vs-INT8 logits
    # the same for torchao, whose CPU int8 matmul is slow: 8 prompts, so that the interval of its
    # cosine change over prompts has 7 degrees of freedom
    torchao_prompts: int = 8
    last_k: int = 16                     # compared positions at the end of each prompt
    # timed batches: one sequence, and the evaluation's batch (EvalConfig.batch_size), where the
    # chapter's held-out evaluations decode and where INT8 has to beat the fastest decoder
    batch_sizes: tuple[int, ...] = (1, 32)
    decode_tokens: int = 32              # new tokens per timing run
    # torchao's prefill costs about the same per token at any batch on a CPU without int8 dot
    # products, so a timing at the evaluation's batch would cost minutes of prefill: it is timed
    # at 8, and the page estimates its evaluation from that timing's prefill and decoding rate
    torchao_batch_sizes: tuple[int, ...] = (1, 8)
    torchao_decode_tokens: int = 4
    eval_n: int = 192                    # held-out problems per evaluation (four of them, paired)
    policy_steps: int = 6                # GRPO steps of the policy trained here when chapter 3's
                                         # is not in the cache (its recipe, from the warm start)


@dataclass(frozen=True)
class ProfilingSizes:
    """Chapter 7 (CPU profiling); the profiled step itself uses ``grpo``."""
    steps: int = 2                                   # timed trainer steps (after one warm-up)
    threads: tuple[int, ...] = (1, 2, 3, 4)          # thread counts for the scaling runs
    scaling_length: int = 32                         # completion budget of the scaling step
    matmul_n: int = 2048                             # square matmul for peak GFLOP/s
    copy_mib: int = 256                              # tensor copied for the bandwidth
    lever_length: int = 32                           # completion budget of the lever steps
    lever_generations: tuple[int, ...] = (2, 4, 8)
    lever_lengths: tuple[int, ...] = (32, 64, 128)
    nocache_tokens: int = 32                         # budget of the KV-cache lever
    trace_step: dict[str, Any] = field(default_factory=dict)   # GRPOConfig changes for the step
                                                     # torch.profiler records (it keeps every event
                                                     # in memory, thousands of events per step)
    full_finetune: bool = True                       # time a full fine-tuning step beside LoRA (its
                                                     # gradients and AdamW moments of every weight)
    logits_completions: int | None = None            # completions in the all-position-logits pass
                                                     # (None: all)


#: Completion budget at a reverse-curriculum start (lines_left -> new tokens): room for the lines
#: left and the answer line; whole problems use the evaluation's budget (``EvalConfig``).
START_BUDGETS: dict[int, int] = {1: 64, 2: 112}


@dataclass(frozen=True)
class StartSizes:
    """Chapter 3's live run and its held-out tests at the reverse-curriculum start: the recipe's
    changes on top of the profile's ``grpo`` (``recipes/reverse_curriculum.yaml``, the start that
    ``bench/headroom.py`` picks), the held-out test slices whose first problems the pass@k curves
    sample before and after the run (paired), and the whole problems of the three-model test."""
    changes: dict[str, Any] = field(default_factory=lambda: dict(REVERSE_CURRICULUM))
    slices: tuple[tuple[int, int], ...] = ((512, 768), (768, 1024))   # test rows [start, end)
    samples: int = 16                    # samples per problem of the pass@k curves (k <= samples)
    pass_k_problems: int = 12            # first problems of each slice in the pass@k curves
    sample_prompts: int = 8              # problems whose samples are decoded together (each key/
                                         # value cache holds sample_prompts x samples sequences)
    whole_problems: int = 128            # first test problems of chapter 3's whole-problem test (the
                                         # base model's and the warm start's come from chapters 1-2's
                                         # evaluations of P.eval.n, cached a block at a time)


@dataclass(frozen=True)
class ReferenceSizes:
    """The reference run's tests (:mod:`grpo_course.measure.reference`). ``slices``/``samples``/``transfer``
    are the test fixed in advance (``bench/reference_test.py`` runs it); chapter 3's second page
    recomputes the first ``live_problems`` problems of each slice live (same seed and blocks, so
    the same answers on the same kind of machine) and checks them against the benchmark's."""
    slices: tuple[tuple[int, int], ...] = ((512, 768), (768, 1024))   # test rows [start, end)
    samples: int = 8                     # samples per problem (temperature 1)
    transfer: bool = True                # also the greedy transfer to two lines left and whole problems
    live_problems: int = 16              # first problems of each slice the page samples again (0:
                                         # none, the page shows the benchmark's numbers alone)


@dataclass(frozen=True)
class ShortRunSizes:
    """Chapters 4 and 5 train shorter runs than chapter 3, with smaller steps (see
    :meth:`Profile.short_run`)."""
    num_generations: int = 4             # G
    per_step_completions: int = 8        # completions per step
    num_iterations: int = 1              # updates per sampled batch


@dataclass(frozen=True)
class Profile:
    """All sizes of one profile: the evaluation and the GRPO recipe every chapter shares, then one
    section per chapter (``P.quant.eval_n`` is chapter 6's held-out problems)."""

    name: str
    eval: EvalConfig
    grpo: GRPOConfig
    data: DataSizes = field(default_factory=DataSizes)               # chapter 1
    rewards: RewardSizes = field(default_factory=RewardSizes)        # chapter 2
    loop: LoopSizes = field(default_factory=LoopSizes)               # chapter 3
    start: StartSizes = field(default_factory=StartSizes)            # chapter 3's main run
    ref: ReferenceSizes = field(default_factory=ReferenceSizes)      # chapter 3's reference run
    trl: TRLSizes = field(default_factory=TRLSizes)                  # chapter 4
    cl: CurriculumSizes = field(default_factory=CurriculumSizes)     # chapter 5
    quant: QuantSizes = field(default_factory=QuantSizes)            # chapter 6
    prof: ProfilingSizes = field(default_factory=ProfilingSizes)     # chapter 7
    short: ShortRunSizes = field(default_factory=ShortRunSizes)      # chapters 4 and 5
    # memory: trade a little speed for memory (grpo_course.infra.memory.use_low_memory: freed tensors go
    # back to the system at once, heaps trimmed after each step, one sampler weight copy; binder)
    low_memory: bool = False
    # which sizes a full or binder profile took on this machine: "large" or "compact" (cpu_kind)
    sizes: str = ""

    @property
    def label(self) -> str:
        """The name, with the sizes it took here: ``full (compact sizes)``; ``smoke`` alone."""
        return sized_label(self.name, self.sizes)

    @property
    def main_run(self) -> GRPOConfig:
        """Chapter 3's main run: the profile's recipe at the reverse-curriculum start."""
        return replace(self.grpo, **self.start.changes)

    def with_grpo(self, **changes: Any) -> Profile:
        return replace(self, grpo=replace(self.grpo, **changes))

    @property
    def curriculum_run(self) -> GRPOConfig:
        """Chapter 5's GRPO steps: the short steps of :meth:`short_run` with the main run's
        rewards and filter (each stage's rows carry their own start), chapter 5's completion
        budget and learning rate, from the warm start (no new SFT), without the main run's prompt
        pool (a screening at one start says nothing of the next stage's)."""
        own = {k: v for k, v in self.start.changes.items() if k in CURRICULUM_TAKES}
        return self.short_run(**own, max_completion_length=self.cl.max_completion_length,
                              sft_steps=0, learning_rate=self.cl.learning_rate)

    def short_run(self, **changes: Any) -> GRPOConfig:
        """Chapter 3's recipe (levers, rewards, warm start) with the smaller steps of chapters
        4 and 5 (G, completions per step, updates per batch, a sampling round of one step's
        prompts) and ``changes`` on top."""
        return replace(self.grpo, num_generations=self.short.num_generations,
                       per_step_completions=self.short.per_step_completions,
                       generation_batch_size=None,
                       num_iterations=self.short.num_iterations, **changes)


SIZES_ENV = "GRPO_COURSE_SIZES"
FULL_SIZES = ("large", "compact")    # the keys of FULL_BY_CPU
SIZED_PROFILES = ("full", "binder")  # the profiles whose sizes follow the CPU (smoke's never do)


def sized_label(name: str, sizes: str | None) -> str:
    """``name`` with the sizes it ran at, ``"full (large sizes)"``; ``name`` alone without sizes.
    One format for this machine's profiles (:attr:`Profile.label`) and for measurements taken on
    another (:func:`grpo_course.infra.memory.measured_profile`)."""
    return f"{name} ({sizes} sizes)" if sizes else name


def cpu_kind(strict: bool = True) -> str:
    """``"large"`` or ``"compact"``: which of :data:`FULL_BY_CPU`'s profiles is this machine's
    ``full``, or ``$GRPO_COURSE_SIZES`` where set. A value that is neither raises
    :class:`ConfigError`; with ``strict=False`` (importing this module, which must not fail: a
    command line could not report it) the CPU's own choice stands and :func:`get_profile` raises.

    The large sizes go to the CPUs whose 2 cores were measured to run every chapter at them within
    15 minutes: native bf16 through AVX512-BF16 without AMX (AMD EPYC). A CPU without native bf16
    computes in fp32 and decodes more slowly. A 2-core Xeon with AMX multiplies large bf16 matrices
    fast but decodes (small matrices, one token at a time) more slowly than that EPYC, and ran
    chapter 2 of the large sizes past 15 minutes (``make book``); it takes the compact sizes too.
    The sampler's and the training pass's dtype follow the CPU (bf16 where native), not this."""
    chosen = os.environ.get(SIZES_ENV, "").strip().lower()
    if chosen in FULL_SIZES:
        return chosen
    if chosen and strict:
        raise ConfigError(f"unknown full-profile sizes {chosen!r} (from ${SIZES_ENV}); choose "
                          f"one of {', '.join(FULL_SIZES)}")
    return sizes_for(hardware.native_bf16(), hardware.has_amx())


def sizes_for(native_bf16: bool, amx: bool) -> str:
    """The full profile's sizes of a CPU with or without native bf16 and AMX (:func:`cpu_kind`):
    also how a measurement taken on another machine is labelled."""
    return "large" if native_bf16 and not amx else "compact"


#: Chapter 3's levers for a learning signal in every GRPO step (both profiles run the same path),
#: read from the recipe that a student runs from the shell: ``recipes/grpo_levers.yaml``.
GRPO_LEVERS: dict[str, Any] = load_recipe(RECIPES_DIR / "grpo_levers.yaml")
#: ... and chapter 3's main run on top of them: GRPO where the groups are mixed
REVERSE_CURRICULUM: dict[str, Any] = load_recipe(RECIPES_DIR / "reverse_curriculum.yaml")

PROFILES: dict[str, Profile] = {
    "smoke": Profile(
        name="smoke",
        eval=EvalConfig(n=8, batch_size=8, max_new_tokens=48),
        grpo=GRPOConfig(max_steps=2, per_step_completions=8, num_generations=4,
                        max_completion_length=32, sft_steps=2, sft_batch_size=4,
                        **{**GRPO_LEVERS, "generation_batch_size": 16}),
        data=DataSizes(n_inspect=200, n_demo=1),
        rewards=RewardSizes(prompts=2, max_new_tokens=48),
        loop=LoopSizes(steps=2, kl_steps=1, prompts=1, pool=2),
        # no prompt pool: a 2-step warm start at 32 tokens solves too few prompts for a screening
        # of a few to keep one (tests/test_pool.py tests the pool)
        start=StartSizes(changes={**REVERSE_CURRICULUM, "generation_batch_size": 16,
                                  "max_completion_length": 32, "prompt_pool": "all"},
                         slices=((512, 520), (768, 776)), samples=4, pass_k_problems=2,
                         whole_problems=8),
        ref=ReferenceSizes(live_problems=4),
        trl=TRLSizes(max_steps=1, eval_n=8, ddp_steps=1),
        cl=CurriculumSizes(steps_per_stage=1, max_completion_length=16, stage_problems=4, eval_n=4,
                           budgets=(16, 16, 24), fisher_prompts=2, live_problems=4),
        quant=QuantSizes(agreement_prompts=2, torchao_prompts=2, last_k=8, batch_sizes=(1,),
                         decode_tokens=6, torchao_batch_sizes=(1,), torchao_decode_tokens=2,
                         eval_n=4, policy_steps=1),
        prof=ProfilingSizes(steps=1, threads=(1, 2), scaling_length=8, matmul_n=1024, copy_mib=64,
                            lever_length=8, lever_generations=(2, 4), lever_lengths=(8, 16),
                            nocache_tokens=8),
    ),
    "full": Profile(
        name="full",
        # 512 held-out problems: a gain of a few points needs that many for a paired test (compact sizes:
        # fewer, with intervals that say so)
        eval=EvalConfig(n=512, batch_size=32, max_new_tokens=200),
        # recipe: a LoRA SFT warm-up on GSM8K train solutions (the shared warm start, trained in
        # chapter 2), then GRPO (chapter 3): G = 8, 8 prompts sampled a round and the 4 whose
        # completions reach different gold steps trained, the levers of chapter 3 (measured in
        # bench/levers.py and bench/recipes.py). GRPO gets what chapter 3's 15 minutes leave after
        # its held-out evaluation. These are the large sizes (cpu_kind); FULL_BY_CPU also holds
        # the compact ones of a CPU that decodes more slowly.
        # The training pass runs one group (8 completions) at a time: the same update, a quarter
        # of the activations; TRL passes 2 completions at a time (chapter 4, and 2 per process in
        # its 2-process run), so that every chapter fits an 8 GB laptop (bench/memory.py measures
        # each chapter's peak).
        grpo=GRPOConfig(sft_steps=210, sft_batch_size=1, sft_learning_rate=3e-4,
                        max_steps=6,
                        num_generations=8, per_step_completions=32, learning_rate=3e-4,
                        train_micro_batch=8, **GRPO_LEVERS),
        data=DataSizes(n_inspect=7473, n_demo=3),
        rewards=RewardSizes(prompts=8, max_new_tokens=160),
        # chapter 3's loop: the notebook's own step has no prompt cache and no bf16 training pass,
        # so it samples one prompt a step with shorter completions
        # the loop's one plain forward over G completions keeps every layer's activations for the
        # backward pass: recomputed instead, the chapter stays within an 8 GB laptop's memory
        loop=LoopSizes(changes={"max_completion_length": 96, "gradient_checkpointing": True}),
        trl=TRLSizes(micro_batch=2),
        # chapter 7: the step under torch.profiler trains one group (it keeps every event in
        # memory), and the all-position-logits pass takes half a group (the whole batch's
        # [32, L, vocab] fp32 logits and their gradient are several GiB)
        prof=ProfilingSizes(trace_step={"per_step_completions": 8, "generation_batch_size": None},
                            logits_completions=4),
    ),
}


def _binder_profile(full: Profile) -> Profile:
    """The full profile's lessons within a free Binder session's 2 GB (aiming at a peak RSS of
    at most 1.8 GiB per chapter, measured by ``bench/memory.py``): the same recipe and warm start, with
    activation checkpointing in the training passes (the course trainer's and TRL's; TRL's step's
    completions through the model two at a time),
    smaller sampling and evaluation batches (the pass@k samples of one problem at a time; the
    live run of chapter 3's second page samples one prompt a round, up to four rounds a step),
    64-token completions in chapter 3's loop, fewer
    held-out problems (the intervals say so), no
    2-process run (two more copies of the model do not fit), no live re-sampling of the reference
    run's tests on chapter 3's second page (the reference run's model and its samples do not fit
    beside the page's; the page shows the benchmark's numbers), a shorter step under torch.profiler
    and no full fine-tuning run in chapter 7 (AdamW's state for every weight), and the
    low-memory mode (:func:`grpo_course.infra.memory.use_low_memory`)."""
    return replace(
        full, name="binder",
        eval=EvalConfig(n=min(full.eval.n, 128), batch_size=8, max_new_tokens=200),
        grpo=replace(full.grpo, per_step_completions=8, generation_batch_size=16,
                     gradient_checkpointing=True),
        rewards=replace(full.rewards, prompts=4),
        loop=replace(full.loop,
                     changes={**full.loop.changes, "max_completion_length": 64}),
        start=replace(full.start, changes={**full.start.changes, "generation_batch_size": 8,
                                           "max_sampling_rounds": 4},
                      slices=tuple((lo, min(hi, lo + 128)) for lo, hi in full.start.slices),
                      whole_problems=min(full.start.whole_problems, 128), sample_prompts=1),
        trl=replace(full.trl, eval_n=min(full.trl.eval_n, 128), ddp_steps=0, micro_batch=2),
        quant=replace(full.quant, eval_n=min(full.quant.eval_n, 48), policy_steps=min(full.quant.policy_steps, 4),
                      batch_sizes=(1, 8)),     # the evaluation's batch
        prof=replace(full.prof, copy_mib=128, full_finetune=False, logits_completions=2,
                     trace_step={"num_generations": 2, "per_step_completions": 2,
                                 "max_completion_length": 8, "generation_batch_size": None}),
        short=replace(full.short, per_step_completions=4),
        ref=replace(full.ref, live_problems=0),
        cl=replace(full.cl, live_problems=0),
        low_memory=True)


def _compact_profile(full: Profile) -> Profile:
    """The full profile's lessons on a CPU that decodes more slowly (:func:`cpu_kind`): one without
    native bf16, where the sampler and the training pass run in fp32 (``bench/throughput.py``), or
    a 2-core Xeon with AMX, each chapter within 15 minutes on 2 cores
    where its parts allow (``make book`` on a clean clone prints each page's minutes;
    ``bench/memory.py --profiles full`` each cell's seconds): fewer held-out problems (the
    intervals say so: chapters 1-2 and 4-6, chapter 3's whole-problem test, a whole evaluation
    block so that chapters 3 and 4 reuse chapters 1-2's records, and the warm start's greedy check
    at the start on the first rows of chapter 3's slices), fewer reward samples in chapter 2, fewer
    GRPO steps in chapters 3-5 (two a stage in chapter 5: EWC acts from a stage's second step),
    on chapter 3's second page a smaller screened pool, fewer pass@k problems (whole sampling
    rounds) and fewer live re-sampled problems of the reference run (the same rows), one timed
    step and fewer thread counts and lever settings in chapter 7. The recipe (its warm start
    included) and each test's design stay."""
    return replace(
        full,
        eval=replace(full.eval, n=64),
        grpo=replace(full.grpo, max_steps=4),
        rewards=replace(full.rewards, prompts=4),
        start=replace(full.start, samples=8, pass_k_problems=8, whole_problems=64,
                      changes={**full.start.changes, "pool_prompts": 48},
                      slices=tuple((lo, lo + 16) for lo, _ in full.start.slices)),
        ref=replace(full.ref, live_problems=4),
        trl=replace(full.trl, max_steps=3, eval_n=64),
        cl=replace(full.cl, steps_per_stage=2, eval_n=16, live_problems=8),
        quant=replace(full.quant, eval_n=48, policy_steps=4),   # no longer than chapter 3's run
        prof=replace(full.prof, steps=1, threads=(1, 2, 4), scaling_length=16, lever_generations=(2, 4),
                     lever_lengths=(32, 64)))


#: The full profile of each kind of CPU (:func:`cpu_kind`): ``PROFILES["full"]`` is this machine's.
FULL_BY_CPU: dict[str, Profile] = {"large": replace(PROFILES["full"], sizes="large"),
                                   "compact": replace(_compact_profile(PROFILES["full"]), sizes="compact")}
PROFILES["full"] = FULL_BY_CPU[cpu_kind(strict=False)]
PROFILES["binder"] = _binder_profile(PROFILES["full"])


def get_profile(name: str | None = None) -> Profile:
    """The profile named ``name``, else ``$GRPO_COURSE_PROFILE``, else ``binder`` on a machine
    (or container) with less than 4 GiB of memory (saying so once), else ``full``."""
    name = name or os.environ.get(PROFILE_ENV) or _default_profile_name()
    name = name.strip().lower()
    if name not in PROFILES:
        raise ConfigError(
            f"unknown profile {name!r} (from ${PROFILE_ENV} or the argument); "
            f"choose one of {', '.join(PROFILE_NAMES)}")
    if name != "smoke":
        cpu_kind()          # a bad $GRPO_COURSE_SIZES: one line, here rather than at import
    return PROFILES[name]


@lru_cache(maxsize=1)
def _default_profile_name() -> str:
    """``full``, or ``binder`` where the memory limit is under 4 GiB (printed once)."""

    limit = hardware.memory_limit_bytes()
    if limit >= hardware.SMALL_MACHINE_BYTES:
        return "full"
    print(f"This machine gives {limit / 2**30:.1f} GiB of memory (less than "
          f"{hardware.SMALL_MACHINE_BYTES / 2**30:.0f} GiB), so the course uses the binder profile, made to fit "
          f"2 GB; set {PROFILE_ENV}=full to override.")
    return "binder"
