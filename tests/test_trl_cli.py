"""``python -m grpo_course.trl_bridge``: TRL's GRPOTrainer from the course config, one process or
data-parallel under ``accelerate launch`` (2 CPU processes over gloo)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_course import trl_bridge
from grpo_course.config import ConfigError, GRPOConfig
from tests.helpers import free_port as _free_port

ROOT = Path(__file__).resolve().parents[1]


def test_per_device_batch_splits_the_step_and_checks_the_batch_rule():
    cfg = GRPOConfig(num_generations=4, per_step_completions=8)
    assert trl_bridge.per_device_batch(cfg, 1) == 8
    assert trl_bridge.per_device_batch(cfg, 2) == 4
    assert trl_bridge.per_device_batch(cfg, 4) == 2          # 2 x 4 processes = 8, a multiple of G
    with pytest.raises(ConfigError, match="does not split over 3 processes"):
        trl_bridge.per_device_batch(cfg, 3)
    assert trl_bridge.per_device_batch(GRPOConfig(num_generations=3, per_step_completions=12), 2,
                                       accumulation=3) == 2
    with pytest.raises(ConfigError, match=">= 1"):
        trl_bridge.per_device_batch(cfg, 0)


def test_vllm_modes_are_checked_before_launch():
    assert trl_bridge.vllm_overrides(None) == {}
    with pytest.raises(ConfigError, match="choose one of colocate, server"):
        trl_bridge.vllm_overrides("fast")
    import torch
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="needs a CUDA GPU"):
            trl_bridge.vllm_overrides("colocate")


def test_distributed_world_reads_the_launcher_environment(monkeypatch):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert trl_bridge.distributed_world() == (0, 0, 1)
    monkeypatch.setenv("RANK", "1"); monkeypatch.setenv("LOCAL_RANK", "1"); monkeypatch.setenv("WORLD_SIZE", "2")
    assert trl_bridge.distributed_world() == (1, 1, 2)


@pytest.mark.parametrize("argv, says", [
    (["--profile", "nope", "--out", "x"], "unknown profile 'nope'"),
    (["--profile", "smoke"], "--out is required"),
    (["--profile", "smoke", "--out", "x", "--vllm_mode", "fast"], "--vllm_mode 'fast'"),
    (["--profile", "smoke", "--out", "x", "--num_generations", "3"], "num_generations"),
    (["--profile", "smoke", "--out", "x", "--max-steps", "two"], "max_steps"),
])
def test_cli_answers_bad_input_with_one_line(argv, says, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert trl_bridge.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and says in err and "\n" not in err, err


def test_cli_refuses_an_out_that_is_a_file(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    assert trl_bridge.main(["--profile", "smoke", "--out", str(tmp_path / "f")]) == 2
    assert "is a file" in capsys.readouterr().err


def test_accelerate_configs_are_valid_yaml_for_their_machines():
    import yaml

    configs = {p.stem: yaml.safe_load(p.read_text()) for p in (ROOT / "configs" / "accelerate").glob("*.yaml")}
    assert {"cpu_2proc", "multi_gpu", "zero2"} <= set(configs)
    assert configs["cpu_2proc"]["distributed_type"] == "MULTI_GPU"   # the torchrun launcher (see the file)
    assert configs["cpu_2proc"]["num_processes"] == 2
    assert configs["multi_gpu"]["distributed_type"] == "MULTI_GPU" and configs["multi_gpu"]["num_processes"] == 8
    assert configs["zero2"]["deepspeed_config"]["zero_stage"] == 2


@pytest.mark.slow
def test_two_processes_train_data_parallel_with_identical_adapters(gsm8k_dir, tmp_path):
    """``accelerate launch`` with the course's 2-process CPU config: both ranks take every step,
    DDP keeps their adapters identical, and the JSON line says world_size 2."""
    out = tmp_path / "ddp"
    env = {**os.environ, "GSM8K_DIR": str(gsm8k_dir), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "accelerate.commands.launch",
           "--config_file", str(ROOT / "configs" / "accelerate" / "cpu_2proc.yaml"),
           "--main_process_port", str(_free_port()),
           "-m", "grpo_course.trl_bridge", "--profile", "smoke", "--out", str(out),
           "--max_steps", "2", "--num_generations", "2", "--per_step_completions", "4",
           "--max_completion_length", "16",
           # a reward with spread in 16 tokens, and truncated completions kept: the adapters move
           "--reward_weights", '{"heuristic": 1.0}', "--mask_truncated_completions", "false"]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["world_size"] == 2 and summary["steps"] == 2 and summary["backend"] == "gloo"
    assert summary["device"].startswith("cpu")
    assert summary["completions_per_s"] > 0 and summary["seconds"] > 0
    ranks = [json.loads((out / "ranks" / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["steps"] for r in ranks] == [2, 2]
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert ranks[0]["adapter_sha256"] == ranks[1]["adapter_sha256"] == summary["adapter_sha256"]
    assert all(r["threads"] >= 1 for r in ranks)
    assert (out / "adapter_config.json").is_file() and (out / "config.yaml").is_file()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all("reward" in r for r in rows)
    assert any(r["grad_norm"] > 0 for r in rows), "no gradient: identical adapters would prove nothing"


def test_launch_command_runs_one_process_plainly_and_more_under_accelerate(tmp_path):
    one = trl_bridge.launch_command(1, tmp_path, "--profile", "smoke")
    assert one[:3] == [sys.executable, "-m", "grpo_course.trl_bridge"] and "--profile" in one
    two = trl_bridge.launch_command(2, tmp_path, "--profile", "smoke")
    assert two[1:3] == ["-m", "accelerate.commands.launch"]
    config = Path(two[two.index("--config_file") + 1])
    assert config.is_file() and config.name == "cpu_2proc.yaml"
    assert two[two.index("--num_processes") + 1] == "2"
    with pytest.raises(ConfigError, match="processes must be >= 1"):
        trl_bridge.launch_command(0, tmp_path)
    assert trl_bridge.shell_line(one).startswith("python -m grpo_course.trl_bridge --out ")
    assert trl_bridge.shell_line(two).startswith("accelerate launch --config_file ")


def test_share_cores_pins_each_process_to_its_own_cores(monkeypatch):
    from grpo_course import hardware

    pinned = {}
    monkeypatch.setattr(hardware.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr(hardware.os, "sched_setaffinity", lambda pid, cores: pinned.update(cores=list(cores)),
                        raising=False)
    assert hardware.share_cores(1, 2) == 2 and pinned["cores"] == [2, 3]
    assert hardware.share_cores(0, 1) == 4                     # alone: all cores, nothing pinned
    assert hardware.share_cores(0, 8) == 1                     # more processes than cores: share by count


def test_launch_returns_the_json_line_and_reports_a_failure(tmp_path, capsys):
    ok = [sys.executable, "-c", "import sys; print('noise'); sys.stderr.write('bar 1/1'); print('{\"steps\": 3}')"]
    assert trl_bridge.launch(ok) == {"steps": 3}
    assert "bar 1/1" in capsys.readouterr().err           # the child's progress passes through
    bad = [sys.executable, "-c", "import sys; sys.stderr.write('error: bad flag'); sys.exit(2)"]
    with pytest.raises(RuntimeError, match="status 2: error: bad flag"):
        trl_bridge.launch(bad)
