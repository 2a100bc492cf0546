"""Chapter 4 writes TRL's ``GRPOConfig`` and ``LoraConfig`` out field by field; the course's bridge
builds them from the course config for the command line. They must agree, field by field, on every
profile (the notebook's cells run here as they run in the chapter, without a model)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from grpo_course.topics import trl_bridge

NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "04_trl_trainer.ipynb"


def cell_source(cell_id: str) -> str:
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    (cell,) = [c for c in cells if c.get("id") == cell_id]
    return "".join(cell["source"])


@pytest.mark.parametrize("profile", ["smoke", "full", "binder"])
def test_notebook_grpo_config_equals_the_bridge(profile, monkeypatch, tmp_path):
    monkeypatch.setenv("GRPO_COURSE_PROFILE", profile)
    monkeypatch.setenv("GRPO_COURSE_CACHE", str(tmp_path))
    namespace: dict = {}
    exec(cell_source("c01"), namespace)                   # the profile and its cfg
    exec(cell_source("c03"), namespace)                   # GRPOConfig(...) and LoraConfig(...)
    args, P, cfg = namespace["args"], namespace["P"], namespace["cfg"]
    assert P.name == profile
    assert "GRPOConfig(" in cell_source("c03") and "GRPOTrainer(" in cell_source("c10")
    bridge = trl_bridge.grpo_config_from_course(cfg, namespace["out_dir"], micro_batch=P.trl.micro_batch,
                                                bf16=args.bf16, disable_tqdm=False)
    assert trl_bridge.trl_config_differences(args, bridge) == {}
    assert namespace["peft_config"].to_dict() == trl_bridge.lora_config_from_course(cfg).to_dict()
    names = [f.__name__ for f in namespace["reward_funcs"]]
    assert names == trl_bridge.reward_names(cfg)


def test_config_differences_names_each_field(tmp_path):
    from grpo_course.config import GRPOConfig

    a = trl_bridge.grpo_config_from_course(GRPOConfig(), tmp_path)
    b = trl_bridge.grpo_config_from_course(GRPOConfig(), tmp_path, temperature=0.7, beta=0.04)
    assert trl_bridge.trl_config_differences(a, b) == {"beta": (a.beta, 0.04),
                                                   "temperature": (a.temperature, 0.7)}
    assert trl_bridge.trl_config_differences(a, a) == {}
