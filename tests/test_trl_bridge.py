"""Chapter 4: the TRL bridge, and the cross-check of our loss against TRL's trainer.

The cross-check feeds one fixed batch (log-probs, old and reference log-probs,
advantages from fixed rewards, a ragged completion mask) through
``trl.GRPOTrainer._compute_loss`` — TRL's own code, on a real trainer built around a
tiny random Llama — with only the model forward (``_get_per_token_logps_and_entropies``)
replaced by the fixed log-probs. ``grpo_course.core.grpo.grpo_loss`` must give the same
loss, the same gradient and the same clip ratios.

The command line (``python -m grpo_course.topics.trl_bridge``): TRL's GRPOTrainer from the course config,
one process or data-parallel under ``accelerate launch`` (2 CPU processes over gloo).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo_course.config import ConfigError, GRPOConfig
from grpo_course.core.grpo import group_advantages, grpo_loss
from grpo_course.topics import trl_bridge
from grpo_course.topics.loss_check import (
    CASES,
    MAX_LEN,
    PROMPTS,
    G,
    compare_case,
    course_loss,
    fixed_batch,
    tiny_llama,
    trl_loss,
    trl_trainer,
)
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


def test_bf16_flag_asks_trl_for_its_default_precision():
    """``--bf16`` (chapter 4 passes it where its own TRL run is in bf16): TRL's bf16=True for
    every process; without it, fp32 on a CPU."""
    from types import SimpleNamespace

    cfg = GRPOConfig(num_generations=4, per_step_completions=8)
    flags = SimpleNamespace(micro_batch=None, vllm_mode=None, bf16=True)
    assert trl_bridge.process_overrides(cfg, flags, 1)["bf16"] is True
    assert trl_bridge.parse_train_args(["--out", "x", "--bf16"], trl_bridge.TRLRunArguments,
                                       "trl_bridge")[0].bf16 is True
    import torch
    if not torch.cuda.is_available():
        assert "bf16" not in trl_bridge.process_overrides(cfg, SimpleNamespace(
            micro_batch=None, vllm_mode=None, bf16=False), 1)


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
           "-m", "grpo_course.topics.trl_bridge", "--profile", "smoke", "--out", str(out),
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
    assert one[:3] == [sys.executable, "-m", "grpo_course.topics.trl_bridge"] and "--profile" in one
    two = trl_bridge.launch_command(2, tmp_path, "--profile", "smoke")
    assert two[1:3] == ["-m", "accelerate.commands.launch"]
    config = Path(two[two.index("--config_file") + 1])
    assert config.is_file() and config.name == "cpu_2proc.yaml"
    assert two[two.index("--num_processes") + 1] == "2"
    with pytest.raises(ConfigError, match="processes must be >= 1"):
        trl_bridge.launch_command(0, tmp_path)
    assert trl_bridge.shell_line(one).startswith("python -m grpo_course.topics.trl_bridge --out ")
    assert trl_bridge.shell_line(two).startswith("accelerate launch --config_file ")


def test_share_cores_pins_each_process_to_its_own_cores(monkeypatch):
    from grpo_course.infra import hardware

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
    quiet = [sys.executable, "-c", "import os; print(os.environ['HF_DATASETS_DISABLE_PROGRESS_BARS'])"]
    assert trl_bridge.launch(quiet) == 1                  # but not datasets' Map bars
    bad = [sys.executable, "-c", "import sys; sys.stderr.write('error: bad flag'); sys.exit(2)"]
    with pytest.raises(RuntimeError, match="status 2: error: bad flag"):
        trl_bridge.launch(bad)


# ---------------------------------------------------------------- a tiny offline trainer
@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    """A randomly initialised 1-layer Llama and a word-level tokenizer, saved locally."""
    trl_bridge.quiet_trl()
    return tiny_llama(tmp_path_factory.mktemp("tiny_llama"))


@pytest.fixture(scope="module")
def batch():
    return fixed_batch()


@pytest.mark.parametrize("loss_type,beta,epsilon_high", CASES,
                         ids=[f"{lt}-beta{b}-epshi{e}" for lt, b, e in CASES])
def test_grpo_loss_matches_trl_trainer(tiny_model_dir, tmp_path, batch, loss_type, beta,
                                       epsilon_high):
    """The chapter's cross-check, case by case: what chapter 4 glues is held to 1e-6."""
    folder, tok = tiny_model_dir
    trainer = trl_trainer(folder, tok, tmp_path, loss_type=loss_type, beta=beta,
                          epsilon_low=0.2, epsilon_high=epsilon_high)
    assert (trainer.epsilon_low, trainer.epsilon_high) == (0.2, epsilon_high or 0.2)
    assert trainer.beta == beta and trainer.loss_type == loss_type
    row = compare_case(folder, tok, tmp_path, batch, loss_type, beta, epsilon_high)
    assert abs(row["trl_loss"]) > 1e-4                  # a non-trivial batch
    assert row["loss_diff"] <= 1e-6, row
    assert row["grad_diff"] <= 1e-5 and row["clip_diff"] <= 1e-6 and row["kl_diff"] <= 1e-5, row


def test_trl_default_ratio_weighted_kl_is_a_different_objective(tiny_model_dir, tmp_path, batch):
    """TRL's default ``use_bias_correction_kl=True`` multiplies the k3 KL by the ratio.
    On-policy (logps == old) the loss values agree but the gradients do not, which is
    why the bridge turns it off to train the course's objective."""
    folder, tok = tiny_model_dir
    trainer = trl_trainer(folder, tok, tmp_path, beta=0.04,
                           trl_overrides={"use_bias_correction_kl": True})
    on_policy = dict(batch, logps=batch["old"].clone())
    adv = group_advantages(batch["rewards"], G)
    items = float(batch["mask"].sum())
    ref_loss, ref_grad, _ = trl_loss(trainer, on_policy, adv, items)
    loss, grad, _ = course_loss(on_policy, adv, items, beta=0.04)
    assert abs(float(loss) - float(ref_loss)) < 1e-5
    assert (grad - ref_grad).abs().max() > 1e-4


def test_the_fixed_batch_exercises_both_clip_bounds(batch):
    """Guard: the cross-check would be weak if no token were clipped."""
    adv = group_advantages(batch["rewards"], G)
    _, m = grpo_loss(batch["logps"], batch["old"], adv, batch["mask"],
                     epsilon_low=0.2, epsilon_high=0.28)
    assert m["clip_ratio/low_mean"] > 0 and m["clip_ratio/high_mean"] > 0


# ---------------------------------------------------------------- the bridge
def test_grpo_config_maps_the_course_fields(tmp_path):
    cfg = GRPOConfig(num_generations=4, per_step_completions=8, max_completion_length=64,
                     beta=0.04, epsilon_low=0.2, epsilon_high=0.28, loss_type="dr_grpo",
                     scale_rewards="none", learning_rate=1e-4, max_steps=3, seed=7)
    args = trl_bridge.grpo_config_from_course(cfg, tmp_path)
    assert args.use_cpu and not args.bf16 and not args.fp16
    assert args.report_to == [] or args.report_to == "none" or args.report_to == ["none"]
    assert (args.num_generations, args.per_device_train_batch_size) == (4, 8)
    assert args.generation_batch_size == 8 and args.steps_per_generation == 1
    assert (args.max_completion_length, args.beta, args.epsilon, args.epsilon_high) == \
        (64, 0.04, 0.2, 0.28)
    assert (args.loss_type, args.scale_rewards) == ("dr_grpo", "none")
    assert (args.learning_rate, args.max_steps, args.seed, args.logging_steps) == (1e-4, 3, 7, 1)
    assert args.reward_weights == [1.0, 0.5, 0.5]
    rows = trl_bridge.mapping_rows(cfg, args)
    assert all(r["trl_value"] is not None for r in rows if r["course"] != "epsilon_high")
    assert {r["course"]: r["trl_value"] for r in rows}["per_step_completions"] == 8
    split = trl_bridge.grpo_config_from_course(cfg, tmp_path, micro_batch=2)    # 4 passes of 2
    row = next(r for r in trl_bridge.mapping_rows(cfg, split) if r["course"] == "per_step_completions")
    assert (row["trl"], row["trl_value"]) == ("per_device_train_batch_size × gradient_accumulation_steps", "2 × 4")
    assert args.shuffle_dataset                          # prompt_order="random"
    sequential = trl_bridge.grpo_config_from_course(GRPOConfig(prompt_order="sequential"), tmp_path)
    assert sequential.shuffle_dataset is False           # TRL takes the prompts in the data set's order


def test_symmetric_clip_when_epsilon_high_is_none(tmp_path):
    args = trl_bridge.grpo_config_from_course(GRPOConfig(epsilon_high=None), tmp_path)
    assert args.epsilon_high == args.epsilon == 0.2


def test_overrides_and_unknown_fields(tmp_path):
    args = trl_bridge.grpo_config_from_course(GRPOConfig(), tmp_path, temperature=0.7)
    assert args.temperature == 0.7
    with pytest.raises(ConfigError, match="no field"):
        trl_bridge.grpo_config_from_course(GRPOConfig(), tmp_path, num_generation=4)


def test_trl_batch_rules_raise_readable_errors(tmp_path):
    with pytest.raises(ValueError, match="divisible by num_generations"):
        trl_bridge.grpo_config_from_course(GRPOConfig(), tmp_path, per_device_train_batch_size=6)
    with pytest.raises(ValueError, match="at least 2 generations"):
        trl_bridge.grpo_config_from_course(GRPOConfig(), tmp_path, num_generations=1)


def test_micro_batch_accumulates_gradients_over_the_step(tmp_path):
    cfg = GRPOConfig(num_generations=4, per_step_completions=8)
    args = trl_bridge.grpo_config_from_course(cfg, tmp_path, micro_batch=2)
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (2, 4)
    assert args.generation_batch_size == 8          # still one generation of the whole step
    for bad in (0, 3, 16):
        with pytest.raises(ConfigError, match="must divide per_step_completions"):
            trl_bridge.grpo_config_from_course(cfg, tmp_path, micro_batch=bad)


def varied_reward(completions, **kwargs):
    """A reward that differs inside a group (the tiny model writes random tokens)."""
    return [float(sum(map(ord, str(c))) % 7) for c in completions]


def test_micro_batches_take_the_same_step_as_the_whole_batch(tiny_model_dir, tmp_path):
    """The binder profile's memory saver changes no result: the step's completions through the
    model two at a time (gradient accumulation) give the same loss and the same new weights as
    all of them at once (same seed, so the same completions; plain SGD, so the step is lr x grad)."""
    from datasets import Dataset
    from trl import GRPOTrainer

    folder, tok = tiny_model_dir
    cfg = GRPOConfig(num_generations=G, per_step_completions=G * PROMPTS, max_completion_length=MAX_LEN,
                     max_steps=1, loss_type="dapo", learning_rate=0.5, prompt_order="sequential",
                     reward_weights={"exact_format": 1.0}, use_lora=False)
    weights, losses = [], []
    for micro in (None, 2):
        args = trl_bridge.grpo_config_from_course(cfg, tmp_path / f"micro{micro}", micro_batch=micro,
                                                  optim="sgd")
        trainer = GRPOTrainer(model=str(folder), reward_funcs=varied_reward, args=args,
                              train_dataset=Dataset.from_dict({"prompt": ["t1 t2", "t3 t4"]}),
                              processing_class=tok)
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        trainer.train()
        weights.append({n: p.detach().clone() for n, p in trainer.model.named_parameters()})
        losses.append(trainer.state.log_history[0]["loss"])
    assert any(not torch.equal(before[n], weights[1][n]) for n in before)     # the step moved them
    assert losses[0] == pytest.approx(losses[1], abs=1e-6)
    for name in weights[0]:
        torch.testing.assert_close(weights[1][name], weights[0][name], rtol=1e-5, atol=1e-6)


def test_lora_config_from_course():
    cfg = GRPOConfig(lora_r=8, lora_alpha=16, lora_dropout=0.05)
    lora = trl_bridge.lora_config_from_course(cfg)
    assert (lora.r, lora.lora_alpha, lora.lora_dropout) == (8, 16, 0.05)
    assert set(lora.target_modules) == set(cfg.lora_target_modules)
    with pytest.raises(ConfigError, match="use_lora"):
        trl_bridge.lora_config_from_course(GRPOConfig(use_lora=False))


def test_reward_funcs_and_weights():
    from grpo_course.core.rewards import REWARD_FUNCTIONS

    funcs, weights = trl_bridge.reward_funcs_from_course(
        GRPOConfig(reward_weights={"correctness": 2.0, "heuristic": 0.25}))
    assert funcs == [REWARD_FUNCTIONS["correctness"], REWARD_FUNCTIONS["heuristic"]]
    assert weights == [2.0, 0.25]
    with pytest.raises(ValueError, match="unknown reward"):
        trl_bridge.reward_funcs_from_course(GRPOConfig(reward_weights={"nope": 1.0}))
    with pytest.raises(ConfigError, match="empty"):
        trl_bridge.reward_funcs_from_course(GRPOConfig(reward_weights={}))


def test_trl_dataset_is_conversational(gsm8k_dir):
    ds = trl_bridge.trl_dataset("train", n=3, data_dir=str(gsm8k_dir))
    assert len(ds) == 3 and set(ds.column_names) == {"prompt", "answer", "solution", "difficulty", "idx"}
    prompt = ds[0]["prompt"]
    assert [m["role"] for m in prompt] == ["system", "user"]
    assert "3 apples" in prompt[1]["content"] and ds[0]["answer"] == "7"
    funcs, _ = trl_bridge.reward_funcs_from_course(GRPOConfig(reward_weights={"correctness": 1}))
    completion = [{"role": "assistant", "content": "3 + 4 = 7\n#### 7"}]
    assert funcs[0]([completion], answer=[ds[0]["answer"]]) == [3.0]


@pytest.mark.slow
def test_train_with_trl_one_step_on_the_bundled_model(gsm8k_dir, tmp_path):
    cfg = GRPOConfig(num_generations=2, per_step_completions=2, max_completion_length=6,
                     max_steps=1, lora_r=4, lora_alpha=8)
    ds = trl_bridge.trl_dataset("train", n=1, data_dir=str(gsm8k_dir))
    run = trl_bridge.train_with_trl(cfg, tmp_path / "run", train_dataset=ds)
    assert run.trainer.state.global_step == 1 and len(run.steps) == 1
    step = run.steps[0]
    for key in ("reward", "reward_std", "frac_reward_zero_std", "entropy",
                "clip_ratio/region_mean", "completions/clipped_ratio",
                "rewards/correctness/mean", "step_time"):
        assert key in step, key
    assert run.throughput()["tokens_per_s"] > 0
    from grpo_course.core.loading import load_model

    adapter_dir = trl_bridge.save_adapter(run, tmp_path / "adapter")
    assert (adapter_dir / "adapter_config.json").is_file()
    merged = trl_bridge.merge_adapter(load_model()[0], adapter_dir)   # on the weights it started from
    assert not hasattr(merged, "peft_config")


def test_metrics_rows_use_the_course_trainer_names():
    log = [{"loss": 0.1, "reward": -0.5, "reward_std": 0.4, "rewards/correctness/mean": -1.0,
            "rewards/exact_format/mean": 0.5, "completions/mean_length": 42.0, "step_time": 3.0,
            "frac_reward_zero_std": 0.25},
           {"train_runtime": 9.0},                               # TRL's summary entry, no reward
           {"reward": 0.5, "rewards/correctness/mean": 1.0, "completions/mean_length": 30.0}]
    rows = trl_bridge.TRLRun(trainer=None, log_history=log).metrics_rows()
    assert [r["step"] for r in rows] == [0, 1]
    assert rows[0] == {"phase": "grpo", "step": 0, "loss": 0.1, "reward": -0.5, "reward_std": 0.4,
                       "rewards/correctness": -1.0, "rewards/exact_format": 0.5,
                       "completion_length": 42.0, "step_seconds": 3.0,
                       "frac_reward_zero_std": 0.25}
    assert rows[1]["rewards/correctness"] == 1.0 and "step_seconds" not in rows[1]


def test_trl_default_rows_name_trl_116_defaults_and_the_bridge_changes(tmp_path):
    cfg = GRPOConfig(loss_type="grpo", num_generations=4, per_step_completions=8, beta=0.0)
    rows = {r["field"]: r for r in trl_bridge.trl_default_rows(
        trl_bridge.grpo_config_from_course(cfg, tmp_path))}
    assert rows["loss_type"]["trl_default"] == "dapo" and rows["loss_type"]["bridge"] == "grpo"
    assert rows["bf16"]["trl_default"] is True and rows["bf16"]["bridge"] is False
    assert rows["gradient_checkpointing"]["trl_default"] is True
    assert rows["num_generations"]["trl_default"] == 8 and rows["num_generations"]["changed"]
    assert rows["beta"] == {"field": "beta", "trl_default": 0.0, "bridge": 0.0, "changed": False,
                            "why": ""}
    assert all(r["why"] for r in rows.values() if r["changed"])


def test_the_step_data_flow_table_lines_up_trls_names_with_the_course_trainers():
    """Issue 85: one inputs dict from _generate_and_score_completions to compute_loss(model,
    inputs), with TRL's keys; chapter 4 reads this table from both trainers' code."""
    from trl import GRPOTrainer

    from grpo_course.core.train import CourseTrainer
    from grpo_course.topics.trl_bridge import data_flow_rows

    rows = data_flow_rows(GRPOTrainer, CourseTrainer)
    methods = {r["course"].split("(")[0]: r for r in rows if r["what"] == "method"}
    assert methods["compute_loss"]["course"].startswith("compute_loss(self, model, inputs")
    assert methods["compute_loss"]["TRL"].startswith("compute_loss(self, model, inputs")
    shared = [r["course"] for r in rows if r["what"] == "inputs key"]
    assert {"prompt_ids", "completion_ids", "completion_mask", "advantages",
            "old_per_token_logps", "ref_per_token_logps"} <= set(shared)
    course_only = next(r["course"] for r in rows if r["what"] == "inputs keys of the course only")
    assert "groups_to_train" in course_only and "advantages" not in course_only
