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
    run = subprocess.run([str(py), "-m", "grpo_course.evaluate", "--n", "2", "--max-new-tokens", "16",
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
