"""The train CLI's options: every :class:`~grpo_course.config.GRPOConfig` field as a flag with
TRL's spelling, YAML recipes, and the order in which they apply.

``transformers.HfArgumentParser`` turns the dataclass fields into flags, each with the
``metadata["help"]`` that sits next to the field (``--help`` lists them all). As with TRL's
``TrlParser``, a run's values are layered: the profile (or, with ``--resume``, the config saved
in the checkpoint) < the YAML recipe given as ``--config`` < flags. Non-scalar fields take
JSON or several words on the command line (``--reward_weights '{"correctness": 1.0}'``,
``--lora_target_modules q_proj v_proj``). Every bad input raises :class:`ConfigError` with
one readable line.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin

from transformers import HfArgumentParser

from grpo_course.config import RECIPES_DIR, ConfigError, GRPOConfig, coerce_field, get_profile, load_recipe
from grpo_course.core.runs import RUN_KEYS, load_run_config

CHECKPOINT = "checkpoint"


@dataclass
class RunArguments:
    """Options of a run that are not trainer hyper-parameters (TRL's ``ScriptArguments``)."""

    _argument_group_name = "run"

    out: str | None = field(default=None, metadata={
        "help": "Run folder (required): the adapter, metrics.jsonl, config.yaml and what the "
                "trainer adds (see --help of each command)."})
    profile: str | None = field(default=None, metadata={
        "help": "smoke | full: the sizes that the recipe and the flags start from "
                "(else $GRPO_COURSE_PROFILE, else full; a recipe may name one)."})
    config: str | None = field(default=None, metadata={
        "help": "YAML recipe of GRPOConfig fields (recipes/*.yaml, or a run's config.yaml); "
                "flags override it."})


@dataclass
class TrainArguments(RunArguments):
    """``python -m grpo_course.core.train``'s run options: the common ones and ``--resume``."""

    out: str | None = field(default=None, metadata={
        "help": "Run folder (required): the adapter, metrics.jsonl, config.yaml, sft/ (the "
                "warm-up alone) and checkpoint/."})
    resume: bool = field(default=False, metadata={
        "help": "Continue OUT/checkpoint with the config saved there; --config and flags "
                "override it (--max_steps 40 trains on to step 40)."})
    warm_start: str | None = field(default=None, metadata={
        "help": "An adapter folder to start GRPO from, its warm-up counted done (e.g. "
                "data/runs/reference/sft, the reference run's warm start); saved as OUT/sft."})


def _value_type(name: str):
    """An argparse ``type`` that reads field ``name`` as config.py does (JSON, none, lists)."""
    def convert(text: str) -> Any:
        try:
            return coerce_field(name, text)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    convert.__name__ = name
    return convert


class CourseArgumentParser(HfArgumentParser):
    """``HfArgumentParser`` that reports errors by raising :class:`ConfigError` (one line, no
    usage dump) and also reads the field types it cannot: ``X | None`` (``none`` on the command
    line), ``tuple[str, ...]`` (several words) and ``dict[str, float]`` (a JSON object)."""

    def __init__(self, dataclass_types, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)      # exact field names only
        super().__init__(dataclass_types, **kwargs)

    def error(self, message: str):
        raise ConfigError(message)

    @staticmethod
    def _parse_dataclass_field(parser: argparse.ArgumentParser, field: dataclasses.Field):
        kind, origin = field.type, get_origin(field.type)
        optional = origin in (Union, UnionType) and type(None) in get_args(field.type)
        if not (origin in (tuple, dict) or (optional and bool not in get_args(kind))) \
                or field.name not in {f.name for f in dataclasses.fields(GRPOConfig)}:
            return HfArgumentParser._parse_dataclass_field(parser, field)
        names = [f"--{field.name}"] + ([f"--{field.name.replace('_', '-')}"]
                                       if "_" in field.name else [])
        default = field.default_factory() if field.default_factory is not dataclasses.MISSING \
            else field.default
        extra = {"nargs": "+", "type": str} if origin is tuple else \
            {"type": _value_type(field.name), "metavar": "JSON" if origin is dict else None}
        parser.add_argument(*names, default=default, help=field.metadata.get("help"), **extra)


def build_parser(run_arguments: type = TrainArguments,
                 prog: str = "python -m grpo_course.core.train") -> CourseArgumentParser:
    """The parser of a train command: its run options, then every GRPOConfig field."""
    return CourseArgumentParser((run_arguments, GRPOConfig), prog=prog,
                                description="Train the bundled model with GRPO. Each value comes "
                                            "from the profile < a YAML recipe (--config) < a "
                                            "flag; the defaults shown are the profile's and "
                                            "the recipe's.")


def _checkpoint_config(out: Path) -> dict[str, Any] | None:
    """The GRPOConfig fields saved in ``out/checkpoint`` (``None`` without a checkpoint)."""
    meta = out / CHECKPOINT / "trainer.json"
    if not meta.is_file():
        return None
    try:
        saved = json.loads(meta.read_text())["config"]
    except (ValueError, KeyError) as exc:
        raise ConfigError(f"{meta} is not a readable checkpoint ({exc})") from None
    return {k: coerce_field(k, v) for k, v in saved.items()}


def parse_train_args(argv: Sequence[str] | None = None, run_arguments: type = TrainArguments,
                     prog: str = "python -m grpo_course.core.train") -> tuple[Any, GRPOConfig, str]:
    """Run options (a ``run_arguments`` instance), the resolved GRPOConfig and the profile's name
    of a train command line (``python -m grpo_course.core.train``, ``python -m grpo_course.topics.trl_bridge``)."""
    argv = list(argv) if argv is not None else None
    first, _ = CourseArgumentParser(run_arguments, add_help=False).parse_known_args(argv)
    recipe = load_recipe(first.config, extra_keys=RUN_KEYS) if first.config else {}
    recipe.pop("trainer", None)                      # a run's config.yaml names what trained it
    from_recipe = recipe.pop("profile", None)
    resume = getattr(first, "resume", False)
    saved = _checkpoint_config(Path(first.out)) if resume and first.out else None
    if saved is not None:               # --resume: the checkpoint's config replaces the profile's
        run = load_run_config(first.out) or {}
        profile = get_profile(first.profile or run.get("profile") or from_recipe).name
        base = saved
    else:
        profile = get_profile(first.profile or from_recipe).name
        base = dataclasses.asdict(get_profile(profile).grpo)
    parser = build_parser(run_arguments, prog)
    parser.set_defaults(**{**base, **recipe})
    values = vars(parser.parse_args(argv))
    run_names = {f.name for f in dataclasses.fields(run_arguments)}
    args = run_arguments(**{k: v for k, v in values.items() if k in run_names})
    if not args.out:
        raise ConfigError("--out is required: name a folder for the run")
    fields = {k: coerce_field(k, v) for k, v in values.items() if k not in run_names}
    return args, GRPOConfig(**fields), profile



def run_folder(out: str | Path) -> Path:
    """``--out`` as a Path, or a :class:`ConfigError` naming it when it is (or is inside) a file."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {str(out)!r} is a file; name a folder for the run")
    for part in out.parents:
        if part.exists() and not part.is_dir():
            raise ConfigError(f"--out {str(out)!r} is inside {str(part)!r}, which is a file")
    return out


def _flag_value(value: Any) -> list[str]:
    """A field value as command-line words (the inverse of the parser's reading)."""
    if isinstance(value, (tuple, list)):
        return [str(v) for v in value]
    if isinstance(value, dict):
        return [json.dumps(value)]
    if value is None or isinstance(value, bool):
        return [str(value).lower()]
    return [str(value)]


def shown_recipe(recipe: str | Path) -> str:
    """A recipe as a printed command names it: ``recipes/<name>.yaml`` for one of the course's own
    (:func:`~grpo_course.config.load_recipe` finds it from any folder), never a machine's path."""
    recipe = Path(recipe)
    return f"recipes/{recipe.name}" if (RECIPES_DIR / recipe.name).is_file() and \
        recipe.resolve() == (RECIPES_DIR / recipe.name).resolve() else str(recipe)


def config_flags(config: GRPOConfig, profile: str, recipe: str | Path | None = None) -> list[str]:
    """``--profile`` (and ``--config recipe``), then a flag for each field of ``config`` that the
    two leave different: the words that rebuild ``config`` on any train command line."""
    base = {**dataclasses.asdict(get_profile(profile).grpo), **(load_recipe(recipe) if recipe else {})}
    words = ["--profile", get_profile(profile).name]
    words += ["--config", shown_recipe(recipe)] if recipe else []
    for name, value in dataclasses.asdict(config).items():
        if value != base[name]:
            words += [f"--{name}", *_flag_value(value)]
    return words


def train_command(config: GRPOConfig, profile: str, out: str | Path,
                  recipe: str | Path | None = None) -> str:
    """The shell command that trains ``config`` (what a chapter prints for its run)."""
    words = ["python", "-m", "grpo_course.core.train", *config_flags(config, profile, recipe)]
    return " ".join(shlex.quote(w) for w in [*words, "--out", str(out)])
