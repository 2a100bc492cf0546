"""What this machine offers: CPU flags, native bf16 and AMX, usable cores and torch's threads on
them, resident memory.

One probe for each, so that the sampler's and the trainer's ``"auto"`` precision
(:func:`grpo_course.core.sampling.resolve_sampling_dtype`), chapter 6's description of the CPU
(:func:`describe_cpu`), the profiler and the benchmarks all say the same thing.

Native bf16 (:func:`native_bf16`) means bf16 matrix products in hardware: AVX512-BF16 or
AMX, as listed in ``/proc/cpuinfo`` or detected by torch. Without it bf16 products are
emulated and slower than fp32.
"""
from __future__ import annotations

import os
import platform
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any

import psutil
import torch


@lru_cache(maxsize=1)
def _cpuinfo() -> tuple[str, frozenset[str]]:
    """``(model name, flags)`` from ``/proc/cpuinfo`` (the platform's name and no flags
    where it cannot be read)."""
    name, flags = platform.processor() or platform.machine(), frozenset()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    name = value.strip()
                elif key.strip() in ("flags", "Features"):
                    flags = frozenset(value.split())
                    break
    except OSError:
        pass
    return name, flags


def cpu_name() -> str:
    """The CPU's model name, e.g. ``"AMD EPYC 7763 64-Core Processor"``."""
    return _cpuinfo()[0]


def cpu_flags() -> frozenset[str]:
    """The instruction-set flags the kernel lists for this CPU (empty where unknown)."""
    return _cpuinfo()[1]


def has_avx512_bf16() -> bool:
    """AVX512-BF16 (bf16 dot products in vector registers)."""
    return "avx512_bf16" in cpu_flags() or bool(torch.cpu._is_avx512_bf16_supported())


def has_amx() -> bool:
    """AMX tiles (Intel Advanced Matrix Extensions: bf16 and int8 matrix products)."""
    return "amx_tile" in cpu_flags() or bool(torch.cpu._is_amx_tile_supported())


def native_bf16() -> bool:
    """Whether bf16 matrix products run natively here (AVX512-BF16 or AMX)."""
    return has_avx512_bf16() or has_amx()


def cpu_features() -> dict[str, Any]:
    """What this CPU offers int8 and bf16 kernels: its name, torch's vector ISA level, the
    instruction sets that make int8 dot products (VNNI, AMX) and bf16 matmuls native."""
    flags = cpu_flags()
    return {"cpu": cpu_name(), "torch_isa": torch.backends.cpu.get_cpu_capability(),
            "avx512_vnni": "avx512_vnni" in flags, "avx_vnni": "avx_vnni" in flags,
            "avx512_bf16": has_avx512_bf16(), "amx": has_amx(), "native_bf16": native_bf16()}


def bench_facts() -> dict[str, Any]:
    """What every benchmark records about the machine it ran on: the CPU, the flags that decide
    the fastest precision (AVX2, AVX-512, AVX512-BF16, AMX), native bf16 and torch's version."""
    flags = cpu_flags()
    return {"cpu": cpu_name(), "torch": torch.__version__,
            **{f: f in flags for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")},
            "native_bf16": native_bf16()}


def describe_cpu(features: dict[str, Any] | None = None) -> str:
    """One phrase for the prose, e.g. "AMD EPYC; torch kernels at AVX512; int8 dot products
    (VNNI): yes; native bf16: no; AMX: no"."""
    f = features or cpu_features()
    native = f.get("native_bf16", f["avx512_bf16"] or f["amx"])
    yes = lambda b: "yes" if b else "no"
    return (f"{f['cpu']}; torch kernels at {f['torch_isa']}; int8 dot products (VNNI): "
            f"{yes(f['avx512_vnni'] or f['avx_vnni'])}; native bf16: {yes(native)}; "
            f"AMX: {yes(f['amx'])}")


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity; all cores where unknown)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def set_threads(n: int | None = None) -> int:
    """Use ``n`` intra-op threads (default: the cores we may run on,
    :func:`~grpo_course.infra.hardware.available_cores`)."""
    n = max(1, int(available_cores() if n is None else n))
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n


def share_cores(local_rank: int, local_world: int) -> int:
    """Pin this process to its own slice of the cores it may run on (process ``local_rank`` of
    ``local_world`` on this machine) and return how many it got. Unpinned, data-parallel processes
    on a small CPU migrate between the same cores and run several times slower."""
    try:
        cores = sorted(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows: no affinity API; share by count only
        return max(1, (os.cpu_count() or 1) // max(1, local_world))
    if local_world <= 1 or len(cores) < local_world:
        return max(1, len(cores) // max(1, local_world))
    per = len(cores) // local_world
    mine = cores[local_rank * per:(local_rank + 1) * per]
    os.sched_setaffinity(0, mine)
    return len(mine)


def rss_bytes() -> int:
    """This process's resident memory now, in bytes."""
    return psutil.Process().memory_info().rss


def rss_mib() -> float:
    """This process's resident memory now, in MiB."""
    return rss_bytes() / 2**20


def peak_rss_mib() -> float:
    """The most resident memory this process has held so far, in MiB."""
    try:
        import resource
    except ImportError:  # Windows
        return getattr(psutil.Process().memory_info(), "peak_wset", rss_bytes()) / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024   # bytes vs KiB


#: Below this much memory the ``binder`` profile is chosen when none is named.
SMALL_MACHINE_BYTES = 4 * 2**30
_CGROUP_FILES = ("/sys/fs/cgroup/memory.max",                        # cgroup v2
                 "/sys/fs/cgroup/memory/memory.limit_in_bytes")      # cgroup v1


def cgroup_limit_bytes(files: tuple[str, ...] = _CGROUP_FILES) -> int | None:
    """The container's memory limit (cgroup v2 or v1), or ``None`` where there is none."""
    for name in files:
        try:
            text = Path(name).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:     # "max" or a huge v1 value: no limit
            return int(text)
    return None


def memory_limit_bytes() -> int:
    """The memory this process can use at most: the machine's RAM or its container's limit,
    whichever is smaller."""

    total = psutil.virtual_memory().total
    limit = cgroup_limit_bytes()
    return min(total, limit) if limit else total
