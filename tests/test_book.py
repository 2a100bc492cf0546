"""Checks of a built book (make test runs this with BOOK_HTML pointing at the HTML)."""
import os
import re
from pathlib import Path

import pytest

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


# ------------------------------------------------------------------ in a real browser
def _chromium() -> str | None:
    import shutil
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


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
    from playwright.sync_api import sync_playwright
    import tempfile

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
