"""Numbers into the book's prose: :func:`glue` quotes a computed value as ``{eval}`glued.name```,
for the built book (myst-nb) and for a live kernel (:data:`glued`) alike."""
from __future__ import annotations

from typing import Any

import pandas as pd


class Shown(str):
    """A glued value as the prose shows it: text whose ``repr`` is the text itself, so an inline
    ``{eval}`` prints ``2.9`` and not ``'2.9'``."""

    def __repr__(self) -> str:
        return str(self)


class Glued(dict):
    """Every value glued in this kernel, by name, as the prose shows it. A markdown cell quotes one
    as ``{eval}`glued.name```: jupyterlab-myst evaluates that expression in the kernel, and the
    built book reads the same value from the notebook's glue outputs (``book/_ext/eval_glue.py``)."""

    def __getattr__(self, name: str) -> Shown:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"nothing is glued as {name!r} yet: run the cell that computes it") from None


#: The glued values of this kernel (import it beside ``glue``: the prose's ``{eval}`` roles read it).
glued = Glued()


def glue(name: str, value: Any, fmt: str = "", display: bool = False) -> None:
    """Quote ``value`` in the prose as ``{eval}`glued.name```, formatted with ``fmt`` (a format
    spec such as ``".1f"``; the default is ``str``). numpy and torch scalars become Python numbers
    first (numpy 2 would print ``np.float64(0.5)``). The text is glued with myst-nb (what the built
    book reads) and kept in :data:`glued` (what JupyterLab reads). Where myst-nb is not installed
    (``pip install "grpo_course[notebooks]"`` alone: myst-nb requires Sphinx), only :data:`glued`
    keeps it: a kernel that builds no book loses nothing."""
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):
        value = value.item()
    shown = Shown(format(value, fmt))
    glued[name] = shown
    try:
        from myst_nb import glue as myst_glue
    except ImportError:
        return
    myst_glue(name, shown, display=display)


def glued_values():
    """The glued values, one row each: where MyST is not rendered (Colab; Jupyter without
    jupyterlab-myst) each chapter's last cell, hidden in the built book, shows them with this."""

    return pd.DataFrame({"value": {k: str(v) for k, v in glued.items()}}).rename_axis("glue name")
