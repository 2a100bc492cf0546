"""Checks of a built book (make test runs this with BOOK_HTML pointing at the HTML)."""
import os
import re
from pathlib import Path

import pytest

from tests.helpers import chromium as _chromium

HTML = os.environ.get("BOOK_HTML")
pytestmark = pytest.mark.skipif(not HTML, reason="BOOK_HTML is not set (run through make test)")
ROOT = Path(__file__).resolve().parents[1]


def chapters():
    return sorted(p.stem for p in (ROOT / "notebooks").glob("0*_*.ipynb"))


def test_index_and_chapters_exist():
    html = Path(HTML)
    assert (html / "index.html").is_file() or (html / "book" / "intro.html").is_file()
    for stem in chapters():
        assert (html / "notebooks" / f"{stem}.html").is_file(), f"{stem} was not built"


@pytest.mark.parametrize("stem", chapters())
def test_chapter_page_has_outputs_and_no_errors(stem):
    page = (Path(HTML) / "notebooks" / f"{stem}.html").read_text(encoding="utf-8")
    assert "cell_output" in page, f"{stem}: the page shows no executed output"
    assert "Traceback (most recent call last)" not in page
    assert not re.search(r'class="[^"]*\berror\b', page), f"{stem}: a cell error is rendered"


# library start-up noise a student would read as an error: torchao's CUDA-only kernels and its
# pytree registrations, and notes to library developers (transformers' and peft's renamed attributes)
NOISE = ("Failed to load", "FutureWarning", "_pytree.py")


@pytest.mark.parametrize("stem", chapters())
def test_executed_chapter_prints_no_library_noise(stem):
    """The book hides stderr (``remove-warn``), JupyterLab and Colab do not: what the executed
    chapter wrote there must be its own (progress bars), not libraries' start-up lines."""
    import json

    executed = Path(HTML).parent / "jupyter_execute" / "notebooks" / f"{stem}.ipynb"
    assert executed.is_file(), f"{executed} is missing: myst-nb's layout changed?"
    cells = json.loads(executed.read_text(encoding="utf-8"))["cells"]
    noisy = [(i, line.strip()[:120]) for i, cell in enumerate(cells) for out in cell.get("outputs", [])
             if out.get("name") == "stderr" for line in "".join(out["text"]).splitlines()
             if any(word in line for word in NOISE)]
    assert not noisy, f"{stem}: library noise on stderr (cell, line): {noisy[:4]}"


@pytest.mark.parametrize("stem", chapters())
def test_chapter_colab_links_open_the_colab_edition(stem):
    page = (Path(HTML) / "notebooks" / f"{stem}.html").read_text(encoding="utf-8")
    links = re.findall(r'href="(https://colab\.research\.google\.com/[^"]+)"', page)
    assert links, f"{stem}: no Colab link"
    assert all(link.endswith(f"/blob/gh-pages/colab/{stem}.ipynb") for link in links), links


def test_intro_tables_the_measured_memory_and_says_what_fits():
    page = (Path(HTML) / "book" / "intro.html").read_text(encoding="utf-8")
    text = " ".join(_prose_text(page).split())
    assert "Measured by bench/memory.py" in text, "the memory table is missing from the intro"
    # (Sphinx turns the apostrophe into a typographic one)
    assert re.search(r"(Every measured chapter \(\d+\) stays within|Over) the binder "
                     r"profile[’']s \d\.\d\d GiB target", text), "no verdict on the binder limit"


ROLE = re.compile(r"\{(eval|glue|term|cite|doc|ref|numref|eq|download)(:[a-z]*)?\}|"
                  r"\{(admonition|dropdown|note|warning|tip|math|figure|code-cell|glossary)\}")


def _prose_text(page: str) -> str:
    """The page's text as a reader sees it, without code cells (``<pre>``), scripts, styles and
    LaTeX (where a literal ``{glue`` or ``{ref}`` may legitimately appear). Inline ``<code>``
    stays: a role written inside backticks is exactly the bug this finds."""
    page = re.sub(r"<(script|style|pre)\b.*?</\1>", " ", page, flags=re.S | re.I)
    page = re.sub(r'<(span|div) class="math[^"]*">.*?</\1>', " ", page, flags=re.S)  # LaTeX
    return re.sub(r"<[^>]+>", " ", page)


def pages() -> list[Path]:
    return sorted(Path(HTML).rglob("*.html")) if HTML else []


def test_no_unrendered_myst_role_on_any_page():
    assert pages(), "no HTML pages were built"
    bad = {}
    for path in pages():
        if "_static" in path.parts or path.name in ("genindex.html", "search.html"):
            continue
        found = sorted({m.group(0) for m in ROLE.finditer(_prose_text(path.read_text(encoding="utf-8")))})
        if found:
            bad[str(path.relative_to(HTML))] = found
    assert not bad, f"unrendered MyST roles or directives in the built book: {bad}"


def test_role_check_catches_a_literal_role():
    page = ("<p>The loss is {glue:text}`x:.2f`, {glue:}`n`, {eval}`glued.k` and {term}`GRPO`.</p>"
            "<pre>{glue:text}`fine`</pre>"
            '<span class="math notranslate nohighlight">\\(\\pi_\\text{ref}\\)</span>')
    assert {m.group(0) for m in ROLE.finditer(_prose_text(page))} == {"{glue:text}", "{glue:}", "{eval}", "{term}"}


# ------------------------------------------------------------------ in a real browser
@pytest.fixture(scope="module")
def served_book():
    """Serve the built HTML on localhost for the browser (stopped after the tests)."""
    import functools
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=HTML)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def page():
    exe = _chromium()
    if exe is None:
        if os.environ.get("REQUIRE_BROWSER"):
            pytest.fail("no chromium found: `make test` installs Debian's chromium when missing")
        pytest.skip("no chromium on this machine (make test installs it with apt-get)")
    import tempfile

    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            tempfile.mkdtemp(prefix="chromium-"),   # a fresh --user-data-dir
            executable_path=exe, headless=True, viewport={"width": 1280, "height": 900},
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"])
        yield context.new_page()
        context.close()


SHOTS = ROOT / "_build" / "screenshots"


def test_browser_navigation_lists_every_chapter(served_book, page):
    page.goto(f"{served_book}/index.html", wait_until="networkidle")
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / "index.png"), full_page=False)
    links = page.eval_on_selector_all("nav.bd-docs-nav a", "els => els.map(e => e.href)")
    for stem in chapters():
        assert any(f"notebooks/{stem}.html" in href for href in links), f"{stem} not in navigation"


@pytest.mark.parametrize("stem", chapters()[:1] + chapters()[2:3])
def test_browser_chapter_renders_figures_without_errors(served_book, page, stem):
    page.goto(f"{served_book}/notebooks/{stem}.html", wait_until="networkidle")
    page.screenshot(path=str(SHOTS / f"{stem}.png"), full_page=True)
    # the book's own images (executed figures under _images/); external badges need the internet
    sizes = page.eval_on_selector_all(
        "article img", "els => els.filter(e => e.src.startsWith(location.origin + '/_images/'))"
                       ".map(e => [e.complete, e.naturalWidth, e.naturalHeight])")
    assert sizes, f"{stem}: no executed figure on the page"
    assert all(done and w > 0 and h > 0 for done, w, h in sizes), f"{stem}: broken images {sizes}"
    text = page.inner_text("article")
    assert "Traceback (most recent call last)" not in text
    assert page.query_selector_all(".output.traceback, .output.error") == [], f"{stem}: cell error"


def _block_outside(page) -> list[str]:
    """Block every request of ``page`` that leaves localhost; the list collects their URLs
    (``page.unroute("**/*")`` ends it)."""
    from urllib.parse import urlparse

    outside: list[str] = []
    def route(r):
        if urlparse(r.request.url).hostname in ("127.0.0.1", "localhost"):
            r.continue_()
        else:
            outside.append(r.request.url)
            r.abort()
    page.route("**/*", route)
    return outside


@pytest.mark.parametrize("stem", chapters())
def test_browser_chapter_is_complete_offline(served_book, page, stem):
    """What a reader without internet sees: every request a page makes stays on localhost (any
    other is blocked and reported), the math is typeset by MathJax (no raw LaTeX left), static
    widgets render where a chapter embeds one, and figures have a size."""
    failed = []
    outside = _block_outside(page)
    on_failed = lambda req: failed.append(req.url)
    on_response = lambda resp: failed.append(f"{resp.status} {resp.url}") if resp.status >= 400 else None
    page.on("requestfailed", on_failed)
    page.on("response", on_response)
    try:
        page.goto(f"{served_book}/notebooks/{stem}.html", wait_until="networkidle")
        has_math = page.eval_on_selector_all(".math", "els => els.length") > 0
        if has_math:
            page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise"
                                   " && document.querySelectorAll('mjx-container').length > 0",
                                   timeout=30_000)
            page.evaluate("() => MathJax.startup.promise")
        if page.query_selector('script[type="application/vnd.jupyter.widget-view+json"]'):
            page.wait_for_selector(".jupyter-widgets", state="attached", timeout=30_000)
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / f"offline-{stem}.png"), full_page=True)
        text = page.inner_text("article")
        sizes = page.eval_on_selector_all(
            "article img", "els => els.map(e => [e.getAttribute('src'), e.complete, e.naturalWidth])")
    finally:
        page.unroute("**/*")
        page.remove_listener("requestfailed", on_failed)
        page.remove_listener("response", on_response)
    assert not outside, f"{stem}: requests leaving localhost: {sorted(set(outside))}"
    assert not failed, f"{stem}: failed requests: {sorted(set(failed))}"
    assert "\\(" not in text and "\\[" not in text and "$$" not in text, f"{stem}: raw LaTeX on the page"
    assert all(done and w > 0 for _, done, w in sizes), f"{stem}: images that did not load {sizes}"


@pytest.mark.parametrize("stem", chapters())
def test_browser_quiz_answers_a_question_with_feedback_offline(served_book, page, stem):
    """A reader without internet clicks an answer of the chapter's quiz and gets its feedback;
    the quiz's questions and scripts are in the page, so no request leaves it."""
    outside = _block_outside(page)
    try:
        page.goto(f"{served_book}/notebooks/{stem}.html", wait_until="networkidle")
        page.wait_for_selector(".Quiz .MCButton", timeout=30_000)
        quizzes = page.query_selector_all(".Quiz")
        question = next(q for q in quizzes if q.query_selector(".MCButton"))   # multiple choice
        answer = question.query_selector(".MCButton")
        answer.scroll_into_view_if_needed()
        answer.click()
        page.wait_for_function("q => q.querySelector('.Feedback').innerText.trim().length > 0",
                               arg=question, timeout=10_000)
        feedback = question.query_selector(".Feedback").inner_text().strip()
        SHOTS.mkdir(parents=True, exist_ok=True)
        question.screenshot(path=str(SHOTS / f"quiz-{stem}.png"))
    finally:
        page.unroute("**/*")
    assert feedback, f"{stem}: clicking an answer gave no feedback"
    assert len(quizzes) >= 3, f"{stem}: the quiz shows {len(quizzes)} questions"
    assert not outside, f"{stem}: the quiz made requests leaving localhost: {sorted(set(outside))}"
