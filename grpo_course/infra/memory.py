"""How much memory a chapter needs, and how much this machine gives.

``bench/memory.py`` executes each chapter in a fresh kernel and records its peak resident memory
(kernel and child processes, sampled) per profile in ``grpo_course/measurements/memory.json``. A notebook calls
:func:`check_memory` before its heavy cells: where the measured peak of its chapter on the
current profile exceeds what the machine (or its container, e.g. Binder's ~2 GB) allows, it says
so before it starts instead of being killed half-way. :func:`memory_limit_bytes` is also what
picks the ``binder`` profile automatically on small machines (:func:`grpo_course.config.get_profile`).
"""
from __future__ import annotations

import ctypes
import gc
import json
import os
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import psutil

from grpo_course.config import PROFILES, SIZED_PROFILES, sized_label, sizes_for
from grpo_course.infra.hardware import memory_limit_bytes

#: The measurements of ``bench/memory.py``: ``{"results": {chapter: {profile: {...}}}}``.
#: the measured peaks (package data, written by ``bench/memory.py``)
MEMORY_FILE = Path(str(resources.files("grpo_course") / "measurements" / "memory.json"))
#: Binder's per-session memory (mybinder.org gives "up to 2 GB") and the most a chapter may take
#: on the ``binder`` profile, leaving room for the notebook server.
BINDER_BYTES = 2 * 10**9
CHAPTER_LIMIT_MIB = 1.8 * 1024

#: glibc's ``mallopt`` parameter number for the mmap threshold (malloc.h: ``M_MMAP_THRESHOLD``).
M_MMAP_THRESHOLD = -3


def return_freed_memory(threshold: int = 128 * 1024) -> bool:
    """Make the C allocator hand blocks of ``threshold`` bytes or more back to the system as soon
    as they are freed. By default glibc raises this threshold (up to 32 MiB) each time a large
    block is freed; from then on tensors of a few MiB come from the heap, and the heap keeps what a
    training step freed: a chapter's resident memory grew by gigabytes that way, with nothing
    alive in it. Fixing the threshold turns that raise off. Returns ``False`` where the C
    library is not glibc (nothing changes there)."""
    mallopt = _libc("mallopt")
    return bool(mallopt and mallopt(M_MMAP_THRESHOLD, int(threshold)))


def _libc(name: str):
    """glibc's function ``name`` (``None`` off Linux or where the C library is not glibc)."""

    if not sys.platform.startswith("linux"):
        return None
    try:
        return getattr(ctypes.CDLL("libc.so.6"), name)
    except (OSError, AttributeError):
        return None


#: Set by :func:`use_low_memory` (or ``GRPO_COURSE_LOW_MEMORY=1`` in the environment, which
#: ``binder/start`` exports for every process of a Binder session).
LOW_MEMORY_ENV = "GRPO_COURSE_LOW_MEMORY"
_low_memory = False
#: Set by :func:`give_back_freed_memory` (every notebook, through :func:`check_memory`), and
#: inherited by the processes it starts (TRL's ranks under ``accelerate launch``).
GIVE_BACK_ENV = "GRPO_COURSE_GIVE_BACK_MEMORY"
_give_back = False
#: oneDNN's caches of compiled matrix-product kernels (and ideep's, which PyTorch's bf16 products go
#: through) keep one entry per new shape, up to 1024 by default, and every GRPO step brings new
#: lengths, so the caches grow with every step; capped at 64 they hold far less at the same speed
#: (``bench/throughput.py`` records the peak RSS of its steps). Importing ``grpo_course`` caps them
#: (:func:`cap_kernel_caches`; environment variables read at oneDNN's first use, so a value set
#: before stays; LRU_CACHE_CAPACITY=0 crashed the training pass here).
ONEDNN_CACHES = {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64", "LRU_CACHE_CAPACITY": "64"}


def cap_kernel_caches() -> None:
    """Cap oneDNN's kernel caches at :data:`ONEDNN_CACHES` in this process and the processes it
    starts, unless the environment already sets them (it takes effect before oneDNN's first use)."""
    for name, value in ONEDNN_CACHES.items():
        os.environ.setdefault(name, value)


def give_back_freed_memory() -> bool:
    """Hand freed memory back to the system from now on, in this process and the processes it
    starts: the trainers trim their heap after every step and a notebook after every cell
    (:func:`trim_heap`, :func:`free_memory`). Without it a chapter's resident memory keeps what its
    training steps freed, and the next cell (or a 2-process run, started beside the kernel) adds
    to it. Every notebook turns it on (:func:`check_memory`); the low-memory mode adds unmapping
    each large block as it is freed. Returns whether this process can trim (glibc only)."""
    global _give_back
    _give_back = True
    os.environ[GIVE_BACK_ENV] = "1"               # processes started from here on inherit it
    _free_after_every_cell()
    return _libc("malloc_trim") is not None


def gives_back_memory() -> bool:
    """Whether :func:`give_back_freed_memory` (or the low-memory mode) is in effect, here or
    through the environment."""
    return (_give_back or low_memory()
            or os.environ.get(GIVE_BACK_ENV, "") not in ("", "0"))


def use_low_memory() -> bool:
    """Trade a little speed for memory from now on, in this process (the ``binder`` profile's
    ``low_memory``): freed memory goes back to the system (:func:`give_back_freed_memory`), large
    blocks as soon as they are freed (:func:`return_freed_memory`), the GRPO training pass casts
    each frozen weight to bf16 as it uses it (no bf16 copy of the model), and the sampler keeps no
    second, re-ordered copy of its bf16 weights. Child processes inherit the mode through the
    environment. Returns whether the allocator part took effect (glibc only; the rest always
    does)."""
    global _low_memory
    _low_memory = True
    os.environ[LOW_MEMORY_ENV] = "1"              # processes started from here on inherit the mode
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "131072")   # (glibc reads this one at start-up)
    give_back_freed_memory()
    return return_freed_memory()


def _free_after_every_cell() -> bool:
    """In IPython/Jupyter, run :func:`free_memory` after every cell (once registered, it stays):
    what a cell freed goes back before the next cell starts. ``False`` outside IPython."""
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None:
        return False
    callbacks = shell.events.callbacks.get("post_run_cell", [])
    if not any(getattr(cb, "__name__", "") == "_free_memory_after_cell" for cb in callbacks):
        shell.events.register("post_run_cell", _free_memory_after_cell)
    return True


def _free_memory_after_cell(result=None) -> None:
    free_memory()


def low_memory() -> bool:
    """Whether :func:`use_low_memory` is in effect (here or through ``$GRPO_COURSE_LOW_MEMORY``)."""
    return _low_memory or os.environ.get(LOW_MEMORY_ENV, "") not in ("", "0")


def trim_heap() -> int:
    """Where freed memory is given back (:func:`gives_back_memory`), hand the free pages inside
    glibc's heaps back to the system (``malloc_trim``) and return how many bytes the resident
    memory fell; 0 otherwise. A training
    step frees thousands of small blocks (under the mmap threshold) that stay in the heap between
    live ones: on the binder profile the resident memory crept up with every GRPO update, with no
    tensor using it, and stays flat with a trim after each update."""
    if not gives_back_memory():
        return 0
    trim = _libc("malloc_trim")
    if trim is None:
        return 0

    before = psutil.Process().memory_info().rss
    trim(0)
    return max(before - psutil.Process().memory_info().rss, 0)


def free_memory() -> int:
    """Collect Python's garbage now (a trainer and its model hold reference cycles, so ``del`` alone
    does not free them), then :func:`trim_heap`; returns the bytes the resident memory fell by
    (0 where freed memory is not given back, :func:`gives_back_memory`: only the collection runs)."""

    gc.collect()
    return trim_heap()


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of process ``pid`` and all its descendants now (0 once it is gone)."""

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.Error:      # exited between listing and reading
            pass
    return total


def read_measurements(path: str | Path = MEMORY_FILE) -> dict[str, dict[str, dict[str, Any]]]:
    """``{chapter: {profile: {"peak_rss_mib", "wall_s", ...}}}`` from ``bench/memory.py``'s
    file; empty when it has not been run."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8")).get("results", {})
    except (OSError, ValueError):
        return {}


def check_memory(chapter: str, profile: str, path: str | Path = MEMORY_FILE,
                 limit_bytes: int | None = None) -> str:
    """One sentence on whether ``chapter`` fits this machine on ``profile``, from its measured
    peak (printed by the notebook before its heavy cells). It warns, naming the profile that
    fits, when the measured peak is larger than the memory this machine gives. It first turns on
    what the measured peaks assume, and says so: on a profile with ``low_memory`` (binder) the
    low-memory mode (:func:`use_low_memory`), on any other :func:`give_back_freed_memory`."""
    if profile in PROFILES and PROFILES[profile].low_memory:
        use_low_memory()
        note = (" Low-memory mode is on: freed memory goes back to the system at once, the trainers "
                "trim their heap after each step, the sampler keeps one copy of its weights.")
    else:
        give_back_freed_memory()
        note = (" Freed memory goes back to the system after every cell and training step (the "
                "measured peaks assume it).")
    return _fits(chapter, profile, path, limit_bytes) + note


def measured_profile(profile: str, record: dict[str, Any]) -> str:
    """``"full profile (large sizes)"``: the profile of a measurement with the sizes it ran at,
    which are those of the machine that measured it (its ``sizes``, else its CPU's), not always
    this machine's."""
    sizes = record.get("sizes")
    machine = record.get("machine")
    if sizes is None and machine and profile in SIZED_PROFILES:
        sizes = sizes_for(bool(machine.get("native_bf16")), bool(machine.get("amx_bf16")))
    return sized_label(f"{profile} profile", sizes)


def _fits(chapter: str, profile: str, path: str | Path, limit_bytes: int | None) -> str:
    limit = memory_limit_bytes() if limit_bytes is None else limit_bytes
    limit_gib = limit / 2**30
    peaks = read_measurements(path).get(chapter, {})
    peak = peaks.get(profile, {}).get("peak_rss_mib")
    if peak is None:
        return (f"This machine gives {limit_gib:.1f} GiB; the peak of {chapter} on the {profile} "
                f"profile has not been measured here (python bench/memory.py).")
    if peak * 2**20 <= limit:
        return (f"This chapter peaked at {peak / 1024:.1f} GiB on the "
                f"{measured_profile(profile, peaks[profile])} when measured; this machine gives "
                f"{limit_gib:.1f} GiB: it fits.")
    fits = sorted((p for p, m in peaks.items() if m.get("peak_rss_mib", 1e18) * 2**20 <= limit),
                  key=lambda p: -peaks[p]["peak_rss_mib"])
    advice = (f"set GRPO_COURSE_PROFILE={fits[0]} (measured {peaks[fits[0]]['peak_rss_mib'] / 1024:.1f} "
              f"GiB) and restart the kernel" if fits else "no measured profile fits it")
    return (f"WARNING: this chapter peaked at {peak / 1024:.1f} GiB on the "
            f"{measured_profile(profile, peaks[profile])}, more "
            f"than the {limit_gib:.1f} GiB this machine gives: the kernel would be killed part-way. "
            f"{advice[0].upper()}{advice[1:]}.")
