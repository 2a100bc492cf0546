"""The package's shape (issue 58): one home per name, no import cycle, short functions, and the
lint that keeps ``noqa`` comments honest. Read from the source with ``ast``: nothing is run."""
from __future__ import annotations

import ast
import json
import tomllib
from functools import cache
from pathlib import Path

import pytest

from grpo_course.infra import fingerprint

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "grpo_course"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def defined_names(module: str) -> frozenset[str]:
    """What ``module`` itself defines at its top level (functions, classes, assignments, also
    under ``if``/``try``) and its submodules; not what it imports."""
    path = ROOT / Path(*module.split("."))
    source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    names = {p.stem for p in path.glob("*.py")} if path.is_dir() else set()
    todo = list(ast.parse(source.read_text(encoding="utf-8")).body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in [t, *getattr(t, "elts", [])]
                         if isinstance(n, ast.Name))
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            todo += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", []),
                     *(s for h in getattr(node, "handlers", []) for s in h.body)]
    return frozenset(names)


def notebook_source(path: Path) -> str:
    """A notebook's code cells as one module (shell and magic lines dropped)."""
    cells = [c for c in json.loads(path.read_text(encoding="utf-8"))["cells"] if c["cell_type"] == "code"]
    lines = [line for c in cells for line in "".join(c["source"]).splitlines()
             if not line.lstrip().startswith(("!", "%"))]
    return "\n".join(lines)


def sources() -> list[tuple[str, ast.Module]]:
    files = [*PACKAGE.rglob("*.py"), *(ROOT / "tests").glob("*.py"), *(ROOT / "bench").glob("*.py"),
             *(ROOT / "book").rglob("*.py")]
    found = [(str(f.relative_to(ROOT)), ast.parse(f.read_text(encoding="utf-8"))) for f in files]
    found += [(str(f.relative_to(ROOT)), ast.parse(notebook_source(f)))
              for f in sorted((ROOT / "notebooks").glob("*.ipynb"))]
    return found + [(f"{where} (code in a string)", tree) for where, module in found
                    if where != "tests/test_package_shape.py"       # its strings are planted faults
                    for tree in code_in_strings(module)]


def code_in_strings(tree: ast.Module) -> list[ast.Module]:
    """String literals that are themselves Python importing the package (a test's notebook cell,
    a subprocess's ``-c`` script): the relayout's string imports escaped every other check."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "grpo_course" in node.value \
                and "import" in node.value:
            try:
                found.append(ast.parse(node.value))
            except SyntaxError:
                continue
    return found


def imported_module(node: ast.ImportFrom, package: str) -> str | None:
    """The absolute name of the module ``node`` imports from (``package``: the importing file's
    package, for a relative import)."""
    if node.level == 0:
        return node.module
    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
    return f"{base}.{node.module}" if node.module else base


def borrowed_imports(tree: ast.Module, attributes: bool, package: str = "grpo_course") -> list[str]:
    """``from grpo_course.X import name`` (or ``from .X import name`` in the package) where X
    does not define ``name`` (it only imports it), and, with ``attributes``, ``M.name`` for a
    module alias ``M`` of the package."""
    found, aliases = [], {}
    for node in ast.walk(tree):
        module = imported_module(node, package) if isinstance(node, ast.ImportFrom) else None
        if module and module.split(".")[0] == "grpo_course":
            for alias in node.names:
                if alias.name not in defined_names(module):
                    found.append(f"from {module} import {alias.name}")
                elif (ROOT / Path(*module.split(".")) / f"{alias.name}.py").is_file():   # a module
                    aliases[alias.asname or alias.name] = f"{module}.{alias.name}"
        elif isinstance(node, ast.Import):
            aliases.update({a.asname: a.name for a in node.names
                            if a.asname and a.name.startswith("grpo_course.")})
    if attributes:
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in aliases \
                    and node.attr not in defined_names(aliases[node.value.id]):
                found.append(f"{aliases[node.value.id]}.{node.attr}")
    return found


def test_every_name_is_imported_from_its_home():
    """Before: nine re-exports kept old homes alive, and the chapters imported names from both."""
    borrowed = {where: names for where, tree in sources()
                if (names := borrowed_imports(tree, attributes=not where.startswith("tests")))}
    assert borrowed == {}


def test_the_check_reads_code_inside_strings():
    tree = ast.parse("cell = 'from grpo_course.book.plotting import glue'\n")
    assert [borrowed_imports(t, attributes=True) for t in code_in_strings(tree)] == [
        ["from grpo_course.book.plotting import glue"]]


def test_the_check_finds_a_borrowed_name():
    tree = ast.parse("from grpo_course.topics import quantize as Q\nfrom grpo_course.measure.evaluate import "
                     "wilson_interval\nQ.torch\nQ.quantize\n")
    assert borrowed_imports(tree, attributes=True) == [
        "from grpo_course.measure.evaluate import wilson_interval", "grpo_course.topics.quantize.torch"]


def package_modules() -> list[str]:
    """Every module of the package, its layers' ``__init__`` files left out."""
    return sorted(module_name(p) for p in PACKAGE.rglob("*.py") if p.stem != "__init__")


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (anywhere in its source), packages left out."""
    modules = package_modules()
    return {m: {n for n in fingerprint._direct_imports(m, "grpo_course") if n in modules} for m in modules}


#: what each layer may import from: its own layer and those before it (config and infra read each other)
LAYERS = {"infra": {"infra", "config"}, "config": {"infra", "config"},
          "core": {"infra", "config", "core"}, "measure": {"infra", "config", "core", "measure"},
          "topics": {"infra", "config", "core", "measure", "topics"},
          "book": {"infra", "config", "core", "measure", "topics", "book"}}


def layer(module: str) -> str:
    return module.split(".")[1]


def test_every_module_sits_in_a_layer_and_imports_only_the_layers_below_it():
    """Issue 66: 38 modules sat side by side; the layout did not show the algorithm, the
    measurement, the chapters' topics and the book's tooling apart."""
    assert {layer(m) for m in package_modules()} <= set(LAYERS)
    assert [m for m in package_modules() if m.count(".") == 1] == ["grpo_course.config"]
    upward = {m: sorted(n for n in deps if layer(n) not in LAYERS[layer(m)])
              for m, deps in import_graph().items()}
    assert {m: deps for m, deps in upward.items() if deps} == {}


def test_the_module_map_is_the_tree():
    """Every module of the package has its row in CONTRIBUTING.md's module map, under its own path,
    and every row names a module that exists."""
    readme = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    table = readme.split("## The package")[1].split("\n## ")[0]
    rows = {line.split("`")[1] for line in table.splitlines() if line.startswith("| `")}
    tree = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p.stem != "__init__"}
    assert rows == tree


def test_no_import_cycle_in_the_package():
    graph = import_graph()
    modules = list(graph)
    cycles, state = [], {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for nxt in sorted(graph.get(module, ())):
            if state.get(nxt) == "open":
                cycles.append(path[path.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[module] = "done"
    for module in sorted(modules):
        if module not in state:
            visit(module, [module])
    assert cycles == []


@pytest.mark.parametrize("rule", ["RUF100"])
def test_ruff_reports_stale_noqa_comments_and_lints_the_whole_tree(rule):
    """A ``noqa`` for a rule that is off or never fires is itself an error; ``make lint`` checks
    every folder, not four."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert rule in config["tool"]["ruff"]["lint"]["select"]
    lint = (ROOT / "Makefile").read_text(encoding="utf-8").split("\nlint:")[1].split("\n\n")[0]
    assert "ruff check .\n" in lint + "\n"


def test_the_trainer_is_the_grpo_step_and_grpo_is_the_mathematics():
    """Before: train.py (783 lines) held the warm-up, the step and the persistence in one class
    of 546 lines, and grpo.py, "mathematics in the algorithm's order", held the attention,
    autocast and PEFT plumbing too. Issue 85: TRL's data flow, one ``inputs`` dict from
    ``_generate_and_score_completions`` to ``compute_loss(model, inputs)``."""
    train = (PACKAGE / "core" / "train.py").read_text(encoding="utf-8")
    trainer = next(n for n in ast.parse(train).body
                   if isinstance(n, ast.ClassDef) and n.name == "CourseTrainer")
    methods = {n.name: n for n in trainer.body if isinstance(n, ast.FunctionDef)}
    assert {"_generate_and_score_completions", "_prepare_inputs", "compute_loss", "step"} <= set(methods)
    assert [a.arg for a in methods["compute_loss"].args.args] == ["self", "model", "inputs"]
    code = {n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else n.name
            for n in ast.walk(ast.parse((PACKAGE / "core" / "grpo.py").read_text(encoding="utf-8")))
            if isinstance(n, (ast.Name, ast.Attribute, ast.alias))}
    assert not {name for name in code for word in ("autocast", "attention", "peft") if word in name}


def test_grpo_is_mathematics_on_tensors_and_imports_only_its_option_names():
    """Issue 66: grpo.py imported modeling for per_token_logps, and sft and curriculum imported
    grpo only for that function; it lives in core/policy.py now. Issue 85: the names of the loss
    types and scales have one home, config, where GRPOConfig checks them."""
    tree = ast.parse((PACKAGE / "core" / "grpo.py").read_text(encoding="utf-8"))
    local = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
             and (n.level > 0 or (n.module or "").startswith("grpo_course"))]
    assert local == ["from grpo_course.config import LOSS_TYPES, SCALES"], local


def test_the_step_reads_like_the_algorithm():
    """Issue 66: the step was spread over four methods with the CPU devices (bf16 weight copies,
    attention and norm casts, micro-batches, tied-group skipping, the log row) between its lines.
    Now ``step`` calls the algorithm's parts in order, and the devices sit in named helpers."""
    tree = ast.parse((PACKAGE / "core" / "train.py").read_text(encoding="utf-8"))
    trainer = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "CourseTrainer")
    step = next(n for n in trainer.body if isinstance(n, ast.FunctionDef) and n.name == "step")
    calls = [n.func.attr if isinstance(n.func, ast.Attribute) else n.func.id
             for n in sorted((n for n in ast.walk(step) if isinstance(n, ast.Call)
                              and isinstance(n.func, (ast.Attribute, ast.Name))),
                             key=lambda n: (n.lineno, n.col_offset))]
    order = ["_generate_and_score_completions", "_training_pass", "_prepare_inputs", "_update", "step_log"]
    assert [c for c in calls if c in order] == order
    devices = {"frozen_linear_weights_as", "norms_cast_once", "course_attention", "autocast",
               "low_memory", "repeat_interleave", "zero_std_groups", "nonzero", "split"}
    assert devices.isdisjoint(calls)
    assert step.end_lineno - step.lineno + 1 <= 30


def test_the_readme_is_a_front_door():
    """README.md: at most 120 lines, its figure in the repository, each chapter's minutes those
    bench/memory.py measured on the full profile, and the two commands."""
    import json
    import re

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 120
    for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", readme):
        assert (ROOT / image).is_file(), image
    assert "make book" in readme and "make test" in readme and "CONTRIBUTING.md" in readme
    measured = json.loads((PACKAGE / "measurements" / "memory.json").read_text())["results"]
    rows = re.findall(r"^\| (\d)\. [^|]+\|[^|]+\| ([\d.]+) \|$", readme, flags=re.M)
    assert len(rows) == 7
    for chapter, minutes in rows:
        (name,) = [n for n in measured if n.startswith(f"0{chapter}_") and "full" in measured[n]]
        assert float(minutes) == round(measured[name]["full"]["wall_s"] / 60, 1), name
