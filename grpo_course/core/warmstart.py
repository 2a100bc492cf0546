"""The shared warm start: the SFT-warmed LoRA adapter of a recipe, trained once and cached.

Chapters 3-7 need a policy that already writes the ``#### N`` line (chapter 2: from the base
model nearly every group ties). :func:`warm_start` trains the supervised warm-up of a
:class:`~grpo_course.config.GRPOConfig` once and keeps the adapter under
``cache_dir()/warm_start/<fingerprint>``, keyed by everything that changes its weights (model,
SFT sizes and learning rate, LoRA shape, seed, data, the warm-up's resolved precision, and the
code that trains it: this module's source and that of every package module it imports, and the
library versions, see :mod:`grpo_course.infra.fingerprint`), so any chapter opened first pays for it
once and the others load it in a second.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import torch

from grpo_course.config import config_to_dict
from grpo_course.core.checkpoints import STATE_FILE, load_adapter_state
from grpo_course.core.loading import load_model, unloadable
from grpo_course.core.policy import add_lora, enable_activation_checkpointing
from grpo_course.core.runs import load_run_config
from grpo_course.core.sampling import resolve_sampling_dtype
from grpo_course.core.train import CourseTrainer
from grpo_course.infra.atomic import atomic_write, write_text_atomic
from grpo_course.infra.fingerprint import code_fingerprint, data_hash
from grpo_course.infra.memory import free_memory
from grpo_course.infra.paths import cache_dir, runs_dir, shown_path

WARM_FIELDS = ("model", "sft_steps", "sft_batch_size", "sft_learning_rate", "sft_dtype",
               "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "max_grad_norm",
               "seed", "train_offset")


def warm_start_key(config, train_dataset) -> str:
    """Fingerprint of the warm-up recipe: the fields that change its weights and the data."""

    recipe = {f: getattr(config, f) for f in WARM_FIELDS}
    recipe["sft_dtype"] = str(resolve_sampling_dtype(config.sft_dtype) or "float32")
    recipe["lora_target_modules"] = list(recipe["lora_target_modules"])
    recipe["data"] = data_hash(train_dataset)
    recipe["code"] = code_fingerprint("grpo_course.core.warmstart")      # this module and every module it imports
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:20]


def warm_start(config, train_dataset, verbose: bool = True) -> Path:
    """The folder of ``config``'s SFT-warmed adapter, trained now (with a progress bar) unless
    an identical recipe was trained before. Loadable by :func:`~grpo_course.core.loading.load_model`;
    :meth:`~grpo_course.core.train.CourseTrainer.start_from` continues training from it."""

    folder = cache_dir() / "warm_start" / warm_start_key(config, train_dataset)
    if (folder / STATE_FILE).is_file():
        broken = unloadable(folder / STATE_FILE)
        if broken is None:
            if verbose:
                print(f"warm start: reusing {config.sft_steps} SFT steps from {shown_path(folder)}")
            return folder
        print(f"warm start: {shown_path(folder / STATE_FILE)} does not load ({broken}); training it again")
    if verbose:
        print(f"warm start: training {config.sft_steps} SFT steps once; every chapter then "
              f"reuses them from {folder}")
    _train_warm_start(config, train_dataset, folder)
    free_memory()        # the trainer and its model hold reference cycles: gone before the caller loads
    return folder


def _train_warm_start(config, train_dataset, folder: Path) -> None:
    model, tokenizer = load_model(config.model)
    trainer = CourseTrainer(model, tokenizer, dataclasses.replace(config, max_steps=0),
                            train_dataset)
    log = trainer.sft()

    def write(tmp: Path) -> None:
        trainer.save_model(tmp)
        torch.save({n: p.detach().clone() for n, p in trainer.model.named_parameters()
                    if p.requires_grad}, tmp / STATE_FILE)
        (tmp / "sft_log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    atomic_write(folder, write, folder=True)


def warm_policy(model, config, folder):
    """``model`` with fresh LoRA adapters of ``config``'s shape set to the warm start's weights in
    ``folder``: the policy a GRPO run starts from (its base weights stay as they are, fp32 for a
    freshly loaded model), with activation checkpointing where ``config`` asks for it. Chapter 3's
    own GRPO loop trains it."""
    policy = add_lora(model, config)
    load_adapter_state(policy, folder)
    if config.gradient_checkpointing:         # the binder profile: the loop's passes recompute
        enable_activation_checkpointing(policy)   # activations (in train mode; sampling is eval)
        policy.train()
    return policy


#: where :func:`trained_policy` keeps the policy it trains when chapter 3's is not cached
POLICY_DIR = "policy"


def trained_policy(profile, train_dataset) -> tuple[Path, str]:
    """A GRPO-trained policy of ``profile``'s main run (:attr:`~grpo_course.config.Profile.main_run`)
    and one sentence saying which: chapter 3's
    (``runs_dir()/grpo``: its warm start and GRPO adapter, which
    :func:`~grpo_course.core.loading.load_model` merges) when chapter 3 ran on this profile; else the
    same recipe trained now from the warm start for ``profile.quant.policy_steps`` steps, saved
    under ``runs_dir()/policy`` and reused while its recipe, code and data are unchanged. A saved
    adapter that does not load is trained again, with one line saying so."""

    chapter3 = runs_dir(profile.name) / "grpo"
    adapter = "adapter_model.safetensors"
    if (chapter3 / "adapter_config.json").is_file() and (chapter3 / adapter).is_file():
        ran = {k: list(v) if isinstance(v, tuple) else v
               for k, v in (load_run_config(chapter3) or {}).items()}
        same = all(ran.get(k) == v for k, v in config_to_dict(profile.main_run).items())
        broken = unloadable(chapter3 / adapter)
        if same and broken is None:
            return chapter3, "chapter 3's GRPO policy (its warm start and GRPO adapter, merged)"
        print(f"{chapter3} is not chapter 3's run of this recipe "
              f"({broken or 'its config.yaml differs'}); training the policy here")
    config = dataclasses.replace(profile.main_run, max_steps=profile.quant.policy_steps)
    sft_dir = warm_start(config, train_dataset)

    # the warm start's key (its recipe, data and code), every field of the GRPO recipe and the
    # code that trains it
    recipe = json.dumps({"config": config_to_dict(config), "code": code_fingerprint("grpo_course.core.warmstart")},
                        sort_keys=True, default=str)
    key = f"{warm_start_key(config, train_dataset)}-{hashlib.sha256(recipe.encode()).hexdigest()[:20]}"
    folder = runs_dir(profile.name) / POLICY_DIR
    steps = f"{config.max_steps} GRPO step{'s' if config.max_steps != 1 else ''}"
    how = (f"chapter 3's recipe, trained here for {steps} from the warm start (chapter 3's "
           f"policy is not in the cache: run chapter 3 first to use its run)")
    if (folder / "adapter_config.json").is_file() and (folder / "policy_key.txt").is_file() \
            and (folder / "policy_key.txt").read_text() == key:
        broken = unloadable(folder / adapter)
        if broken is None:
            return folder, how
        print(f"{shown_path(folder / adapter)} does not load ({broken}); training the policy again")

    (folder / "policy_key.txt").unlink(missing_ok=True)   # stale until the new policy is saved
    model, tokenizer = load_model(config.model)
    trainer = CourseTrainer(model, tokenizer, config, train_dataset).start_from(sft_dir)
    trainer.train()
    trainer.save_model(folder)
    write_text_atomic(folder / "policy_key.txt", key)
    return folder, how
