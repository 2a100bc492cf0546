"""Where a GRPO step spends its time and memory, against this machine's limits.

* :class:`PhaseTimer` — wall time per phase (sampling, rewards, logprobs,
  forward_backward, optimizer) and per step; the trainer calls ``timer.phase(name)``.
* :class:`RSSSampler` — a background thread that samples resident memory (and the
  process's CPU %) with the timer's current phase label.
* :func:`top_ops` — ``torch.profiler``'s operators by self CPU time, as a table
  (optionally a Chrome trace).
* :func:`matmul_gflops`, :func:`copy_bandwidth`, :func:`plot_roofline` — the machine's
  limits measured on the spot, and achieved vs possible.
* :func:`run_with_threads`, :func:`omp_order_demo` — thread scaling in subprocesses.

Nothing here touches random state or tensors of the run it measures: timing a step
does not change its results.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import psutil
import torch
from torch.profiler import ProfilerActivity, profile

from grpo_course.infra.hardware import available_cores, native_bf16, rss_bytes
from grpo_course.infra.memory import free_memory
from grpo_course.measure.stats import as_sentences

PHASES = ("sampling", "rewards", "logprobs", "forward_backward", "optimizer")


# ---------------------------------------------------------------- phase timer
@dataclass
class StepRecord:
    """One step: its wall time and the seconds of each (top-level) phase inside it."""

    step: int
    wall: float
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def other(self) -> float:
        """Wall time not covered by any phase (glue code, logging, the timer itself)."""
        return self.wall - sum(self.phases.values())


class PhaseTimer:
    """Wall-clock time per phase and per step.

    >>> timer = PhaseTimer()
    >>> with timer.step():
    ...     with timer.phase("sampling"):
    ...         pass
    >>> timer.records[0].phases["sampling"] >= 0
    True

    ``phase(name)`` works inside or outside a ``step()``; every phase is added to
    :attr:`totals`, and phases inside a step also to that step's record. A phase
    opened inside another is recorded as ``"outer/inner"`` and not counted again in
    the step's sum. :attr:`current` names the innermost open phase (read by
    :class:`RSSSampler` from its thread).
    """

    def __init__(self) -> None:
        self.records: list[StepRecord] = []
        self.totals: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.current: str | None = None
        self._stack: list[str] = []
        self._open: StepRecord | None = None
        self._nested: dict[str, float] = {}

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if not isinstance(name, str) or not name:
            raise ValueError(f"a phase needs a non-empty name, got {name!r}")
        full = "/".join(self._stack + [name])
        self._stack.append(name)
        self.current = full
        start = time.perf_counter()
        try:
            yield
        finally:
            seconds = time.perf_counter() - start
            self._stack.pop()
            self.current = "/".join(self._stack) or None
            self.totals[full] = self.totals.get(full, 0.0) + seconds
            self.counts[full] = self.counts.get(full, 0) + 1
            if self._open is not None:
                target = self._open.phases if not self._stack else self._nested
                target[full] = target.get(full, 0.0) + seconds

    @contextmanager
    def step(self) -> Iterator[StepRecord]:
        """Time one step; the record is appended to :attr:`records` when it ends."""
        if self._open is not None:
            raise RuntimeError("PhaseTimer.step() is already open; steps do not nest")
        record = StepRecord(step=len(self.records), wall=0.0)
        self._open, self._nested = record, {}
        start = time.perf_counter()
        try:
            yield record
        finally:
            record.wall = time.perf_counter() - start
            self._open = None
            self.records.append(record)

    def to_frame(self) -> pd.DataFrame:
        """One row per step: seconds per phase, ``other`` and ``wall``."""
        names = list(dict.fromkeys(n for r in self.records for n in r.phases))
        rows = [{**{n: r.phases.get(n, 0.0) for n in names}, "other": r.other, "wall": r.wall}
                for r in self.records]
        return pd.DataFrame(rows, index=pd.Index([r.step for r in self.records], name="step"))

    def summary(self) -> pd.DataFrame:
        """Mean seconds and share of the step per phase (over the recorded steps)."""
        frame = self.to_frame()
        if frame.empty:
            raise ValueError("no steps recorded: wrap work in `with timer.step():`")
        mean = frame.mean()
        return pd.DataFrame({"seconds": mean, "share": mean / mean["wall"]})


# ---------------------------------------------------------------- memory (and CPU %) timeline
#: the phase label of the RSS samples taken outside every labelled phase (set-up, between steps)
BETWEEN_PHASES = "between phases"


class RSSSampler:
    """Sample the process's resident memory every ``interval`` s in a background thread.

    Use as a context manager; each sample is ``(t, rss_bytes, cpu_percent, phase)`` with
    ``phase`` read from ``timer.current`` (or ``None``). One sample is taken on entry and
    one on exit, so :attr:`peak` >= :attr:`start_rss`. ``cpu_percent`` is the process's
    CPU time over the last interval / wall time (100 = one core busy).
    """

    def __init__(self, interval: float = 0.02, timer: PhaseTimer | None = None) -> None:
        if interval <= 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval}")
        self.interval, self.timer = interval, timer
        self.samples: list[tuple[float, int, float, str | None]] = []
        self._proc = psutil.Process()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0

    def _sample(self) -> None:
        phase = self.timer.current if self.timer is not None else None
        self.samples.append((time.perf_counter() - self._t0, rss_bytes(),
                             self._proc.cpu_percent(None), phase))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def start(self) -> RSSSampler:
        if self._thread is not None:
            raise RuntimeError("RSSSampler is already running")
        self._stop.clear()
        self._t0 = time.perf_counter()
        self._proc.cpu_percent(None)          # prime: the next call measures from here
        self._sample()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self._sample()

    def __enter__(self) -> RSSSampler:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def start_rss(self) -> int:
        return self.samples[0][1]

    @property
    def peak(self) -> int:
        return max(s[1] for s in self.samples)

    def to_frame(self) -> pd.DataFrame:
        frame = pd.DataFrame(self.samples, columns=["t", "rss", "cpu_percent", "phase"])
        frame["rss_mib"] = frame["rss"] / 2**20
        return frame

    def peak_by_phase(self) -> pd.DataFrame:
        """Peak and mean RSS (MiB) and mean CPU % per phase label (:data:`BETWEEN_PHASES` for the
        samples outside any)."""
        frame = self.to_frame().fillna({"phase": BETWEEN_PHASES})
        frame = frame.iloc[1:]  # the first CPU % reading covers no interval
        return frame.groupby("phase", sort=False).agg(
            peak_mib=("rss_mib", "max"), mean_mib=("rss_mib", "mean"),
            cpu_percent=("cpu_percent", "mean"), samples=("rss", "size"))


def plot_memory_timeline(sampler: RSSSampler, ax=None):
    """RSS (MiB) over time, one colour per phase label."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 3))
    frame = sampler.to_frame().fillna({"phase": BETWEEN_PHASES})
    ax.plot(frame["t"], frame["rss_mib"], color="lightgrey", lw=1, zorder=1)
    for i, (name, part) in enumerate(frame.groupby("phase", sort=False)):
        ax.scatter(part["t"], part["rss_mib"], s=6, label=name, color=f"C{i}", zorder=2)
    ax.set_xlabel("seconds")
    ax.set_ylabel("RSS (MiB)")
    # beside the axes, not over them: the first step's plateau sits where an inside legend would go
    ax.legend(fontsize=8, markerscale=2, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    return ax


def cpu_utilization(fn: Callable[[], Any], cores: int | None = None) -> dict[str, float]:
    """Run ``fn()``; return wall s, CPU s (user+system, all threads) and the utilization
    ``cpu / (wall * cores)`` — the "x % CPU utilization" number. It counts every cycle
    a thread held a core, including OpenMP threads spinning while they wait for work."""
    if cores is None:
        cores = available_cores()
    proc = psutil.Process()
    c0, t0 = proc.cpu_times(), time.perf_counter()
    fn()
    c1, wall = proc.cpu_times(), time.perf_counter() - t0
    cpu = (c1.user - c0.user) + (c1.system - c0.system)
    return {"wall": wall, "cpu": cpu, "cores": float(cores), "utilization": cpu / (wall * cores)}


# ---------------------------------------------------------------- torch.profiler
#: what Kineto (the profiler's C++ side) writes to the process's stderr as it starts and stops
KINETO_NOTICES = ("USDT:", "STAGE:")


@contextmanager
def without_kineto_notices() -> Iterator[None]:
    """Hold the process's stderr (file descriptor 2, below Python's ``sys.stderr``) in a file while
    the block runs, then pass on every line but Kineto's start and stop notices
    (:data:`KINETO_NOTICES`): no environment variable silences them, and a notebook shows them as
    red error output although nothing went wrong. Wrap the profiler's start and stop only, so the
    work between them writes as usual."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            for line in held.read().decode(errors="replace").splitlines(keepends=True):
                if not line.startswith(KINETO_NOTICES):
                    sys.stderr.write(line)


def top_ops(fn: Callable[[], Any], row_limit: int = 15,
            trace_path: str | os.PathLike | None = None) -> pd.DataFrame:
    """Run ``fn()`` under ``torch.profiler`` (CPU); operators by self CPU time.

    Columns: ``op``, ``self_ms``, ``total_ms`` (with children), ``calls``, ``self_share``
    (of all self time). With ``trace_path`` also writes a Chrome trace (open it in
    ``chrome://tracing`` or https://ui.perfetto.dev).
    """

    prof = profile(activities=[ProfilerActivity.CPU])
    with without_kineto_notices():
        prof.start()
    try:
        fn()
    finally:
        with without_kineto_notices():
            prof.stop()
    if trace_path is not None:
        prof.export_chrome_trace(str(trace_path))
    rows = [{"op": e.key, "self_ms": e.self_cpu_time_total / 1e3,
             "total_ms": e.cpu_time_total / 1e3, "calls": e.count}
            for e in prof.key_averages()]
    table = pd.DataFrame(rows, columns=["op", "self_ms", "total_ms", "calls"])
    if table.empty:
        raise RuntimeError("torch.profiler recorded no operators: did fn() run any torch code?")
    del prof, rows                 # every recorded event (in reference cycles: collected now), and in
    free_memory()                  # low-memory mode their many small blocks go back to the system
    table["self_share"] = table["self_ms"] / table["self_ms"].sum()
    return table.sort_values("self_ms", ascending=False).head(row_limit).reset_index(drop=True)


# ---------------------------------------------------------------- machine limits and roofline
def _best_time(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm-up (allocation, thread pool start)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def matmul_gflops(n: int = 2048, repeats: int = 3, dtype: torch.dtype = torch.float32) -> float:
    """GFLOP/s of an ``n x n`` @ ``n x n`` matmul (2 n^3 FLOPs) in ``dtype``, best of ``repeats``."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    out = torch.empty(n, n, dtype=dtype)
    return 2 * n**3 / _best_time(lambda: torch.mm(a, b, out=out), repeats) / 1e9


def copy_bandwidth(mib: int = 256, repeats: int = 5) -> float:
    """Memory bandwidth in GB/s from copying a ``mib`` MiB fp32 tensor (read + write
    counted), best of ``repeats``. Far larger than the caches, so it measures DRAM."""
    src = torch.ones(mib * 2**20 // 4)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / _best_time(lambda: dst.copy_(src), repeats) / 1e9


@dataclass
class Limits:
    gflops: float          # peak fp32 matmul GFLOP/s measured here
    bandwidth: float       # GB/s measured here
    bf16_gflops: float | None = None   # peak bf16 matmul GFLOP/s, where the CPU has native bf16

    @property
    def ridge(self) -> float:
        """FLOP/byte above which a kernel can be compute-bound."""
        return self.gflops / self.bandwidth


def measure_limits(n: int = 2048, mib: int = 256, bf16: bool | None = None) -> Limits:
    """The fp32 matmul peak and the copy bandwidth; also the bf16 matmul peak when ``bf16``
    (default: where the CPU has native bf16, :func:`grpo_course.infra.hardware.native_bf16`)."""
    if bf16 is None:
        bf16 = native_bf16()
    return Limits(gflops=matmul_gflops(n), bandwidth=copy_bandwidth(mib),
                  bf16_gflops=matmul_gflops(n, dtype=torch.bfloat16) if bf16 else None)


@dataclass
class RooflinePoint:
    """A workload on the roofline: FLOPs done, bytes moved, seconds taken."""

    name: str
    flops: float
    bytes: float
    seconds: float
    dtype: str = "float32"   # the precision of its weights and matmuls: which compute roof applies

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes

    @property
    def gflops(self) -> float:
        return self.flops / self.seconds / 1e9

    def peak(self, limits: Limits) -> float:
        """The matmul peak of this point's precision (bf16 where it was measured)."""
        return limits.bf16_gflops if self.dtype == "bfloat16" and limits.bf16_gflops else limits.gflops

    def ridge(self, limits: Limits) -> float:
        """The ridge point under this point's own roof (FLOP per byte): below it, memory-bound."""
        return self.peak(limits) / limits.bandwidth

    def bound(self, limits: Limits) -> float:
        """The GFLOP/s the roofline allows at this intensity (the bf16 roof for a bf16 point
        where it was measured)."""
        return min(self.peak(limits), self.intensity * limits.bandwidth)


def decode_point(n_params: int, tokens: int, decode_steps: int, seconds: float,
                 dtype: str = "float32", name: str = "sampling (decode)") -> RooflinePoint:
    """Decoding: each of ``decode_steps`` steps reads every weight once (4 bytes each in
    fp32, 2 in bf16) and does 2 FLOPs per parameter per sequence; ``tokens`` = all
    generated tokens (live rows)."""
    bytes_per_param = 2 if dtype == "bfloat16" else 4
    return RooflinePoint(name, 2.0 * n_params * tokens,
                         float(n_params * bytes_per_param * decode_steps), seconds, dtype)


def training_point(n_params: int, tokens: int, seconds: float, flops_per_param: float = 6.0,
                   weight_reads: int = 3, dtype: str = "float32",
                   name: str = "training pass") -> RooflinePoint:
    """A forward+backward over ``tokens`` tokens in one batch: ``flops_per_param`` x
    params x tokens (2 forward + 4 backward for full fine-tuning; about 4 with LoRA,
    which skips the frozen weights' gradients) and ``weight_reads`` reads of the
    weights (activations ignored, so the intensity is an upper estimate). ``dtype``: the
    precision its products run in (bf16 under bf16 autocast, weights read as bf16), which
    picks the compute roof it is read against."""
    bytes_per_param = 2 if dtype == "bfloat16" else 4
    return RooflinePoint(name, flops_per_param * n_params * tokens,
                         float(n_params * bytes_per_param * weight_reads), seconds, dtype)


def roofline_frame(limits: Limits, points: list[RooflinePoint]) -> pd.DataFrame:
    """The roofline's points as numbers: what each did (FLOPs, bytes, seconds) and what that
    reaches against the bound at its intensity and against its own precision's peak."""
    return pd.DataFrame([{"point": p.name, "dtype": p.dtype, "GFLOP": p.flops / 1e9,
                          "GB of weights read": p.bytes / 1e9, "seconds": p.seconds,
                          "FLOP/byte": p.intensity, "GFLOP/s": p.gflops,
                          "bound GFLOP/s": p.bound(limits), "% of bound": 100 * p.gflops / p.bound(limits),
                          "% of its peak": 100 * p.gflops / p.peak(limits)} for p in points]).set_index("point")


def plot_roofline(limits: Limits, points: list[RooflinePoint], ax=None):
    """Log-log roofline: the bandwidth slope, the matmul ceiling, and the points."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 4))
    lo = min([p.intensity for p in points] + [limits.ridge]) / 4
    hi = max([p.intensity for p in points] + [limits.ridge]) * 4
    x = np.logspace(np.log10(lo), np.log10(hi), 200)
    ax.loglog(x, np.minimum(limits.gflops, x * limits.bandwidth), "k-", lw=2, label="roofline (fp32)")
    if limits.bf16_gflops:
        ax.loglog(x, np.minimum(limits.bf16_gflops, x * limits.bandwidth), "k--", lw=1.5,
                  label="roofline (bf16)")
    ax.axvline(limits.ridge, color="grey", ls=":", lw=1, label=f"ridge point (fp32): {limits.ridge:.1f} FLOP/byte")
    for i, p in enumerate(points):
        ax.plot(p.intensity, p.gflops, "o", ms=9, color=f"C{i}",
                label=f"{p.name}: {p.gflops:.1f} GFLOP/s ({p.gflops / p.bound(limits):.0%} of roof)")
    ax.set_xlabel("arithmetic intensity (FLOP / byte)")
    ax.set_ylabel("GFLOP/s")
    ax.legend(fontsize=8, loc="lower right")
    return ax


# ---------------------------------------------------------------- a lever: all-position logits
def full_sequence_logps(model, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor,
                        completion_ids: torch.Tensor, completion_mask: torch.Tensor,
                        temperature: float = 1.0) -> torch.Tensor:
    """The naive per-token log-probs ``[B, T]``: prompt+completion as one sequence per
    completion (``prompt_ids`` ``[B, Lp]``) and logits for *every* position, then keep
    the completion's. Same values as ``policy.per_token_logps``; here to measure the cost."""
    Lp, T = prompt_ids.shape[1], completion_ids.shape[1]
    ids = torch.cat([prompt_ids, completion_ids], 1)
    mask = torch.cat([prompt_mask, completion_mask], 1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits  # [B, L, V]
    logps = torch.log_softmax(logits[:, Lp - 1:Lp - 1 + T].float() / temperature, -1)
    return logps.gather(-1, completion_ids[..., None]).squeeze(-1)


# ---------------------------------------------------------------- threads, in subprocesses
def run_with_threads(code: str, threads: int, omp_env: bool = True, timeout: float = 600) -> dict:
    """Run ``code`` in a fresh Python with ``threads`` torch threads; it must print one
    JSON object as its last line, which is returned. ``omp_env`` also sets
    ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` in the child's environment (before torch is
    imported there) in addition to ``torch.set_num_threads``."""
    env = dict(os.environ)
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.pop(key, None)
        if omp_env:
            env[key] = str(threads)
    prelude = f"import torch\ntorch.set_num_threads({int(threads)})\n"
    done = subprocess.run([sys.executable, "-c", prelude + code], capture_output=True,
                          text=True, env=env, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"the {threads}-thread subprocess failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


_ORDER_CODE = """
import json, os, time
{before}
import torch
{after}
a = torch.randn(1024, 1024)
torch.mm(a, a)
t0 = time.perf_counter()
for _ in range(5):
    torch.mm(a, a)
print(json.dumps({{"torch_threads": torch.get_num_threads(),
                  "matmul_s": (time.perf_counter() - t0) / 5}}))
"""


def omp_order_demo(threads: int = 1) -> pd.DataFrame:
    """Set ``OMP_NUM_THREADS`` before vs after ``import torch`` in a subprocess: only
    before takes effect, because torch sizes its thread pool from the variable at
    start-up."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    line = f"os.environ['OMP_NUM_THREADS'] = '{int(threads)}'"
    rows = []
    for where, before, after in (("before import torch", line, ""),
                                 ("after import torch", "", line)):
        done = subprocess.run([sys.executable, "-c", _ORDER_CODE.format(before=before, after=after)],
                              capture_output=True, text=True, env=env, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"subprocess failed:\n{done.stderr[-2000:]}")
        rows.append({"OMP_NUM_THREADS set": where,
                     **json.loads(done.stdout.strip().splitlines()[-1])})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------- the sampler benchmark
SAMPLER_ENGINES = {"course": "course sampler", "before": "course sampler, before",
                   "generate": "transformers generate", "llama_cpp": "llama.cpp"}


def sampler_table(record: dict) -> pd.DataFrame:
    """``bench/sampler.py``'s record (``data/sampler.json``) as one row per shape and engine:
    its fastest setting, tokens/s, GFLOP/s and percent of the roof measured in the same run."""
    rows = []
    for shape, engines in record["summary"].items():
        for engine, label in SAMPLER_ENGINES.items():
            if engine in engines:
                e = engines[engine]
                if engine == "before" and record.get("before"):     # the commit it was timed at
                    label = f"course sampler at commit {record['before']}"
                rows.append({"shape": shape, "engine": label, "setting": e["setting"],
                             "tokens/s": round(e["tokens_per_s"]),
                             "GFLOP/s": round(e["gflops"], 1),
                             "% of roof": round(100 * e["fraction_of_roof"], 1)})
    return pd.DataFrame(rows)


#: ratios within this of 1 read "level with": back-to-back runs of one setting on a 2-core VM
#: differ by about as much
LEVEL_BAND = 0.10


#: the band for a ratio of two single timings (no repeat to size the noise): a change of shape
#: timed once moves by more than a repeated best-of timing does
SINGLE_TIMING_BAND = 0.25


def band_word(ratio: float, level: str, above: str, below: str, band: float = LEVEL_BAND) -> str:
    """The words for a ratio of two timings: ``level`` within ``band`` of 1 (default
    :data:`LEVEL_BAND`), else ``above`` (ratio > 1) or ``below``. The band is the same both ways
    (``r`` and ``1 / r`` read alike), so the words do not depend on which timing is on top."""
    if not ratio > 0:                     # NaN (not run) and a non-positive ratio read "below"
        return below
    return level if max(ratio, 1 / ratio) < 1 + band else above if ratio > 1 else below


def _against(ratio: float, peer: str) -> str:
    """"ahead of <peer> (1.95×)", "behind <peer> (0.80×)" or, within :data:`LEVEL_BAND`,
    "level with <peer> (1.03×)"."""
    return f"{band_word(ratio, 'level with', 'ahead of', 'behind')} {peer} ({ratio:.2f}×)"


def against_repeats(what: str, runs: list[float], other: float, unit: str, fmt: str,
                    names: tuple[str, str] = ("LoRA", "full fine-tuning")) -> str:
    """A sentence reading one run of a second setting (``other``, NaN where not run) against one
    or two runs of the first (``runs``): a difference is read only beyond the spread of the
    first setting's two runs, and with one run the sentence says there is no repeat to size
    the noise."""
    text = f"{what} " + " and ".join(f"{v:{fmt}} {unit}" for v in runs) + f" with {names[0]}"
    text += " (the same step, run twice on this page)" if len(runs) == 2 else ""
    if other != other:                   # NaN: the second setting was not run (the profile)
        return text + f"; {names[1]} was not run on this profile"
    text += f" and {other:{fmt}} {unit} with {names[1]}"
    if len(runs) < 2:
        return text + " (one run each: no repeat to size the noise)"
    spread = max(runs) - min(runs)
    if min(runs) - spread <= other <= max(runs) + spread:
        return text + f": within the spread of {names[0]}'s two runs, so these runs show no difference"
    return text + f": {'higher' if other > max(runs) else 'lower'} than both {names[0]} runs by more than their spread"


def runs_compare(a: list[float], b: list[float], name_b: str) -> str:
    """``a``'s repeated runs against ``b``'s (rates, higher is faster): faster or slower only
    where every run of one beats every run of the other, else not told apart, since a best of
    N alone would hide the runs' spread."""
    if min(a) > max(b):
        return f"faster than {name_b} in every run"
    if max(a) < min(b):
        return f"slower than {name_b} in every run"
    return f"not told apart from {name_b} (the runs' ranges overlap)"


def sampler_sentence(record: dict) -> str:
    """One sentence per shape of the course sampler against each peer's fastest setting, the
    words (ahead, behind, level) read from the ratios."""
    names = {"one_line": "at one line left", "whole": "on whole problems",
             "greedy": "in greedy evaluation"}
    peer_names = {"generate": "transformers' generate with {} weights",
                  "llama_cpp": "llama.cpp on its {} file",
                  "before": "this sampler at commit " + str(record.get("before"))}
    parts = []
    for shape, row in record["summary"].items():
        if "course" not in row:
            continue
        P, G, T, _ = record["shapes"][shape]
        peers = [_against(row[f"course_vs_{p}"], peer_names[p].format(row[p]["setting"]))
                 for p in ("generate", "llama_cpp", "before") if f"course_vs_{p}" in row]
        parts.append(f"{names.get(shape, shape)} ({P} prompts × {G}, {T} tokens) the course "
                     f"sampler decodes {row['course']['tokens_per_s']:.0f} tokens/s "
                     f"({100 * row['course']['fraction_of_roof']:.0f} % of the roof)"
                     + (", " + ", ".join(peers) if peers else ""))
    return as_sentences(parts)


def throughput_sentence(bench: dict) -> str:
    """``data/throughput.json`` in words, led by the fair comparison: this trainer with the
    training pass on every group (TRL's amount of work) against TRL's fastest setting on the
    machine the benchmark ran on; then the trainer as shipped, whose lead also depends on how
    many groups tie on the benchmark's prompts; then the sampler alone."""
    facts = bench.get("measured", {})
    native = measured_native_bf16(bench)
    machine = (f"{facts.get('cpu', 'a CPU')} with {facts.get('cpus', '?')} cores, "
               f"{'native' if native else 'no native'} bf16, {facts.get('date', 'undated')}")
    ours, every, best = bench["ours"], bench.get("ours_all_groups", {}), bench.get("trl_best")
    if best and "ratio_all_groups_vs_best" in bench:
        out = (f"at equal work (the training pass on every group, as TRL runs it) this trainer takes "
               f"{every['s_per_step']:.1f} s per step against {best['s_per_step']:.1f} s for TRL at "
               f"its fastest setting ({best['mode']}; {machine}): "
               f"{bench['ratio_all_groups_vs_best']:.1f}× its completions per second")
        if "rss_ratio_all_groups_vs_best" in bench:
            out += (f", at {bench['rss_ratio_all_groups_vs_best']:.2f}× its peak memory "
                    f"({every['peak_rss_mib']:.0f} against {best['peak_rss_mib']:.0f} MiB)")
        if "frac_groups_dropped" in ours:
            out += (f". As shipped it also leaves groups whose rewards tie out of the training "
                    f"pass ({100 * ours['frac_groups_dropped']:.0f} % of this benchmark's groups; "
                    f"how many tie depends on the prompts and the policy): "
                    f"{bench['ratio_vs_best']:.1f}× in that benchmark")
    else:
        out = (f"{bench['ratio']:.1f}× TRL's completions per second with TRL in fp32, which is "
               f"not its fastest setting ({machine}; rerun make bench for the fair comparison)")
    sampling, fp32 = bench.get("sampling_32", {}), bench.get("sampling_32_fp32", {})
    if "tokens_per_s" in sampling:
        dtype = recorded_sampler_dtype(sampling, native)
        out += (f". The sampler alone decodes {sampling['tokens_per_s']:.0f} tokens/s with "
                f"{sampling.get('sequences', 32)} sequences at once, with {dtype} weights")
        if "tokens_per_s" in fp32 and dtype != "float32":
            out += f" ({fp32['tokens_per_s']:.0f} with float32 weights)"
    return out


def measured_native_bf16(bench: dict) -> bool:
    """Whether the CPU a benchmark file was measured on had native bf16: as recorded, or, for an
    older file, from its AVX512-BF16 and AMX flags."""
    facts = bench.get("measured", {})
    return bool(facts.get("native_bf16", facts.get("avx512_bf16") or facts.get("amx_bf16")))


def recorded_sampler_dtype(record: dict, native: bool) -> str:
    """The weights' dtype a sampler timing ran in: as recorded, or, for a file that recorded only
    the setting ``"auto"``, what auto resolves to on the benchmark's CPU (bf16 where ``native``)."""
    dtype = str(record.get("sampling_dtype", "auto")).removeprefix("torch.")
    if dtype == "auto":
        return "bfloat16" if native else "float32"
    return dtype


def trl_modes_frame(bench: dict) -> pd.DataFrame:
    """Every TRL precision mode ``bench/throughput.py`` timed, one row each: the median step, the
    fastest and slowest of its steps, completions per second and peak memory, fastest first."""
    rows = {name: {"weights": m.get("weights"), "bf16 autocast": m.get("bf16"),
                   "gradient checkpointing": m.get("gradient_checkpointing"),
                   "steps timed": m.get("steps"), "s/step (median)": m.get("s_per_step"),
                   "fastest step s": min(m["step_seconds"]) if m.get("step_seconds") else None,
                   "slowest step s": max(m["step_seconds"]) if m.get("step_seconds") else None,
                   "completions/s": m.get("completions_per_s"), "peak RSS MiB": m.get("peak_rss_mib")}
            for name, m in bench.get("trl_modes", {}).items()}
    frame = pd.DataFrame.from_dict(rows, orient="index")
    frame.index.name = "TRL mode"
    return frame.sort_values("completions/s", ascending=False) if len(frame) else frame
