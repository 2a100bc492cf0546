"""The train CLI configured as TRL's is: every GRPOConfig field a flag, YAML recipes, the order
profile < recipe < flags, the resolved config saved in the run folder, one-line errors."""
from __future__ import annotations

import dataclasses
import json
import re

import pytest
import yaml

from grpo_course import config as C
from grpo_course.config import GRPOConfig, load_recipe
from grpo_course.core import runs as R
from grpo_course.core.cli import build_parser, parse_train_args
from tests.helpers import tiny_model, tiny_tokenizer

FIELDS = [f.name for f in dataclasses.fields(GRPOConfig)]


@pytest.fixture
def tiny_run(gsm8k_dir, tmp_path, monkeypatch):
    """``train.main`` on the conftest rows with a tiny model; records every sampling call."""
    from grpo_course.core import train
    monkeypatch.setenv("GSM8K_DIR", str(gsm8k_dir))
    monkeypatch.setenv("GRPO_COURSE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(train, "load_model", lambda name: (tiny_model(), tiny_tokenizer()))
    calls = []
    real = train.sample_completions

    def spy(model, tokenizer, prompts, G, max_new_tokens, *args, **kwargs):
        calls.append({"prompts": len(prompts), "G": G, "max_new_tokens": max_new_tokens})
        return real(model, tokenizer, prompts, G, max_new_tokens, *args, **kwargs)
    monkeypatch.setattr(train, "sample_completions", spy)
    return train.main, calls


def _recipe(tmp_path, text: str, name: str = "recipe.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _saved(folder) -> dict:
    return yaml.safe_load((folder / R.RUN_CONFIG_FILE).read_text())


# ---------------------------------------------------------------- the acceptance run
def test_smoke_run_with_a_recipe_and_two_flags(tiny_run, tmp_path, capsys):
    main, calls = tiny_run
    recipe = _recipe(tmp_path, "num_generations: 4\nloss_type: dr_grpo\ndynamic_sampling: false\n"
                               "max_completion_length: 8\nsft_steps: 1\n")
    out = tmp_path / "run"
    assert main(["--profile", "smoke", "--out", str(out), "--config", recipe,
                 "--num_generations", "2", "--per_step_completions", "6", "--max-steps", "1"]) == 0
    saved = _saved(out)
    assert saved["profile"] == "smoke"
    assert (saved["num_generations"], saved["per_step_completions"]) == (2, 6)     # flags
    assert (saved["loss_type"], saved["max_completion_length"]) == ("dr_grpo", 8)  # recipe
    assert saved["sft_batch_size"] == C.PROFILES["smoke"].grpo.sft_batch_size     # profile
    assert set(FIELDS) <= set(saved) and saved["max_steps"] == 1
    # the trainer did what the config says: 6 completions a step, 3 prompts x G = 2
    assert calls == [{"prompts": 3, "G": 2, "max_new_tokens": 8}]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in rows] == ["sft", "grpo"] and rows[1]["prompts_sampled"] == 3
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["steps"] == 1
    # the saved config is a recipe: it resolves to the same GRPOConfig
    _, again, profile = parse_train_args(["--out", str(tmp_path / "x"), "--config",
                                          str(out / R.RUN_CONFIG_FILE)])
    assert profile == "smoke" and C.config_to_dict(again) == {k: saved[k] for k in FIELDS}


def test_resume_reuses_the_saved_config_and_flags_override_it(tiny_run, tmp_path):
    main, calls = tiny_run
    out = tmp_path / "run"
    first = ["--profile", "smoke", "--out", str(out), "--sft_steps", "0", "--dynamic_sampling",
             "false", "--max_completion_length", "6", "--num_generations", "2", "--max-steps", "1"]
    assert main(first) == 0
    assert main(["--out", str(out), "--resume", "--max_steps", "2", "--learning_rate", "1e-3"]) == 0
    saved = _saved(out)
    assert (saved["max_steps"], saved["learning_rate"]) == (2, 1e-3)       # the flags
    assert (saved["num_generations"], saved["profile"]) == (2, "smoke")    # the first run's
    assert [c["G"] for c in calls] == [2, 2]                               # one step each
    steps = [json.loads(r)["step"] for r in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1]


# ---------------------------------------------------------------- precedence and types
def test_profile_then_recipe_then_flags(tmp_path, monkeypatch):
    monkeypatch.delenv("GRPO_COURSE_PROFILE", raising=False)
    recipe = _recipe(tmp_path, "learning_rate: 1e-4\nnum_generations: 4\nper_step_completions: 8\n"
                               "reward_weights: {correctness: 2}\nlora_target_modules: [q_proj]\n")
    _, cfg, profile = parse_train_args(["--out", "o"])
    assert profile == "full" and cfg == C.PROFILES["full"].grpo
    _, cfg, _ = parse_train_args(["--out", "o", "--config", recipe])
    assert (cfg.learning_rate, cfg.num_generations, cfg.sft_steps) == \
        (1e-4, 4, C.PROFILES["full"].grpo.sft_steps)       # YAML's "1e-4" string read as a float
    assert cfg.reward_weights == {"correctness": 2.0} and cfg.lora_target_modules == ("q_proj",)
    _, cfg, profile = parse_train_args(
        ["--profile", "smoke", "--out", "o", "--config", recipe, "--learning-rate", "3e-4",
         "--reward_weights", '{"correctness": 1, "exact_format": 0.25}', "--epsilon_high", "none",
         "--lora_target_modules", "q_proj", "v_proj", "--use_lora", "false", "--seed", "7"])
    assert profile == "smoke" and cfg.max_completion_length == 32          # smoke's
    assert (cfg.learning_rate, cfg.epsilon_high, cfg.use_lora, cfg.seed) == (3e-4, None, False, 7)
    assert cfg.reward_weights == {"correctness": 1.0, "exact_format": 0.25}
    assert cfg.lora_target_modules == ("q_proj", "v_proj")
    _, cfg, _ = parse_train_args(["--out", "o", "--profile", "smoke", "--max-steps", "5"])
    assert cfg.max_steps == 5 and parse_train_args(
        ["--out", "o", "--profile", "smoke", "--max_steps", "6"])[1].max_steps == 6


def test_a_recipe_may_name_the_profile_and_the_flag_wins(tmp_path):
    recipe = _recipe(tmp_path, "profile: smoke\nloss_type: bnpo\n")
    assert parse_train_args(["--out", "o", "--config", recipe])[2] == "smoke"
    assert parse_train_args(["--out", "o", "--config", recipe, "--profile", "full"])[2] == "full"


def test_help_lists_every_field_with_its_help(capsys):
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(["--help"])
    assert stop.value.code == 0
    text = "".join(capsys.readouterr().out.split())        # wrapping ignored
    for f in dataclasses.fields(GRPOConfig):
        assert f"--{f.name}" in text, f.name
        assert "".join(f.metadata["help"].split()) in text, f.name
    for option in ("--out", "--profile", "--config", "--resume", "--max-steps"):
        assert option in text


def test_every_field_has_help_next_to_it():
    assert all(f.metadata.get("help") for f in dataclasses.fields(GRPOConfig))


def test_defaults_and_validation_unchanged():
    cfg = GRPOConfig()
    assert (cfg.num_generations, cfg.per_step_completions, cfg.learning_rate, cfg.epsilon_high,
            cfg.loss_type, cfg.lora_target_modules[0], cfg.reward_weights["exact_format"]) == \
        (4, 8, 2e-4, None, "grpo", "q_proj", 0.5)
    with pytest.raises(C.ConfigError, match="not divisible"):
        GRPOConfig(num_generations=3)


# ---------------------------------------------------------------- the recipes in the repository
def test_levers_come_from_their_recipe():
    assert C.GRPO_LEVERS == load_recipe(C.RECIPES_DIR / "grpo_levers.yaml")
    for profile in C.PROFILES.values():        # the sampling round's width is each profile's size
        assert all(getattr(profile.grpo, k) == v for k, v in C.GRPO_LEVERS.items()
                   if k != "generation_batch_size")
        assert profile.grpo.generation_batch_size >= profile.grpo.per_step_completions
    assert C.PROFILES["full"].grpo.generation_batch_size == C.GRPO_LEVERS["generation_batch_size"]


@pytest.mark.parametrize("recipe", sorted(p.name for p in C.RECIPES_DIR.glob("*.yaml")))
@pytest.mark.parametrize("profile", C.PROFILE_NAMES)
def test_every_recipe_resolves_on_both_profiles(recipe, profile):
    _, cfg, _ = parse_train_args(["--profile", profile, "--out", "o",
                                  "--config", str(C.RECIPES_DIR / recipe)])
    assert all(getattr(cfg, k) == v for k, v in load_recipe(C.RECIPES_DIR / recipe).items())


def test_run_config_is_printed_by_the_runs_helper_and_evaluate(tmp_path, capsys):
    from grpo_course.book.plotting import print_run_config, run_config_differences
    from grpo_course.measure.evaluate import run_configs
    cfg = GRPOConfig(num_generations=2, loss_type="dapo")
    R.save_run_config(tmp_path / "a", cfg, "smoke")
    R.save_run_config(tmp_path / "b", GRPOConfig(), "full")
    assert print_run_config(tmp_path / "a")["loss_type"] == "dapo"
    assert re.search(r"\n  num_generations +2\n", capsys.readouterr().out)
    diff = run_config_differences({"a": tmp_path / "a", "b": tmp_path / "b"})
    assert diff["loss_type"] == {"a": "dapo", "b": "grpo"} and "seed" not in diff
    found = run_configs([str(tmp_path / "a"), "smollm2-135m-instruct", str(tmp_path)])
    assert list(found) == [str(tmp_path / "a")] and found[str(tmp_path / "a")]["profile"] == "smoke"
    assert not list(tmp_path.glob("a/.*"))          # no temporary left behind


# ---------------------------------------------------------------- bad input: one line, exit 2
BAD_YAML = "num_generations: [4\n"


@pytest.mark.parametrize("args,files,match", [
    (["--num_generationz", "8"], {}, "unrecognized arguments: --num_generationz 8"),
    (["--num_generations", "eight"], {}, "argument --num_generations"),
    (["--reward_weights", "{correctness: 1}"], {}, "reward_weights must be a mapping"),
    (["--epsilon_high", "wide"], {}, "epsilon_high must be a number or none"),
    (["--use_lora", "maybe"], {}, "argument --use_lora"),
    (["--loss_type", "ppo"], {}, "loss_type must be one of"),
    (["--num_generations", "3"], {}, "not divisible by num_generations=3"),
    (["--config", "{dir}/missing.yaml"], {}, "cannot be read"),
    (["--config", "{dir}/r.yaml"], {"r.yaml": BAD_YAML}, "is not valid YAML at line 2"),
    (["--config", "{dir}/r.yaml"], {"r.yaml": "- a list\n"}, "must be a mapping"),
    (["--config", "{dir}/r.yaml"], {"r.yaml": "num_gens: 8\n"}, "unknown GRPOConfig field 'num_gens'"),
    (["--config", "{dir}/r.yaml"], {"r.yaml": "max_steps: many\n"}, "max_steps must be an integer"),
    (["--config", "{dir}/r.yaml"], {"r.yaml": "use_lora: 3\n"}, "use_lora must be true or false"),
    (["--profile", "huge"], {}, "unknown profile 'huge'"),
])
def test_bad_input_is_one_error_line(tmp_path, capsys, monkeypatch, args, files, match):
    from grpo_course.core import train
    from grpo_course.core.train import main
    monkeypatch.setattr(train, "load_model", lambda name: pytest.fail("loaded a model"))
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    args = [a.replace("{dir}", str(tmp_path)) for a in args]
    assert main(["--out", str(tmp_path / "run"), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and match in err[0], err
    assert not (tmp_path / "run").exists()


def test_out_is_required(capsys):
    from grpo_course.core.train import main
    assert main(["--profile", "smoke"]) == 2
    assert capsys.readouterr().err.strip() == "error: --out is required: name a folder for the run"


@pytest.mark.parametrize("profile", C.PROFILE_NAMES)
def test_train_command_round_trips(profile):
    import shlex

    from grpo_course.core.cli import train_command
    P = C.PROFILES[profile]
    cfg = dataclasses.replace(P.grpo, num_generations=4, per_step_completions=8, max_steps=3,
                              epsilon_high=None, use_lora=False, lora_target_modules=("q_proj",),
                              reward_weights={"correctness": 1.0}, loss_type="dr_grpo")
    command = train_command(cfg, profile, "runs/x", recipe=C.RECIPES_DIR / "dr_grpo.yaml")
    assert "--loss_type" not in command and "--learning_rate" not in command   # recipe, profile
    words = shlex.split(command)
    assert words[:3] == ["python", "-m", "grpo_course.core.train"]
    args, again, name = parse_train_args(words[3:])
    assert (again, name, args.out) == (cfg, profile, "runs/x")
    assert train_command(P.grpo, profile, "o").endswith(f"--profile {profile} --out o")
    # the course's recipe is named recipes/<name>: no machine path, and it loads from any folder
    assert "--config recipes/dr_grpo.yaml" in command and str(C.RECIPES_DIR) not in command


def test_a_course_recipe_loads_by_its_printed_name_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert C.load_recipe("recipes/dr_grpo.yaml") == C.load_recipe(C.RECIPES_DIR / "dr_grpo.yaml")
    with pytest.raises(C.ConfigError, match="cannot be read"):
        C.load_recipe("recipes/no_such_recipe.yaml")
