"""Every command line answers bad input with one ``error:`` line on stderr naming the bad value
and exit status 2: never a traceback, never a silent n = 0 (issue 19, point 3)."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_course.infra.errors import CourseError, RewardError
from tests.helpers import ROWS, tiny_model, tiny_tokenizer, write_jsonl

ROOT = Path(__file__).resolve().parents[1]


def one_line(capsys, *values: str) -> str:
    """The single stderr line of a failed command; it names each of ``values``."""
    err = capsys.readouterr().err
    # what a terminal shows: a progress bar that a carriage return overwrote is gone
    lines = [line.split("\r")[-1] for line in err.split("\n")]
    lines = [line for line in lines if line.strip()]
    assert "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for value in values:
        assert value in lines[0], (value, lines[0])
    return lines[0]


def _bench(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def folders(tmp_path):
    """GSM8K folders: good rows, an empty file, a non-UTF-8 row, a malformed row."""
    made = {}
    for name, tail in (("good", b""), ("empty", None), ("nonutf", b"\xff\xfe not text\n"),
                       ("badrow", b'{"question": "x"\n')):
        folder = tmp_path / name
        folder.mkdir()
        for split in ("train", "test"):
            path = folder / f"{split}.jsonl"
            if tail is None:
                path.write_bytes(b"")
            else:
                write_jsonl(path, ROWS[:2])
                path.write_bytes(path.read_bytes() + tail)
        made[name] = folder
    return made


@pytest.fixture
def tiny_folders(tmp_path):
    """A tiny saved model, a LoRA adapter on it cut short, and the model with its weights cut
    short (``load_model`` reads each as it would a real one)."""
    from peft import LoraConfig, get_peft_model
    base = tmp_path / "base"
    tiny_model().save_pretrained(base)
    tiny_tokenizer().save_pretrained(base)
    model = get_peft_model(tiny_model(), LoraConfig(r=2, target_modules=["q_proj", "v_proj"],
                                                    task_type="CAUSAL_LM"))
    adapter = tmp_path / "adapter"
    model.save_pretrained(adapter)
    meta = json.loads((adapter / "adapter_config.json").read_text())
    meta["base_model_name_or_path"] = str(base)
    (adapter / "adapter_config.json").write_text(json.dumps(meta))
    weights = adapter / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    cut = tmp_path / "cut_model"
    tiny_model().save_pretrained(cut)
    tiny_tokenizer().save_pretrained(cut)
    (cut / "model.safetensors").write_bytes((cut / "model.safetensors").read_bytes()[:100])
    return {"base": base, "adapter": adapter, "cut_model": cut}


def test_one_base_class_for_the_package_errors():
    from grpo_course.config import ConfigError
    from grpo_course.core.data import DataError
    from grpo_course.core.loading import ModelError
    from grpo_course.topics.curriculum import CurriculumError
    from grpo_course.topics.quantize import QuantizeError
    for error in (ConfigError, CurriculumError, DataError, ModelError, QuantizeError, RewardError):
        assert issubclass(error, CourseError)
    assert issubclass(ConfigError, ValueError) and issubclass(ModelError, RuntimeError)


# ---------------------------------------------------------------- evaluate
EVAL = ["--n", "2", "--max-new-tokens", "2", "--json"]


@pytest.mark.parametrize("args,values", [
    (["--offset", "-1"], ["--offset", "-1"]),
    (["--n", "0"], ["--n", "0"]),
    (["--n", "abc"], ["--n", "'abc'"]),
    (["--batch-size", "0"], ["--batch-size", "0"]),
    (["--max-new-tokens", "-1"], ["--max-new-tokens", "-1"]),
    (["--split", "dev"], ["'dev'"]),
    (["--sampling-dtype", "fp8"], ["'fp8'"]),
    (["--csv", "{tmp}"], ["--csv", "{tmp}"]),
    (["--csv", "{tmp}/no/such/folder/r.csv"], ["--csv"]),
    (["--frobnicate"], ["--frobnicate"]),
])
def test_evaluate_bad_options(args, values, tmp_path, capsys, monkeypatch):
    from grpo_course.measure import evaluate
    monkeypatch.setattr(evaluate, "load_model", lambda *a, **k: pytest.fail("loaded a model"))
    fill = lambda s: s.replace("{tmp}", str(tmp_path))
    with pytest.raises(SystemExit) as exit_:
        evaluate.main([*EVAL, *map(fill, args)])
    assert exit_.value.code == 2
    one_line(capsys, *map(fill, values))


@pytest.mark.parametrize("folder,args,values", [
    ("empty", [], ["test", "empty"]),                         # was accuracy 0.0, n = 0, exit 0
    ("good", ["--offset", "99999"], ["row 99999", "past its end"]),
    ("nonutf", ["--n", "5"], ["test.jsonl:3", "not UTF-8"]),
    ("badrow", ["--n", "5"], ["test.jsonl:3", "not valid JSON"]),
    ("missing", [], ["missing", "does not exist"]),
])
def test_evaluate_bad_data(folder, args, values, folders, tmp_path, capsys, monkeypatch):
    from grpo_course.measure import evaluate
    monkeypatch.setattr(evaluate, "load_model", lambda *a, **k: pytest.fail("loaded a model"))
    data = folders.get(folder, tmp_path / folder)
    assert evaluate.main([*EVAL, "--data-dir", str(data), *args]) == 2
    one_line(capsys, *values)


def test_a_test_file_that_is_a_folder(folders, capsys):
    from grpo_course.measure import evaluate
    (folders["empty"] / "test.jsonl").unlink()
    (folders["empty"] / "test.jsonl").mkdir()
    assert evaluate.main([*EVAL, "--data-dir", str(folders["empty"])]) == 2
    one_line(capsys, "test.jsonl")


@pytest.mark.parametrize("which,values", [
    ("adapter", ["adapter", "SafetensorError"]),     # was a safetensors traceback
    ("cut_model", ["cut_model", "not a loadable model folder"]),
])
def test_evaluate_corrupt_model_files(which, values, tiny_folders, folders, capsys):
    from grpo_course.measure import evaluate
    assert evaluate.main([*EVAL, "--data-dir", str(folders["good"]),
                          "--model", str(tiny_folders[which])]) == 2
    one_line(capsys, str(tiny_folders[which]), *values[1:])


# ---------------------------------------------------------------- train
@pytest.fixture
def train_main(folders, tmp_path, monkeypatch):
    """``train.main`` on the good rows, with the tiny model for any model name."""
    from grpo_course.core import train
    monkeypatch.setenv("GSM8K_DIR", str(folders["good"]))
    monkeypatch.setenv("GRPO_COURSE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(train, "load_model", lambda name: (tiny_model(), tiny_tokenizer()))
    return train.main


SMOKE = ["--profile", "smoke", "--max_steps", "1", "--sft_steps", "0"]


def test_train_out_is_a_file(train_main, tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    assert train_main([*SMOKE, "--out", str(tmp_path / "afile")]) == 2
    one_line(capsys, str(tmp_path / "afile"), "is a file")
    assert train_main([*SMOKE, "--out", str(tmp_path / "afile" / "run")]) == 2
    one_line(capsys, str(tmp_path / "afile"), "which is a file")


@pytest.mark.parametrize("args,values", [
    (["--max_steps", "-3"], ["max_steps=-3", ">= 0"]),
    (["--train_offset", "-1"], ["train_offset", "-1"]),
    (["--train_offset", "99999"], ["train_offset 99999", "past its end"]),
    (["--sampling_dtype", "fp8"], ["sampling_dtype", "'fp8'"]),
])
def test_train_bad_values(args, values, train_main, tmp_path, capsys):
    assert train_main(["--profile", "smoke", *args, "--out", str(tmp_path / "run")]) == 2
    one_line(capsys, *values)


def test_train_unknown_profile_from_the_environment(train_main, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GRPO_COURSE_PROFILE", "huge")
    assert train_main(["--out", str(tmp_path / "run")]) == 2
    one_line(capsys, "'huge'", "GRPO_COURSE_PROFILE")


@pytest.mark.parametrize("folder,values", [
    ("empty", ["train_offset 0", "empty"]),          # was a ConfigError traceback
    ("nonutf", ["train.jsonl:3", "not UTF-8"]),
    ("badrow", ["train.jsonl:3", "not valid JSON"]),
])
def test_train_bad_data(folder, values, train_main, folders, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GSM8K_DIR", str(folders[folder]))
    assert train_main([*SMOKE, "--out", str(tmp_path / "run")]) == 2
    one_line(capsys, *values)


def test_train_corrupt_adapter_as_model(tiny_folders, folders, tmp_path, capsys, monkeypatch):
    from grpo_course.core import train
    monkeypatch.setenv("GSM8K_DIR", str(folders["good"]))
    assert train.main([*SMOKE, "--model", str(tiny_folders["adapter"]),
                       "--out", str(tmp_path / "run")]) == 2
    one_line(capsys, str(tiny_folders["adapter"]), "SafetensorError")


@pytest.mark.heavy
def test_train_cli_runs_the_reverse_curriculum_recipe(train_main, tmp_path, capsys):
    import yaml

    from grpo_course.config import RECIPES_DIR
    out = tmp_path / "run"
    assert train_main([*SMOKE, "--config", str(RECIPES_DIR / "reverse_curriculum.yaml"),
                       "--generation_batch_size", "8", "--prompt_pool", "all",  # no pool: smoke
                       "--out", str(out)]) == 0
    saved = yaml.safe_load((out / "config.yaml").read_text())
    assert saved["lines_left"] == 1 and saved["dynamic_sampling_reward"] == "correctness"
    assert train_main([*SMOKE, "--lines_left", "0", "--out", str(tmp_path / "bad")]) == 2
    one_line(capsys, "lines_left must be >= 1")


def test_train_corrupt_checkpoint(train_main, tmp_path, capsys):
    out = tmp_path / "run"
    assert train_main([*SMOKE, "--out", str(out)]) == 0
    capsys.readouterr()
    state = out / "checkpoint" / "state.pt"
    state.write_bytes(state.read_bytes()[:64])              # cut short
    assert train_main([*SMOKE, "--resume", "--max_steps", "2", "--out", str(out)]) == 2
    one_line(capsys, str(state))
    meta = out / "checkpoint" / "trainer.json"
    meta.write_text('{"global_step": 1')
    assert train_main([*SMOKE, "--resume", "--out", str(out)]) == 2
    one_line(capsys, str(meta), "not a readable checkpoint")


def test_a_run_stopped_before_its_first_checkpoint_starts_its_log_again(train_main, tmp_path, capsys):
    """--resume without a checkpoint trains from the start, and its log holds that start's rows
    alone: the stopped run's rows would count twice in the run's steps and hours."""
    out = tmp_path / "run"
    out.mkdir()
    stale = [{"phase": "sft", "sft_step": 0, "step_seconds": 9.0},
             {"phase": "grpo", "step": 0, "step_seconds": 99.0}]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in stale))
    assert train_main([*SMOKE, "--resume", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["phase"] == "grpo"] == [0]
    assert 99.0 not in [r.get("step_seconds") for r in rows] and not any(r["phase"] == "sft" for r in rows)


def test_train_ctrl_c_saves_a_checkpoint_and_says_how_to_resume(train_main, tmp_path, capsys,
                                                               monkeypatch):
    from grpo_course.core.train import CourseTrainer

    def interrupt(self, rows=None):
        raise KeyboardInterrupt
    monkeypatch.setattr(CourseTrainer, "step", interrupt)
    out = tmp_path / "run"
    assert train_main([*SMOKE, "--out", str(out)]) == 130
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err and (out / "checkpoint" / "state.pt").is_file()
    lines = [line.split("\r")[-1] for line in captured.err.split("\n")]
    assert [line for line in lines if line.strip()] == [f"stopped: continue with --resume --out {out}"]


@pytest.mark.heavy
def test_train_cli_in_a_subprocess_prints_one_line(tmp_path):
    (tmp_path / "afile").write_text("x")
    proc = subprocess.run([sys.executable, "-m", "grpo_course.core.train", "--profile", "smoke",
                           "--out", str(tmp_path / "afile")], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: --out {str(tmp_path / 'afile')!r} is a file; name a folder for the run"]


# ---------------------------------------------------------------- rewards
def test_reward_functions_returning_the_wrong_length_or_nan_are_named():
    from grpo_course.core.rewards import checked_rewards
    assert checked_rewards("ok", [1, 0.5], 2).tolist() == [1.0, 0.5]
    with pytest.raises(RewardError, match=r"'short' returned 1 rewards for 2 completions"):
        checked_rewards("short", [1.0], 2)
    with pytest.raises(RewardError, match=r"'nan' returned nan for completion 1"):
        checked_rewards("nan", [1.0, float("nan")], 2)
    with pytest.raises(RewardError, match=r"'text' returned list"):
        checked_rewards("text", ["a", "b"], 2)


@pytest.mark.parametrize("reward,values", [
    (lambda completions, **kw: [1.0], ["'broken'", "returned 1 rewards"]),
    (lambda completions, **kw: [float("nan")] * len(completions), ["'broken'", "nan"]),
])
def test_train_names_the_broken_reward_function(reward, values, folders, tmp_path, capsys,
                                                 monkeypatch):
    from grpo_course.core import rewards, train
    monkeypatch.setenv("GSM8K_DIR", str(folders["good"]))
    monkeypatch.setenv("GRPO_COURSE_CACHE", str(tmp_path / "cache"))
    fine = lambda completions, **kw: [0.0] * len(completions)
    monkeypatch.setattr(rewards, "default_rewards", lambda weights: {n: fine for n in weights}
                        | {"broken": reward})
    monkeypatch.setattr("grpo_course.core.train.load_model",
                        lambda name: (tiny_model(), tiny_tokenizer()))
    assert train.main([*SMOKE, "--max_completion_length", "4", "--out",
                       str(tmp_path / "run")]) == 2
    one_line(capsys, *values)


# ---------------------------------------------------------------- quantize
@pytest.mark.parametrize("prompts,args,values", [
    (None, [], ["nope.json", "not a readable JSON file"]),
    (b"\xff\xfe", [], ["prompts.json", "UnicodeDecodeError"]),
    (b'{"a": 1}', [], ["prompts.json", "non-empty JSON list"]),
    (b'["hi"]', [], ["quantization.json", "not written by save_quantized"]),
    (b'["hi"]', ["--batch-sizes", "0"], ["--batch-sizes", "0"]),
    (b'["hi"]', ["--repeats", "x"], ["--repeats", "'x'"]),
])
def test_quantize_bad_input(prompts, args, values, tmp_path, capsys):
    from grpo_course.topics import quantize
    path = tmp_path / ("nope.json" if prompts is None else "prompts.json")
    if prompts is not None:
        path.write_bytes(prompts)
    argv = ["--folder", str(tmp_path), "--prompts", str(path), *args]
    try:
        code = quantize.main(argv)
    except SystemExit as exit_:
        code = exit_.code
    assert code == 2
    one_line(capsys, *values)


def test_quantize_corrupt_variant_description(tmp_path, capsys):
    from grpo_course.topics import quantize
    (tmp_path / quantize.INFO_FILE).write_text("{not json")
    (tmp_path / "prompts.json").write_text('["hi"]')
    assert quantize.main(["--folder", str(tmp_path), "--prompts",
                          str(tmp_path / "prompts.json")]) == 2
    one_line(capsys, quantize.INFO_FILE, "not a readable variant description")


# ---------------------------------------------------------------- bench
@pytest.mark.parametrize("script,args,values", [
    ("levers", ["--only", "bogus"], ["'bogus'"]),
    ("levers", ["--steps", "0"], ["--steps", "0"]),
    ("levers", ["--out", "{tmp}"], ["--out", "{tmp}"]),
    ("throughput", ["-G", "0"], ["--num-generations", "0"]),
    ("throughput", ["-G", "3", "--completions", "8"], ["--completions 8", "3"]),
    ("throughput", ["--only", "bogus"], ["'bogus'"]),
    ("throughput", ["--trl-modes", "fp32,fp8"], ["--trl-modes", "fp8"]),
    ("throughput", ["--out", "{tmp}"], ["--out", "{tmp}"]),
    ("throughput", ["--train-micro-batch", "2"], ["--train-micro-batch", "'2'"]),
    ("memory", ["--profiles", "full,huge"], ["--profiles", "huge"]),
    ("memory", ["--chapters", "09"], ["--chapters", "'09'"]),
    ("memory", ["--interval", "0"], ["--interval", "0"]),
    ("memory", ["--out", "{tmp}"], ["--out", "{tmp}"]),
    ("memory", ["--executed", "{tmp}/nowhere"], ["--executed", "{tmp}/nowhere"]),
    ("headroom", ["--samples", "1"], ["--samples", "1"]),
    ("headroom", ["--samples", "4", "--group_size", "8"], ["--group_size", "8", "--samples", "4"]),
    ("headroom", ["--slices", "10:5"], ["--slices", "'10:5'"]),
    ("headroom", ["--out", "{tmp}"], ["--out", "{tmp}"]),
    ("learning_curve", ["--steps", "0,x"], ["--steps", "'0,x'"]),
    ("learning_curve", ["--val_n", "1"], ["--val_n", "1"]),
    ("reference_test", ["--run", "{tmp}"], ["--run", "'{tmp}'", "not a finished run folder"]),
    ("sampler", ["--engines", "course,vllm"], ["engine", "'vllm'"]),
    ("sampler", ["--shapes", "huge"], ["shape", "'huge'"]),
    ("sampler", ["--repeats", "0"], ["--repeats", "0"]),
    ("sampler", ["--out", "{tmp}"], ["--out", "'{tmp}'"]),
    ("sampler", ["--before", "no-such-commit"], ["--before", "'no-such-commit'"]),
    ("sampler_agreement", ["--before", "HEAD", "--n", "0"], ["--n", "0"]),
    ("sampler_agreement", ["--before", "nowhere"], ["--before", "'nowhere'"]),
    ("sft_step", ["--steps", "0"], ["--steps", "0"]),
    ("sft_step", ["--steps", "two"], ["--steps", "'two'"]),
    ("sft_step", ["--out", "{tmp}"], ["--out", "{tmp}"]),
    ("shipped_run", ["--recipe", "{tmp}/none_run.yaml"], ["--recipe", "none_run.yaml", "is not a file"]),
    ("curriculum_test", ["--run", "{tmp}"], ["--run", "{tmp}", "not a finished run folder"]),
    ("calculator_test", ["--run", "{tmp}"], ["--run", "{tmp}", "not a finished run folder"]),
    ("sft_curve", ["--work", "{tmp}"], ["--work", "{tmp}", "holds no kept adapter"]),
    ("sft_curve", ["--val_n", "1"], ["--val_n", "1"]),
])
def test_bench_bad_options(script, args, values, tmp_path, capsys):
    fill = lambda s: s.replace("{tmp}", str(tmp_path))
    with pytest.raises(SystemExit) as exit_:
        _bench(script).main(list(map(fill, args)))
    assert exit_.value.code == 2
    one_line(capsys, *map(fill, values))


@pytest.mark.parametrize("script,args,values", [
    ("learning_curve", ["--run", "{tmp}/nowhere"], ["--run", "{tmp}/nowhere", "not a run folder"]),
    ("shipped_run", ["--export-only", "--work", "{tmp}"], ["{tmp}", "holds no finished run"]),
])
def test_bench_bad_run_folders(script, args, values, tmp_path, capsys):
    fill = lambda s: s.replace("{tmp}", str(tmp_path))
    assert _bench(script).main(list(map(fill, args))) == 2
    one_line(capsys, *map(fill, values))


def test_learning_curve_refuses_validation_rows_the_run_trains_on(tmp_path, capsys):
    from grpo_course.config import GRPOConfig
    from grpo_course.core.runs import save_run_config
    save_run_config(tmp_path, GRPOConfig(train_offset=100))
    assert _bench("learning_curve").main(["--run", str(tmp_path), "--val_n", "256"]) == 2
    one_line(capsys, "--val_n 256", "train rows from 100 on", "overlap")


def test_sft_curve_refuses_validation_rows_the_warm_up_trains_on(tmp_path, capsys):
    from grpo_course.config import GRPOConfig
    from grpo_course.core.runs import save_run_config
    save_run_config(tmp_path, GRPOConfig(train_offset=100, sft_steps=4))
    (tmp_path / "adapter_config.json").write_text("{}")
    with pytest.raises(SystemExit) as exit_:
        _bench("sft_curve").main(["--work", str(tmp_path), "--val_n", "256"])
    assert exit_.value.code == 2
    one_line(capsys, "--val_n 256", "train rows from 100 on", "overlap")


def test_throughput_train_micro_batch_sets_the_course_trainers_passes():
    bench = _bench("throughput")
    assert bench.bench_config(4, 8, 128).train_micro_batch == 4          # one group per pass
    assert bench.bench_config(4, 8, 128, "all").train_micro_batch is None  # the whole step
    assert bench.settings("all")["ours"]["train_micro_batch"] == bench.MICRO_BATCHES["all"]
    assert bench.settings()["ours"]["train_micro_batch"] == bench.MICRO_BATCHES["group"]


# ---------------------------------------------------------------- the train CLI's errors
@pytest.mark.parametrize("args,env,match", [
    (["--max-steps", "-3"], {}, "max_steps"),
    ([], {"GRPO_COURSE_PROFILE": "huge"}, "unknown profile"),
])
def test_train_cli_answers_bad_options_in_one_line(tmp_path, capsys, monkeypatch, args, env, match):
    from grpo_course.core.train import main
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert main(["--out", str(tmp_path / "run"), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and match in err[0]


def test_train_cli_rejects_a_file_as_out(tmp_path, capsys):
    from grpo_course.core.train import main
    (tmp_path / "f").write_text("x")
    assert main(["--profile", "smoke", "--out", str(tmp_path / "f")]) == 2
    assert "is a file" in capsys.readouterr().err
