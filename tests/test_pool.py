"""The balanced prompt pool: which prompts it keeps, that the trainer draws only those, and that
a checkpoint carries the screening so a resumed run trains on the same pool."""
from __future__ import annotations

import json

import pytest

from grpo_course.config import ConfigError, GRPOConfig
from grpo_course.core import pool as pool_module
from grpo_course.core.pool import mixed_ids, pool_summary
from tests.helpers import ADDITION_ROWS, tiny_trainer


def test_mixed_ids_keeps_the_prompts_solved_sometimes():
    assert mixed_ids([10, 11, 12, 13], [0, 3, 8, 1], samples=8) == [11, 13]
    summary = pool_summary({"ids": [10, 11, 12, 13], "correct": [0, 3, 8, 1], "samples": 8,
                            "mixed": [11, 13]})
    assert summary == {"screened": 4, "kept": 2, "samples": 8, "never_share": 0.25,
                       "mixed_share": 0.5, "always_share": 0.25}


@pytest.mark.parametrize("changes, message", [
    ({"prompt_pool": "some"}, "prompt_pool must be one of all, mixed"),
    ({"pool_prompts": 0}, "pool_prompts must be >= 1"),
    ({"pool_samples": 1}, "pool_samples >= 2"),
    ({"snapshot_every": -1}, "snapshot_every must be >= 0"),
])
def test_bad_pool_settings_are_named(changes, message):
    with pytest.raises(ConfigError, match=message):
        GRPOConfig(**changes)


def fake_screening(counts):
    """A screen_prompts that returns ``counts`` in order, a sampling round at a time, and records
    the questions it screened (all of its calls together)."""
    screened = []

    def screen(model, tokenizer, rows, samples, *args, **kwargs):
        lo = len(screened)
        screened.extend(rows["question"])
        return counts[lo:lo + len(rows["question"])]
    return screen, screened


def test_the_trainer_draws_only_the_mixed_prompts(monkeypatch, tmp_path):
    monkeypatch.setenv("GRPO_COURSE_CACHE", str(tmp_path / "cache"))
    screen, calls = fake_screening([0, 1, 2, 1, 0, 2])
    monkeypatch.setattr(pool_module, "screen_prompts", screen)
    trainer = tiny_trainer(out_dir=tmp_path / "run", prompt_pool="mixed", pool_prompts=4,
                           max_steps=3)
    order = list(trainer.prompt_order)
    trainer.train()
    screened = order[:4]
    kept = [i for i, c in zip(screened, [0, 1, 2, 1], strict=True) if c == 1]
    assert trainer.prompt_order == kept and len(calls) == 4
    saved = json.loads((tmp_path / "run" / "pool.json").read_text())
    assert saved["mixed"] == kept and saved["kept"] == 2 and saved["screened"] == 4
    assert saved["mixed_share"] == 0.5 and saved["never_share"] == 0.25
    questions = {ADDITION_ROWS[i]["question"] for i in kept}
    # every prompt the steps drew is in the pool (3 steps x 2 prompts, cycling through it)
    drawn = trainer.prompts_used
    assert drawn == 6 and all(trainer.dataset[trainer.prompt_order[k % 2]]["question"] in questions
                              for k in range(drawn))
    # a second trainer with the same weights reads the screening from the cache
    again = tiny_trainer(prompt_pool="mixed", pool_prompts=4)
    again.build_pool()
    assert len(calls) == 4 and again.prompt_order == kept


def test_a_checkpoint_keeps_the_pool_and_a_resume_trims_the_log(monkeypatch, tmp_path):
    from grpo_course.core.train import CourseTrainer
    from tests.helpers import tiny_model, tiny_tokenizer

    monkeypatch.setenv("GRPO_COURSE_CACHE", str(tmp_path / "cache"))
    screen, calls = fake_screening([1, 1, 0, 1, 1, 1])
    monkeypatch.setattr(pool_module, "screen_prompts", screen)
    run = tmp_path / "run"
    trainer = tiny_trainer(out_dir=run, prompt_pool="mixed", pool_prompts=4, max_steps=2)
    trainer.train()
    trainer.save_checkpoint(run / "checkpoint")
    with open(run / "metrics.jsonl", "a") as fh:        # a step logged after the checkpoint
        fh.write(json.dumps({"phase": "grpo", "step": 2, "reward": 9.0}) + "\n")
    resumed = CourseTrainer.resume(run / "checkpoint", tiny_model(), tiny_tokenizer(),
                                   trainer.dataset, reward_funcs=trainer.reward_funcs, out_dir=run)
    assert resumed.pool == trainer.pool and resumed.prompt_order == trainer.prompt_order
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1]
    resumed.train(max_steps=3)
    assert len(calls) == 4                 # not screened again by the trained policy


def test_the_screening_decodes_a_sampling_round_at_a_time(monkeypatch, tmp_path):
    """As many prompts at once as a round of the run samples: no more memory than training
    (the binder profile samples one prompt a round)."""
    monkeypatch.setenv("GRPO_COURSE_CACHE", str(tmp_path / "cache"))
    seen = []

    def screen(model, tokenizer, rows, samples, max_new_tokens, lines_left, temperature, seed,
               sampling_dtype, batch_prompts, progress, calculator=False):
        seen.append((batch_prompts, len(rows["question"])))      # a round's prompts at a time
        return [1] * len(rows["question"])
    monkeypatch.setattr(pool_module, "screen_prompts", screen)
    for gbs in (4, 8):
        trainer = tiny_trainer(prompt_pool="mixed", pool_prompts=4, generation_batch_size=gbs)
        trainer.build_pool()
    r4, r8 = 4 // trainer.config.num_generations, 8 // trainer.config.num_generations
    assert seen == [(r4, r4)] * (4 // r4) + [(r8, r8)] * (4 // r8)


def test_a_screening_stopped_part_way_goes_on_and_ends_as_one_run_would(monkeypatch, tmp_path):
    """Each sampling round is saved as it ends; a rerun screens only the rounds left, each with
    the seed it had in one uninterrupted screening, and keeps the same pool."""
    seeds, stop_after = [], [None]

    def screen(model, tokenizer, rows, samples, max_new_tokens, lines_left, temperature, seed,
               sampling_dtype, batch_prompts, progress, calculator=False):
        if stop_after[0] is not None and len(seeds) == stop_after[0]:
            raise KeyboardInterrupt                      # the session ends part way
        seeds.append(seed)
        return [1 + seed % 2] * len(rows["question"])   # what a round draws depends on its seed
    monkeypatch.setattr(pool_module, "screen_prompts", screen)
    settings = dict(prompt_pool="mixed", pool_prompts=6, generation_batch_size=4)   # 2 prompts a round
    monkeypatch.setenv("GRPO_COURSE_CACHE", str(tmp_path / "once"))
    whole = tiny_trainer(**settings).build_pool()
    once = list(seeds)
    assert len(once) == 3 and once[1] - once[0] == 2          # seed + lo, lo the round's first prompt

    seeds.clear()
    stop_after[0] = 2
    monkeypatch.setenv("GRPO_COURSE_CACHE", str(tmp_path / "twice"))
    with pytest.raises(KeyboardInterrupt):
        tiny_trainer(**settings).build_pool()
    assert [p.name.endswith(".partial.json") for p in (tmp_path / "twice" / "pools").iterdir()] == [True]
    stop_after[0] = None
    resumed = tiny_trainer(**settings).build_pool()
    assert seeds == once                                      # the last round only, with its own seed
    assert {k: v for k, v in resumed.items() if k != "seconds"} == {k: v for k, v in whole.items() if k != "seconds"}
    assert [p.name.endswith(".partial.json") for p in (tmp_path / "twice" / "pools").iterdir()] == [False]


def test_an_empty_pool_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("GRPO_COURSE_CACHE", str(tmp_path / "cache"))
    screen, _ = fake_screening([0, 2, 0, 2, 0, 0])
    monkeypatch.setattr(pool_module, "screen_prompts", screen)
    with pytest.raises(ConfigError, match="the mixed prompt pool is empty: .* none of the 4"):
        tiny_trainer(prompt_pool="mixed", pool_prompts=4).build_pool()


def test_snapshots_are_kept_every_n_steps(tmp_path):
    trainer = tiny_trainer(out_dir=tmp_path / "run", snapshot_every=2, max_steps=4)
    trainer.train()
    assert sorted(p.name for p in (tmp_path / "run" / "steps").iterdir()) == ["2", "4"]
    assert (tmp_path / "run" / "steps" / "2" / "adapter_config.json").is_file()


def test_correct_mixed_groups_leave_format_spreads_out():
    import torch

    from grpo_course.core.rewards import correct_mixed_groups
    scores = torch.tensor([3.0, -0.5, -1.0, -0.5, 3.0, 3.0, 1.5, -0.5])   # G = 2: four groups
    assert correct_mixed_groups({"correctness": scores}, 2) == 1      # only the first mixes right and wrong
    assert correct_mixed_groups({}, 2) is None


@pytest.mark.heavy
def test_a_step_logs_the_trained_groups_mixed_on_correctness():
    from tests.helpers import tiny_trainer as make
    row = make(dynamic_sampling=True, dynamic_sampling_reward="correctness").step()
    assert row["trained_correct_mixed"] == 0 and row["correct_mixed_groups"] == 0   # a tiny model is never right
