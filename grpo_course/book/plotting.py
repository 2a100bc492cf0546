"""Figures for a training run's metrics log (``metrics.jsonl`` from :mod:`grpo_course.core.train`;
the run's ``config.yaml`` read, printed and compared between runs beside them)
and for the throughput benchmark's results (``data/throughput.json`` from ``bench/throughput.py``).
The numbers the prose quotes go through :mod:`grpo_course.book.glue`."""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from html import escape
from pathlib import Path
from typing import Any

import numpy as np

from grpo_course.core.rewards import EXACT_REWARD, MISSING_REWARD
from grpo_course.core.runs import read_metrics, read_run_config

DEFAULT_KEYS = ("reward", "rewards/correctness", "rewards/exact_format", "completion_length",
                "kl", "entropy", "loss", "frac_reward_zero_std", "step_seconds")
#: each logged metric's y label: what its number counts (a key not here gets "value")
METRIC_UNITS = {"reward": "weighted reward, mean", "rewards/correctness": f"reward, mean (tiers {MISSING_REWARD:g} to {EXACT_REWARD:g})",
                "rewards/exact_format": "reward, mean", "completion_length": "tokens, mean",
                "kl": "nats/token", "entropy": "nats/token", "loss": "loss",
                "frac_reward_zero_std": "share of groups tied", "step_seconds": "seconds per step"}


def print_run_config(source) -> dict[str, Any] | None:
    """Print a run folder's config, one ``field: value`` a line; returns it (``None`` if absent)."""
    config = read_run_config(source)
    if config is None:
        print(f"{source}: no config.yaml (not a run of grpo_course.core.train)")
        return None
    print(f"{source}:")
    width = max(map(len, config))
    for key, value in config.items():
        print(f"  {key:<{width}}  {list(value) if isinstance(value, tuple) else value}")
    return config


def run_config_differences(runs: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{field: {label: value}}`` for the fields on which the configs of ``runs`` (label -> run
    folder, as for :func:`plot_metrics`) differ; a run without a config shows ``None``."""
    configs = {label: read_run_config(src) or {} for label, src in runs.items()}
    keys = list(dict.fromkeys(k for c in configs.values() for k in c))
    table = {k: {label: c.get(k) for label, c in configs.items()} for k in keys}
    return {k: row for k, row in table.items() if len({repr(v) for v in row.values()}) > 1}


def series(rows: Iterable[dict], key: str, phase: str = "grpo") -> tuple[list[int], list[float]]:
    """(steps, values) of ``key`` over the rows of one phase (``grpo`` or ``sft``)."""
    xs, ys = [], []
    for i, r in enumerate(r for r in rows if r.get("phase", "grpo") == phase):
        if key in r and r[key] is not None:
            xs.append(r.get("step", r.get("sft_step", i)))
            ys.append(float(r[key]))
    return xs, ys


def smooth(values: Sequence[float], window: int = 5) -> list[float]:
    """Trailing moving average (ignores NaN)."""
    out = []
    for i in range(len(values)):
        chunk = [v for v in values[max(0, i - window + 1):i + 1] if not math.isnan(v)]
        out.append(sum(chunk) / len(chunk) if chunk else float("nan"))
    return out


def plot_band(ax, xs: Sequence[float], ys: Sequence[float], window: int = 5,
              label: str | None = None, color: str | None = None) -> None:
    """Raw values faint, their trailing moving average, and a band of +- one trailing
    standard deviation around it (how noisy a single step is)."""

    ys = [float("nan") if y is None else float(y) for y in ys]
    mean = smooth(ys, window)
    spread = []
    for i in range(len(ys)):
        chunk = [v for v in ys[max(0, i - window + 1):i + 1] if not math.isnan(v)]
        spread.append(float(np.std(chunk)) if chunk else float("nan"))
    line, = ax.plot(xs, ys, alpha=0.25, color=color)
    color = line.get_color()
    ax.plot(xs, mean, color=color, label=label)
    ax.fill_between(xs, np.array(mean) - spread, np.array(mean) + spread, color=color, alpha=0.15)


def band_caption(fig, window: int) -> None:
    """Say under ``fig`` what :func:`plot_band` draws, so no band goes unexplained."""
    fig.text(0.5, -0.01, f"faint: each step; line: the mean of the last {window} steps; band: ± one "
                         f"standard deviation of those steps", ha="center", va="top", fontsize=8)


def plot_metrics(source, keys: Sequence[str] = DEFAULT_KEYS, window: int = 5, runs=None,
                 ncols: int = 3):
    """A grid of curves, one panel per metric; ``runs`` = {label: source} overlays several."""
    import matplotlib.pyplot as plt

    runs = runs or {"run": source}
    data = {label: read_metrics(src) for label, src in runs.items()}
    keys = [k for k in keys if any(series(rows, k)[1] for rows in data.values())]
    nrows = max(1, math.ceil(len(keys) / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(4 * ncols, 2.8 * nrows), squeeze=False)
    for ax, key in zip(axes.flat, keys, strict=False):
        for label, rows in data.items():
            xs, ys = series(rows, key)
            plot_band(ax, xs, ys, window, label=label)
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("GRPO step")
        ax.set_ylabel(METRIC_UNITS.get(key, "value"), fontsize=8)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    if len(data) > 1:
        axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    band_caption(fig, window)
    return fig


def read_throughput(path, flat: bool = True) -> dict[str, Any] | None:
    """The JSON that ``bench/throughput.py`` writes; ``None`` when it does not exist yet.

    ``flat=True`` keeps the numbers only, keyed ``"ours/completions_per_s"`` and so on;
    ``flat=False`` returns the file as written (with the ``sweep`` list).
    """
    path = Path(path)
    if not path.is_file():
        return None
    raw = json.loads(path.read_text())
    if not flat:
        return raw
    out: dict[str, float] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{prefix}/{key}" if prefix else str(key))
        elif isinstance(node, (int, float)) and not isinstance(node, bool):
            out[prefix] = float(node)

    walk(raw, "")
    return out


def plot_cost_curve(sweep: Sequence[dict], length: int = 128, num_generations: int = 4):
    """Seconds per step against G (at ``length`` tokens) and against the completion budget (at
    ``num_generations``), from the ``sweep`` rows of ``bench/throughput.py --sweep``."""
    import matplotlib.pyplot as plt

    rows = [r for r in sweep if "s_per_step" in r]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3))
    for ax, key, fixed, value, label in (
            (axes[0], "num_generations", "length", length, f"G (2 prompts, {length} tokens)"),
            (axes[1], "length", "num_generations", num_generations,
             f"max completion tokens (G={num_generations})")):
        pts = sorted((r[key], r["s_per_step"], r.get("completions_per_s", float("nan")))
                     for r in rows if r[fixed] == value)
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o")
            for x, y, c in pts:
                ax.annotate(f"{c:.2f}/s", (x, y), textcoords="offset points", xytext=(4, 4),
                            fontsize=7)
        ax.set(xlabel=label, ylabel="seconds per step")
        ax.margins(x=0.15, y=0.15)      # room for the last point's label inside the axes
    axes[0].set_title("cost vs group size (labels: completions/s)", fontsize=9)
    axes[1].set_title("cost vs completion budget", fontsize=9)
    fig.tight_layout()
    return fig


class LiveCurves:
    """A figure of one panel per metric that redraws in place as a loop adds points (a training
    loop's reward as it trains): ``curves.add(label, step, {"reward": ..., "kl": ...})``. In
    JupyterLab and Colab the figure updates under the cell; the built book keeps its last state."""

    def __init__(self, panels: dict[str, str], figsize: tuple[float, float] | None = None):
        import matplotlib.pyplot as plt
        from IPython.display import display

        self.panels = dict(panels)                      # metric -> panel title
        self.points: dict[str, dict[str, tuple[list, list]]] = {}
        self.fig, axes = plt.subplots(1, len(self.panels), squeeze=False,
                                      figsize=figsize or (4.2 * len(self.panels), 3.0))
        self.axes = dict(zip(self.panels, axes[0], strict=False))
        plt.close(self.fig)                             # shown through the display handle only
        self.handle = display(self.fig, display_id=True)

    def add(self, label: str, step: int, values: dict[str, float]) -> None:
        """Add ``values`` (metric -> number) of ``label``'s run at ``step`` and redraw."""
        runs = self.points.setdefault(label, {})
        for key in self.panels:
            if values.get(key) is not None:
                xs, ys = runs.setdefault(key, ([], []))
                xs.append(step)
                ys.append(float(values[key]))
        for key, ax in self.axes.items():
            ax.clear()
            for name, run in self.points.items():
                if key in run:
                    ax.plot(*run[key], "o-", label=name, markersize=3)
            ax.set_title(self.panels[key], fontsize=10)
            ax.set_xlabel("step")
        if len(self.points) > 1:
            next(iter(self.axes.values())).legend(fontsize=8)
        self.fig.tight_layout()
        if self.handle is not None:
            self.handle.update(self.fig)


def side_by_side(sources: dict[str, str], max_height_px: int = 480):
    """Source texts in columns, each under its title and scrolling on its own (an HTML output:
    the same in the built book, JupyterLab and Colab)."""

    from IPython.display import HTML

    columns = "".join(
        f'<div style="flex:1;min-width:0"><b>{escape(title)}</b>'
        f'<pre style="max-height:{max_height_px}px;overflow:auto;font-size:11px;'
        f'border:1px solid #ddd;padding:4px">{escape(text)}</pre></div>'
        for title, text in sources.items())
    return HTML(f'<div style="display:flex;gap:12px">{columns}</div>')
