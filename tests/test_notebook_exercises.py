"""Every chapter's coding exercises, as a student and an instructor meet them.

Each exercise is three cells and a closed solution (``tags``: ``exercise``, ``check``,
``solution``). For every one: the stub is "not written yet", the chapter's own solution passes
its check, and a function that just calls the course's version - or any other function of the
package, or a library function that does the work - fails it. No exercise's reference is shown
(``inspect.getsource``, ``??``) above it.
"""
from __future__ import annotations

import ast
import contextlib
import io
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("0*.ipynb"))
PRELUDE = "import numpy as np\nimport torch\n"


def _source(cell) -> str:
    return "".join(cell["source"])


def exercises(path: Path) -> list[dict]:
    """The exercises of one notebook: index of the stub cell, stub, check and solution code."""
    cells = json.loads(path.read_text())["cells"]
    found = []
    for i, cell in enumerate(cells):
        if "exercise" not in cell["metadata"].get("tags", []):
            continue
        check, solution = cells[i + 1], cells[i + 2]
        assert "check" in check["metadata"].get("tags", []), f"{path.name}: no check after cell {i}"
        assert "solution" in solution["metadata"].get("tags", []), f"{path.name}: no solution after {i}"
        code = re.search(r"```python\n(.*?)```", _source(solution), re.S)
        assert code, f"{path.name}: the solution after cell {i} has no python block"
        found.append({"notebook": path.name, "index": i, "stub": _source(cell),
                      "check": _source(check), "solution": code.group(1),
                      "before": [_source(c) for c in cells[:i] if c["cell_type"] == "code"]})
    return found


ALL = [ex for nb in NOTEBOOKS for ex in exercises(nb)]
IDS = [f"{ex['notebook'][:2]}-{k}" for nb in NOTEBOOKS
       for k, ex in enumerate(exercises(nb), 1)]


def _check_call(check_source: str) -> ast.Call:
    last = ast.parse(check_source).body[-1]
    assert isinstance(last, ast.Expr) and isinstance(last.value, ast.Call), \
        "a check cell ends with its check(...) call"
    return last.value


def _run(*sources: str) -> str:
    namespace: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for source in (PRELUDE, *sources):
            exec(compile(source, "<exercise>", "exec"), namespace)
    return out.getvalue()


def test_every_chapter_has_at_least_two_exercises():
    counts = {nb.name: len(exercises(nb)) for nb in NOTEBOOKS}
    assert len(counts) == 10 and all(n >= 2 for n in counts.values()), counts
    assert sum(counts.values()) >= 16


@pytest.mark.parametrize("ex", ALL, ids=IDS)
def test_the_stub_is_not_written_yet(ex):
    assert "not written yet" in _run(ex["stub"], ex["check"])


@pytest.mark.parametrize("ex", ALL, ids=IDS)
def test_the_chapters_solution_passes_its_check(ex):
    out = _run(ex["stub"], ex["solution"], ex["check"])
    assert re.search(r"all \d+ cases pass", out), out


@pytest.mark.parametrize("ex", ALL, ids=IDS)
def test_a_wrapper_around_the_reference_fails(ex):
    call = _check_call(ex["check"])
    candidate, reference = ast.unparse(call.args[0]), ast.unparse(call.args[1])
    wrapper = f"{candidate} = lambda *a, **k: ({reference})(*a, **k)\n"
    out = _run(ex["stub"], wrapper, ex["check"])
    assert "calls the course's version" in out, out
    assert "def " not in out                                   # a failure never shows code


@pytest.mark.parametrize("ex", ALL, ids=IDS)
def test_no_reference_is_printed_above_its_exercise(ex):
    call = _check_call(ex["check"])
    hidden = [call.args[1]] + [e for kw in call.keywords if kw.arg == "hide"
                               for e in getattr(kw.value, "elts", [])]
    names = {ast.unparse(h).split(".")[-1] for h in hidden}
    for source in ex["before"]:
        for line in source.splitlines():
            if "getsource" in line or re.search(r"\?\?\s*$", line):   # the code, not a result
                assert not any(re.search(rf"\b{n}\b", line) for n in names), \
                    f"{ex['notebook']}: {line.strip()!r} shows the reference above its exercise"


@pytest.mark.parametrize("ex", ALL, ids=IDS)
def test_a_call_into_the_package_a_level_down_fails(ex):
    candidate = ast.unparse(_check_call(ex["check"]).args[0])
    route = (f"def {candidate}(*a, **k):\n    from grpo_course.core.answers import answer_slot\n"
             f"    answer_slot('#### 1')\n    raise ValueError('after the call')\n")
    out = _run(ex["stub"], route, ex["check"])
    assert "calls `grpo_course.core.answers.answer_slot`, from the course's package" in out, out


def test_chapter_6_checks_fail_torch_quantizing_for_you():
    int8 = [ex for ex in ALL if ex["notebook"].startswith("06")]
    assert len(int8) >= 2
    for ex in int8:
        candidate = ast.unparse(_check_call(ex["check"]).args[0])
        route = (f"def {candidate}(W):\n    s = W.abs().amax(1)\n"
                 f"    s = torch.where(s > 0, s / 127, torch.ones_like(s))\n"
                 f"    return torch.fake_quantize_per_channel_affine(\n"
                 f"        W, s, torch.zeros(len(s), dtype=torch.int32), 0, -127, 127)\n")
        out = _run(ex["stub"], route, ex["check"])
        assert "calls `torch.fake_quantize_per_channel_affine`, a library function" in out, out
