"""One hardware probe: native bf16 / AMX, cores, RSS; the sampler and chapter 6 agree."""
import os

import pytest
import torch

from grpo_course.core.sampling import resolve_sampling_dtype
from grpo_course.infra import hardware


@pytest.fixture
def fake_cpu(monkeypatch):
    """Pretend a CPU: ``fake_cpu(flags, torch_bf16, torch_amx)``."""
    def make(flags=(), torch_bf16=False, torch_amx=False):
        monkeypatch.setattr(hardware, "_cpuinfo", lambda: ("Fake CPU", frozenset(flags)))
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: torch_bf16)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: torch_amx)
    return make


@pytest.mark.parametrize("flags, torch_bf16, torch_amx, native", [
    ((), False, False, False),
    (("avx2", "avx512f"), False, False, False),
    (("avx512_bf16",), False, False, True),          # listed by the kernel
    ((), True, False, True),                         # detected by torch
    (("amx_tile", "amx_bf16"), False, False, True),  # AMX alone is native bf16
    ((), False, True, True),
])
def test_native_bf16_is_avx512_bf16_or_amx(fake_cpu, flags, torch_bf16, torch_amx, native):
    fake_cpu(flags, torch_bf16, torch_amx)
    assert hardware.native_bf16() is native
    assert resolve_sampling_dtype("auto") == (torch.bfloat16 if native else None)
    features = hardware.cpu_features()
    assert features["native_bf16"] is native and features["cpu"] == "Fake CPU"
    assert f"native bf16: {'yes' if native else 'no'}" in hardware.describe_cpu(features)


def test_chapter6_and_the_sampler_agree_on_an_amx_only_cpu(fake_cpu):
    """Before: chapter 6 said "native bf16: no" (it read AVX512-BF16 only) while the sampler
    picked bf16 (it also counted AMX)."""
    fake_cpu(flags=("amx_tile",))
    assert resolve_sampling_dtype("auto") is torch.bfloat16
    assert "native bf16: yes" in hardware.describe_cpu(hardware.cpu_features())


def test_cpu_flags_come_from_proc_cpuinfo():
    flags = hardware.cpu_flags()
    assert isinstance(flags, frozenset)
    if os.path.exists("/proc/cpuinfo") and os.uname().machine in ("x86_64", "AMD64"):
        assert "sse2" in flags                        # every x86-64 CPU lists it


def test_cores_and_memory():
    expected = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert hardware.available_cores() == expected
    before = hardware.rss_mib()
    block = torch.ones(64 * 2**20 // 4)               # 64 MiB, touched
    grown = hardware.rss_mib() - before
    assert 48 < grown < 128, grown
    assert hardware.peak_rss_mib() >= hardware.rss_mib() - 1
    del block
