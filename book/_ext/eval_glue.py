"""Sphinx extension: ``{eval}`glued.name``` in a notebook's prose reads the value glued as ``name``.

The chapters quote computed numbers as ``{eval}`glued.name``` (``grpo_course.book.glue.glue``):
JupyterLab with jupyterlab-myst evaluates that expression in the running kernel; myst-nb evaluates
``{eval}`` only when it executes a notebook inline, so for the book (executed through the cache, or
not at all for the smoke build) this role reads the same value from the notebook's glue outputs.
A name that was never glued is a build warning and stays visible in the page as the raw role, which
``tests/test_book.py`` fails on. Any other ``{eval}`` expression keeps myst-nb's behaviour.
"""
from __future__ import annotations

import re

from docutils import nodes
from myst_nb.core.variables import RetrievalError, create_warning, render_variable_outputs
from myst_nb.ext.eval import EvalRoleAny
from myst_nb.ext.glue.utils import retrieve_glue_data

GLUED = re.compile(r"glued\.([A-Za-z_][A-Za-z0-9_]*)")


class EvalGlueRole(EvalRoleAny):
    def run(self):
        match = GLUED.fullmatch(self.text.strip())
        if not match:
            return super().run()
        try:
            data = retrieve_glue_data(self.document, match.group(1))
        except RetrievalError as exc:
            warning = create_warning(f"{self.text}: {exc}", self.document, self.line, subtype="eval")
            return [nodes.literal(self.rawtext, self.rawtext)], [warning]
        data.metadata["strip_text_quotes"] = True
        return render_variable_outputs([data], self.document, self.line, self.source, inline=True), []


def setup(app):
    app.add_role("eval", EvalGlueRole(), override=True)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
