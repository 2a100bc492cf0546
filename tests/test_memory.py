"""Memory limits, the measured peaks and the binder profile (issue 22)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_course import config
from grpo_course.infra import hardware, memory


def test_cgroup_limit_reads_v2_and_v1_and_ignores_no_limit(tmp_path):
    v2, v1 = tmp_path / "memory.max", tmp_path / "limit_in_bytes"
    v2.write_text("max\n")
    v1.write_text("9223372036854771712\n")               # cgroup v1's "no limit"
    assert hardware.cgroup_limit_bytes((str(v2), str(v1))) is None
    v1.write_text("2147483648\n")
    assert hardware.cgroup_limit_bytes((str(v2), str(v1))) == 2 * 2**30
    v2.write_text("1073741824\n")
    assert hardware.cgroup_limit_bytes((str(v2), str(v1))) == 2**30
    assert hardware.cgroup_limit_bytes((str(tmp_path / "absent"),)) is None
    assert 0 < hardware.memory_limit_bytes()


def test_tree_rss_counts_a_child_process():
    import os
    import subprocess
    import sys

    alone = memory.tree_rss_bytes(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        import time
        time.sleep(0.5)
        assert memory.tree_rss_bytes(os.getpid()) > alone
    finally:
        child.kill()
        child.wait()
    assert memory.tree_rss_bytes(child.pid) == 0          # gone: nothing, no error


@pytest.fixture(autouse=True)
def modes_restored(monkeypatch):
    """check_memory turns modes on in this process: each test's changes are undone after it."""
    monkeypatch.setattr(memory, "_low_memory", memory._low_memory)
    monkeypatch.setattr(memory, "_give_back", memory._give_back)
    for name in (memory.LOW_MEMORY_ENV, memory.GIVE_BACK_ENV):
        monkeypatch.setenv(name, os.environ.get(name, "0"))


def measured(tmp_path, results):
    path = tmp_path / "memory.json"
    path.write_text(json.dumps({"results": results}))
    return path


def test_check_memory_says_whether_the_chapter_fits(tmp_path):
    path = measured(tmp_path, {"03_grpo": {"full": {"peak_rss_mib": 3200.0},
                                           "binder": {"peak_rss_mib": 1500.0}}})
    fits = memory.check_memory("03_grpo", "full", path, limit_bytes=24 * 2**30)
    assert "3.1 GiB" in fits and "fits" in fits and "WARNING" not in fits
    warn = memory.check_memory("03_grpo", "full", path, limit_bytes=2 * 10**9)
    assert warn.startswith("WARNING") and "GRPO_COURSE_PROFILE=binder" in warn and "1.5 GiB" in warn
    none_fit = memory.check_memory("03_grpo", "full", path, limit_bytes=2**30)
    assert none_fit.startswith("WARNING") and "No measured profile fits" in none_fit
    unknown = memory.check_memory("04_trl", "full", path, limit_bytes=2**30)
    assert "full profile when" in fits              # a record that does not say its sizes
    assert "not been measured" in unknown
    assert memory.read_measurements(tmp_path / "absent.json") == {}


def test_small_machines_get_the_binder_profile(monkeypatch, capsys):
    monkeypatch.delenv(config.PROFILE_ENV, raising=False)
    config._default_profile_name.cache_clear()
    monkeypatch.setattr(hardware, "memory_limit_bytes", lambda: 2 * 10**9)
    try:
        assert config.get_profile().name == "binder"
        assert config.get_profile().name == "binder"
        said = capsys.readouterr().out
        assert said.count("binder profile") == 1 and "1.9 GiB" in said     # said once
        config._default_profile_name.cache_clear()
        monkeypatch.setattr(hardware, "memory_limit_bytes", lambda: 24 * 2**30)
        assert config.get_profile().name == "full" and capsys.readouterr().out == ""
    finally:
        config._default_profile_name.cache_clear()


def test_binder_profile_keeps_the_full_recipe_with_less_memory():
    full, binder = config.get_profile("full"), config.get_profile("binder")
    assert binder.grpo.gradient_checkpointing and not full.grpo.gradient_checkpointing
    # the same warm start (SFT recipe) and GRPO recipe, smaller batches
    for name in ("sft_steps", "sft_batch_size", "sft_learning_rate", "num_generations",
                 "max_completion_length", "learning_rate", "dynamic_sampling"):
        assert getattr(binder.grpo, name) == getattr(full.grpo, name), name
    assert binder.grpo.per_step_completions < full.grpo.per_step_completions
    assert binder.eval.batch_size < full.eval.batch_size and binder.trl.ddp_steps == 0
    assert binder.grpo.per_step_completions % binder.grpo.num_generations == 0
    assert binder.short.per_step_completions % binder.short.num_generations == 0


def _bench_memory():
    """``bench/memory.py`` as a module."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location(
        "bench_memory", Path(__file__).resolve().parents[1] / "bench" / "memory.py")
    bench_memory = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench_memory)
    return bench_memory


def test_peak_rises_name_the_cell_that_added_the_memory():
    bench_memory = _bench_memory()
    cells = [("load", 600, 600), ("train", 2000, 1900), ("plot", 1950, 1950), ("eval", 2100, 1900)]
    assert bench_memory.peak_rises(cells) == [(600, "load", 600), (1400, "train", 2000),
                                              (0, "plot", 1950), (100, "eval", 2100)]


def _last_number(script: str, arg: str) -> float:
    """Run ``script`` in a fresh Python with ``arg`` and return the number it printed last (a
    fresh process: the allocator's state of this one does not leak in)."""
    return float(subprocess.run([sys.executable, "-c", script, arg], text=True,
                                capture_output=True, check=True).stdout.split()[-1])


FRAGMENTS = """
import sys, psutil, torch
from grpo_course.infra.memory import return_freed_memory
if sys.argv[1] == "fix":
    assert return_freed_memory()
rss = lambda: psutil.Process().memory_info().rss
x = torch.ones(2**21); del x            # an 8 MiB block freed: glibc raises its mmap threshold
before = rss()
big, small = [], []
for _ in range(40):
    big.append(torch.ones(2**21))       # 8 MiB each...
    small.append(torch.ones(64))        # ...with a small block kept after each
del big
print((rss() - before) / 2**20)
"""


@pytest.mark.heavy
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_return_freed_memory_hands_freed_tensors_back():
    # Without the fix what the heap keeps depends on where glibc placed the blocks, and varies
    # from run to run. With it, every block over 128 KiB is its own mapping, unmapped when freed:
    # nothing is kept, every time.
    for _ in range(3):
        assert _last_number(FRAGMENTS, "fix") < 20


def test_check_memory_on_the_binder_profile_turns_low_memory_mode_on(tmp_path, monkeypatch):
    path = tmp_path / "memory.json"
    path.write_text('{"results": {}}')
    monkeypatch.setattr(memory, "_low_memory", False)          # restored after the test
    monkeypatch.setattr(memory, "_give_back", False)
    for name in (memory.LOW_MEMORY_ENV, memory.GIVE_BACK_ENV, "MALLOC_MMAP_THRESHOLD_",
                 *memory.ONEDNN_CACHES):
        monkeypatch.setenv(name, "0")                          # set, so that teardown restores them
    said = memory.check_memory("03_grpo", "full", path, limit_bytes=2 * 10**9)
    assert "Low-memory mode" not in said and not memory.low_memory()
    # every profile gives freed memory back (the measured peaks assume it), children included
    assert "goes back to the system" in said and memory.gives_back_memory()
    assert os.environ[memory.GIVE_BACK_ENV] == "1"
    said = memory.check_memory("03_grpo", "binder", path, limit_bytes=2 * 10**9)
    assert "Low-memory mode is on" in said and memory.low_memory()
    assert os.environ[memory.LOW_MEMORY_ENV] == "1"            # child processes inherit the mode


def test_low_memory_and_giving_back_from_the_environment(monkeypatch):
    monkeypatch.setattr(memory, "_low_memory", False)
    monkeypatch.setattr(memory, "_give_back", False)
    monkeypatch.setenv(memory.LOW_MEMORY_ENV, "0")
    monkeypatch.setenv(memory.GIVE_BACK_ENV, "0")
    assert not memory.gives_back_memory() and memory.trim_heap() == 0 and memory.free_memory() == 0
    monkeypatch.setenv(memory.GIVE_BACK_ENV, "1")          # a rank started by a notebook's kernel
    assert memory.gives_back_memory() and not memory.low_memory()
    monkeypatch.setenv(memory.GIVE_BACK_ENV, "0")
    monkeypatch.setenv(memory.LOW_MEMORY_ENV, "1")
    assert memory.low_memory() and memory.gives_back_memory()


HOLES = """
import os, sys
os.environ["GRPO_COURSE_LOW_MEMORY"] = os.environ["GRPO_COURSE_GIVE_BACK_MEMORY"] = sys.argv[1]
import torch
from grpo_course.infra.memory import trim_heap
kept, freed = [], []
for i in range(6000):                     # 64 KiB blocks: under the mmap threshold, from the heap
    (kept if i % 50 == 0 else freed).append(torch.ones(16 * 1024))
del freed                                 # ~370 MiB of holes between the kept blocks
print(trim_heap() / 2**20)
"""


@pytest.mark.heavy
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_trim_heap_hands_the_holes_of_the_heap_back():
    assert _last_number(HOLES, "0") == 0          # where memory is not given back it does nothing
    assert _last_number(HOLES, "1") > 200         # most of what was freed comes back


def _memory_table_extension():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "book" / "_ext" / "memory_table.py"
    spec = importlib.util.spec_from_file_location("memory_table", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_memory_table_says_which_chapters_are_over_the_binder_limit():
    verdict = _memory_table_extension()._verdict
    limit = memory.CHAPTER_LIMIT_MIB                                     # 1.8 GiB
    data = {"results": {
        "01_a": {"binder": {"peak_rss_mib": 1400.0}, "full": {"peak_rss_mib": 3000.0}},
        "02_b": {"binder": {"peak_rss_mib": 1900.0}},
        "03_c": {"full": {"peak_rss_mib": 5000.0}}}}
    assert verdict(data, limit) == ("Over the binder profile's 1.80 GiB target: 02_b; "
                                    "1 of 2 measured chapters fit it.")
    data["results"]["02_b"]["binder"]["peak_rss_mib"] = limit           # at the limit fits
    assert verdict(data, limit) == ("Every measured chapter (2) stays within the binder "
                                    "profile's 1.80 GiB target (highest: 1.80 GiB).")
    assert verdict({"results": {}}, limit) == "The binder profile was not measured."


@pytest.mark.heavy
def test_importing_the_package_caps_onednn_kernel_caches():
    """Every process that imports grpo_course caps oneDNN's kernel caches (a value the environment
    already sets is kept)."""
    code = ("import os, grpo_course; print(os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'], "
            "os.environ['LRU_CACHE_CAPACITY'])")
    env = {k: v for k, v in os.environ.items() if k not in memory.ONEDNN_CACHES}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.split() == [memory.ONEDNN_CACHES["ONEDNN_PRIMITIVE_CACHE_CAPACITY"],
                                  memory.ONEDNN_CACHES["LRU_CACHE_CAPACITY"]]
    env["LRU_CACHE_CAPACITY"] = "512"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.split()[1] == "512"


def test_memory_table_names_the_machine_of_each_entry():
    machines = _memory_table_extension()._machines
    avx512 = {"cpu": "AMD EPYC", "native_bf16": True}
    avx2 = {"cpu": "AMD EPYC", "native_bf16": False}
    data = {"machine": avx512, "results": {
        "01_a": {"binder": {"peak_rss_mib": 1.0}, "full": {"peak_rss_mib": 1.0}},
        "02_b": {"binder": {"peak_rss_mib": 1.0, "machine": avx2}}}}
    assert machines(data) == ("AMD EPYC (native bf16), except 02_b on binder on "
                              "AMD EPYC (no native bf16: fp32)")
    del data["results"]["02_b"]
    assert machines(data) == "AMD EPYC (native bf16)"


def test_bench_keeps_the_old_machine_record_with_the_entries_it_described():
    bench_memory = _bench_memory()
    old = {"cpu": "X", "avx512_bf16": True, "amx_bf16": False, "native_bf16": True, "torch": "2"}
    own = {"cpu": "Y", "native_bf16": False}
    results = {"01": {"binder": {}, "full": {"machine": own}}}
    out = bench_memory.with_machines(results, old)
    assert out["01"]["binder"]["machine"] == {k: old[k] for k in bench_memory.MACHINE_KEYS}
    assert out["01"]["full"]["machine"] == own


def test_slowest_cells_name_where_a_page_spends_its_minutes():
    bench_memory = _bench_memory()
    cells = [("load", 600, 600, 10.0), ("train", 2000, 1900, 60.0), ("plot", 1950, 1950, 1.0),
             ("eval", 2100, 1900, 29.0)]
    assert bench_memory.slowest_cells(cells, n=2) == [{"cell": "train", "seconds": 60.0, "share": 0.6},
                                                      {"cell": "eval", "seconds": 29.0, "share": 0.29}]


def test_the_memory_table_says_when_it_was_measured():
    ext = _memory_table_extension()
    results = {"a": {"full": {"date": "2026-11-27 12:59"}, "binder": {"date": "2026-11-25 22:16"}}}
    assert ext._dates(results) == " Measured between 2026-11-25 and 2026-11-27."
    assert ext._dates({"a": {"full": {"date": "2026-11-27 12:59"}}}) == " Measured on 2026-11-27."
    assert ext._dates({"a": {"full": {}}}) == ""


@pytest.mark.parametrize(("record", "label"), [
    ({"machine": {"native_bf16": True, "amx_bf16": False}}, "full profile (large sizes)"),
    ({"machine": {"native_bf16": False, "amx_bf16": False}}, "full profile (compact sizes)"),
    ({"machine": {"native_bf16": True, "amx_bf16": True}}, "full profile (compact sizes)"),
    ({"machine": {"native_bf16": False}, "sizes": "large"}, "full profile (large sizes)"),
    ({}, "full profile")])
def test_a_measured_peak_names_the_sizes_it_ran_at(tmp_path, record, label):
    """The peak was measured at the sizes of the machine that measured it, which need not be
    this machine's: the sentence names them (the record's own ``sizes``, else its CPU's)."""
    path = measured(tmp_path, {"03_grpo": {"full": {"peak_rss_mib": 3200.0, **record}}})
    said = memory.check_memory("03_grpo", "full", path, limit_bytes=24 * 2**30)
    assert f"on the {label} when measured" in said
