"""The reference run's tests (the verdict fixed in advance) and its export (bench/shipped_run.py)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from grpo_course.infra.paths import shown_path
from grpo_course.measure.reference import MIN_FORMAT, SAMPLES, SLICES, primary_verdict

ROOT = Path(__file__).resolve().parents[1]


def _slice(difference, p, fmt):
    return {"sampled": {"pass_at_1": {"difference": difference, "p_value": p},
                        "after": {"format_rate": fmt}}}


def test_the_fixed_test_is_the_full_profiles():
    assert SLICES == ((512, 768), (768, 1024)) and SAMPLES == 8 and MIN_FORMAT == 0.95


@pytest.mark.parametrize("slices, passed", [
    ([_slice(0.04, 0.001, 0.99), _slice(0.02, 0.03, 0.97)], True),
    ([_slice(0.04, 0.001, 0.99), _slice(0.02, 0.06, 0.97)], False),     # one slice not significant
    ([_slice(0.04, 0.001, 0.99), _slice(-0.03, 0.01, 0.97)], False),    # one slice fell
    ([_slice(0.04, 0.001, 0.99), _slice(0.02, 0.01, 0.90)], False),     # the format slipped
])
def test_the_primary_test_needs_both_slices_and_the_format(slices, passed):
    verdict = primary_verdict(slices)
    assert verdict["passed"] is passed and len(verdict["rose"]) == 2


def _bench(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _adapter(folder: Path) -> None:
    from safetensors.torch import save_file
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text("{}")
    save_file({"a.lora_A.weight": torch.randn(4, 3), "step": torch.tensor([3])},
              str(folder / "adapter_model.safetensors"))


def test_a_finished_run_is_exported_in_bf16_with_its_machine_and_hours(tmp_path):
    from safetensors.torch import load_file
    bench = _bench("shipped_run")
    work, out = tmp_path / "work", tmp_path / "out"
    _adapter(work)
    _adapter(work / "sft")
    (work / "config.yaml").write_text("trainer: course\n")
    (work / "metrics.jsonl").write_text(
        json.dumps({"phase": "sft", "sft_step": 0, "step_seconds": 1800.0}) + "\n"
        + json.dumps({"phase": "grpo", "step": 0, "step_seconds": 1800.0}) + "\n")
    (work / "pool.json").write_text(json.dumps({"seconds": 3600.0, "mixed": [1], "ids": [1, 2],
                                                "correct": [1, 0], "samples": 2}))
    (work / "started.json").write_text(json.dumps({"commit": "abc", "time": "t"}))
    # kept snapshots go with it, but the final step's, which is the adapter at the top
    _adapter(work / "steps" / "0")
    _adapter(work / "steps" / "1")
    assert bench.main(["--export-only", "--work", str(work), "--out", str(out)]) == 0
    info = json.loads((out / "run.json").read_text())
    assert info["hours"] == 2.0 and info["grpo_steps"] == 1 and info["sft_steps"] == 1
    assert info["commit"] == "abc" and "avx2" in info["machine"]
    assert info["snapshots"] == [0] and sorted(p.name for p in (out / "steps").iterdir()) == ["0"]
    for folder in (out, out / "sft", out / "steps" / "0"):
        weights = load_file(folder / "adapter_model.safetensors")
        assert weights["a.lora_A.weight"].dtype == torch.bfloat16 and weights["step"].dtype == torch.int64
    assert (out / "pool.json").is_file() and (out / "metrics.jsonl").is_file()
    assert info["recipe"] == "recipes/reference_run.yaml" and info["reproduce"] == "make reference-run"
    # another recipe names its run, its default folders and its make target
    curriculum = bench.RECIPE.with_name("curriculum_run.yaml")
    assert bench.run_name(curriculum) == "curriculum"
    assert bench.main(["--export-only", "--recipe", str(curriculum), "--work", str(work),
                       "--out", str(tmp_path / "cur")]) == 0
    info = json.loads((tmp_path / "cur" / "run.json").read_text())
    assert info["recipe"] == "recipes/curriculum_run.yaml" and info["reproduce"] == "make curriculum-run"
    # a shipped warm-up it began from keeps its own record in sft/ (make sft-run's run.json, ...)
    warm = tmp_path / "warm"
    _adapter(warm)
    (warm / "run.json").write_text('{"reproduce": "make sft-run"}')
    assert bench.main(["--export-only", "--recipe", str(bench.RECIPE.with_name("calculator_run.yaml")),
                       "--work", str(work), "--out", str(tmp_path / "calc"), "--warm_start", str(warm)]) == 0
    assert json.loads((tmp_path / "calc" / "sft" / "run.json").read_text())["reproduce"] == "make sft-run"
    assert json.loads((tmp_path / "calc" / "run.json").read_text())["reproduce"] == "make calculator-run"
    assert not (tmp_path / "calc" / "sft" / "config.yaml").exists()     # only what the warm start has


def test_a_kept_warm_up_adapter_is_exported_as_a_warm_up_of_that_many_steps(tmp_path):
    """--sft_step N: the adapter a warm-up alone kept at step N, with its first N steps' metrics and
    hours and a config of sft_steps N; a step it did not keep is refused in one line."""
    from grpo_course.core.sft import SFT_SNAPSHOTS
    bench = _bench("shipped_run")
    work, out = tmp_path / "work", tmp_path / "out"
    _adapter(work)
    _adapter(work / SFT_SNAPSHOTS / "2")
    (work / "config.yaml").write_text("calculator: true\nmax_steps: 0\nsft_steps: 4\n")
    (work / "metrics.jsonl").write_text("".join(
        json.dumps({"phase": "sft", "sft_step": i, "step_seconds": 900.0}) + "\n" for i in range(4)))
    (work / "started.json").write_text(json.dumps({"commit": "abc", "time": "t"}))
    recipe = bench.RECIPE.with_name("calculator_sft_run.yaml")
    args = ["--export-only", "--recipe", str(recipe), "--work", str(work), "--out", str(out)]
    assert bench.main([*args, "--sft_step", "2"]) == 0
    info = json.loads((out / "run.json").read_text())
    assert info["sft_steps"] == 2 and info["grpo_steps"] == 0 and info["hours"] == 0.5
    assert info["reproduce"] == "make sft-run"
    assert "sft_steps: 2\n" in (out / "config.yaml").read_text()
    assert [json.loads(x)["sft_step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [0, 1]
    assert not (out / "sft").exists() and (out / "adapter_model.safetensors").is_file()
    assert bench.main([*args, "--sft_step", "3"]) == 2


def _patch_sampling(monkeypatch, sampled) -> None:
    """Route whole_problems' block-by-block sampling (load_model, then sampled_records per cache
    block) through a fake with evaluate_sampled's signature, the model standing for its folder."""
    from grpo_course.measure import paired

    def records(model, tok, rows, samples, budget, temperature, seed, batch_prompts, dtype, progress, desc,
                calculator=False):
        return sampled(model, rows, samples, budget, temperature, seed, batch_prompts, dtype, progress).records
    monkeypatch.setattr(paired, "load_model", lambda name: (name, None))
    monkeypatch.setattr(paired, "sampled_records", records)


def test_the_learning_curve_keeps_each_step_s_samples_and_resumes(tmp_path, monkeypatch):
    """A stopped learning-curve bench resumes: a step tested before is read back from the cache,
    the same records; another adapter (or other rows) is sampled again."""
    from grpo_course.measure.evaluate import SampledResult
    bench = _bench("learning_curve")
    monkeypatch.setenv("GRPO_COURSE_CACHE", str(tmp_path / "cache"))
    calls = []

    def sampled(model, rows, samples, budget, temperature, seed, batch_prompts, sampling_dtype,
                progress=True):
        calls.append(model)
        records = [{"idx": r["idx"], "right": len(calls), "formatted": samples} for r in rows]
        return SampledResult(samples, records, 1.5, model)

    _patch_sampling(monkeypatch, sampled)                           # the cache the benches share
    a, b = tmp_path / "a", tmp_path / "b"
    _adapter(a)
    _adapter(b)
    rows = [{"idx": i, "question": f"q{i}", "answer": f"#### {i}", "start": "s"} for i in range(3)]
    first = bench.validation_samples(a, rows, 4, 64)
    again = bench.validation_samples(a, rows, 4, 64)
    assert calls == [str(a)] and again.records == first.records and again.seconds == first.seconds
    assert bench.validation_samples(b, rows, 4, 64).records[0]["right"] == 2       # other weights
    bench.validation_samples(a, rows[:2], 4, 64)                                    # other rows
    bench.validation_samples(a, rows, 2, 64)                                        # other samples
    assert calls == [str(a), str(b), str(a), str(a)]
    # PEFT writes target_modules in a set's order: a copy that differs in that order alone is the
    # same adapter, another module list is not
    (a / "adapter_config.json").write_text('{"target_modules": ["v_proj", "q_proj"]}')
    bench.validation_samples(a, rows, 4, 64)
    (a / "adapter_config.json").write_text('{"target_modules": ["q_proj", "v_proj"]}')
    bench.validation_samples(a, rows, 4, 64)
    (a / "adapter_config.json").write_text('{"target_modules": ["q_proj"]}')
    bench.validation_samples(a, rows, 4, 64)
    assert calls == [str(a), str(b), str(a), str(a), str(a), str(a)]


def _curve_run(folder: Path, lr: float, sft: Path | None = None, **changes) -> None:
    """A run folder as the learning curve reads it: its config (``changes`` from the defaults), log,
    warm start (a copy of ``sft``'s, or new) and step 20."""
    import shutil

    from grpo_course.config import GRPOConfig
    from grpo_course.core.runs import save_run_config
    save_run_config(folder, GRPOConfig(train_offset=512, learning_rate=lr, **{"lines_left": 1, **changes}))
    if sft:
        shutil.copytree(sft, folder / "sft")
    else:
        _adapter(folder / "sft")
    _adapter(folder / "steps" / "20")
    (folder / "metrics.jsonl").write_text("".join(json.dumps(
        {"phase": "grpo", "step": i, "step_seconds": 30.0, "prompts_sampled": 8, "informative_groups": 4,
         "correct_mixed_groups": 4, "trained_correct_mixed": 3}) + "\n" for i in range(20)))


def test_the_learning_curve_compares_runs_on_the_same_rows_and_names_the_best(tmp_path, monkeypatch, capsys):
    """Two runs (two learning rates) side by side: a curve each, on the same problems, and the best
    (run, step) on validation."""
    from grpo_course.measure.evaluate import SampledResult
    bench = _bench("learning_curve")
    monkeypatch.setenv("GRPO_COURSE_CACHE", str(tmp_path / "cache"))
    a, b = tmp_path / "a", tmp_path / "b"
    _curve_run(a, 3e-4)
    _curve_run(b, 1e-4, sft=a / "sft")
    right = {str(a / "sft"): 1, str(a / "steps" / "20"): 3, str(b / "sft"): 1, str(b / "steps" / "20"): 2,
             str(a / "steps" / "40"): 3}

    def sampled(model, rows, samples, budget, temperature, seed, batch_prompts, sampling_dtype,
                progress=True):
        return SampledResult(samples, [{"idx": r["idx"], "right": right.get(model, 1) if r["idx"] else 0,
                                        "formatted": samples} for r in rows], 1.0, model)

    _patch_sampling(monkeypatch, sampled)                           # the cache the benches share
    monkeypatch.setattr(bench, "held_out_rows", lambda split, n, offset, lines_left: [
        {"idx": i, "question": f"q{i}", "answer": "#### 1", "start": "s"} for i in range(n)])
    out_file = tmp_path / "curve.json"
    assert bench.main(["--run", str(a), "--run", str(b), "--steps", "20", "--val_n", "4",
                       "--samples", "4", "--out", str(out_file)]) == 0
    out = json.loads(out_file.read_text())
    first, second = out["curves"]
    assert [p["step"] for p in first["points"]] == [0, 20] and second["recipe"]["learning_rate"] == 1e-4
    assert first["points"][1]["right"] == [0, 3, 3, 3]
    assert second["points"][1]["right"] == [0, 2, 2, 2]
    assert second["points"][1]["vs_step_0"]["up"] == 3 and first["training"]["steps"] == 20
    assert out["best"] == {"run": shown_path(a), "learning_rate": 3e-4, "step": 20, "pass_at_1": 9 / 16}
    # runs that differ in more than the learning rate, the start and the steps are not compared,
    # nor two at one rate and start
    _curve_run(tmp_path / "c", 1e-4, sft=a / "sft", num_generations=2)
    _curve_run(tmp_path / "d", 1e-4)
    _curve_run(tmp_path / "e", 1e-4, sft=a / "sft", reward_weights={"correctness": 1.0})
    _curve_run(tmp_path / "f", 3e-4, sft=a / "sft", max_steps=120, save_every=10)
    capsys.readouterr()
    for other, says in (("c", "differs from a's in num_generations;"), ("d", "warm start"),
                        ("e", "in reward_weights;"), ("f", "it trains at a's learning rate")):
        assert bench.main(["--run", str(a), "--run", str(tmp_path / other), "--val_n", "4", "--steps", "20",
                           "--out", str(out_file)]) == 2
        err = capsys.readouterr().err
        assert f"--run {tmp_path / other}: " in err and says.replace("a's", f"{a}'s") in err
        assert err.count("\n") == 1
    # a mix of starts comes with its pool: a run that differs in both is compared
    _curve_run(tmp_path / "g", 3e-4, sft=a / "sft", lines_left=None, start_mix=("whole", "1"),
               pool_prompts=1024)
    assert bench.main(["--run", str(a), "--run", str(tmp_path / "g"), "--val_n", "4", "--steps", "20",
                       "--samples", "4", "--out", str(out_file)]) == 0
    assert json.loads(out_file.read_text())["curves"][1]["recipe"]["pool_prompts"] == 1024
    # each run is tested on the steps it kept: one without step 40 still gives its 0 and 20, and says so
    _adapter(a / "steps" / "40")
    assert bench.main(["--run", str(a), "--run", str(b), "--steps", "20,40", "--val_n", "4",
                       "--samples", "4", "--out", str(out_file)]) == 0
    out = json.loads(out_file.read_text())
    assert [[p["step"] for p in c["points"]] for c in out["curves"]] == [[0, 20, 40], [0, 20]]
    assert f"{b}: no adapter at step 40; tested at 0, 20" in capsys.readouterr().err


def test_a_warm_start_stored_in_bf16_is_the_same_warm_start(tmp_path):
    from safetensors.torch import save_file
    bench = _bench("learning_curve")
    w = torch.randn(4, 3)
    for name, t in (("fp32", w), ("bf16", w.to(torch.bfloat16)), ("other", w + 1)):
        (tmp_path / name).mkdir()
        save_file({"a.lora_A.weight": t}, str(tmp_path / name / "adapter_model.safetensors"))
    assert bench.same_warm_start(tmp_path / "fp32", tmp_path / "fp32")
    assert bench.same_warm_start(tmp_path / "fp32", tmp_path / "bf16")
    assert not bench.same_warm_start(tmp_path / "fp32", tmp_path / "other")


def test_the_learning_curve_answers_whole_problems_and_names_the_best_mix(tmp_path, monkeypatch):
    """A run at one line left beside one that mixes starts: both sampled at one line left, both
    answering the same whole problems greedily, McNemar against step 0, and the best on whole
    problems named with its recipe."""
    from grpo_course.measure.evaluate import EvalResult, SampledResult
    bench = _bench("learning_curve")
    monkeypatch.setenv("GRPO_COURSE_CACHE", str(tmp_path / "cache"))
    a, m = tmp_path / "a", tmp_path / "m"
    _curve_run(a, 3e-4)
    _curve_run(m, 3e-4, sft=a / "sft", lines_left=None, start_mix=("whole", "1"),
               max_completion_length=200)
    solved = {str(a / "sft"): [1, 0, 0, 0], str(a / "steps" / "20"): [1, 1, 0, 0],
              str(m / "sft"): [1, 0, 0, 0], str(m / "steps" / "20"): [1, 1, 1, 1]}
    starts = []

    def sampled(model, rows, samples, budget, temperature, seed, batch_prompts, sampling_dtype,
                progress=True):
        starts.append((budget, rows[0]["start"]))
        return SampledResult(samples, [{"idx": r["idx"], "right": 1, "formatted": samples}
                                       for r in rows], 1.0, model)

    _patch_sampling(monkeypatch, sampled)
    monkeypatch.setattr(bench, "held_out_rows", lambda split, n, offset, lines_left=None: [
        {"idx": i, "question": f"q{i}", "answer": "#### 1", "start": f"left {lines_left}"}
        for i in range(n)])
    monkeypatch.setattr(bench, "greedy", lambda folder, rows: EvalResult.from_records(
        [{"idx": r["idx"], "correct": c, "formatted": True}
         for r, c in zip(rows, solved[str(folder)], strict=True)]))
    out_file = tmp_path / "curve.json"
    assert bench.main(["--run", str(a), "--run", str(m), "--steps", "20", "--val_n", "4",
                       "--whole_n", "4", "--samples", "2", "--out", str(out_file)]) == 0
    out = json.loads(out_file.read_text())
    assert set(starts) == {(64, "left 1")}             # the mix sampled at one line left too
    mixed = out["curves"][1]["points"][1]["whole_greedy"]
    assert mixed["accuracy"] == 1.0 and mixed["correct"] == [1, 1, 1, 1] and mixed["vs_step_0"]["b_only"] == 3
    assert out["best_whole"]["run"] == shown_path(m) and out["best_whole"]["step"] == 20
    assert out["best_whole"]["recipe"]["start_mix"] == ["whole", "1"]
    assert out["validation"]["whole_greedy"] == {"split": "train", "rows": [0, 4], "n": 4,
                                                 "max_new_tokens": 200}


@pytest.mark.slow
def test_the_tests_run_end_to_end_on_a_short_real_run(real_gsm8k_dir, tmp_path):
    """A one-step run of the bundled model (its sft/ beside it) through every test, tiny sizes."""
    from grpo_course.core.train import main as train
    from grpo_course.measure.reference import reference_tests
    run = tmp_path / "run"
    assert train(["--profile", "smoke", "--config", str(ROOT / "recipes" / "reference_run.yaml"),
                  "--sft_steps", "1", "--max_steps", "1", "--prompt_pool", "all",
                  "--generation_batch_size", "16", "--per_step_completions", "8",
                  "--num_generations", "4", "--max_completion_length", "16", "--out", str(run)]) == 0
    out = reference_tests(run, slices=((512, 514), (768, 770)), samples=2, progress=False)
    assert [s["n"] for s in out["slices"]] == [2, 2] and set(out["transfer"]) == {
        "two_lines_left", "whole_problems"}
    first = out["slices"][0]
    assert len(first["sampled"]["before"]["right"]) == 2 and first["greedy"]["n"] == 2
    assert first["sampled"]["before"]["entropy"] > 0 and isinstance(out["verdict"]["passed"], bool)


def test_a_samples_only_recheck_runs_no_greedy_test(monkeypatch):
    """Chapter 3's live re-check compares sampled counts only: with ``greedy=False`` no greedy
    evaluation runs (each costs two model loads and a decoding), and the verdict still comes out."""
    from grpo_course.measure import reference

    calls = []
    monkeypatch.setattr(reference, "held_out_rows", lambda split, n, offset, lines_left: list(range(n)))
    monkeypatch.setattr(reference, "sampled_test", lambda before, after, rows, *args, **kw: (
        calls.append(("sampled", len(rows))) or
        {"pass_at_1": {"difference": 0.1, "p_value": 0.01}, "after": {"format_rate": 1.0}}))
    monkeypatch.setattr(reference, "greedy_test", lambda *a, **k: calls.append(("greedy",)) or {"n": 0})
    out = reference.reference_tests("run", slices=((512, 516), (768, 772)), samples=2,
                                    transfer=False, greedy=False, progress=False)
    assert calls == [("sampled", 4), ("sampled", 4)]
    assert all("greedy" not in s for s in out["slices"]) and out["verdict"]["passed"] is True
    calls.clear()
    out = reference.reference_tests("run", slices=((512, 516),), samples=2, transfer=False, progress=False)
    assert calls == [("sampled", 4), ("greedy",)] and out["slices"][0]["greedy"] == {"n": 0}


def test_make_reference_run_screens_as_the_committed_run_did():
    """The committed pool was screened 8 prompts at a time (the fixed batch before the screening
    took a sampling round's prompts); the recipe on the full profile still decodes 8 a round, so
    `make reference-run` screens the same blocks with the same seeds and keeps the same prompts,
    after the same warm-up (the recipe pins its length)."""
    from dataclasses import replace

    from grpo_course.config import FULL_BY_CPU, RECIPES_DIR, load_recipe
    from grpo_course.core.runs import RUN_KEYS, load_run_config
    from grpo_course.measure.reference import REFERENCE_RUN
    committed = {k: v for k, v in load_run_config(REFERENCE_RUN).items() if k not in RUN_KEYS}
    pool = json.loads((REFERENCE_RUN / "pool.json").read_text())
    for full in FULL_BY_CPU.values():
        recipe = replace(full.grpo, **load_recipe(RECIPES_DIR / "reference_run.yaml"))
        assert recipe.prompts_per_round == 8 and recipe.pool_prompts == pool["screened"]
        ran = replace(full.grpo, **committed)
        assert recipe.sft_steps == ran.sft_steps        # its own warm-up, whatever the profile's
        assert ran.prompts_per_round == 8 and (ran.pool_samples or ran.num_generations) == pool["samples"]


def test_the_page_says_whether_the_learning_rate_and_steps_were_chosen_on_validation():
    """Chapter 3b's two sentences from the learning curve: one learning rate cannot have been
    chosen; with two, each other rate is paired by problem against the recipe's at the last step
    both kept, and the page says whether the recipe is the best point."""
    import copy

    from grpo_course.measure.reference import curve_sentences, curve_table, recipe_curve
    shipped = json.loads((ROOT / "data" / "learning_curve.json").read_text())
    shipped["curves"] = shipped["curves"][:1]          # its first learning rate alone, then a second
    first = shipped["curves"][0]
    best = max(first["points"], key=lambda p: p["pass_at_1"]["mean"])
    shipped["best"] = {"run": first["run"], "learning_rate": first["recipe"]["learning_rate"],
                       "step": best["step"], "pass_at_1": best["pass_at_1"]["mean"]}
    recipe = {"learning_rate": first["recipe"]["learning_rate"], "max_steps": best["step"]}  # at the best point
    said = curve_sentences(shipped, recipe)
    assert "only one learning rate" in said["choice_sentence"]
    assert f"step {shipped['curves'][0]['points'][-1]['step']}" in said["curve_sentence"]
    assert curve_sentences(None, recipe)["choice_sentence"] == "nothing has been chosen on validation yet"
    assert recipe_curve(shipped, {"learning_rate": 1.0}) is None
    two = copy.deepcopy(shipped)
    other = copy.deepcopy(two["curves"][0])
    other["run"], other["recipe"]["learning_rate"] = "runs/lr1e-4", 1e-4
    other["points"] = other["points"][:3]                       # it kept fewer steps
    for curve, right in ((two["curves"][0], [4, 4, 0, 0]), (other, [0, 0, 0, 0])):
        for p in curve["points"]:
            p["right"] = right
    two["curves"].append(other)
    said = curve_sentences(two, recipe)["choice_sentence"]
    step = other["points"][-1]["step"]
    assert f"learning rate 0.0001 against {recipe['learning_rate']:g} at step {step}: -25.0 points" in said
    assert said.endswith("that point") and not said.endswith("not that point")
    assert "not that point" in curve_sentences(two, {**recipe, "max_steps": 999})["choice_sentence"]
    # a recipe that stops before its run's best step: that step is paired against the recipe's
    early = next(p["step"] for p in first["points"] if p["step"] and p["step"] != best["step"])
    said = curve_sentences(two, {**recipe, "max_steps": early})
    assert (f"not that point; on the recipe's run, step {best['step']} against step {early}, paired by "
            f"problem: +0.0 points (95 % CI +0.0 to +0.0, p = 1)") in said["choice_sentence"]
    assert f"at step {early}, where the recipe stops." in said["curve_sentence"] or early == first["points"][-1]["step"]
    assert len(curve_table(two)) == len(shipped["curves"][0]["points"]) + 3


def test_the_fixed_tests_words_come_from_the_shipped_record():
    """Page 3b's sentences on the reference run's test (measure.reference), read from
    data/reference_test.json: every direction word from its number, and a live re-check that
    matches, or says how far it is from the benchmark."""
    import copy

    from grpo_course.measure.paired import live_recheck_sentence
    from grpo_course.measure.reference import fixed_test_sentences, fixed_test_table
    fixed = json.loads((ROOT / "data" / "reference_test.json").read_text())
    said = fixed_test_sentences(fixed)
    assert set(said) == {"ref_verdict", "ref_table", "ref_transfer", "ref_passk_change", "ref_pattern",
                         "ref_greedy", "ref_format_share"}
    assert said["ref_format_share"].count("the format explains") == len(fixed["slices"])
    assert said["ref_verdict"].startswith("it passed" if fixed["verdict"]["passed"] else "it did not pass")
    whole = fixed["transfer"]["whole_problems"]
    word = "no detectable change" if whole["mcnemar"]["p_value"] >= 0.05 else \
        "rose" if whole["after"] > whole["before"] else "fell"
    assert f"whole problems: greedy {100 * whole['before']:.1f}" in said["ref_transfer"] and word in said["ref_transfer"]
    assert len(fixed_test_table(fixed)) == len(fixed["slices"])
    live = {"slices": [{"sampled": {side: {"right": s["sampled"][side]["right"][:4]} for side in ("before", "after")}}
                       for s in fixed["slices"]]}
    assert "match the benchmark's" in live_recheck_sentence(live, fixed, fixed["samples"], fixed["cpu"])
    moved = copy.deepcopy(live)
    moved["slices"][0]["sampled"]["after"]["right"] = [0, 0, 0, 0]
    text = live_recheck_sentence(moved, fixed, fixed["samples"], fixed["cpu"])
    assert f"1 of {2 * len(fixed['slices'])} model-slice counts differ" in text
    assert "The verdict below is the benchmark's" in text


def test_a_shipped_run_is_tested_at_its_final_step(tmp_path):
    """A run exported to data/runs/ keeps its final adapter at the top, not among its snapshots:
    it is its last step (run.json's grpo_steps), so the learning curve tests it there."""
    bench = _bench("learning_curve")
    _curve_run(tmp_path / "r", 3e-4)
    (tmp_path / "r" / "adapter_config.json").write_text("{}")      # the final adapter at the top
    (tmp_path / "r" / "run.json").write_text(json.dumps({"grpo_steps": 60}))
    assert bench.kept_steps(tmp_path / "r", [0, 20, 60]) == {
        0: tmp_path / "r" / "sft", 20: tmp_path / "r" / "steps" / "20", 60: tmp_path / "r"}
