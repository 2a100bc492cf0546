"""``trained_policy``: the GRPO policy chapter 6 quantizes (chapter 3's, or a short run of its
recipe, trained once and reused while its key holds)."""
from __future__ import annotations

from dataclasses import replace

import datasets
import pytest
import torch
from safetensors.torch import save_file

from grpo_course.config import GRPOConfig, get_profile
from grpo_course.core import checkpoints, loading, warmstart
from grpo_course.core.runs import save_run_config
from grpo_course.core.train import CourseTrainer
from grpo_course.infra.paths import runs_dir
from tests.helpers import ADDITION_ROWS, tiny_model, tiny_tokenizer


class FakeTrainer:
    """Stands in for ``CourseTrainer``: counts GRPO runs and writes an adapter folder."""
    runs = 0

    def __init__(self, model, tokenizer, config, data):
        self.config = config

    def start_from(self, folder):
        return self

    def train(self):
        FakeTrainer.runs += 1

    def save_model(self, folder):
        write_adapter(folder)


def write_adapter(folder):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text("{}")
    save_file({"lora_A": torch.ones(2, 2)}, str(folder / "adapter_model.safetensors"))


def truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


@pytest.fixture
def fake_training(monkeypatch, tmp_path):

    monkeypatch.setenv("GRPO_COURSE_CACHE", str(tmp_path))
    monkeypatch.setattr(warmstart, "warm_start", lambda config, data: tmp_path / "warm")
    monkeypatch.setattr(warmstart, "warm_start_key", lambda config, data: "key")
    monkeypatch.setattr(warmstart, "load_model", lambda name: (None, None))
    monkeypatch.setattr(warmstart, "CourseTrainer", FakeTrainer)
    FakeTrainer.runs = 0
    return tmp_path


def test_chapter_3s_policy_is_used_when_it_was_trained(fake_training):
    profile = get_profile("smoke")
    folder = runs_dir("smoke") / "grpo"
    write_adapter(folder)
    save_run_config(folder, profile.main_run, "smoke")
    got, how = warmstart.trained_policy(profile, [])
    assert got == folder and "chapter 3's GRPO policy" in how and FakeTrainer.runs == 0


def test_chapter_3s_folder_of_another_recipe_or_cut_short_is_not_used(fake_training, capsys):
    profile = get_profile("smoke")
    folder = runs_dir("smoke") / "grpo"
    write_adapter(folder)
    save_run_config(folder, replace(profile.main_run, learning_rate=1.0), "smoke")
    assert warmstart.trained_policy(profile, [])[0].name == warmstart.POLICY_DIR
    assert "config.yaml differs" in capsys.readouterr().out and FakeTrainer.runs == 1
    save_run_config(folder, profile.main_run, "smoke")
    truncate(folder / "adapter_model.safetensors")
    assert warmstart.trained_policy(profile, [])[0].name == warmstart.POLICY_DIR
    assert "SafetensorError" in capsys.readouterr().out


def test_a_policy_that_does_not_load_is_trained_again(fake_training, capsys):
    profile = get_profile("smoke")
    folder, _ = warmstart.trained_policy(profile, [])
    truncate(folder / "adapter_model.safetensors")
    assert warmstart.trained_policy(profile, [])[0] == folder and FakeTrainer.runs == 2
    assert "does not load" in capsys.readouterr().out
    assert loading.unloadable(folder / "adapter_model.safetensors") is None   # rebuilt whole


def test_otherwise_the_recipe_is_trained_once_and_reused(fake_training):
    profile = get_profile("smoke")
    profile = replace(profile, quant=replace(profile.quant, policy_steps=3))
    folder, how = warmstart.trained_policy(profile, [])
    assert folder.name == warmstart.POLICY_DIR and FakeTrainer.runs == 1
    assert "3 GRPO steps" in how and (folder / "adapter_config.json").is_file()
    assert warmstart.trained_policy(profile, [])[0] == folder and FakeTrainer.runs == 1   # reused
    warmstart.trained_policy(replace(profile, quant=replace(profile.quant, policy_steps=4)), [])  # new key
    assert FakeTrainer.runs == 2
    changed = replace(profile, grpo=replace(profile.grpo, learning_rate=1e-3))          # GRPO field
    warmstart.trained_policy(changed, [])
    assert FakeTrainer.runs == 3


# ---------------------------------------------------------------- the shared warm start
@pytest.mark.heavy
def test_warm_start_trains_once_and_start_from_loads_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GRPO_COURSE_CACHE", str(tmp_path))
    monkeypatch.setattr(warmstart, "load_model", lambda name: (tiny_model(), tiny_tokenizer()))
    data = datasets.Dataset.from_list(ADDITION_ROWS)
    cfg = GRPOConfig(num_generations=2, per_step_completions=4, max_completion_length=6,
                     sft_steps=2, sft_batch_size=2, sft_learning_rate=5e-2, sft_dtype="float32",
                     lora_r=4, lora_alpha=8, lora_target_modules=("q_proj", "v_proj", "up_proj"))
    folder = warmstart.warm_start(cfg, data)
    assert folder.parent == tmp_path / "warm_start"
    assert len((folder / "sft_log.jsonl").read_text().splitlines()) == 2
    # the GRPO fields do not change the recipe's key; an SFT field does
    assert warmstart.warm_start_key(cfg.__class__(**{**cfg.__dict__, "learning_rate": 1.0}), data) \
        == folder.name
    assert warmstart.warm_start_key(cfg.__class__(**{**cfg.__dict__, "sft_steps": 3}), data) \
        != folder.name
    with monkeypatch.context() as m:
        m.setattr(CourseTrainer, "sft", lambda self, steps=None: pytest.fail("retrained"))
        assert warmstart.warm_start(cfg, data) == folder          # reused, not retrained
    trainer = CourseTrainer(tiny_model(), tiny_tokenizer(), cfg, data).start_from(folder)
    saved = torch.load(folder / checkpoints.STATE_FILE, weights_only=True)
    params = dict(trainer.model.named_parameters())
    assert saved and all(torch.equal(params[n], v) for n, v in saved.items())
    assert any(v.abs().sum() > 0 for n, v in saved.items() if "lora_B" in n)   # SFT moved B
    assert trainer.sft_done == 2 and trainer.train(max_steps=0) == []        # straight to GRPO
    # other data: another key; a state file cut short: trained again, with one line saying so
    other = datasets.Dataset.from_list([{**ADDITION_ROWS[0], "answer": "#### 0"}, *ADDITION_ROWS[1:]])
    assert warmstart.warm_start_key(cfg, other) != folder.name
    truncate(folder / checkpoints.STATE_FILE)
    capsys.readouterr()
    assert warmstart.warm_start(cfg, data) == folder
    assert "does not load" in capsys.readouterr().out
    assert loading.unloadable(folder / checkpoints.STATE_FILE) is None
