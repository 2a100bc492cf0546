"""Tracked runs: one folder layout for every trainer, the runs table, trackio when asked for."""
from __future__ import annotations

import json
import sys
import types
import warnings

import pytest

from grpo_course.config import ConfigError, GRPOConfig
from grpo_course.core import runs
from grpo_course.core.runs import load_run_config
from tests.helpers import ADDITION_ROWS as ROWS
from tests.helpers import tiny_trainer as _trainer


def test_write_run_writes_the_common_layout_and_list_runs_tables_it(tmp_path):
    rows = [{"phase": "grpo", "step": i, "reward": r, "rewards/correctness": r, "completion_length": 40 - i}
            for i, r in enumerate([0.1, 0.5, 0.9])]
    runs.write_run(tmp_path / "ch4" / "trl", GRPOConfig(max_steps=3), rows, "smoke", trainer="trl")
    runs.write_run(tmp_path / "ch5", GRPOConfig(), rows[:1], "full", trainer="curriculum")
    config = load_run_config(tmp_path / "ch4" / "trl")
    assert config["trainer"] == "trl" and config["profile"] == "smoke" and config["max_steps"] == 3
    assert [json.loads(line) for line in (tmp_path / "ch4" / "trl" / "metrics.jsonl").read_text().splitlines()] == rows
    table = runs.list_runs(tmp_path)
    assert set(table.index) == {"ch4/trl", "ch5"}
    assert table.loc["ch4/trl", "trainer"] == "trl" and table.loc["ch4/trl", "grpo steps"] == 3
    assert table.loc["ch4/trl", "last reward"] == 0.9 and table.loc["ch5", "trainer"] == "curriculum"
    runs.write_run(tmp_path / "long", GRPOConfig(), [{**rows[0], "reward": 0.123456}], "smoke")
    with warnings.catch_warnings():
        warnings.simplefilter("error")                  # rounding the whole table warns on its dates
        assert runs.list_runs(tmp_path).loc["long", "last reward"] == 0.123
    with pytest.raises(ConfigError, match="trainer 'keras'"):
        runs.write_run(tmp_path / "x", GRPOConfig(), rows, trainer="keras")


def test_a_run_config_with_its_trainer_is_still_a_recipe(tmp_path):
    from grpo_course.core.cli import parse_train_args

    runs.write_run(tmp_path / "old", GRPOConfig(num_generations=2, per_step_completions=4), [], "smoke",
                   trainer="trl")
    _, config, profile = parse_train_args(["--config", str(tmp_path / "old" / "config.yaml"),
                                           "--out", str(tmp_path / "new")])
    assert profile == "smoke" and config.num_generations == 2


def test_the_course_trainer_writes_the_layout(tmp_path):
    trainer = _trainer(tmp_path / "run")
    trainer.train(max_steps=1)
    table = runs.list_runs(tmp_path)
    assert table.loc["run", "trainer"] == "course" and table.loc["run", "grpo steps"] == 1


@pytest.fixture
def fake_trackio(monkeypatch):
    """A stand-in for the trackio package that records what it is given."""
    calls = []
    module = types.ModuleType("trackio")
    module.__spec__ = types.SimpleNamespace(name="trackio")
    module.init = lambda **kw: calls.append(("init", kw)) or object()
    module.log = lambda metrics: calls.append(("log", metrics))
    module.finish = lambda: calls.append(("finish", None))
    monkeypatch.setitem(sys.modules, "trackio", module)
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: object() if name == "trackio" else None)
    return calls


def test_report_to_trackio_logs_every_step_of_the_course_trainer(tmp_path, fake_trackio):
    trainer = _trainer(tmp_path / "tracked", report_to="trackio")
    trainer.train(max_steps=2)
    kinds = [k for k, _ in fake_trackio]
    assert kinds == ["init", "log", "log", "finish"]
    init = fake_trackio[0][1]
    assert init["project"] == runs.TRACKIO_PROJECT and init["name"] == "tracked"
    assert init["config"]["trainer"] == "course" and init["config"]["report_to"] == "trackio"
    logged = fake_trackio[1][1]
    assert "reward" in logged and all(isinstance(v, (int, float)) for v in logged.values())


def test_trl_gets_trackio_through_its_own_report_to(tmp_path, fake_trackio):
    from grpo_course.topics import trl_bridge

    args = trl_bridge.grpo_config_from_course(GRPOConfig(report_to="trackio"), tmp_path)
    assert args.report_to == ["trackio"] and args.project == runs.TRACKIO_PROJECT
    assert trl_bridge.grpo_config_from_course(GRPOConfig(), tmp_path).report_to in ([], "none", ["none"])


def test_report_to_without_trackio_or_with_another_tracker_is_one_clear_error(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    with pytest.raises(ConfigError, match="trackio package is not installed"):
        runs.Tracker(GRPOConfig(report_to="trackio"), "x")
    with pytest.raises(ConfigError, match="report_to must be none or trackio; got 'wandb'"):
        GRPOConfig(report_to="wandb")
    assert runs.Tracker(GRPOConfig(), "x").run is None


def test_a_curriculum_run_is_saved_in_the_same_layout_with_its_stages(tmp_path, monkeypatch):
    import datasets

    from grpo_course.topics.curriculum import Stage, train_stages
    from tests.helpers import length_reward

    trainer = _trainer()
    stages = [Stage("basic", ("basic",), datasets.Dataset.from_list(ROWS[:3])),
              Stage("advanced", ("advanced",), datasets.Dataset.from_list(ROWS[3:]))]
    monkeypatch.setattr("grpo_course.core.rewards.default_rewards", lambda weights: {"length": length_reward})
    train_stages(trainer.model, trainer.tokenizer, trainer.config, stages, 1,
                 out_dir=tmp_path / "cur", profile="smoke")
    rows = [json.loads(line) for line in (tmp_path / "cur" / "metrics.jsonl").read_text().splitlines()]
    assert [(r["stage"], r["step"]) for r in rows] == [("basic", 0), ("advanced", 1)]
    assert runs.list_runs(tmp_path).loc["cur", "trainer"] == "curriculum"


def test_a_curriculum_resumed_at_a_stage_boundary_ends_where_the_uninterrupted_one_does(
        tmp_path, monkeypatch):
    """Chapter 5 trains stage 1 once and starts the later stages from its checkpoint: they must
    start as in one uninterrupted run (fresh optimizer, their rows from the first, step 0)."""
    import datasets
    import torch

    from grpo_course.core.policy import adapter_state
    from grpo_course.topics.curriculum import Stage, train_stages
    from tests.helpers import length_reward, tiny_model, tiny_tokenizer

    monkeypatch.setattr("grpo_course.core.rewards.default_rewards", lambda weights: {"length": length_reward})
    config = _trainer().config
    stages = [Stage("one", ("basic",), datasets.Dataset.from_list(ROWS[:4])),
              Stage("two", ("basic",), datasets.Dataset.from_list(ROWS[2:])),
              Stage("three", ("basic",), datasets.Dataset.from_list(ROWS))]
    whole, _ = train_stages(tiny_model(), tiny_tokenizer(), config, stages, 2, out_dir=tmp_path / "whole")
    first, _ = train_stages(tiny_model(), tiny_tokenizer(), config, stages[:1], 2)
    checkpoint = first.save_checkpoint(tmp_path / "stage1")
    resumed, records = train_stages(tiny_model(), tiny_tokenizer(), config, stages[1:], 2,
                                    resume=checkpoint, out_dir=tmp_path / "resumed")
    assert [r["step"] for r in records[0]["steps"]] == [0, 1]        # the stage's own steps
    # its log numbers the steps as the uninterrupted run's does, so both plot on one axis
    logged = {name: [(r["stage"], r["step"]) for r in runs.read_metrics(tmp_path / name)]
              for name in ("whole", "resumed")}
    assert logged["resumed"] == logged["whole"][2:] == [("two", 2), ("two", 3), ("three", 4), ("three", 5)]
    want, got = adapter_state(whole.model), adapter_state(resumed.model)
    assert want.keys() == got.keys() and want
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=0, msg=name)
