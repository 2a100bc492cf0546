"""Chapter 4: the TRL bridge, and the cross-check of our loss against TRL's trainer.

The cross-check feeds one fixed batch (log-probs, old and reference log-probs,
advantages from fixed rewards, a ragged completion mask) through
``trl.GRPOTrainer._compute_loss`` — TRL's own code, on a real trainer built around a
tiny random Llama — with only the model forward (``_get_per_token_logps_and_entropies``)
replaced by the fixed log-probs. ``grpo_course.grpo.grpo_loss`` must give the same
loss, the same gradient and the same clip ratios.
"""
from __future__ import annotations

import pytest
import torch

from grpo_course import trl_bridge
from grpo_course.config import ConfigError, GRPOConfig
from grpo_course.grpo import group_advantages, grpo_loss
from grpo_course.loss_check import (
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
    from grpo_course.rewards import REWARD_FUNCTIONS

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
    from grpo_course.models import load_model

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
