"""Peak memory and wall time of every chapter, each executed in a fresh kernel.

    python bench/memory.py                                 # binder and full profiles, all chapters
    python bench/memory.py --profiles binder --chapters 03,04

Each (chapter, profile) pair runs its notebook top to bottom in a new Jupyter kernel started with
``GRPO_COURSE_PROFILE=<profile>`` (a copy of the notebook in a temporary folder; ``notebooks/``
is never written). While it runs, the resident memory of the kernel and every process it starts
(TRL's launcher and its ranks, pytest) is summed every ``--interval`` seconds; the peak of that sum
is the chapter's ``peak_rss_mib``; ``top_cells`` names the three code cells (by id) that raised the running
peak the most, and ``cells`` lists every code cell's peak, its resident memory at its end and its
seconds: where to look when a chapter is over its limit; ``slowest_cells`` names the five code cells
that took longest, where to look when a chapter is over its 15 minutes; ``machine`` names the CPU it ran on and whether bf16
is native there (the top-level ``machine`` is the last run's). The results are merged into ``--out`` (default
``grpo_course/measurements/memory.json``, package data, written atomically after every pair, so an interrupted run keeps what it
measured and the notebooks' :func:`grpo_course.infra.memory.check_memory` reads it). One JSON line
with every measured pair, the limit of the ``binder`` profile (1.8 GiB per chapter) and the
machine is printed at the end; progress goes to stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grpo_course.config import PROFILE_NAMES, cpu_kind
from grpo_course.infra.atomic import write_json_atomic
from grpo_course.infra.errors import OneLineArgumentParser
from grpo_course.infra.hardware import bench_facts, memory_limit_bytes
from grpo_course.infra.memory import CHAPTER_LIMIT_MIB, MEMORY_FILE, read_measurements, tree_rss_bytes

NOTEBOOKS = ROOT / "notebooks"


class PeakSampler(threading.Thread):
    """Samples the summed RSS of a process tree until stopped; ``peak`` is the largest sum."""

    def __init__(self, pid: int, interval: float):
        super().__init__(daemon=True)
        self.pid, self.interval, self.peak, self.window_peak = pid, interval, 0, 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            rss = tree_rss_bytes(self.pid)
            self.peak, self.window_peak = max(self.peak, rss), max(self.window_peak, rss)
            self._stop_event.wait(self.interval)

    def take_window(self) -> tuple[int, int]:
        """The peak since the last call (one cell's peak when called after every cell) and the
        resident memory now."""
        rss = tree_rss_bytes(self.pid)
        self.peak, peak, self.window_peak = max(self.peak, rss), max(self.window_peak, rss), 0
        return peak, rss

    def stop(self) -> int:
        self._stop_event.set()
        self.join()
        return self.peak


def run_chapter(path: Path, profile: str, interval: float, timeout: float,
                executed: Path | None = None) -> dict:
    """Execute one notebook in a fresh kernel on ``profile``; its peak RSS (MiB) and wall time.
    With ``executed`` the notebook with its outputs is written there as ``<stem>.<profile>.ipynb``."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    work = Path(tempfile.mkdtemp(prefix="memory-"))
    try:
        shutil.copytree(ROOT / "book", work / "book")           # relative image links
        (work / "notebooks").mkdir()
        env = {**os.environ, "GRPO_COURSE_PROFILE": profile}
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3",
                                resources={"metadata": {"path": str(work / "notebooks")}})
        start, error, cells = time.perf_counter(), None, []
        with client.setup_kernel(env=env, cwd=str(work / "notebooks")):
            sampler = PeakSampler(client.km.provisioner.pid, interval)
            sampler.start()
            try:
                for index, cell in enumerate(nb.cells):
                    sampler.take_window()
                    began = time.perf_counter()
                    client.execute_cell(cell, index)
                    if cell.cell_type == "code":
                        cells.append((cell.get("id", str(index)), *sampler.take_window(),
                                      time.perf_counter() - began))
            except CellExecutionError as exc:
                error = " ".join(str(exc).split())[-300:]
            finally:
                peak = sampler.stop()
        wall = time.perf_counter() - start
        if executed is not None:
            from grpo_course.infra.atomic import write_text_atomic
            write_text_atomic(executed / f"{path.stem}.{profile}.ipynb", nbformat.writes(nb))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    top = [{"cell": cid, "peak_rss_mib": mib(peak), "rise_mib": mib(rise)}
           for rise, cid, peak in sorted(peak_rises([c[:3] for c in cells]), reverse=True)[:3] if rise > 0]
    return {"peak_rss_mib": mib(peak), "wall_s": round(wall, 1), "ok": error is None,
            "top_cells": top, "slowest_cells": slowest_cells(cells),
            "cells": [[cid, mib(peak), mib(end), round(s, 1)] for cid, peak, end, s in cells],
            **({"error": error} if error else {}), "date": time.strftime("%Y-%m-%d %H:%M"),
            "commit": git_commit(), "machine": machine_facts(),
            **({"sizes": cpu_kind()} if profile != "smoke" else {})}


MACHINE_KEYS = ("cpu", "avx512_bf16", "amx_bf16", "native_bf16")


def machine_facts() -> dict:
    """The machine a pair ran on, kept with its entry (the file merges runs from several machines,
    and whether bf16 is native changes a profile's sizes and dtypes)."""
    facts = bench_facts()
    return {k: facts[k] for k in MACHINE_KEYS}


def read_machine(path: Path) -> dict | None:
    """The file's top-level ``machine`` record (its last run's), if it has one."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8")).get("machine")
    except (OSError, ValueError):
        return None


def with_machines(results: dict, machine: dict | None) -> dict:
    """``results`` with every entry that has no ``machine`` of its own given the file's top-level
    record (from before entries kept their own, that record was the only one and named the machine
    of all of them), before a new run replaces it."""
    if machine:
        for entry in (e for by_profile in results.values() for e in by_profile.values()):
            entry.setdefault("machine", {k: machine.get(k) for k in MACHINE_KEYS})
    return results


def mib(n_bytes: int) -> float:
    return round(n_bytes / 2**20, 1)


def peak_rises(cells: list[tuple[str, int, int]]) -> list[tuple[int, str, int]]:
    """(rise, cell id, peak) of each cell: how far its peak raised the running maximum of the
    cells before it. Memory that one cell keeps raises the baseline of every later cell; this
    names the cell that added it, not the later cells that merely sit on it."""
    rises, high = [], 0
    for cid, peak, _ in cells:
        rises.append((max(0, peak - high), cid, peak))
        high = max(high, peak)
    return rises


def slowest_cells(cells: list[tuple[str, int, int, float]], n: int = 5) -> list[dict]:
    """The ``n`` code cells that took longest (id, seconds, share of the chapter's cell time): where
    a page's minutes go, for fitting it to its budget."""
    total = sum(c[3] for c in cells) or 1.0
    return [{"cell": cid, "seconds": round(s, 1), "share": round(s / total, 3)}
            for cid, _, _, s in sorted(cells, key=lambda c: -c[3])[:n]]


def git_commit() -> str | None:
    """The checkout's commit (with ``+`` when it has uncommitted changes other than this
    benchmark's own results file), if git knows it."""
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".",
                                f":(exclude){MEMORY_FILE.relative_to(ROOT)}"], cwd=ROOT,
                               text=True, capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+" if dirty else "")


def chapter_paths(names: str | None) -> list[Path]:
    """The notebooks named by ``--chapters`` (number prefixes or stems), all when ``None``."""
    every = sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
    if not names:
        return every
    chosen = []
    for name in (n.strip() for n in names.split(",") if n.strip()):
        match = [p for p in every if p.stem == name or p.stem.split("_")[0] == name.zfill(2)]
        if not match:
            raise ValueError(f"--chapters: no chapter {name!r} (choose from "
                             f"{', '.join(p.stem for p in every)})")
        chosen += match
    return chosen


def main(argv: list[str] | None = None) -> int:
    p = OneLineArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--profiles", default="binder,full", help="comma-separated profiles to measure")
    p.add_argument("--chapters", default=None, help="e.g. 03,04 (default: every chapter)")
    p.add_argument("--interval", type=float, default=0.5, help="seconds between RSS samples")
    p.add_argument("--timeout", type=float, default=3600, help="seconds one cell may run")
    p.add_argument("--out", default=str(MEMORY_FILE))
    p.add_argument("--executed", default=None, help="a folder for the executed notebooks (kept)")
    a = p.parse_args(argv)
    profiles = [x.strip() for x in a.profiles.split(",") if x.strip()]
    bad = [x for x in profiles if x not in PROFILE_NAMES]
    if bad or not profiles:
        p.error(f"--profiles {a.profiles!r}: choose from {', '.join(PROFILE_NAMES)}")
    if a.interval <= 0 or a.timeout <= 0:
        p.error(f"--interval and --timeout must be > 0; got {a.interval} and {a.timeout}")
    out = Path(a.out)
    if out.is_dir() or not out.parent.is_dir():
        p.error(f"--out {a.out!r} must name a file in an existing folder")
    if a.executed is not None and not Path(a.executed).is_dir():
        p.error(f"--executed {a.executed!r} is not a folder")
    try:
        paths = chapter_paths(a.chapters)
    except ValueError as exc:
        p.error(str(exc))

    results = with_machines(read_measurements(out), read_machine(out))
    failed: list[str] = []
    for path in paths:
        for profile in profiles:
            print(f"{path.stem} on {profile} ...", file=sys.stderr, flush=True)
            res = run_chapter(path, profile, a.interval, a.timeout,
                              Path(a.executed) if a.executed else None)
            if res["ok"] or not results.get(path.stem, {}).get(profile, {}).get("ok"):
                results.setdefault(path.stem, {})[profile] = res
            else:                                  # a failed run never replaces a measured peak
                failed.append(f"{path.stem}/{profile}")
            print(f"  peak {res['peak_rss_mib']:.0f} MiB, {res['wall_s'] / 60:.1f} min"
                  + ("" if res["ok"] else f", FAILED: {res['error']}"), file=sys.stderr, flush=True)
            write_json_atomic(out, {"results": results})
    failed += [f"{ch}/{pr}" for ch, r in results.items() for pr, v in r.items() if not v["ok"]]
    binder = {ch: r["binder"]["peak_rss_mib"] for ch, r in results.items() if "binder" in r}
    line = {"bench": "memory", "results": results,
            "binder_limit_mib": CHAPTER_LIMIT_MIB,
            "binder_within_limit": (all(v <= CHAPTER_LIMIT_MIB for v in binder.values()) and not failed
                                    if binder else None),
            "failed": failed,
            "machine": {**bench_facts(), "memory_limit_mib": round(memory_limit_bytes() / 2**20)}}
    write_json_atomic(out, {"results": results, "machine": line["machine"]})
    print(json.dumps(line))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
