import json
import subprocess
import sys

import pytest

from grpo_course.evaluate import EvalResult, answers_match, main, wilson_interval


def test_wilson_interval_known_values():
    lo, hi = wilson_interval(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)
    lo, hi = wilson_interval(0, 200)
    assert lo == 0.0 and hi == pytest.approx(0.01885, abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)


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


def test_cli_rejects_bad_n(capsys):
    with pytest.raises(SystemExit):
        main(["--n", "0"])


def test_cli_missing_data_dir(tmp_path, capsys):
    assert main(["--data-dir", str(tmp_path / "nope"), "--n", "2", "--json"]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.slow
def test_cli_json_on_a_few_problems(gsm8k_dir, tmp_path):
    csv_path = tmp_path / "records.csv"
    out = subprocess.run([sys.executable, "-m", "grpo_course.evaluate", "--data-dir", str(gsm8k_dir),
                          "--n", "3", "--offset", "1", "--max-new-tokens", "24", "--json",
                          "--csv", str(csv_path)],
                         capture_output=True, text=True, timeout=600, check=True)
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["n"] == 3
    assert 0.0 <= summary["accuracy"] <= 1.0 and 0.0 <= summary["format_rate"] <= 1.0
    lo, hi = summary["accuracy_ci95"]
    assert 0.0 <= lo <= summary["accuracy"] <= hi <= 1.0
    lines = csv_path.read_text().splitlines()
    assert len(lines) == 4 and lines[0].startswith("idx,")
    assert [line.split(",")[0] for line in lines[1:]] == ["1", "2", "3"]   # --offset respected
