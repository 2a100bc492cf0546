"""The package installs as a package: its wheel carries the data it reads (recipes, measured peaks,
quizzes), and installed non-editable into a fresh virtual environment it evaluates from outside the
checkout. The fresh environment reuses this one's installed dependencies (offline: a path line, so
this environment's editable ``grpo_course`` is not seen) and installs the wheel with ``--no-deps``."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(out), str(ROOT)], check=True, capture_output=True, text=True)
    (path,) = out.glob("grpo_course-*.whl")
    return path


def test_the_wheel_carries_the_data_the_package_reads(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    for data in ("grpo_course/recipes/grpo_levers.yaml", "grpo_course/measurements/memory.json",
                 "grpo_course/quizzes/03_grpo_from_scratch.json", "grpo_course/accelerate/cpu_2proc.yaml"):
        assert data in names, data
    requires = [line for line in zipfile.ZipFile(wheel).read(
        next(n for n in names if n.endswith("METADATA"))).decode().splitlines()
        if line.startswith("Requires-Dist:")]
    assert any("torch" in r for r in requires) and any("trl" in r for r in requires)


@pytest.mark.slow
def test_a_fresh_non_editable_install_evaluates_outside_the_checkout(wheel, tmp_path, real_gsm8k_dir):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "parent_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q", str(wheel)],
                   check=True, capture_output=True, text=True)
    env = {**os.environ, "GSM8K_DIR": str(real_gsm8k_dir), "PYTHONPATH": ""}
    where = subprocess.run([str(py), "-c", "import grpo_course; print(grpo_course.__file__)"],
                           cwd=tmp_path, env=env, check=True, capture_output=True, text=True).stdout
    assert str(ROOT) not in where and str(site) in where          # the installed copy, not the checkout
    run = subprocess.run([str(py), "-m", "grpo_course.measure.evaluate", "--n", "2", "--max-new-tokens", "16",
                          "--json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["n"] == 2


def test_every_third_party_import_of_the_package_is_declared():
    """A dependency that only arrives through another one (mpmath through torch's sympy) is still
    named in pyproject.toml: each top-level import of the package maps to a declared distribution."""
    import ast
    import tomllib
    from importlib.metadata import packages_distributions

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = [d for group in project.get("optional-dependencies", {}).values() for d in group]
    declared = {re.split(r"[<>=!~ \[]", d, maxsplit=1)[0].lower().replace("_", "-")
                for d in [*project["dependencies"], *extras]}
    providers = packages_distributions()
    missing = set()
    for path in (ROOT / "grpo_course").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else []
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top == "grpo_course":
                    continue
                dists = {d.lower().replace("_", "-") for d in providers.get(top, [top])}
                if not dists & declared:
                    missing.add(f"{path.name}: {top}")
    assert not missing, sorted(missing)


def _project() -> dict:
    import tomllib
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~ \[;]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements}


def test_the_notebooks_extra_carries_no_book_browser_or_test_tools_and_leaves_torch_alone():
    """``pip install "grpo_course[notebooks]"`` is what a kernel needs (Colab, Binder): nothing
    that builds the book, drives a browser or tests, and torch only bounded below, so a host keeps
    its own build."""
    project = _project()
    installed = _names(project["dependencies"] + project["optional-dependencies"]["notebooks"])
    for tool in ("jupyter-book", "sphinx", "myst-nb", "myst-parser", "playwright", "pytest", "nbmake",
                 "hypothesis", "ruff", "jupyterlab", "ghp-import"):
        assert tool not in installed, tool
    (torch,) = [r for r in project["dependencies"] if _names([r]) == {"torch"}]
    assert re.fullmatch(r"torch>=[\d.]+", torch.replace(" ", "")), torch


def test_every_third_party_import_of_the_chapters_is_declared():
    """Each module a chapter imports comes with the package or its ``notebooks`` extra; myst-nb
    (glue) is the one exception, installed with --no-deps where there is no Sphinx (``book``)."""
    from importlib.metadata import packages_distributions

    project = _project()
    extras = project["optional-dependencies"]
    declared = _names(project["dependencies"] + extras["notebooks"])
    providers = packages_distributions()
    missing = set()
    for path in sorted((ROOT / "notebooks").glob("0*_*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        for top in re.findall(r"^\s*(?:import|from)\s+([A-Za-z_]\w*)", code, re.M):
            if top in sys.stdlib_module_names or top == "grpo_course":
                continue
            dists = _names(providers.get(top, [top]))
            if not dists & declared and not (dists & _names(extras["book"]) and top == "myst_nb"):
                missing.add(f"{path.name}: {top}")
    assert not missing, sorted(missing)
