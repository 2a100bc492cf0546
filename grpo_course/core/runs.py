"""Tracked runs: one folder layout for every trainer, a list of the runs, and trackio (optional).

Every run — the course trainer (:mod:`grpo_course.core.train`), TRL (:mod:`grpo_course.topics.trl_bridge`)
and a curriculum (:func:`grpo_course.topics.curriculum.train_stages`) — leaves a folder holding

* ``config.yaml``: ``trainer`` (course | trl | curriculum), ``profile`` and every GRPOConfig
  field (a recipe: ``--config folder/config.yaml`` reruns it);
* ``metrics.jsonl``: one row per step in the course trainer's names (``reward``,
  ``rewards/<name>``, ``completion_length``, ``step_seconds``, ...).

:func:`list_runs` tables the runs under a folder; :func:`grpo_course.book.plotting.plot_metrics`
with ``runs={label: folder}`` puts any metric of several of them on one figure. With
``report_to="trackio"`` (and ``pip install trackio``) the course trainer also logs every step to
trackio, offline, and TRL does the same through its own ``report_to``; ``trackio show`` opens the
dashboard.
"""
from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from grpo_course.config import ConfigError, GRPOConfig, config_to_dict, load_recipe
from grpo_course.infra.atomic import write_text_atomic

METRICS_FILE = "metrics.jsonl"
RUN_CONFIG_FILE = "config.yaml"     # a run folder's resolved GRPOConfig (+ profile)
RUN_KEYS = ("trainer", "profile")   # the keys of a run's config.yaml that are not GRPOConfig fields
TRACKIO_PROJECT = "grpo-course"


def finished_run(folder: str | os.PathLike) -> bool:
    """Whether ``folder`` holds a finished run as the train CLI saves it: an adapter at the top and
    the warm start it began from in ``sft/`` (what the fixed tests compare)."""
    folder = Path(folder)
    return (folder / "adapter_config.json").is_file() and (folder / "sft" / "adapter_config.json").is_file()


def trim_metrics(out_dir: Path, sft_done: int, global_step: int) -> None:
    """Keep the rows of ``out_dir``'s metrics file that a checkpoint at ``sft_done`` warm-up
    steps and ``global_step`` GRPO steps had logged (a resumed run logs the rest again, so it
    ends with the file an uninterrupted run writes); rewritten atomically."""
    path = Path(out_dir) / METRICS_FILE
    if not path.is_file():
        return
    rows = [r for r in read_metrics(path)
            if (r.get("phase") == "sft" and r.get("sft_step", 0) < sft_done)
            or (r.get("phase") == "grpo" and r.get("step", 0) < global_step)
            or r.get("phase") not in ("sft", "grpo")]
    write_text_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))


def read_metrics(source) -> list[dict]:
    """Rows of a ``metrics.jsonl`` file (or a folder holding one, or a list of rows)."""
    if isinstance(source, (list, tuple)):
        return list(source)
    path = Path(source)
    if path.is_dir():
        path = path / METRICS_FILE
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


#: What trained a run folder (the ``trainer`` key of its config.yaml).
TRAINERS = ("course", "trl", "curriculum")


def save_run_config(folder: str | os.PathLike, config: GRPOConfig,
                    profile: str | None = None, trainer: str = "course") -> Path:
    """Write ``folder/config.yaml`` atomically: the trainer, the profile's name and every field
    of ``config``. It is a recipe too: ``--config folder/config.yaml`` reruns it."""
    if trainer not in TRAINERS:
        raise ConfigError(f"trainer {trainer!r}: choose one of {', '.join(TRAINERS)}")
    folder = Path(folder)
    body = {"trainer": trainer} | ({"profile": profile} if profile else {}) | config_to_dict(config)
    command = "grpo_course.topics.trl_bridge" if trainer == "trl" else "grpo_course.core.train"
    text = (f"# The resolved GRPOConfig of this run ({trainer} trainer).\n"
            f"# Rerun: python -m {command} --config {folder / RUN_CONFIG_FILE} --out NEW_DIR\n"
            + yaml.safe_dump(body, sort_keys=False))
    return write_text_atomic(folder / RUN_CONFIG_FILE, text)


def load_run_config(folder: str | os.PathLike) -> dict[str, Any] | None:
    """The config a run folder was trained with (``trainer``, ``profile`` + fields), or ``None``."""
    path = Path(folder) / RUN_CONFIG_FILE
    if not path.is_file():
        return None
    return load_recipe(path, extra_keys=RUN_KEYS)


def read_run_config(source) -> dict[str, Any] | None:
    """The config a run folder was trained with (its ``config.yaml``, written by
    :mod:`grpo_course.core.train`: ``profile`` and every GRPOConfig field), or ``None``."""

    path = Path(source)
    return load_run_config(path.parent if path.name == RUN_CONFIG_FILE else path)


def write_run(folder: str | os.PathLike, config: GRPOConfig, rows: Iterable[dict[str, Any]],
              profile: str | None = None, trainer: str = "course") -> Path:
    """Write a finished run's ``config.yaml`` and ``metrics.jsonl`` (each atomically); the folder."""

    folder = Path(folder)
    save_run_config(folder, config, profile, trainer=trainer)
    write_text_atomic(folder / METRICS_FILE, "".join(json.dumps(r) + "\n" for r in rows))
    return folder


def list_runs(root: str | os.PathLike):
    """A table of the run folders under ``root`` (any depth), newest first: what trained each, on
    which profile, how many GRPO steps, and the last step's reward, correctness and length (to 3
    decimals: the table is for reading, the logs keep every digit)."""

    root = Path(root)
    table = []
    for config_file in sorted(root.rglob(RUN_CONFIG_FILE)):
        folder = config_file.parent
        config = load_run_config(folder) or {}
        rows = [r for r in read_metrics(folder) if r.get("phase", "grpo") == "grpo"] \
            if (folder / METRICS_FILE).is_file() else []
        last = rows[-1] if rows else {}
        table.append({"run": str(folder.relative_to(root)) if folder != root else folder.name,
                      "trainer": config.get("trainer", "course"), "profile": config.get("profile"),
                      "grpo steps": len(rows), "last reward": last.get("reward"),
                      "last correctness": last.get("rewards/correctness"),
                      "last completion length": last.get("completion_length"),
                      "modified": pd.Timestamp(config_file.stat().st_mtime, unit="s").floor("s")})
    columns = ["run", "trainer", "profile", "grpo steps", "last reward", "last correctness",
               "last completion length", "modified"]
    frame = pd.DataFrame(table, columns=columns)
    last = ["last reward", "last correctness", "last completion length"]
    frame[last] = frame[last].astype(float).round(3)     # only these: rounding the dates warns
    return frame.sort_values("modified", ascending=False).set_index("run")


class Tracker:
    """Logs a run's steps to trackio when ``config.report_to == "trackio"``; does nothing otherwise.

    trackio keeps its data locally (no account, no internet); ``trackio show`` opens the dashboard.
    """

    @staticmethod
    def check(config: GRPOConfig) -> bool:
        """Whether ``config`` logs to trackio (GRPOConfig allows none or trackio); a
        :class:`ConfigError` if trackio is not installed."""
        if config.report_to == "none":
            return False
        if importlib.util.find_spec("trackio") is None:
            raise ConfigError("report_to trackio: the trackio package is not installed "
                              "(pip install trackio, or pip install -e '.[track]')")
        return True

    def __init__(self, config: GRPOConfig, name: str, trainer: str = "course"):
        self.run = None
        if not self.check(config):
            return
        import trackio
        self.run = trackio.init(project=TRACKIO_PROJECT, name=name,
                                config={"trainer": trainer, **config_to_dict(config)})

    def log(self, row: dict[str, Any]) -> None:
        """One step's numbers (strings and None are left out)."""
        if self.run is not None:
            import trackio
            trackio.log({k: v for k, v in row.items()
                         if isinstance(v, (int, float)) and not isinstance(v, bool)})

    def finish(self) -> None:
        if self.run is not None:
            import trackio
            trackio.finish()
            self.run = None


def append_metrics(out_dir: Path | None, row: dict[str, Any]) -> None:
    """Append one step's ``row`` to ``out_dir``'s metrics file (nothing without a folder)."""
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        with open(out_dir / METRICS_FILE, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")
