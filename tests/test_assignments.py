"""`make assignments`: the student versions an instructor releases and autogrades."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_course.assignments import build, graded_check, main

ROOT = Path(__file__).resolve().parents[1]


def test_seven_student_notebooks_keep_stubs_and_graded_checks_and_drop_solutions(tmp_path):
    written = build(sorted((ROOT / "notebooks").glob("0*.ipynb")), tmp_path)
    assert len(written) == 7
    for path in written:
        cells = json.loads(path.read_text())["cells"]
        tags = [c["metadata"].get("tags", []) for c in cells]
        assert not any("solution" in t for t in tags), path.name
        stubs = [c for c, t in zip(cells, tags, strict=False) if "exercise" in t]
        checks = [c for c, t in zip(cells, tags, strict=False) if "check" in t]
        assert len(stubs) >= 2 and len(checks) == len(stubs)
        assert all(c["metadata"]["nbgrader"]["solution"] for c in stubs)
        assert all(c["metadata"]["nbgrader"]["grade"] and c["metadata"]["nbgrader"]["locked"]
                   for c in checks)
        assert all("\nassert " in "\n" + "".join(c["source"]) and
                   "".join(c["source"]).endswith('is True, "the check above did not pass"')
                   for c in checks)
        assert all(not c.get("outputs") for c in cells if c["cell_type"] == "code")


def test_a_graded_check_fails_the_stub_and_passes_a_solution():
    check = graded_check("from grpo_course import exercises\n\n"
                         "exercises.check(roofline_bound, exercises.roofline_bound,\n"
                         "                exercises.roofline_cases())")
    stub = "def roofline_bound(i, p, b):\n    raise NotImplementedError\n"
    with pytest.raises(AssertionError):
        exec(stub + check, {})
    exec("def roofline_bound(i, p, b):\n    return min(p, i * b)\n" + check, {})


def test_bad_folders_get_one_line_and_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--notebooks", str(tmp_path)])
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert err.startswith("error: --notebooks") and err.count("\n") == 1
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit) as stop:
        main(["--out", str(tmp_path / "file")])
    assert stop.value.code == 2 and capsys.readouterr().err.startswith("error: --out")


def test_the_command_line_writes_the_folder(tmp_path):
    out = subprocess.run([sys.executable, "-m", "grpo_course.assignments", "--out",
                          str(tmp_path / "a")], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert len(list((tmp_path / "a").glob("0*.ipynb"))) == 7
