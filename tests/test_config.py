import pytest

from grpo_course.config import PROFILES, ConfigError, EvalConfig, GRPOConfig, check_group_config, get_profile


def test_default_profile_is_full(monkeypatch):
    monkeypatch.delenv("GRPO_COURSE_PROFILE", raising=False)
    assert get_profile().name == "full"


def test_profile_from_env(monkeypatch):
    monkeypatch.setenv("GRPO_COURSE_PROFILE", "smoke")
    assert get_profile().name == "smoke"
    monkeypatch.setenv("GRPO_COURSE_PROFILE", " FULL ")
    assert get_profile().name == "full"


def test_argument_beats_env(monkeypatch):
    monkeypatch.setenv("GRPO_COURSE_PROFILE", "full")
    assert get_profile("smoke").name == "smoke"


def test_unknown_profile(monkeypatch):
    monkeypatch.setenv("GRPO_COURSE_PROFILE", "huge")
    with pytest.raises(ConfigError, match="unknown profile 'huge'"):
        get_profile()


def test_smoke_is_smaller_than_full():
    smoke, full = PROFILES["smoke"], PROFILES["full"]
    assert smoke.eval.n < full.eval.n
    assert smoke.grpo.max_steps < full.grpo.max_steps
    assert full.eval.n >= 200   # held-out evaluation on hundreds of problems


@pytest.mark.parametrize("g, b, message", [
    (4, 6, "not divisible by num_generations=4"),
    (1, 8, "must be >= 2"),
    (4, 0, "not divisible"),
])
def test_group_config_errors(g, b, message):
    with pytest.raises(ConfigError, match=message):
        check_group_config(g, b)


def test_grpo_config_validation():
    with pytest.raises(ConfigError, match="not divisible"):
        GRPOConfig(num_generations=3, per_step_completions=8)
    with pytest.raises(ConfigError, match="max_completion_length"):
        GRPOConfig(max_completion_length=0)
    with pytest.raises(ConfigError, match="loss_type"):
        GRPOConfig(loss_type="ppo")
    assert GRPOConfig(num_generations=4, per_step_completions=8).prompts_per_step == 2


def test_eval_config_validation():
    with pytest.raises(ConfigError):
        EvalConfig(n=0)


def test_full_grpo_steps_are_sized_to_the_cpu(monkeypatch):
    """More GRPO steps where the CPU has native bf16 (a step is faster there), and the full
    profile on this machine uses the number this machine gets."""
    from grpo_course import config
    from grpo_course.infra import hardware

    monkeypatch.setattr(hardware, "native_bf16", lambda: True)
    fast = config.full_grpo_steps()
    monkeypatch.setattr(hardware, "native_bf16", lambda: False)
    slow = config.full_grpo_steps()
    assert (fast, slow) == (config.FULL_GRPO_STEPS["native_bf16"], config.FULL_GRPO_STEPS["fp32"])
    assert fast > slow > PROFILES["smoke"].grpo.max_steps
    monkeypatch.undo()
    assert PROFILES["full"].grpo.max_steps == config.full_grpo_steps()


def test_full_live_samples_are_sized_to_the_cpu(monkeypatch):
    """Chapter 3's second page samples less where sampling runs in fp32, within its 15 minutes."""
    from grpo_course import config
    from grpo_course.infra import hardware

    monkeypatch.setattr(hardware, "native_bf16", lambda: True)
    fast = config.full_live_samples()
    monkeypatch.setattr(hardware, "native_bf16", lambda: False)
    slow = config.full_live_samples()
    assert fast == config.FULL_LIVE_SAMPLES["native_bf16"] and slow == config.FULL_LIVE_SAMPLES["fp32"]
    assert all(fast[k] >= slow[k] > getattr(PROFILES["smoke"].start, k, PROFILES["smoke"].ref.live_problems)
               for k in slow)
    monkeypatch.undo()
    full = PROFILES["full"]
    assert (full.start.samples, full.ref.live_problems) == tuple(config.full_live_samples().values())


def test_full_curriculum_is_sized_to_the_cpu(monkeypatch):
    """Chapter 5 trains fewer steps per stage and evaluates fewer problems where it runs in fp32
    (slower); the smoke profile stays below both."""
    from grpo_course import config
    from grpo_course.infra import hardware

    monkeypatch.setattr(hardware, "native_bf16", lambda: True)
    fast = config.full_curriculum()
    monkeypatch.setattr(hardware, "native_bf16", lambda: False)
    slow = config.full_curriculum()
    assert fast == config.FULL_CURRICULUM["native_bf16"] and slow == config.FULL_CURRICULUM["fp32"]
    assert all(fast[k] >= slow[k] > getattr(PROFILES["smoke"].cl, k) for k in slow)
    monkeypatch.undo()
    cl = PROFILES["full"].cl
    assert {k: getattr(cl, k) for k in slow} == config.full_curriculum()


def test_every_profile_section_field_is_read_somewhere():
    """No dead fields: each chapter section's fields are read by a chapter or the package
    (``P.quant.eval_n``, ``self.short.num_generations``, ``profile.quant.policy_steps``)."""
    import dataclasses
    import re
    from pathlib import Path

    from grpo_course.config import Profile

    root = Path(__file__).resolve().parents[1]
    text = "\n".join(p.read_text() for pattern in ("notebooks/*.ipynb", "grpo_course/**/*.py")
                     for p in root.glob(pattern) if p.name != "config.py")
    text += (root / "grpo_course" / "config.py").read_text().split("class Profile:")[1]
    sections = [f for f in dataclasses.fields(Profile) if f.default_factory is not dataclasses.MISSING]
    assert {s.name for s in sections} == {"data", "rewards", "loop", "trl", "cl", "quant", "prof", "short",
                                          "start", "ref"}
    unread = [f"{s.name}.{f.name}" for s in sections for f in dataclasses.fields(s.default_factory)
              if not re.search(rf"\.{s.name}\.{f.name}\b", text)]
    assert not unread, unread


def test_main_run_is_the_recipe_at_the_reverse_curriculum_start():
    from grpo_course.config import REVERSE_CURRICULUM, START_BUDGETS
    assert REVERSE_CURRICULUM["lines_left"] == 1
    for name, profile in PROFILES.items():
        run = profile.main_run
        assert run.lines_left in START_BUDGETS and run.lines_left + 1 in START_BUDGETS, name
        assert run.dynamic_sampling_reward == "correctness" and not run.mask_truncated_completions
        assert run.sft_steps == profile.grpo.sft_steps and run.lora_r == profile.grpo.lora_r
        assert profile.grpo.lines_left is None            # chapters 4-7 train whole problems
        assert run.generation_batch_size % run.num_generations == 0
        assert profile.start.pass_k_problems <= min(hi - lo for lo, hi in profile.start.slices)
    full = PROFILES["full"].start
    assert all(hi - lo >= 256 for lo, hi in full.slices)  # McNemar on n >= 256 per slice
    assert full.slices[0][1] <= full.slices[1][0]         # disjoint
    assert PROFILES["full"].main_run.max_completion_length == START_BUDGETS[1]
