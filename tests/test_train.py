"""``grpo_course.core.train``'s CourseTrainer: the levers that give GRPO a learning signal in every step (chapter 3): dynamic sampling,
prompt order, num_iterations, masking truncated completions, the bf16 training pass, the
dense intermediate-results reward, and the warm-up adapter saved for attribution."""
from __future__ import annotations

import json
import warnings

import datasets
import pytest
import torch

from grpo_course.config import ConfigError, GRPOConfig
from grpo_course.core.policy import per_token_logps
from grpo_course.core.sampling import concat_batches, sample_completions
from grpo_course.core.train import CourseTrainer
from tests.helpers import ADDITION_ROWS as ROWS
from tests.helpers import length_reward, tiny_model, tiny_tokenizer

LORA = dict(lora_r=4, lora_alpha=8, lora_target_modules=("q_proj", "v_proj", "up_proj"))


def _trainer(rows=ROWS, reward=length_reward, **changes):
    cfg = GRPOConfig(**{**dict(num_generations=2, per_step_completions=4, max_completion_length=6,
                               max_steps=2, learning_rate=1e-2, reward_weights={"r": 1.0},
                               sampling_dtype="float32", train_dtype="float32", **LORA),
                        **changes})
    return CourseTrainer(tiny_model(), tiny_tokenizer(), cfg, datasets.Dataset.from_list(rows),
                         reward_funcs={"r": reward})


def tie_unless_odd(completions, answer=None, **kw):
    """Ties (all 0) for prompts with an even answer; a length reward for odd answers."""
    return [0.0 if int(a) % 2 == 0 else 1.0 / (1 + len(c)) for c, a in zip(completions, answer, strict=False)]


# ---------------------------------------------------------------- dynamic sampling
@pytest.mark.heavy
def test_dynamic_sampling_fills_the_step_with_informative_groups():
    # answers 3, 7, 11, 15, 4, 10: only the first four prompts can give unequal rewards
    rows = [{**r, "answer": a} for r, a in zip(ROWS, ["4", "3", "10", "7", "11", "15"], strict=False)]
    plain = _trainer(rows, tie_unless_odd).step()
    assert plain["prompts_sampled"] == 2 and plain["informative_groups"] == 1
    trainer = _trainer(rows, tie_unless_odd, dynamic_sampling=True, max_sampling_rounds=4)
    row = trainer.step()
    assert row["informative_groups"] == 2 and row["frac_groups_dropped"] == 0.0
    assert row["sampling_rounds"] == 2 and row["prompts_sampled"] == 4
    informative = row["prompts_sampled"] * (1 - row["frac_reward_zero_std"])   # ties set aside
    assert 2 <= informative < 4
    assert row["prompts_per_informative_group"] == pytest.approx(4 / informative)
    assert trainer.prompts_used == 4                                      # the cursor moved on
    assert not row["skipped"]


def test_dynamic_sampling_stops_at_its_round_cap():
    always_tied = lambda completions, **kw: [1.0] * len(completions)
    trainer = _trainer(reward=always_tied, dynamic_sampling=True, max_sampling_rounds=3)
    row = trainer.step()
    assert row["sampling_rounds"] == 3 and row["prompts_sampled"] == 6
    assert row["informative_groups"] == 0 and row["skipped"] and row["grad_norm"] == 0.0
    assert row["prompts_per_informative_group"] is None


@pytest.mark.heavy
def test_dynamic_sampling_filters_on_the_named_reward():
    # "length" differs in every group; "odd" ties for the even answers (4, 10). Filtering on the
    # total reward keeps the first two prompts; filtering on "odd" (DAPO's accuracy filter) sets
    # the even-answer prompt aside and samples the next one.
    rows = [{**r, "answer": a} for r, a in zip(ROWS, ["4", "3", "10", "7", "11", "15"], strict=False)]
    funcs = {"length": length_reward, "odd": tie_unless_odd}
    base = dict(num_generations=2, per_step_completions=4, max_completion_length=6, max_steps=2,
                learning_rate=1e-2, reward_weights={"length": 1.0, "odd": 1.0},
                sampling_dtype="float32", train_dtype="float32", dynamic_sampling=True,
                max_sampling_rounds=4, **LORA)

    def step(**changes):
        trainer = CourseTrainer(tiny_model(), tiny_tokenizer(), GRPOConfig(**base, **changes),
                                datasets.Dataset.from_list(rows), reward_funcs=funcs)
        return trainer, trainer.step()

    _, total = step()
    assert total["sampling_rounds"] == 1 and total["prompts_sampled"] == 2
    trainer, by_odd = step(dynamic_sampling_reward="odd")
    assert by_odd["sampling_rounds"] == 2 and by_odd["prompts_sampled"] == 4
    assert by_odd["informative_groups"] == 2 and trainer.prompts_used == 4


def test_an_unknown_filter_reward_is_one_clear_error():
    with pytest.raises(ConfigError, match="neither one of the run's rewards"):
        _trainer(dynamic_sampling=True, dynamic_sampling_reward="accuracy")


def test_a_wide_round_with_no_informative_group_trains_on_nothing():
    always_tied = lambda completions, **kw: [1.0] * len(completions)
    trainer = _trainer(reward=always_tied, dynamic_sampling=True, max_sampling_rounds=2,
                       generation_batch_size=8)
    row = trainer.step()
    assert row["prompts_sampled"] == 8 and row["informative_groups"] == 0 and row["skipped"]


@pytest.mark.heavy
def test_the_filter_reward_is_scored_even_with_no_weight():
    cfg = GRPOConfig(num_generations=2, per_step_completions=4, max_completion_length=6,
                     reward_weights={"correctness": 1.0}, dynamic_sampling=True,
                     dynamic_sampling_reward="intermediate_results", sampling_dtype="float32",
                     train_dtype="float32", **LORA)
    trainer = CourseTrainer(tiny_model(), tiny_tokenizer(), cfg, datasets.Dataset.from_list(ROWS))
    assert list(trainer.reward_funcs) == ["correctness", "intermediate_results"]
    row = trainer.step()
    assert "rewards/intermediate_results" in row          # logged, weighed 0 in the reward


@pytest.mark.heavy
def test_generation_batch_size_samples_wide_and_trains_on_a_step():
    rows = [{**r, "answer": a} for r, a in zip(ROWS, ["4", "3", "10", "7", "11", "15"], strict=False)]
    trainer = _trainer(rows, tie_unless_odd, dynamic_sampling=True, max_sampling_rounds=2,
                       generation_batch_size=8)           # 4 prompts a round, 2 trained
    row = trainer.step()
    assert row["sampling_rounds"] == 1 and row["prompts_sampled"] == 4
    assert row["informative_groups"] == 2 and trainer.prompts_used == 4
    assert row["frac_reward_zero_std"] == pytest.approx(0.5)     # "4" and "10" tie


@pytest.mark.parametrize("changes, words", [
    (dict(generation_batch_size=6), "divisible"),
    (dict(per_step_completions=8, generation_batch_size=4), "at least per_step_completions"),
])
def test_wide_sampling_options_are_checked(changes, words):
    with pytest.raises(ConfigError, match=words):
        GRPOConfig(**{"num_generations": 4, "per_step_completions": 4, **changes})


@pytest.mark.heavy
def test_concatenated_batches_score_as_their_parts():
    model, tok = tiny_model(), tiny_tokenizer()
    a = sample_completions(model, tok, ["abc", "hello there"], 2, 5, seed=0)
    b = sample_completions(model, tok, ["a much longer prompt"], 2, 8, seed=1)
    both = concat_batches([a.select_groups(torch.tensor([False, True])), b])
    assert both.completion_ids.shape[0] == 4 and len(both.completions) == 4
    whole = per_token_logps(model, both.prompt_ids, both.prompt_mask, both.completion_ids,
                            both.completion_mask)
    part = per_token_logps(model, b.prompt_ids, b.prompt_mask, b.completion_ids, b.completion_mask)
    m = b.completion_mask == 1
    torch.testing.assert_close(whole[2:, :b.completion_ids.shape[1]][m], part[m],
                               atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- prompt order
def test_easy_first_prompt_order_and_cursor():
    rows = [{**r, "difficulty": d} for r, d in
            zip(ROWS, ["advanced", "basic", "intermediate", "basic", "advanced", "intermediate"], strict=False)]
    trainer = _trainer(rows, prompt_order="easy_first")
    seen = [trainer._next_rows(2)["difficulty"] for _ in range(3)]
    assert seen == [["basic"] * 2, ["intermediate"] * 2, ["advanced"] * 2]
    assert sorted(trainer.prompt_order) == list(range(6))
    with pytest.raises(ConfigError, match="prompt_order"):
        GRPOConfig(prompt_order="hardest")


def test_sequential_prompt_order_is_the_data_sets_order():
    trainer = _trainer(prompt_order="sequential")
    assert trainer.prompt_order == list(range(len(ROWS)))
    assert trainer._next_rows(2)["question"] == [r["question"] for r in ROWS[:2]]
    assert trainer._next_rows(2)["question"] == [r["question"] for r in ROWS[2:4]]


# ---------------------------------------------------------------- num_iterations
@pytest.mark.heavy
def test_num_iterations_reuses_the_batch_and_the_ratio_leaves_one():
    one = _trainer(learning_rate=5e-2)
    two = _trainer(learning_rate=5e-2, num_iterations=2, epsilon_low=0.01, epsilon_high=0.01)
    r1, r2 = one.step(), two.step()
    steps = lambda t: {int(s["step"]) for s in t.optimizer.state_dict()["state"].values()}
    assert steps(one) == {1} and steps(two) == {2}       # two AdamW updates on one batch
    assert r1["clip_ratio/region_mean"] == 0.0            # ratio 1 on the first update
    assert r2["clip_ratio/region_mean"] > 0.0             # the second update's ratio moved
    assert r1["prompts_sampled"] == r2["prompts_sampled"] == 2
    with pytest.raises(ConfigError, match="num_iterations"):
        GRPOConfig(num_iterations=0)


# ---------------------------------------------------------------- truncated completions
@pytest.mark.heavy
def test_masked_truncated_completions_add_no_loss():
    # 2 new tokens: the random tiny model almost never stops, so (nearly) every completion is cut
    masked = _trainer(max_completion_length=2, mask_truncated_completions=True)
    plain = _trainer(max_completion_length=2)
    inputs = masked._generate_and_score_completions(masked._rows(0, 2))
    assert inputs["sampled"]["clipped_ratio"] == 1.0                 # every completion cut...
    assert inputs["completion_mask"].sum() == 0                      # ...so the loss counts none
    rm, rp = masked.step(masked._rows(0, 2)), plain.step(plain._rows(0, 2))
    assert rm["loss"] == 0.0 and rm["grad_norm"] == 0.0
    assert rp["grad_norm"] > 0.0


# ---------------------------------------------------------------- bf16 training pass
@pytest.mark.heavy
def test_bf16_training_pass_matches_fp32_within_tolerance():
    """Loss within 2e-2 absolute and gradients with cosine similarity > 0.98 (bf16 keeps
    8 bits of mantissa; the LoRA masters, the log-softmax and AdamW stay fp32)."""
    results = {}
    for dtype in ("float32", "bfloat16"):
        trainer = _trainer(train_dtype=dtype)
        inputs = trainer._generate_and_score_completions(trainer._rows(0, 2))
        from grpo_course.core.grpo import grpo_loss
        from grpo_course.core.precision import frozen_linear_weights_as
        bf16 = dtype == "bfloat16"
        with frozen_linear_weights_as(trainer.model, torch.bfloat16 if bf16 else None), \
                torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logps = per_token_logps(trainer.model, inputs["prompt_ids"], inputs["prompt_mask"],
                                    inputs["completion_ids"], inputs["completion_mask"])
            loss, _ = grpo_loss(logps, inputs["sampling_per_token_logps"], inputs["advantages"],
                                inputs["completion_mask"])
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in trainer.model.parameters()
                           if p.requires_grad])
        masters = {p.dtype for p in trainer.model.parameters() if p.requires_grad}
        results[dtype] = (float(loss), grads, masters)
        assert trainer._train_in_bf16() == bf16
    (l32, g32, m32), (l16, g16, m16) = results["float32"], results["bfloat16"]
    assert m32 == m16 == {torch.float32}
    assert abs(l32 - l16) < 2e-2
    assert torch.nn.functional.cosine_similarity(g32, g16, dim=0) > 0.98
    row = _trainer(train_dtype="bfloat16").step()
    assert row["train_dtype"] == "bfloat16" and not row["skipped"]


@pytest.mark.heavy
def test_a_bf16_training_pass_with_a_kl_penalty_scores_the_reference_in_bf16():
    """The reference's log-probs ran without autocast against the step's bf16 copies of the
    frozen weights (an fp32 warm-up, a bf16 training pass, beta > 0): a dtype error. Now they
    run at the pass's precision, the same whether the frozen base is held in bf16 or copied."""
    rows = {}
    for sft_dtype in ("float32", "bfloat16"):
        trainer = _trainer(train_dtype="bfloat16", sampling_dtype="bfloat16", sft_dtype=sft_dtype,
                           beta=0.02, num_iterations=2)
        rows[sft_dtype] = [trainer.step() for _ in range(2)]
    assert all(0.0 <= r["kl"] < 1.0 for r in rows["float32"])
    assert [r["kl"] for r in rows["float32"]] == pytest.approx([r["kl"] for r in rows["bfloat16"]], rel=1e-3)


# ---------------------------------------------------------------- attribution
def test_train_saves_the_warm_up_adapter(tmp_path):
    trainer = _trainer(sft_steps=1, sft_batch_size=2, max_steps=1)
    trainer.out_dir = tmp_path
    trainer.train()
    sft = json.loads((tmp_path / "sft" / "adapter_config.json").read_text())
    assert sft["base_model_name_or_path"] == "smollm2-135m-instruct"
    assert (tmp_path / "sft" / "adapter_model.safetensors").is_file()


# ---------------------------------------------------------------- activation checkpointing
def test_gradient_checkpointing_takes_the_same_step():
    """Recomputing activations in the backward pass (the binder profile's memory saver) changes
    memory, not the update: the same rows, loss and LoRA weights after a step."""
    plain, checkpointed = _trainer(), _trainer(gradient_checkpointing=True)
    assert checkpointed.model.is_activation_checkpointing and not plain.model.is_activation_checkpointing
    a, b = plain.step(), checkpointed.step()
    assert a["loss"] == pytest.approx(b["loss"], abs=1e-6) and a["grad_norm"] > 0
    assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    for (name, p), q in zip(plain.model.named_parameters(), checkpointed.model.parameters(), strict=False):
        if p.requires_grad:
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.heavy
def test_fork_shares_frozen_weights_and_trains_on_its_own():
    trainer = _trainer()
    fork = trainer.fork()
    frozen = lambda t: [p for p in t.model.parameters() if not p.requires_grad]
    lora = lambda t: [p for p in t.model.parameters() if p.requires_grad]
    assert all(a is b for a, b in zip(frozen(trainer), frozen(fork), strict=False))             # shared, not copied
    assert all(a is not b and torch.equal(a, b) for a, b in zip(lora(trainer), lora(fork), strict=False))
    before = [p.detach().clone() for p in lora(trainer)]
    fork.step()
    assert all(torch.equal(a, b) for a, b in zip(before, lora(trainer), strict=False))          # the original is untouched
    assert any(not torch.equal(a, b) for a, b in zip(before, lora(fork), strict=False))
    assert trainer.global_step == 0 and fork.global_step == 1


# ---------------------------------------------------------------- the training pass's attention
@pytest.mark.heavy
@pytest.mark.parametrize("low", [False, True])
def test_training_pass_attention_is_written_out_except_in_low_memory_mode(monkeypatch, low):
    """The GRPO training pass runs grouped_query_attention (faster on a CPU at these lengths),
    and the fused kernel in low-memory mode (it keeps less for the backward pass); the model's
    own setting is back afterwards."""
    import grpo_course.core.policy as grpo_module
    from grpo_course.infra import memory
    monkeypatch.setattr(memory, "_low_memory", low)
    monkeypatch.setenv(memory.LOW_MEMORY_ENV, "1" if low else "0")
    calls = []
    written_out = grpo_module.grouped_query_attention
    monkeypatch.setattr(grpo_module, "grouped_query_attention",
                        lambda *a, **k: calls.append(1) or written_out(*a, **k))
    trainer = _trainer(rows=ROWS[:2])
    assert trainer.step()["grad_norm"] > 0
    assert bool(calls) is not low
    assert trainer.model.config._attn_implementation == "sdpa"
    with trainer.training_attention():      # what chapter 3's hand-written step borrows
        assert trainer.model.config._attn_implementation == ("sdpa" if low else "course_gqa")
    assert trainer.model.config._attn_implementation == "sdpa"


def test_activation_checkpointing_for_a_while_then_as_before():
    """Chapter 3's loop turns checkpointing on (in train mode, where it acts) and hands the policy
    back as it found it; where it was on already (binder) it stays on."""
    from grpo_course.core.policy import (
        activation_checkpointing,
        enable_activation_checkpointing,
        uses_activation_checkpointing,
    )

    model = tiny_model()                                   # eval mode, no checkpointing
    with warnings.catch_warnings():     # transformers' old-name FutureWarning reached chapter 3
        warnings.simplefilter("error", FutureWarning)
        with activation_checkpointing(model, True):
            assert uses_activation_checkpointing(model) and model.training
        assert not uses_activation_checkpointing(model) and not model.training
        with activation_checkpointing(model, False):
            assert not uses_activation_checkpointing(model)
    enable_activation_checkpointing(model)
    model.eval()                          # on already, but in eval mode, where it does not act
    with activation_checkpointing(model, True):
        assert model.training             # (chapter 3's loss comparison after its evaluations)
    assert uses_activation_checkpointing(model) and not model.training


def test_lines_left_continues_each_prompt_from_its_gold_start():
    from grpo_course.core.data import chat_prompt
    from tests.helpers import ROWS as GSM_ROWS
    from tests.helpers import tiny_trainer
    trainer = tiny_trainer(lines_left=2)
    tok = trainer.tokenizer
    rows = {"question": ["five lines", "one line"],
            "solution": [GSM_ROWS[4]["answer"], GSM_ROWS[0]["answer"]]}
    long_start = "First 2 * 3 = 6 km.\nThen 4 * 2 = 8 km.\nThen 1 km.\n"
    assert trainer.prompts(rows) == [chat_prompt("five lines", tok) + long_start,
                                     chat_prompt("one line", tok)]   # too short: starts whole
    assert trainer.prompts({**rows, "start": ["x\n", ""]})[0] == chat_prompt("five lines", tok) + "x\n"
    plain = tiny_trainer()
    assert plain.prompts(rows) == [chat_prompt("five lines", tok), chat_prompt("one line", tok)]
    with pytest.raises(ConfigError, match="lines_left must be >= 1"):
        GRPOConfig(lines_left=0)


def test_old_logps_come_from_the_sampler_only_at_the_training_precision():
    from grpo_course.core.precision import reuses_sampler_logps
    assert reuses_sampler_logps(False, torch.float32)
    assert not reuses_sampler_logps(False, torch.bfloat16)     # a bf16 sampler: another distribution
    assert not reuses_sampler_logps(True, torch.float32)       # a bf16 pass: its own log-probs


def test_the_log_counts_the_tokens_the_training_pass_ran_over():
    """``sampled_tokens`` counts every completion token; ``trained_tokens`` those of the groups
    the updates passed through the model (a group whose rewards tie is left out), which is what a
    training rate must be read against."""
    from grpo_course.core.step_log import step_log
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0])                    # G = 2: group 1 ties
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]])
    info = {"rewards": rewards, "per_func": {}, "frac_reward_zero_std": 0.5, "prompts_sampled": 2,
            "sampling_rounds": 1, "completion_length": 2.25, "clipped_ratio": 0.0,
            "trained_correct_mixed": None}
    inputs = {"rewards": rewards, "groups_to_train": torch.tensor([True, False]),
              "completion_mask": mask, "sampled_tokens": int(mask.sum()), "sampled": info}
    row = step_log(0, [{"loss": 0.0, "skipped": False}], inputs, 2, False, 0.0, 0.5, end=1.0)
    assert row["sampled_tokens"] == 9 and row["trained_tokens"] == 5
