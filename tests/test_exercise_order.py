"""No code cell above an exercise gives its answer away (issue 56).

Every expression of an exercise's solution (the code in its closed Solution dropdown) is
normalized through ``ast`` - variable names dropped, numbers and strings made one token, methods
and module functions written alike (``x.mean(1)`` as ``torch.mean(x, 1)``), conversions such as
``.float()`` / ``.numpy()`` and a one-sided ``clamp(min=...)`` left out - and no code cell above
the exercise's stub may hold one of the solution's non-trivial expressions (at least
:data:`MIN_NODES` nodes, with an operation in it). A worked example calls the package's function,
or comes after the exercise.
"""
from __future__ import annotations

import ast

import pytest

from tests.test_notebook_exercises import NOTEBOOKS, exercises

MIN_NODES = 5                       # the smallest normalized expression that counts as an answer
MODULES = {"np", "numpy", "torch", "math", "F"}
CONVERSIONS = {"float", "double", "int", "numpy", "item", "detach", "to", "tolist", "cpu",
               "clone", "contiguous"}
ALIASES = {"amax": "max", "amin": "min", "maximum": "max", "minimum": "min", "view": "reshape"}
DROPPED_KEYWORDS = {"keepdim", "dtype"}

Shape = tuple


def _constant(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) or (isinstance(node, ast.UnaryOp)
                                              and isinstance(node.operand, ast.Constant))


def normalize(node: ast.AST) -> Shape:
    """``node`` as a nested tuple ``(operation, *operands)``: names become ``_``, constants
    ``#``; a call is ``(function name, *operands)`` whether it is a method or a module function."""
    if isinstance(node, ast.Name):
        return ("_",)
    if _constant(node):
        return ("#",)
    if isinstance(node, ast.Call):
        func = node.func
        keywords = [k.value for k in node.keywords if k.arg not in DROPPED_KEYWORDS]
        if isinstance(func, ast.Attribute):
            name = func.attr
            owner = [] if isinstance(func.value, ast.Name) and func.value.id in MODULES else [func.value]
        elif isinstance(func, ast.Name):
            name, owner = func.id, []
        else:
            name, owner = "call", [func]
        operands = owner + list(node.args) + keywords
        name = ALIASES.get(name, name)
        if operands and (name in CONVERSIONS or (name == "clamp" and len(operands) == 2
                                                   and node.keywords)):
            return normalize(operands[0])            # a conversion or a guard against 0
        return (name, *map(normalize, operands))
    if isinstance(node, ast.BinOp):
        return (type(node.op).__name__, normalize(node.left), normalize(node.right))
    if isinstance(node, ast.Attribute):
        return ("." + node.attr, normalize(node.value))
    return (type(node).__name__, *(normalize(c) for c in ast.iter_child_nodes(node)
                                   if isinstance(c, ast.expr)))


def size(shape: Shape) -> int:
    return 1 + sum(size(c) for c in shape[1:])


def has_operation(shape: Shape) -> bool:
    """Arithmetic or a call somewhere in it (indexing alone is not an answer)."""
    head = shape[0]
    own = head not in ("_", "#", "Subscript", "Tuple", "List", "Slice") and not head.startswith(".")
    return own or any(has_operation(c) for c in shape[1:])


def _python(source: str) -> ast.AST:
    """A code cell's source without IPython's ``!`` and ``%`` lines."""
    return ast.parse("\n".join(line for line in source.splitlines()
                               if not line.lstrip().startswith(("!", "%"))))


def answer_shapes(solution: str) -> dict[Shape, str]:
    """The solution's non-trivial normalized expressions, each with its source."""
    found = {}
    for node in ast.walk(ast.parse(solution)):
        if isinstance(node, ast.expr):
            shape = normalize(node)
            if size(shape) >= MIN_NODES and has_operation(shape):
                found.setdefault(shape, ast.unparse(node))
    return found


def given_away(solution: str, sources: list[str]) -> list[str]:
    """Each place in ``sources`` (code cells) that holds one of the solution's expressions."""
    answers = answer_shapes(solution)
    hits = []
    for k, source in enumerate(sources):
        for node in ast.walk(_python(source)):
            if isinstance(node, ast.expr) and normalize(node) in answers:
                hits.append(f"code cell #{k} from the top: {ast.unparse(node)!r} is the "
                            f"solution's {answers[normalize(node)]!r}")
    return list(dict.fromkeys(hits))


ALL = [ex for nb in NOTEBOOKS for ex in exercises(nb)]
IDS = [f"{ex['notebook'][:2]}-{k}" for nb in NOTEBOOKS for k, ex in enumerate(exercises(nb), 1)]


@pytest.mark.parametrize("ex", ALL, ids=IDS)
def test_no_cell_above_an_exercise_holds_its_answer(ex):
    hits = given_away(ex["solution"], ex["before"])
    assert not hits, f"{ex['notebook']}, exercise at cell {ex['index']}: " + "; ".join(hits)


def test_the_normalization_catches_the_answers_issue_56_found():
    # chapter 3: the loop's group advantages, and the worked example's four aggregations
    advantages = ("def f(rewards, G):\n    groups = rewards.view(-1, G)\n"
                  "    centred = groups - groups.mean(1, keepdim=True)\n"
                  "    return (centred / (groups.std(1, keepdim=True) + 1e-4)).reshape(-1)\n")
    loop = "A = ((groups - groups.mean(1, keepdim=True)) / (groups.std(1, keepdim=True) + 1e-4)).view(-1, 1)"
    assert given_away(advantages, [loop])
    aggregate = ("def f(per_token_loss, completion_mask):\n    mask = completion_mask.float()\n"
                 "    masked = per_token_loss * mask\n"
                 "    return (masked.sum(1) / mask.sum(1).clamp(min=1)).mean()\n")
    assert given_away(aggregate, ["x = np.mean(per_token.sum(1) / mask.numpy().sum(1))"])
    # chapter 6: one row quantized symmetrically
    quant = ("def f(W):\n    scale = W.abs().amax(1, keepdim=True) / 127\n"
             "    return torch.clamp(torch.round(W / scale), -127, 127) * scale\n")
    assert given_away(quant, ["q = torch.clamp(torch.round(w / s), -128, 127).to(torch.int8)"])
    # ... while calling the package, or unrelated arithmetic, gives nothing away
    assert not given_away(advantages, ["A = grpo.group_advantages(rewards, G).view(-1, 1)",
                                       "adv = r - r.mean() + torch.linspace(-1, 1, len(r))"])
    assert not given_away(quant, ["w_hat = torch.fake_quantize_per_tensor_affine(w, s, 0, -128, 127)"])


def test_every_chapter_is_checked():
    assert len(NOTEBOOKS) == 10 and len({ex["notebook"] for ex in ALL}) == 10 and len(ALL) >= 16
