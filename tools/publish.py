"""Publishing a fork of the book: one repository URL, set in one place.

``_config.yml``'s ``repository.url`` is the single setting. The launch buttons read it; the
Colab badge of every chapter and its Colab install cell carry it too (a notebook opened in
Colab cannot read ``_config.yml``), so :func:`set_repository` rewrites all of them at once and
``tests/test_publish.py`` checks that they agree::

    python tools/publish.py --repository-url https://github.com/you/your-fork
    make book && make publish        # then push _build/html with the printed ghp-import command

``.github/workflows/book.yml`` does the same on GitHub (the URL of the repository it runs in, then
``make book``, ``make publish`` and a GitHub Pages deploy): ``book/setup.md``, "publishing your fork".
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:         # run as a script (python tools/<name>.py): the checkout's package
    sys.path.insert(0, str(ROOT))

from grpo_course.infra.atomic import write_text_atomic
from grpo_course.infra.errors import CourseError, OneLineArgumentParser, report

GITHUB = re.compile(r"^https://github\.com/([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+?)/?$")


class PublishError(CourseError, ValueError):
    """A repository URL or a book folder the publishing step cannot use."""


def repository(config_file: Path) -> tuple[str, str]:
    """``(url, branch)`` of the book's repository, from ``_config.yml``."""
    config = yaml.safe_load(Path(config_file).read_text())
    repo = config.get("repository") or {}
    if not repo.get("url"):
        raise PublishError(f"{config_file}: no repository.url")
    return repo["url"].rstrip("/"), repo.get("branch", "main")


def github_repo(url: str, what: str = "repository url") -> str:
    """``owner/repo`` of a GitHub ``url``; ``what`` names the value in the error."""
    match = GITHUB.match(url)
    if not match:
        raise PublishError(f"{what} {url!r} is not https://github.com/<owner>/<repo>")
    return f"{match[1]}/{match[2]}"


#: the branch GitHub Pages serves the site from (``make publish`` pushes ``_build/html`` there)
PAGES_BRANCH = "gh-pages"


def colab_link(url: str, notebook: str) -> str:
    """The Colab address of ``notebook``'s Colab edition (``tools/colab.py``), published
    with the site on the Pages branch of the repository at ``url``."""
    return (f"https://colab.research.google.com/github/{github_repo(url)}/blob/{PAGES_BRANCH}/"
            f"colab/{notebook}")


def set_repository(root: Path, new_url: str) -> list[Path]:
    """Point ``_config.yml``, every chapter's Colab badge and Colab install cell at ``new_url``;
    returns the files changed (each written atomically)."""
    new_url = new_url.rstrip("/")
    new = github_repo(new_url, "--repository-url")
    config_file = Path(root) / "_config.yml"
    old_url, _ = repository(config_file)
    old = github_repo(old_url, f"{config_file}: repository.url")
    swaps = [(old_url, new_url), (f"/github/{old}/", f"/github/{new}/")]
    changed = []
    for path in [config_file, *sorted((Path(root) / "notebooks").glob("0*_*.ipynb"))]:
        text = path.read_text(encoding="utf-8")
        updated = text
        for a, b in swaps:
            updated = updated.replace(a, b)
        if updated != text:
            write_text_atomic(path, updated)
            changed.append(path)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = OneLineArgumentParser(prog="python tools/publish.py",
                                   description="Point the book at your fork's repository URL.")
    parser.add_argument("--repository-url", required=True,
                        help="https://github.com/<owner>/<repo> of the fork to publish")
    parser.add_argument("--root", default=".", help="the book's folder (default: here)")
    args = parser.parse_args(argv)
    try:
        root = Path(args.root)
        if not (root / "_config.yml").is_file():
            raise PublishError(f"--root {args.root}: no _config.yml there")
        changed = set_repository(root, args.repository_url)
    except CourseError as err:
        return report(err)
    print(f"repository set to {args.repository_url.rstrip('/')}: {len(changed)} files updated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
