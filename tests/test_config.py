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
    from grpo_course import config, hardware

    monkeypatch.setattr(hardware, "native_bf16", lambda: True)
    fast = config.full_grpo_steps()
    monkeypatch.setattr(hardware, "native_bf16", lambda: False)
    slow = config.full_grpo_steps()
    assert (fast, slow) == (config.FULL_GRPO_STEPS["native_bf16"], config.FULL_GRPO_STEPS["fp32"])
    assert fast > slow > PROFILES["smoke"].grpo.max_steps
    monkeypatch.undo()
    assert PROFILES["full"].grpo.max_steps == config.full_grpo_steps()
