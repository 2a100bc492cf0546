"""A training run around its steps: the loop, its log, checkpoints, resuming and a cheap fork.

:class:`TrainingRun` is the part of :class:`~grpo_course.core.train.CourseTrainer` that is not GRPO:
:meth:`~TrainingRun.train` loops over the steps and logs them, and the checkpoints hold what a
run needs to continue (the trainable weights, both optimizers, the random states at the last
step boundary and the counters), each folder written atomically
(:func:`grpo_course.infra.atomic.atomic_write`), so a resumed run ends where an uninterrupted one would.
:func:`load_adapter_state` reads the warm start's trainable weights.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import random
from pathlib import Path
from typing import Any, Self

import torch

from grpo_course.config import ConfigError, GRPOConfig
from grpo_course.core.cli import CHECKPOINT
from grpo_course.core.data import select_columns
from grpo_course.core.policy import adapter_state, set_adapter_state
from grpo_course.core.pool import pool_record, screened_pool
from grpo_course.core.runs import Tracker, append_metrics, save_run_config, trim_metrics
from grpo_course.infra.atomic import atomic_write, write_json_atomic
from grpo_course.infra.progress import tqdm

#: the warm start's trainable (LoRA) weights, saved beside its adapter
STATE_FILE = "trainable.pt"
#: a run folder's screened prompt pool (``prompt_pool: mixed``) and its kept adapter snapshots
POOL_FILE, SNAPSHOTS = "pool.json", "steps"


def load_adapter_state(model, folder) -> None:
    """Set ``model``'s trainable (LoRA) weights to those saved in the warm start ``folder``: a
    cached warm start (``trainable.pt``) or an adapter folder as PEFT saves it (a run's ``sft/``);
    a :class:`ConfigError` when the folder holds neither or another shape of adapter."""
    folder = Path(folder)
    if (folder / STATE_FILE).is_file():
        set_adapter_state(model, torch.load(folder / STATE_FILE, weights_only=True))
        return
    adapter = folder / "adapter_model.safetensors"
    if not adapter.is_file():
        raise ConfigError(f"warm start {str(folder)!r} holds no adapter ({STATE_FILE} or "
                          f"adapter_model.safetensors)")
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file
    saved = json.loads((folder / "adapter_config.json").read_text()) \
        if (folder / "adapter_config.json").is_file() else {}
    mine = getattr(model, "peft_config", {}).get("default")
    for name in ("r", "lora_alpha"):
        if mine is not None and name in saved and saved[name] != getattr(mine, name):
            raise ConfigError(f"warm start {str(folder)!r} is not an adapter of this run's LoRA shape "
                              f"(its {name} is {saved[name]}, this run's {getattr(mine, name)})")
    try:
        loaded = set_peft_model_state_dict(model, load_file(adapter))
    except RuntimeError as exc:          # torch's size mismatch: another rank
        raise ConfigError(f"warm start {str(folder)!r} is not an adapter of this run's LoRA shape "
                          f"({' '.join(str(exc).split())[:160]})") from None
    missing = [k for k in loaded.missing_keys if "lora_" in k]
    if loaded.unexpected_keys or missing:
        raise ConfigError(f"warm start {str(folder)!r} is not an adapter of this run's LoRA shape "
                          f"({len(missing)} of its weights missing, {len(loaded.unexpected_keys)} "
                          f"unexpected): give its lora_r and lora_target_modules")


class TrainingRun:
    """The run around the steps, mixed into :class:`~grpo_course.core.train.CourseTrainer` (what
    ``transformers.Trainer`` adds to TRL's ``GRPOTrainer``): :meth:`train` runs the warm-up and
    the GRPO steps (the trainer's ``sft`` and ``step``), logs each, and checkpoints; the rest
    saves, resumes and forks. It reads the trainer's model, tokenizer, config, optimizers and
    counters."""

    def _mark_step_boundary(self) -> None:
        """Remember the random states between two steps (LoRA dropout in SFT and GRPO draws
        from them), so that a checkpoint holds a step boundary's."""
        self._rng_at_boundary = {"torch": torch.get_rng_state(), "python": random.getstate()}

    def _run_state(self, keep: bool = False) -> dict[str, Any]:
        """What a checkpoint holds of the run, as it is now: the trainable weights, both
        optimizers' state, the random states of the last step boundary and the counters.
        ``keep`` copies the optimizers' tensors, which later steps update in place."""
        def optimizer(opt) -> dict | None:
            if opt is None:
                return None
            return copy.deepcopy(opt.state_dict()) if keep else opt.state_dict()
        return {"trainable": adapter_state(self.model), "optimizer": optimizer(self.optimizer),
                "sft_optimizer": optimizer(self.sft_optimizer),
                "rng": self._rng_at_boundary, "global_step": self.global_step,
                "sft_done": self.sft_done, "prompts_used": self.prompts_used}

    def _set_run_state(self, state: dict[str, Any]) -> None:
        """Put back a :meth:`_run_state`: after a cut step, or from a checkpoint."""
        set_adapter_state(self.model, state["trainable"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.sft_optimizer = None        # sft() makes it afresh where the state has none
        if state.get("sft_optimizer") is not None:
            self.sft_optimizer = self._make_sft_optimizer()
            self.sft_optimizer.load_state_dict(state["sft_optimizer"])
        if state.get("rng") is not None:
            torch.set_rng_state(state["rng"]["torch"])
            random.setstate(state["rng"]["python"])
            self._mark_step_boundary()
        self.global_step, self.sft_done = state["global_step"], state["sft_done"]
        self.prompts_used = state["prompts_used"]

    @contextlib.contextmanager
    def _one_step(self):
        """One SFT or GRPO step of :meth:`train`, logged, as a whole or not at all. A step moves
        the prompt cursor, the weights and the optimizers before it ends, so a Ctrl-C inside it
        puts back the state it began from (kept here, where the run has a folder to checkpoint
        into): the checkpoint then holds a step boundary, and the resumed run does the cut step
        again, whole, and ends where an uninterrupted one would."""
        start = self._run_state(keep=True) if self.out_dir is not None else None
        logged = len(self.history)
        try:
            yield
        except KeyboardInterrupt:
            if start is not None:
                self._set_run_state(start)
                del self.history[logged:]       # the metrics file is trimmed on resume
            raise
        self._mark_step_boundary()

    def fork(self) -> Self:
        """A deep copy that shares the frozen base weights with this trainer (they never change):
        a second trainer for the price of its adapters and optimizer state, not of a second model.
        Both can then train on their own (chapter 3 checks its hand-written step this way)."""

        frozen = {id(p): p for p in self.model.parameters() if not p.requires_grad}
        return copy.deepcopy(self, memo=frozen)

    def save_model(self, path) -> Path:
        """Write an evaluable adapter (base recorded as ``config.model``) or full model into
        ``path`` (other files there are kept). The folder is swapped as a whole
        (:func:`grpo_course.infra.atomic.atomic_write`): an interrupted save leaves the old one."""

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
        state = self._run_state()

        def write(tmp: Path) -> None:
            torch.save({k: state[k] for k in ("trainable", "optimizer", "sft_optimizer", "rng")},
                       tmp / "state.pt")
            cfg = dataclasses.asdict(self.config)
            (tmp / "trainer.json").write_text(json.dumps(
                {"global_step": state["global_step"], "sft_done": state["sft_done"],
                 "prompts_used": state["prompts_used"], "config": cfg, "pool": self.pool},
                indent=2))
        return atomic_write(Path(path), write, folder=True)

    @classmethod
    def resume(cls, path, model, tokenizer, train_dataset, config: GRPOConfig | None = None,
               **kwargs) -> Self:
        """A trainer that continues the run saved at ``path`` (``model`` = the fresh base), with
        the config saved there or ``config`` (the CLI's: saved < recipe < flags)."""
        path = Path(path)
        try:
            meta = json.loads((path / "trainer.json").read_text())
            counters = {"global_step": meta["global_step"], "sft_done": meta["sft_done"],
                        "prompts_used": meta.get("prompts_used")}
            if config is None:
                cfg = meta["config"]
                cfg["lora_target_modules"] = tuple(cfg["lora_target_modules"])
                cfg["start_mix"] = tuple(cfg.get("start_mix") or ())
                config = GRPOConfig(**cfg)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f"{path / 'trainer.json'} is not a readable checkpoint "
                              f"({type(exc).__name__}: {exc})") from None
        trainer = cls(model, tokenizer, config, train_dataset, **kwargs)
        try:
            state = torch.load(path / "state.pt", weights_only=True)
            if counters["prompts_used"] is None:     # a checkpoint from before the cursor was saved
                counters["prompts_used"] = counters["global_step"] * trainer.config.prompts_per_step
            trainer._set_run_state({**state, **counters})
        except Exception as exc:  # cut short, or another model's: torch's own errors
            raise ConfigError(f"{path / 'state.pt'} is not a readable checkpoint for this model "
                              f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]})") from None
        if meta.get("pool") is not None:     # the screening of the run's start, not a new one
            trainer.use_pool(meta["pool"])
        if trainer.out_dir is not None:     # rows logged after the checkpoint are logged again
            trim_metrics(trainer.out_dir, trainer.sft_done, trainer.global_step)
        return trainer

    def build_pool(self, progress: bool = True) -> dict[str, Any] | None:
        """With ``prompt_pool: mixed``, screen the first ``pool_prompts`` prompts of GRPO's
        order once with the current policy (the warm start; cached, :mod:`grpo_course.core.pool`)
        and train on those it solved sometimes from here on. Returns the screening."""
        cfg = self.config
        if cfg.prompt_pool != "mixed":
            return None
        if self.pool is None:
            ids = self.prompt_order[:cfg.pool_prompts]
            self.pool = screened_pool(self.model, self.tokenizer, cfg,
                                      select_columns(self.grpo_dataset, ids), ids, progress)
        self.use_pool(self.pool)
        return self.pool

    def use_pool(self, pool: dict[str, Any]) -> None:
        """Draw GRPO's prompts from ``pool["mixed"]`` (in GRPO's order), or a
        :class:`ConfigError` when the screening kept none."""
        if list(pool.get("start_mix", [])) != list(self.config.start_mix):
            raise ConfigError(f"the prompt pool was screened with start_mix "
                              f"{pool.get('start_mix') or 'unset'}, this run has "
                              f"{list(self.config.start_mix) or 'none'}: its ids name other prompts")
        if not pool["mixed"]:
            raise ConfigError(f"the mixed prompt pool is empty: the policy solved none of the "
                              f"{len(pool['ids'])} screened prompts sometimes; screen more "
                              f"(pool_prompts) or start closer to the answer (lines_left, start_mix)")
        self.pool, self.prompt_order = pool, list(pool["mixed"])

    def _log(self, row: dict[str, Any]) -> None:
        self.history.append(row)
        if self.tracker is not None:
            self.tracker.log(row)
        append_metrics(self.out_dir, row)

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
            if self.out_dir is not None and (cfg.sft_steps or self.warm_started) and self.global_step == 0 \
                    and not (self.out_dir / "sft" / "adapter_config.json").is_file():
                self.save_model(self.out_dir / "sft")     # the warm-up alone, for attribution
            pool = self.build_pool()               # prompt_pool: mixed (screened once)
            if pool is not None and self.out_dir is not None:
                write_json_atomic(self.out_dir / POOL_FILE, pool_record(pool))
            bar = tqdm(range(self.global_step, max_steps), desc="grpo", leave=False)
            for _ in bar:
                with self._one_step():
                    row = self.step()
                    self._log(row)
                rows_out.append(row)
                bar.set_postfix(reward=f"{row['reward']:.2f}", s=f"{row['step_seconds']:.1f}")
                if cfg.snapshot_every and self.out_dir is not None and \
                        self.global_step % cfg.snapshot_every == 0:
                    self.save_model(self.out_dir / SNAPSHOTS / str(self.global_step))
                if cfg.save_every and self.out_dir is not None and \
                        self.global_step % cfg.save_every == 0:
                    self.save_checkpoint(self.out_dir / CHECKPOINT)
        except KeyboardInterrupt:
            if self.out_dir is not None:
                self.save_checkpoint(self.out_dir / CHECKPOINT)
                print(f"interrupted: checkpoint saved to {self.out_dir / CHECKPOINT}")
            raise
        finally:
            self.tracker.finish()
            self.tracker = None
        return rows_out


