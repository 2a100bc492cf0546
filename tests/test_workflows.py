"""The GitHub Actions workflows: CI runs what the README says CI runs, the book workflow builds and
publishes with the README's make targets and GitHub's official Pages actions, and no step fetches
anything from outside the package registries and the repository itself."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
WORKFLOWS = ROOT / ".github" / "workflows"
PINNED_OFFICIAL = re.compile(r"^actions/[A-Za-z0-9_.-]+@v\d+(\.\d+){0,2}$")
# what a run step may not do: fetch a file or a repository outside the package registries
DOWNLOADS = re.compile(r"\b(curl|wget|git\s+clone|git\s+fetch|git\s+submodule|aria2c)\b")


def load(name: str) -> dict[str, Any]:
    """A workflow file, parsed (PyYAML reads the key ``on`` as ``True``)."""
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    data["on"] = data.pop(True, data.get("on"))
    return data


def steps(workflow: dict[str, Any]) -> list[dict[str, Any]]:
    """Every step of every job."""
    return [step for job in workflow["jobs"].values() for step in job.get("steps", [])]


def runs(workflow: dict[str, Any]) -> list[str]:
    """The shell commands of every ``run:`` step."""
    return [step["run"] for step in steps(workflow) if "run" in step]


def test_ci_runs_the_ci_entry_point_on_push_and_pull_request():
    ci = load("ci.yml")
    assert {"push", "pull_request"} <= set(ci["on"])
    assert any(line.strip() == ".ci/run" for run in runs(ci) for line in run.splitlines())
    assert "make test" in (ROOT / ".ci" / "run").read_text()      # what the README says CI runs


def test_the_book_workflow_builds_with_the_readme_targets_and_deploys_to_pages():
    book = load("book.yml")
    commands = [line.strip() for run in runs(book) for line in run.splitlines()]
    readme = (ROOT / "README.md").read_text()
    for target in ("make book", "make publish"):
        assert target in readme and target in commands, target
    assert commands.index("make book") < commands.index("make publish")
    # the repository URL is set once, by the course's own command, before the build
    (setting,) = [c for c in commands if "tools/publish.py" in c]
    assert "--repository-url" in setting and "github.repository" in setting
    assert commands.index(setting) < commands.index("make book")
    uses = [step["uses"].split("@")[0] for step in steps(book) if "uses" in step]
    for action in ("actions/configure-pages", "actions/upload-pages-artifact", "actions/deploy-pages"):
        assert action in uses, action
    (upload,) = [s for s in steps(book) if s.get("uses", "").startswith("actions/upload-pages-artifact")]
    assert upload["with"]["path"] == "_build/html"


def test_the_pages_job_has_the_permissions_pages_needs():
    book = load("book.yml")
    for name, job in book["jobs"].items():
        if any(s.get("uses", "").startswith("actions/deploy-pages") for s in job.get("steps", [])):
            granted = {**book.get("permissions", {}), **job.get("permissions", {})}
            assert granted.get("pages") == "write" and granted.get("id-token") == "write", name
            assert job["environment"]["name"] == "github-pages"
            break
    else:
        pytest.fail("no job deploys to GitHub Pages")


@pytest.mark.parametrize("name", ["ci.yml", "book.yml"])
def test_every_action_is_official_and_pinned(name):
    for step in steps(load(name)):
        if "uses" in step:
            assert PINNED_OFFICIAL.match(step["uses"]), step["uses"]


@pytest.mark.parametrize("name", ["ci.yml", "book.yml"])
def test_no_step_downloads_anything_outside_the_registries_and_the_repository(name):
    for run in runs(load(name)):
        assert not DOWNLOADS.search(run), run
