"""The chapters as a student opens them: JupyterLab (with jupyterlab-myst) in a real browser.

A chapter's prose quotes numbers as {eval}`glued.name`. This runs a two-cell notebook in a real
JupyterLab server and checks that, after "Run All", the markdown shows the glued value (no raw role,
no error) and that a solution dropdown stays closed. Needs chromium (`make test` installs it).
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest

from tests.helpers import chromium as _chromium
from tests.helpers import free_port as _free_port

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def lab():
    """A JupyterLab server on localhost serving a temporary folder with one small notebook."""
    if _chromium() is None:
        if os.environ.get("REQUIRE_BROWSER"):
            pytest.fail("no chromium found: `make test` installs Debian's chromium when missing")
        pytest.skip("no chromium on this machine (make test installs it with apt-get)")
    folder = Path(tempfile.mkdtemp(prefix="lab-"))
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell('from grpo_course.book.glue import glue, glued\n'
                                  'glue("acc", 12.345, fmt=".1f")\nglue("verdict", "not significant")'),
        nbformat.v4.new_markdown_cell("Accuracy {eval}`glued.acc` % — {eval}`glued.verdict`.\n\n"
                                      ":::{admonition} Solution\n:class: dropdown\nHIDDEN-ANSWER\n:::"),
    ]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, folder / "glued.ipynb")
    port = _free_port()
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(folder / ".jupyter"), "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
         "--allow-root", "--IdentityProvider.token=", "--ServerApp.password=", "--LabApp.expose_app_in_browser=True",
         "--ServerApp.disable_check_xsrf=True", f"--ServerApp.root_dir={folder}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.5)
    else:
        server.kill()
        pytest.fail("JupyterLab did not start within 120 s")
    yield f"http://127.0.0.1:{port}"
    server.terminate()
    server.wait(timeout=30)


def test_jupyterlab_fills_in_glued_values_and_keeps_solutions_closed(lab):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=_chromium(), headless=True,
                                     args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(f"{lab}/lab/tree/glued.ipynb")
        page.wait_for_function("() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
                               " && window.jupyterapp.shell.currentWidget.sessionContext"
                               " && window.jupyterapp.shell.currentWidget.sessionContext.session"
                               "?.kernel?.status === 'idle'", timeout=120_000)
        page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
        prose = page.locator(".jp-MarkdownCell").first
        prose.get_by_text("12.3", exact=False).wait_for(timeout=60_000)
        text = prose.inner_text()
        (ROOT / "_build").mkdir(exist_ok=True)
        page.screenshot(path=str(ROOT / "_build" / "jupyterlab-glued.png"))
        browser.close()
    assert "Accuracy 12.3 %" in text and "not significant" in text, text
    assert "{eval}" not in text and "'12.3'" not in text and "Error" not in text, text
    assert "HIDDEN-ANSWER" not in text, "the solution dropdown is open"
