"""R3's mix of starts (``start_mix``): every training problem at each of several starts, the
whole problem included, in one shuffled order; the pool screens (problem, start) pairs, and the
warm-up still draws whole problems as without the mix."""
from __future__ import annotations

import datasets
import pytest

from grpo_course.config import ConfigError, GRPOConfig, coerce_field
from grpo_course.core import pool as pool_module
from grpo_course.core.data import mixed_starts
from grpo_course.core.train import CourseTrainer
from tests.helpers import length_reward, tiny_model, tiny_tokenizer

#: problems of 1, 2 and 3 work lines (GSM8K's layout: calculator annotations, then '#### N')
LINES = [{"question": "what is 1+2?", "answer": "3", "solution": "1+2=<<1+2=3>>3\n#### 3"},
         {"question": "what is 2*3+1?", "answer": "7", "solution": "2*3=6\n6+1=7\n#### 7"},
         {"question": "what is 2+2+2+2?", "answer": "8",
          "solution": "2+2=4\n4+2=6\n6+2=8\n#### 8"}]


def test_each_problem_at_each_start_it_has():
    rows = mixed_starts(datasets.Dataset.from_list(LINES), [None, 1, 2])
    pairs = [(r["problem"], r["lines_left"], r["start"]) for r in rows]
    assert pairs == [(0, 1, ""),                       # 1 line: one line left is the whole problem
                     (1, 2, ""), (1, 1, "2*3=6\n"),    # 2 lines: two left is the whole problem
                     (2, 3, ""), (2, 1, "2+2=4\n4+2=6\n"), (2, 2, "2+2=4\n")]
    assert rows[0]["question"] == LINES[0]["question"] and rows[5]["answer"] == "8"
    assert len(mixed_starts(LINES, [3])) == 1          # a list of rows; too few lines: left out


@pytest.mark.parametrize("changes, message", [
    ({"start_mix": ("whole", "0")}, "start_mix entries must be 'whole' or a whole number"),
    ({"start_mix": ("all",)}, "got 'all'"),
    ({"start_mix": ("1", "1")}, "names a start twice"),
    ({"start_mix": ("whole", "1"), "lines_left": 1}, "both set the start: set one"),
])
def test_bad_mixes_are_named(changes, message):
    with pytest.raises(ConfigError, match=message):
        GRPOConfig(**changes)


def test_a_recipe_lists_starts_as_words_and_numbers():
    assert coerce_field("start_mix", ["whole", 1, 2]) == ("whole", "1", "2")
    with pytest.raises(ConfigError, match="start_mix must be a list of strings"):
        coerce_field("start_mix", [True])
    assert GRPOConfig(start_mix=("whole", "2")).starts == [None, 2]
    assert GRPOConfig(lines_left=1).starts == [1]


def _mix_trainer(**changes):
    cfg = GRPOConfig(**{**dict(num_generations=2, per_step_completions=4, max_completion_length=6,
                               lora_r=4, lora_alpha=8, reward_weights={"length": 1.0},
                               sft_batch_size=2, lora_target_modules=("q_proj",)), **changes})
    return CourseTrainer(tiny_model(), tiny_tokenizer(), cfg, datasets.Dataset.from_list(LINES),
                         reward_funcs={"length": length_reward})


def test_the_trainer_draws_pairs_and_the_warm_up_whole_problems():
    plain, mixed = _mix_trainer(), _mix_trainer(start_mix=("whole", "1", "2"))
    assert len(mixed.grpo_dataset) == 6 and sorted(mixed.prompt_order) == list(range(6))
    assert mixed.order == plain.order and mixed._sft_rows(0) == plain._sft_rows(0)
    rows = mixed._next_rows(6)
    texts = mixed.prompts(rows)
    # each prompt ends with its own start; all six pairs drawn once
    assert all(t.endswith(s) for t, s in zip(texts, rows["start"], strict=True))
    assert sorted(zip(rows["problem"], rows["lines_left"], strict=True)) == \
        [(0, 1), (1, 1), (1, 2), (2, 1), (2, 2), (2, 3)]


def test_the_pool_screens_each_pair_at_its_start(monkeypatch, tmp_path):
    monkeypatch.setenv("GRPO_COURSE_CACHE", str(tmp_path / "cache"))
    seen = []

    def screen(model, tokenizer, rows, samples, *args, **kwargs):
        seen.append(list(rows["start"]))
        return [1] * len(rows["question"])
    monkeypatch.setattr(pool_module, "screen_prompts", screen)
    trainer = _mix_trainer(start_mix=("whole", "1", "2"), prompt_pool="mixed", pool_prompts=4)
    trainer.build_pool()
    first = [trainer.grpo_dataset[i]["start"] for i in trainer.pool["ids"]]
    assert sum(seen, []) == first and trainer.prompt_order == trainer.pool["ids"]


def test_screen_prompts_reads_each_rows_start(monkeypatch):
    prompts = []

    def counts(model, tokenizer, problems, *args, **kwargs):
        prompts.extend(p["start"] for p in problems)
        return [0] * len(problems)
    monkeypatch.setattr(pool_module, "correct_counts", counts)
    rows = {"question": ["q", "q"], "answer": ["7", "7"], "solution": [LINES[1]["solution"]] * 2,
            "start": ["", "2*3=6\n"]}
    pool_module.screen_prompts(None, None, rows, 2, 8, lines_left=None)
    assert prompts == ["", "2*3=6\n"]
    del rows["start"]
    prompts.clear()
    pool_module.screen_prompts(None, None, rows, 2, 8, lines_left=1)
    assert prompts == ["2*3=6\n"] * 2


def test_the_command_line_takes_a_mix(tmp_path):
    from grpo_course.core.cli import parse_train_args
    _, cfg, _ = parse_train_args(["--out", str(tmp_path / "run"), "--profile", "smoke",
                                  "--start_mix", "whole", "1", "2"])
    assert cfg.start_mix == ("whole", "1", "2") and cfg.lines_left is None


def test_grpo_starts_from_a_runs_warm_start_folder(tmp_path):
    """``--warm_start DIR`` (the curriculum run starts from the reference run's sft/): the
    adapter's weights, its warm-up counted done; another LoRA shape is a clear error."""
    import torch

    from tests.helpers import tiny_trainer
    trained = tiny_trainer(max_steps=1)
    trained.train()
    trained.save_model(tmp_path / "sft")
    fresh = tiny_trainer(sft_steps=3).start_from(tmp_path / "sft")
    mine = {n: p for n, p in fresh.model.named_parameters() if p.requires_grad}
    for name, p in trained.model.named_parameters():
        if p.requires_grad:
            torch.testing.assert_close(mine[name], p)
    assert fresh.sft_done == 3
    with pytest.raises(ConfigError, match="not an adapter of this run's LoRA shape"):
        tiny_trainer(lora_r=2, lora_alpha=4).start_from(tmp_path / "sft")
    with pytest.raises(ConfigError, match="holds no adapter"):
        tiny_trainer().start_from(tmp_path)


def test_a_mixed_step_logs_each_starts_groups():
    trainer = _mix_trainer(start_mix=("whole", "1", "2"), max_completion_length=4)
    row = trainer.step()
    groups = {k: v for k, v in row.items() if k.startswith("starts/") and k.endswith("/groups")}
    assert sum(groups.values()) == row["prompts_sampled"] == 2
    trained = sum(v for k, v in row.items() if k.endswith("/trained"))
    assert trained == row["informative_groups"]     # groups whose rewards tie are not trained
    assert not any(k.startswith("starts/") for k in _mix_trainer().step())    # one start: none


@pytest.mark.parametrize("mix", [(), ("whole", "1", "2")])
def test_dynamic_sampling_with_and_without_a_mix(mix):
    """A step with DAPO's filter takes informative groups, with or without starts of their own
    (the reference run's rows have none)."""
    def varied(completions, **kw):          # every group has spread: every group is informative
        return [float(i % 2) for i in range(len(completions))]
    cfg = GRPOConfig(num_generations=2, per_step_completions=4, generation_batch_size=4,
                     max_completion_length=4, lora_r=4, lora_alpha=8, reward_weights={"varied": 1.0},
                     dynamic_sampling=True, dynamic_sampling_reward="varied", start_mix=mix,
                     lora_target_modules=("q_proj",))
    trainer = CourseTrainer(tiny_model(), tiny_tokenizer(), cfg, datasets.Dataset.from_list(LINES),
                            reward_funcs={"varied": varied})
    row = trainer.step()
    assert row["informative_groups"] == 2
    trained = sum(v for k, v in row.items() if k.startswith("starts/") and k.endswith("/trained"))
    assert trained == (2 if mix else 0)
    with pytest.raises(ConfigError, match="start_mix entries"):
        GRPOConfig(start_mix=("whole", 1))


def test_a_warm_started_run_keeps_its_warm_start_and_refuses_another_mix(tmp_path, monkeypatch):
    from tests.helpers import tiny_trainer
    monkeypatch.setenv("GRPO_COURSE_CACHE", str(tmp_path / "cache"))
    tiny_trainer().save_model(tmp_path / "warm")
    run = tiny_trainer(out_dir=tmp_path / "run", max_steps=1).start_from(tmp_path / "warm")
    run.train()
    assert (tmp_path / "run" / "sft" / "adapter_model.safetensors").is_file()   # sft_steps is 0
    with pytest.raises(ConfigError, match="lora_alpha is 8, this run's 16"):
        tiny_trainer(lora_alpha=16).start_from(tmp_path / "warm")
    monkeypatch.setattr(pool_module, "screen_prompts",
                        lambda model, tok, rows, *a, **k: [1] * len(rows["question"]))
    mixed = _mix_trainer(start_mix=("whole", "1"), prompt_pool="mixed", pool_prompts=2)
    pool = mixed.build_pool()
    assert pool["start_mix"] == ["whole", "1"]
    with pytest.raises(ConfigError, match="screened with start_mix"):
        _mix_trainer(start_mix=("whole", "2"), prompt_pool="mixed").use_pool(pool)
