import csv
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from grpo_course.core.answers import answers_match
from grpo_course.measure.evaluate import EvalResult, main
from grpo_course.measure.stats import wilson_interval


def test_answers_match():
    assert answers_match("1000", "1000") and answers_match("0.75", "0.750")
    assert not answers_match(None, "3") and not answers_match("4", "3")


def test_result_summary_and_strata():
    records = [{"difficulty": "basic", "correct": True, "formatted": True, "completion_tokens": 10},
               {"difficulty": "basic", "correct": False, "formatted": True, "completion_tokens": 20},
               {"difficulty": "advanced", "correct": False, "formatted": False, "completion_tokens": 30}]
    res = EvalResult(n=3, correct=1, formatted=2, records=records)
    s = res.summary()
    assert s["accuracy"] == pytest.approx(1 / 3) and s["format_rate"] == pytest.approx(2 / 3)
    assert s["by_stratum"]["basic"]["n"] == 2 and s["by_stratum"]["basic"]["accuracy"] == 0.5
    assert s["by_stratum"]["intermediate"]["n"] == 0
    assert s["mean_completion_tokens"] == 20
    table = res.stratum_table()          # the pages' table: counts as integers, the interval as text
    assert table.loc["basic", "n"] == 2 and table.loc["basic", "accuracy %"] == 50.0
    lo, hi = s["by_stratum"]["basic"]["accuracy_ci95"]
    assert table.loc["basic", "95 % CI"] == f"{100 * lo:.1f}–{100 * hi:.1f}"


def test_cli_rejects_bad_n(capsys):
    with pytest.raises(SystemExit):
        main(["--n", "0"])


def test_cli_missing_data_dir(tmp_path, capsys):
    assert main(["--data-dir", str(tmp_path / "nope"), "--n", "2", "--json"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_cli_refuses_zero_problems(tmp_path, capsys):
    (tmp_path / "test.jsonl").write_text("")
    assert main(["--data-dir", str(tmp_path), "--n", "2", "--json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no GSM8K test problems" in err[0]


@pytest.mark.slow
def test_cli_json_on_a_few_problems(gsm8k_dir, tmp_path):
    csv_path = tmp_path / "records.csv"
    out = subprocess.run([sys.executable, "-m", "grpo_course.measure.evaluate", "--data-dir", str(gsm8k_dir),
                          "--n", "3", "--offset", "1", "--max-new-tokens", "24", "--json",
                          "--csv", str(csv_path), "--compare", "smollm2-135m-instruct"],
                         capture_output=True, text=True, timeout=600, check=True)
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["n"] == 3
    assert 0.0 <= summary["accuracy"] <= 1.0 and 0.0 <= summary["format_rate"] <= 1.0
    lo, hi = summary["accuracy_ci95"]
    assert 0.0 <= lo <= summary["accuracy"] <= hi <= 1.0
    with open(csv_path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["idx"] for r in rows] == ["1", "2", "3"]   # --offset respected
    assert {"gold", "predicted", "correct", "formatted", "consistent", "completion"} <= set(rows[0])
    # the same model compared with itself: identical greedy answers, no discordant problem
    assert summary["compare"]["difference"] == 0.0
    assert summary["compare"]["mcnemar"]["p_value"] == 1.0


@pytest.mark.parametrize("completion, expected", [
    ("3 + 4 = 7\n7 * 2 = 14\n#### 14", True),
    ("3 + 4 = 7\n7 * 2 = 14\n#### 15", False),
    ("He pays $5 + $3 = $8.\n#### 8", True),
    ("no computation here\n#### 3", None),
    ("2 + 2 = 4 but no final line", None),
])
def test_work_consistency(completion, expected):
    from grpo_course.measure.evaluate import work_consistent
    assert work_consistent(completion) is expected




def test_compare_requires_same_problems():
    from grpo_course.measure.evaluate import compare
    rec = lambda i, ok: {"idx": i, "correct": ok, "formatted": ok, "completion_tokens": 1}
    a = EvalResult(n=2, correct=1, formatted=1, records=[rec(0, True), rec(1, False)])
    b = EvalResult(n=2, correct=2, formatted=2, records=[rec(0, True), rec(1, True)])
    out = compare(a, b)
    assert out["difference"] == pytest.approx(0.5) and out["mcnemar"]["b_only"] == 1
    c = EvalResult(n=1, correct=1, formatted=1, records=[rec(5, True)])
    with pytest.raises(ValueError, match="same problems"):
        compare(a, c)


def test_eval_cache_reuses_identical_runs_only(gsm8k_dir, tmp_path, monkeypatch):
    """Greedy records are reused for the same weights, prompts and settings, recomputed otherwise."""
    import torch

    from grpo_course.core.data import load_gsm8k
    from grpo_course.infra.fingerprint import weights_fingerprint
    from grpo_course.measure.evaluate import evaluate_model
    from tests.helpers import tiny_model, tiny_tokenizer

    monkeypatch.setenv("GRPO_COURSE_CACHE", str(tmp_path / "cache"))
    model, tok = tiny_model(), tiny_tokenizer()
    rows = load_gsm8k("test", data_dir=gsm8k_dir, limit=3)
    run = lambda m, dtype="float32": evaluate_model(m, tok, rows, batch_size=2, max_new_tokens=6,
                                                    progress=False, cache=True, sampling_dtype=dtype)
    first = run(model)
    again = run(model)
    assert not first.cached and again.cached
    assert again.records == first.records and again.seconds == first.seconds
    assert len(list((tmp_path / "cache" / "evals").glob("*.json"))) == 1
    assert not run(model, "bfloat16").cached     # other settings: recomputed
    before = weights_fingerprint(model)
    with torch.no_grad():
        model.lm_head.weight[0, 0] += 1.0                            # other weights: recomputed
    assert weights_fingerprint(model) != before and not run(model).cached
    fresh = evaluate_model(model, tok, rows, batch_size=2, max_new_tokens=6, progress=False)
    assert not fresh.cached                                          # no cache unless asked


def test_evaluate_model_fast_false_decodes_on_transformers(gsm8k_dir, tmp_path, monkeypatch):
    """``fast=False`` (chapter 6's control) decodes with transformers, never the compact
    decoder, and is cached apart from the default run; in fp32 both write the same greedy text."""
    from grpo_course.core import sampling
    from grpo_course.core.data import load_gsm8k
    from grpo_course.measure.evaluate import evaluate_model
    from tests.helpers import tiny_model, tiny_tokenizer

    monkeypatch.setenv("GRPO_COURSE_CACHE", str(tmp_path / "cache"))
    model, tok = tiny_model(), tiny_tokenizer()
    rows = load_gsm8k("test", data_dir=gsm8k_dir, limit=3)
    run = lambda fast: evaluate_model(model, tok, rows, batch_size=2, max_new_tokens=6,
                                      progress=False, cache=True, sampling_dtype="float32", fast=fast)
    compact = run(None)
    built = []
    monkeypatch.setattr(sampling, "FastLlama", lambda *a, **k: built.append(a) or 1 / 0)
    hf = run(False)
    assert not hf.cached and not built                  # its own cache entry, no compact decoder
    assert [r["completion"] for r in hf.records] == [r["completion"] for r in compact.records]
    assert run(False).cached




def test_attribution_table_rows():
    from grpo_course.measure.evaluate import attribution_table
    rec = lambda ok, fmt, d, t: {"difficulty": d, "correct": ok, "formatted": fmt,
                                 "completion_tokens": t, "consistent": ok}
    a = EvalResult.from_records([rec(False, False, "basic", 200), rec(True, True, "advanced", 50)])
    b = EvalResult.from_records([rec(True, True, "basic", 40), rec(True, True, "advanced", 60)])
    rows = attribution_table({"before": a, "after": b})
    assert [r["model"] for r in rows] == ["before", "after"]
    assert rows[0]["accuracy %"] == 50.0 and rows[1]["accuracy %"] == 100.0
    assert rows[0]["basic % (n=1)"] == 0.0 and rows[1]["basic % (n=1)"] == 100.0
    assert rows[0]["mean tokens"] == 125 and rows[1]["consistency %"] == 100.0


def _paired(a_right: list[bool], b_right: list[bool]):
    rec = lambda i, ok: {"idx": i, "correct": ok, "formatted": True}
    make = lambda oks: EvalResult(n=len(oks), correct=sum(oks), formatted=len(oks),
                                  records=[rec(i, ok) for i, ok in enumerate(oks)])
    return make(a_right), make(b_right)


def test_paired_verdict_computes_overlap_and_the_test():
    from grpo_course.measure.evaluate import paired_verdict
    # 12 problems only B solved, none only A: p = 2 / 2^12 < 0.05
    a, b = _paired([False] * 40, [True] * 12 + [False] * 28)
    text = paired_verdict(a, b, "fp32", "int8")
    assert "0 problems only fp32 solved and 12 only int8" in text
    assert "do not overlap" in text and "int8 is better" in text and "p = 0.00" in text
    # one discordant problem each way: overlap, no verdict
    a, b = _paired([True, False] + [False] * 8, [False, True] + [False] * 8)
    text = paired_verdict(a, b, "fp32", "int8")
    assert "the intervals overlap" in text and "cannot tell from chance" in text and "p = 1.00" in text


def test_answers_side_by_side_switches_adapters_and_restores_them():
    from grpo_course.config import GRPOConfig
    from grpo_course.core.policy import adapter_state, add_lora
    from grpo_course.measure.evaluate import answers_side_by_side
    from tests.helpers import tiny_model, tiny_tokenizer

    torch.manual_seed(0)
    model = add_lora(tiny_model(), GRPOConfig(lora_target_modules=("q_proj", "v_proj")))
    tok = tiny_tokenizer()
    first = adapter_state(model)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p))
    second = adapter_state(model)
    rows = answers_side_by_side(model, tok, "What is 2 + 2?", {"base": None, "first": first,
                                "second": second}, gold="4", max_new_tokens=6)
    assert [r["model"] for r in rows] == ["base", "first", "second"]
    assert all({"completion", "answer", "correctness", "exact_format"} <= set(r) for r in rows)
    # LoRA B starts at zero: the first state answers exactly as the base model does
    assert rows[0]["completion"] == rows[1]["completion"]
    after = adapter_state(model)
    assert all(torch.equal(after[k], second[k]) for k in second)      # the model's weights came back


def test_recorded_answers_read_an_evaluation_s_own_completions():
    from grpo_course.measure.evaluate import EvalResult, recorded_answers

    def result(texts):
        return EvalResult.from_records([{"idx": 7 + i, "correct": False, "formatted": True, "completion": t}
                                        for i, t in enumerate(texts)])
    results = {"base": result(["2 + 2 = 5\n#### 5", "x"]), "after GRPO": result(["2 + 2 = 4\n#### 4", "y"])}
    rows = recorded_answers(results, 7, gold="4")
    assert [(r["model"], r["answer"], r["correctness"]) for r in rows] == [("base", "5", -0.5), ("after GRPO", "4", 3.0)]
    assert rows[1]["completion"] == "2 + 2 = 4\n#### 4"
    with pytest.raises(ValueError, match="no record of problem 9"):
        recorded_answers(results, 9)


def test_eval_blocks_make_a_prefix_reuse_the_cache_of_a_longer_run(gsm8k_dir, tmp_path, monkeypatch, capsys):
    """Rows are decoded in blocks of EVAL_BLOCK: the first block's records do not depend on the rows
    after it, so an evaluation of a prefix reuses the cached blocks of a longer one."""
    from grpo_course.core.data import load_gsm8k
    from grpo_course.measure import evaluate as ev
    from tests.helpers import tiny_model, tiny_tokenizer

    monkeypatch.setenv("GRPO_COURSE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(ev, "EVAL_BLOCK", 2)
    model, tok = tiny_model(), tiny_tokenizer()
    rows = load_gsm8k("test", data_dir=gsm8k_dir, limit=3)
    run = lambda data, cache=True: ev.evaluate_model(model, tok, data, batch_size=2, max_new_tokens=6,
                                                     progress=False, cache=cache,
                                                     sampling_dtype="float32")
    longer = run(rows)
    assert not longer.cached and longer.n == 3
    assert len(list((tmp_path / "cache" / "evals").glob("*.json"))) == 2     # blocks of 2 and 1
    prefix = run(rows.select(range(2)))
    assert prefix.cached and prefix.records == longer.records[:2]
    assert run(rows, cache=False).records == longer.records                  # same with or without
    assert [r["idx"] for r in longer.records] == list(rows["idx"])
    # records read back whole from the cache print one line, not a progress bar
    capsys.readouterr()
    ev.evaluate_model(model, tok, rows, batch_size=2, max_new_tokens=6, progress=True, cache=True,
                      sampling_dtype="float32", name="/tmp/x/after SFT")
    out = capsys.readouterr()
    assert out.out.startswith("evaluate: 3 problems read from the cache (x/after SFT, decoded before in ")
    assert "it/s" not in out.err


# ---------------------------------------------------------------- sampled rewards, pass@k
def _tiny_rows():
    return [{"question": "What is 2 + 2?", "answer": "4", "solution": "2+2=<<2+2=4>>4\n#### 4"},
            {"question": "What is 3 * 5?", "answer": "15", "solution": "3*5=<<3*5=15>>15\n#### 15"},
            {"question": "How many legs have 2 cats?", "answer": "8",
             "solution": "2*4=<<2*4=8>>8\n#### 8"}]


def test_sampled_rewards_are_each_problems_mean_of_k_weighted_samples():
    from grpo_course.core.data import chat_prompt
    from grpo_course.core.sampling import sample_completions
    from grpo_course.measure.evaluate import sampled_rewards
    from tests.helpers import tiny_model, tiny_tokenizer

    model, tok, rows = tiny_model(), tiny_tokenizer(), _tiny_rows()
    seen = []

    def length(completions, answer, **kw):       # reads a column, as the course's rewards do
        seen.append(list(answer))
        return [float(len(c)) for c in completions]

    res = sampled_rewards(model, tok, rows, k=3, max_new_tokens=5, reward_weights={"length": 0.5},
                          reward_funcs={"length": length}, batch_prompts=2, seed=7,
                          sampling_dtype=None, progress=False)
    assert (res["n"], res["k"]) == (3, 3) and len(res["per_prompt"]) == 3
    assert seen[0] == ["4"] * 3 + ["15"] * 3 and seen[1] == ["8"] * 3   # G copies of each gold
    # the same draws by hand: first block of 2 prompts with seed 7, then 1 prompt with seed 9
    by_hand = []
    for lo, seed in ((0, 7), (2, 9)):
        chunk = rows[lo:lo + 2]
        batch = sample_completions(model, tok, [chat_prompt(r["question"], tok) for r in chunk],
                                   3, 5, 1.0, seed=seed)
        lens = torch.tensor([float(len(c)) for c in batch.completions]).view(len(chunk), 3)
        by_hand += (0.5 * lens).mean(1).tolist()
    assert res["per_prompt"] == pytest.approx(by_hand)
    # each function's own per-problem means, unweighted: here twice the weighted ones
    assert list(res["per_function"]) == ["length"]
    assert res["per_function"]["length"] == pytest.approx([2 * x for x in by_hand])
    assert res["mean"] == pytest.approx(sum(by_hand) / 3)
    again = sampled_rewards(model, tok, rows, k=3, max_new_tokens=5, reward_weights={"length": 0.5},
                            reward_funcs={"length": length}, batch_prompts=2, seed=7,
                            sampling_dtype=None, progress=False)
    assert again["per_prompt"] == res["per_prompt"]                  # seeded: reproducible


def test_sampled_rewards_with_the_course_rewards_and_pass_at_k():
    from grpo_course.measure.evaluate import pass_at_k, sampled_rewards
    from tests.helpers import tiny_model, tiny_tokenizer

    model, tok, rows = tiny_model(), tiny_tokenizer(), _tiny_rows()
    res = sampled_rewards(model, tok, rows, k=2, max_new_tokens=4,
                          reward_weights={"correctness": 1.0, "exact_format": 0.5},
                          sampling_dtype=None, progress=False)
    # a random tiny model never writes "#### <gold>": wrong and unformatted on every sample
    from grpo_course.core.rewards import correctness, exact_format
    floor = correctness(["x"], answer=["4"])[0] + 0.5 * exact_format(["x"])[0]
    assert res["per_prompt"] == pytest.approx([floor] * 3)
    assert res["per_function"] == {"correctness": pytest.approx([correctness(["x"], answer=["4"])[0]] * 3),
                                   "exact_format": pytest.approx([exact_format(["x"])[0]] * 3)}
    hit = pass_at_k(model, tok, rows, k=2, max_new_tokens=4, sampling_dtype=None, progress=False)
    assert (hit["n"], hit["k"], hit["pass_at_k"], hit["solved"]) == (3, 2, 0.0, [False] * 3)
    assert hit["ci95"] == wilson_interval(0, 3)


def test_pass_at_k_curve_from_counts():
    from grpo_course.measure.evaluate import pass_at_k_curve
    curve = pass_at_k_curve([0, 0, 4, 16], 16, ks=(1, 8, 32), group_size=8)
    assert set(curve["pass_at_k"]) == {"1", "8"}                       # k past the samples: left out
    assert curve["pass_at_k"]["1"]["mean"] == pytest.approx((4 / 16 + 1) / 4)
    assert curve["pass_at_k"]["8"]["mean"] > curve["pass_at_k"]["1"]["mean"]
    assert 0 < curve["mixed_groups"]["mean"] < 0.25 and curve["n"] == 4
    with pytest.raises(ValueError, match="at least 2 problems"):
        pass_at_k_curve([3], 16)


@pytest.mark.parametrize("value, message", [
    ("0", "--lines-left must be >= 1; got 0"),
    ("-2", "--lines-left must be >= 1; got -2"),
    ("1.5", "invalid int value: '1.5'"),
])
def test_cli_rejects_a_bad_lines_left(value, message, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--lines-left", value, "--n", "2"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_cli_refuses_a_start_no_problem_has(tmp_path, capsys):
    from tests.helpers import ROWS, write_jsonl
    write_jsonl(tmp_path / "test.jsonl", ROWS)
    assert main(["--data-dir", str(tmp_path), "--n", "6", "--lines-left", "9", "--json"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "none of the 6 problems has 9 or more work lines" in err[0]


@pytest.mark.parametrize("argv, message", [
    (["--samples", "0"], "--samples must be >= 1; got 0"),
    (["--samples", "2.5"], "argument --samples: invalid int value: '2.5'"),
    (["--samples", "eight"], "argument --samples: invalid int value: 'eight'"),
    (["--samples", "8", "--lines-left", "1", "--max-new-tokens", "32"],
     "--max-new-tokens 32 is too short for --samples at --lines-left 1: an answer there needs "
     "up to 64 tokens"),
    (["--samples", "8", "--max-new-tokens", "100"],
     "--max-new-tokens 100 is too short for --samples at whole problems"),
    (["--samples", "4", "--temperature", "0"], "--temperature must be > 0; got 0.0"),
])
def test_cli_rejects_bad_samples_in_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        main([*argv, "--n", "2"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_cli_names_a_bad_sizes_value_where_it_reads_the_full_profile(capsys, monkeypatch):
    """``--samples`` on whole problems takes the full profile's budget: a bad
    ``$GRPO_COURSE_SIZES`` is one line naming it, not a traceback."""
    monkeypatch.setenv("GRPO_COURSE_SIZES", "huge")
    with pytest.raises(SystemExit) as stop:
        main(["--samples", "4", "--n", "2"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown full-profile sizes 'huge'" in err[0]


def test_sampled_result_and_the_paired_difference():
    from grpo_course.measure.evaluate import SampledResult, compare_sampled
    a = SampledResult(4, [{"idx": i, "right": r, "formatted": 4} for i, r in enumerate([0, 1, 2, 0])])
    b = SampledResult(4, [{"idx": i, "right": r, "formatted": 3} for i, r in enumerate([1, 1, 4, 0])])
    s = b.summary()
    assert s["pass_at_1"]["mean"] == pytest.approx(6 / 16) and s["pass_at_4"]["mean"] == 0.75
    assert s["format_rate"] == 0.75 and s["right"] == [1, 1, 4, 0]
    test = compare_sampled(a, b)
    assert test["pass_at_1"]["difference"] == pytest.approx((6 - 3) / 16)
    assert test["up"] == 2 and test["down"] == 0 and test["pass_at_1"]["n"] == 4
    assert test["pass_at_1"]["lo"] < test["pass_at_1"]["difference"] < test["pass_at_1"]["hi"]
    with pytest.raises(ValueError, match="not of the same problems"):
        compare_sampled(a, SampledResult(4, a.records[:3]))


def test_sampled_records_count_right_and_formatted_answers(monkeypatch):
    from grpo_course.core import pool
    from grpo_course.measure import evaluate as ev
    rows = [{"idx": 7, "difficulty": "basic", "answer": "5"},
            {"idx": 8, "difficulty": "advanced", "answer": "2,000"}]
    texts = ["so #### 5", "#### 6", "no answer", "#### 5.0", "#### 2000", "x", "#### 1", "y"]
    # the sampler's tensors are the first T columns of wider buffers: not contiguous
    mask = torch.tensor([[1, 1, 0, 0, 0]] * 4 + [[1, 0, 0, 0, 0]] * 4)[:, :3]
    logps = (-0.5 * torch.tensor([[1, 1, 0, 9, 9]] * 4 + [[1, 0, 0, 9, 9]] * 4))[:, :3]
    assert not mask.is_contiguous()
    batch = SimpleNamespace(completions=texts, completion_mask=mask, model_mask=mask, sampling_logps=logps)
    monkeypatch.setattr(pool, "sampled_blocks", lambda *a, **k: iter([(rows, batch)]))
    records = pool.sampled_records(None, None, rows, 4, 64)
    assert records == [{"idx": 7, "difficulty": "basic", "right": 2, "formatted": 3, "nll": 4.0, "tokens": 8},
                       {"idx": 8, "difficulty": "advanced", "right": 1, "formatted": 2, "nll": 2.0,
                        "tokens": 4}]
    assert ev.SampledResult(4, records).summary()["entropy"] == pytest.approx(0.5)
    assert pool.correct_counts(None, None, rows, 4, 64) == [2, 1]


@pytest.mark.slow
def test_cli_samples_compare_a_model_with_itself(gsm8k_dir):
    out = subprocess.run([sys.executable, "-m", "grpo_course.measure.evaluate", "--data-dir", str(gsm8k_dir),
                          "--n", "2", "--lines-left", "1", "--samples", "2", "--json",
                          "--compare", "smollm2-135m-instruct"],
                         capture_output=True, text=True, timeout=600, check=True)
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["n"] == 2 and summary["samples"] == 2 and len(summary["right"]) == 2
    # the same weights and seed sample the same answers: a difference of exactly 0, p = 1
    test = summary["compare"]["pass_at_1"]
    assert test["difference"] == 0 and test["p_value"] == 1.0
    assert summary["compare"]["up"] == summary["compare"]["down"] == 0
