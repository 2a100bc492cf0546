"""The Colab edition: every chapter as Google Colab renders it, without MyST.

Colab renders notebook markdown as CommonMark (plus ``$`` math), so the book's MyST markup would
show raw. :func:`to_commonmark` rewrites one markdown cell:

* ``{eval}`glued.name``` -> the value of the published run, marked ``**1.8 %** *(book run)*``;
* ``{term}`text <Target>``` -> a link to the term on the book's glossary page;
* ``{cite}`key1,key2``` -> "Author et al. year" links to the references page;
* admonitions -> blockquotes, ``:class: dropdown`` admonitions -> ``<details>``;
* relative links and images -> absolute addresses on the published site.

Code cells are unchanged (outputs cleared), so running them computes the student's own numbers.
``make publish`` writes the edition to ``_build/colab/`` from the executed chapters of ``make
book`` and copies it into the site (``_build/html/colab/``), where each chapter's Colab badge
points (:func:`grpo_course.publish.colab_link`)::

    python -m grpo_course.colab --build _build
"""
from __future__ import annotations

import copy
import json
import re
import shutil
import sys
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

from .atomic import write_text_atomic
from .errors import CourseError, OneLineArgumentParser, report
from .publish import github_repo, repository

ROLE = re.compile(r"\{(eval|term|cite|cite:p|cite:t)\}`([^`]*)`")
TERM_TARGET = re.compile(r"^(.*?)\s*<([^<>]+)>\s*$", re.S)
FENCE = re.compile(r"^(?P<fence>`{3,}|:{3,})\s*\{(?P<name>[\w:-]+)\}\s*(?P<arg>.*)$")
LINK = re.compile(r"(!?\[[^\]]*\])\((?!https?://|#|mailto:)([^)\s]+)\)")
BOOK_RUN = "*(book run)*"


class ColabError(CourseError, ValueError):
    """A chapter the Colab edition cannot be written from (a value never glued, no build)."""


# ---------------------------------------------------------------- the published run's values
def glued_values(executed: dict[str, Any], glue_data: dict[str, Any] | None = None) -> dict[str, str]:
    """Every value an executed notebook glued (myst-nb's ``glue``), by name, as its text: from
    ``glue_data`` (the ``<chapter>.glue.json`` that myst-nb 1.x writes beside the executed
    notebook, leaving no glue outputs in it), then from the executed notebook's outputs."""
    values = {}
    for cell in executed.get("cells", []):
        for out in cell.get("outputs", []):
            name = out.get("metadata", {}).get("scrapbook", {}).get("name")
            data = out.get("data", {})
            text = data.get("application/papermill.record/text/plain", data.get("text/plain"))
            if name is not None and text is not None:
                values[name] = "".join(text) if isinstance(text, list) else str(text)
    for name, out in (glue_data or {}).items():
        text = (out.get("data") or {}).get("text/plain") if isinstance(out, dict) else None
        if text is not None:
            values[name] = "".join(text) if isinstance(text, list) else str(text)
    return values


def read_glue_file(executed: Path) -> dict[str, Any]:
    """The ``<chapter>.glue.json`` beside an executed notebook (``{}`` when there is none)."""
    path = executed.with_name(executed.stem + ".glue.json")
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ColabError(f"{path} is not readable glue data ({exc}): run `make book` again") from None


def glossary_ids(glossary_html: str) -> dict[str, str]:
    """``{term text: anchor id}`` of the built glossary page (Sphinx's ``<dt id="term-...">``)."""

    class Terms(HTMLParser):
        def __init__(self):
            super().__init__()
            self.ids: dict[str, str] = {}
            self._id: str | None = None
            self._text: list[str] = []

        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            if tag == "dt" and str(a.get("id", "")).startswith("term-"):
                self._id, self._text = a["id"], []
            elif tag == "a" and self._id is not None:     # the headerlink ends the term's text
                self.ids[" ".join("".join(self._text).split())] = self._id
                self._id = None

        def handle_data(self, data):
            if self._id is not None:
                self._text.append(data)

    parser = Terms()
    parser.feed(glossary_html)
    return parser.ids


def term_anchor(target: str, ids: dict[str, str] | None = None) -> str:
    """The glossary anchor of a term: the built page's id, else Sphinx's rule (``term-`` and the
    text with spaces as dashes)."""
    key = " ".join(target.split())
    if ids:
        for name, anchor in ids.items():
            if name.lower() == key.lower():
                return anchor
    return "term-" + re.sub(r"\s+", "-", key)


def cite_labels(bib_file: Path) -> dict[str, str]:
    """``{key: "Author et al. year"}`` from a BibTeX file (first author's last name)."""
    from pybtex.database import parse_file

    labels = {}
    for key, entry in parse_file(str(bib_file)).entries.items():
        people = entry.persons.get("author") or entry.persons.get("editor") or []
        lasts = [" ".join(p.last_names).replace("{", "").replace("}", "") for p in people]
        if lasts:
            others = len(lasts) > 2 or "others" in lasts      # BibTeX's "and others"
            name = lasts[0] + (" et al." if others else f" and {lasts[1]}" if len(lasts) == 2 else "")
        else:
            name = entry.fields.get("title", key).replace("{", "").replace("}", "")
        labels[key] = f"{name} {entry.fields.get('year', '')}".strip().replace("{", "").replace("}", "")
    return labels


# ---------------------------------------------------------------- one markdown cell
def _roles(text: str, values: dict[str, str], glossary_url: str, references_url: str,
           term_ids: dict[str, str] | None, cites: dict[str, str]) -> str:
    def role(match: re.Match) -> str:
        kind, body = match[1], match[2]
        if kind == "eval":
            name = body.strip()
            name = name[len("glued."):] if name.startswith("glued.") else name
            if name not in values:
                raise ColabError(f"{{eval}}`{body}` has no value in the executed chapter: was the "
                                 f"cell that glues {name!r} run?")
            return f"**{values[name]}** {BOOK_RUN}"
        if kind == "term":
            found = TERM_TARGET.match(body)
            text_, target = (found[1], found[2]) if found else (body, body)
            return f"[{text_}]({glossary_url}#{term_anchor(target, term_ids)})"
        keys = [k.strip() for k in body.split(",") if k.strip()]
        return "(" + "; ".join(f"[{cites.get(k, k)}]({references_url})" for k in keys) + ")"
    return ROLE.sub(role, text)


def _directives(text: str) -> str:
    """Admonitions (and any other fenced directive) as blockquotes; dropdowns as ``<details>``."""
    lines, out, i = text.split("\n"), [], 0
    while i < len(lines):
        head = FENCE.match(lines[i])
        if not head:
            out.append(lines[i])
            i += 1
            continue
        fence, title = head["fence"], head["arg"].strip() or head["name"].capitalize()
        i += 1
        options, body = {}, []
        while i < len(lines) and re.match(r"^:(\w+):\s*(.*)$", lines[i]):
            key, value = re.match(r"^:(\w+):\s*(.*)$", lines[i]).groups()
            options[key] = value
            i += 1
        while i < len(lines) and lines[i].strip() != fence:
            body.append(lines[i])
            i += 1
        i += 1                                            # the closing fence
        inner = _directives("\n".join(body)).strip("\n")
        if "dropdown" in options.get("class", "").split():
            out += ["<details>", f"<summary>{title}</summary>", "", inner, "", "</details>"]
        else:
            out += [f"> **{title}**", ">"] + [f"> {line}" if line else ">" for line in inner.split("\n")]
    return "\n".join(out)


def to_commonmark(text: str, values: dict[str, str], site_url: str, page_url: str,
                  term_ids: dict[str, str] | None = None, cites: dict[str, str] | None = None) -> str:
    """One markdown cell of a chapter without MyST: see the module docstring. ``site_url`` is the
    published book's root (ending in ``/``), ``page_url`` the chapter's folder on the site (where
    its relative links resolve)."""
    glossary = urljoin(site_url, "book/glossary.html")
    references = urljoin(site_url, "book/references.html")
    text = _directives(text)
    text = _roles(text, values, glossary, references, term_ids, cites or {})
    return LINK.sub(lambda m: f"{m[1]}({_site_link(urljoin(page_url, m[2]))})", text)


def _site_link(url: str) -> str:
    """A chapter link on the site: ``.ipynb``/``.md`` pages are served as ``.html``."""
    return re.sub(r"\.(ipynb|md)(#|$)", r".html\2", url)


# ---------------------------------------------------------------- the edition
def colab_notebook(source: dict[str, Any], values: dict[str, str], site_url: str,
                   term_ids: dict[str, str] | None = None, cites: dict[str, str] | None = None,
                   page_url: str | None = None) -> dict[str, Any]:
    """A chapter's Colab edition: its markdown through :func:`to_commonmark`, its code cells
    unchanged without outputs."""
    page_url = page_url or urljoin(site_url, "notebooks/")
    edition = copy.deepcopy(source)
    for cell in edition["cells"]:
        if cell["cell_type"] == "markdown":
            text = "".join(cell["source"])
            cell["source"] = to_commonmark(text, values, site_url, page_url, term_ids, cites)
        elif cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    edition.setdefault("metadata", {})["colab"] = {"provenance": []}
    return edition


def site_url(config_file: Path) -> str:
    """The published book's root: GitHub Pages of ``_config.yml``'s repository."""

    owner, repo = github_repo(repository(config_file)[0]).split("/")
    return f"https://{owner}.github.io/{repo}/"


def write_edition(root: Path, build: Path, notify: Callable[[str], None] = print) -> list[Path]:
    """Write ``build/colab/0N_*.ipynb`` from the chapters that ``make book`` executed
    (``build/jupyter_execute/notebooks``) and copy them into the site (``build/html/colab``)."""
    root, build = Path(root), Path(build)
    executed_dir = build / "jupyter_execute" / "notebooks"
    sources = sorted((root / "notebooks").glob("0*_*.ipynb"))
    if not sources:
        raise ColabError(f"{root / 'notebooks'}: no chapters")
    glossary = build / "html" / "book" / "glossary.html"
    term_ids = glossary_ids(glossary.read_text(encoding="utf-8")) if glossary.is_file() else None
    cites = cite_labels(root / "book" / "references.bib")
    url = site_url(root / "_config.yml")
    written = []
    for path in sources:
        executed = executed_dir / path.name
        if not executed.is_file():
            raise ColabError(f"{executed} is missing: run `make book` first (the Colab edition "
                             "quotes the values of the book's run)")
        values = glued_values(json.loads(executed.read_text(encoding="utf-8")),
                              read_glue_file(executed))
        edition = colab_notebook(json.loads(path.read_text(encoding="utf-8")), values, url,
                                 term_ids, cites)
        target = build / "colab" / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(target, json.dumps(edition, indent=1, ensure_ascii=False) + "\n")
        written.append(target)
    site_copy = build / "html" / "colab"
    if (build / "html").is_dir():
        site_copy.mkdir(exist_ok=True)
        for target in written:
            shutil.copyfile(target, site_copy / target.name)
    notify(f"Colab edition: {len(written)} chapters in {build / 'colab'}"
           + (f" and {site_copy}" if (build / "html").is_dir() else ""))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = OneLineArgumentParser(prog="python -m grpo_course.colab",
                                   description="Write the Colab edition of the executed book.")
    parser.add_argument("--root", default=".", help="the book's folder (default: here)")
    parser.add_argument("--build", default="_build", help="make book's output folder")
    args = parser.parse_args(argv)
    try:
        if not (Path(args.root) / "_config.yml").is_file():
            raise ColabError(f"--root {args.root}: no _config.yml there")
        if not Path(args.build).is_dir():
            raise ColabError(f"--build {args.build}: not a folder; run `make book` first")
        write_edition(Path(args.root), Path(args.build))
    except (CourseError, OSError) as err:
        return report(err)
    return 0


if __name__ == "__main__":
    sys.exit(main())
