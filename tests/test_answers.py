"""One correctness rule for rewards and evaluation, and no import cycle between data and rewards."""
import ast
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_course.core import answers, rewards
from grpo_course.core.answers import answers_match
from grpo_course.measure import evaluate


@pytest.mark.parametrize("predicted, gold, same", [
    ("0.3333333", "0.33333333", True),    # a repeating decimal cut at 7 vs 8 digits: 3e-8 apart
    ("0.333", "0.33333333", False),       # 3e-4 apart
    ("18", "18", True), ("18.0", "18", True), ("$1,000", "1000", True), ("3/4", "0.75", True),
    ("18.0000001", "18", True),           # 1e-7: within ABS_TOL
    ("18.00001", "18", False),            # 1e-5
    ("19", "18", False), ("-18", "18", False), ("0", "-0", True),
    ("999999999", "999999998", False),    # integers below 1e9 only match themselves
    (None, "18", False), ("eighteen", "18", False), ("18", None, False),
])
def test_one_rule_for_evaluation_and_rewards(predicted, gold, same):
    """Evaluation (answers_match), the correctness reward's exact tier and is_correct agree."""
    assert answers_match(predicted, gold) is same
    assert evaluate.answers_match is answers_match
    if gold is not None and predicted is not None:
        exact = rewards.answer_tier(answers.parse_answer(predicted), gold) == rewards.EXACT_REWARD
        assert exact is same
        assert rewards.is_correct(f"work\n#### {predicted}", gold) is same


def test_the_disputed_case_earns_the_exact_tier():
    """Before: evaluation counted 0.3333333 correct for 0.33333333, the reward gave it 1.5."""
    assert rewards.correctness(["1/3 = 0.3333333\n#### 0.3333333"],
                               answer=["0.33333333"]) == [rewards.EXACT_REWARD]


@settings(max_examples=300, deadline=None)
@given(gold=st.integers(-10**8, 10**8),
       offset=st.sampled_from(["0", "0.0000001", "-0.0000005", "0.000002", "0.5", "1", "-1"]))
def test_integer_answers_score_as_before(gold, offset):
    """For GSM8K's integer answers the rule is the one evaluation always used (math.isclose on
    floats, rel 1e-9, abs 1e-6), so cached evaluations keep their meaning."""
    from decimal import Decimal
    predicted = answers.normalize_number(str(Decimal(gold) + Decimal(offset)))
    before = math.isclose(float(predicted), float(gold), rel_tol=1e-9, abs_tol=1e-6)
    assert answers_match(predicted, str(gold)) is before


def _imports(module: Path) -> set[str]:
    """The package modules ``module`` imports (by their file's stem), at the top or inside functions."""
    layers = {p.name for p in module.parents[1].iterdir() if (p / "__init__.py").is_file()}
    found = set()
    for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("grpo_course"):
            parts = node.module.split(".")
            if len(parts) == 2 and parts[1] in layers:          # from grpo_course.core import data
                found.update(a.name for a in node.names)
            elif len(parts) >= 2:                               # from grpo_course.core.data import x
                found.add(parts[-1])
    found.discard(module.stem)
    return found


def test_no_import_cycle_through_data_rewards_or_answers():
    package = Path(answers.__file__).parents[1]
    graph = {p.stem: _imports(p) for p in package.rglob("*.py") if p.stem != "__init__"}

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt == goal:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return False
    assert graph["answers"] == set() and graph["hardware"] == set() and graph["atomic"] == set()
    assert graph["errors"] == set() and graph["progress"] == set() and graph["calculator"] == set()
    # data reads leaf modules only: answers, calculator (annotations as the tool writes them),
    # errors, and progress (its library_bars_off)
    assert graph["data"] == {"answers", "calculator", "errors", "progress"}
    for name in ("data", "rewards", "answers", "evaluate"):
        assert not reaches(name, name), f"{name} imports itself through a cycle"
