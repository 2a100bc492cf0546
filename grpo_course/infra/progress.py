"""Progress bars that read the same in JupyterLab, Colab and the built book.

``tqdm.auto`` draws a widget in a notebook. An executed notebook keeps the widget's first text
(``0%``) as its plain-text fallback, and a bar closed with ``leave=False`` keeps no widget state
at all, so a static page or an executed ``.ipynb`` shows every bar frozen at 0 %. This
:class:`tqdm` is ``tqdm.auto``'s, with one change in a notebook: when the bar closes, its output
is replaced by the bar's final line of text (``evaluate: 100%|██████████| 64/64 [01:02<00:00]``)
through the display it was shown in, which nbclient (the book's executor) applies to the saved
output as JupyterLab does on screen. Outside a notebook it is ``tqdm.auto.tqdm`` unchanged.

:func:`library_bars_off` turns a library's own bars (transformers', datasets') off around a short
step of theirs, whose first frame would otherwise stay in an executed page, and back on after.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from tqdm.auto import tqdm as _auto_tqdm
from tqdm.notebook import tqdm_notebook


class tqdm(_auto_tqdm):
    """``tqdm.auto.tqdm`` whose notebook bar ends as its final line of text."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._handle = None
        widget = issubclass(_auto_tqdm, tqdm_notebook) and kwargs.get("display", True) \
            and not kwargs.get("disable", False) and kwargs.get("delay", 0) <= 0
        if not widget:
            super().__init__(*args, **kwargs)
            return
        # shown by us, with a display id, so that close() can replace this very output
        from IPython.display import display

        super().__init__(*args, **{**kwargs, "display": False})
        self._handle = display(self.container, display_id=True)
        self.displayed = True

    def close(self) -> None:
        super().close()
        handle, self._handle = getattr(self, "_handle", None), None
        if handle is not None:
            handle.update({"text/plain": self.format_meter(**self.format_dict)}, raw=True)


@contextlib.contextmanager
def library_bars_off(library: str) -> Iterator[None]:
    """``library``'s own progress bars (``"transformers"`` or ``"datasets"``) off for the block,
    then as they were: a short step of theirs would otherwise leave its first frame (0 %) as a
    stray line in an executed page."""
    if library == "transformers":
        from transformers.utils import logging as hf_logging
        shown = hf_logging.is_progress_bar_enabled()
        off, on = hf_logging.disable_progress_bar, hf_logging.enable_progress_bar
    elif library == "datasets":
        from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
        shown = not are_progress_bars_disabled()
        off, on = disable_progress_bars, enable_progress_bars
    else:
        raise ValueError(f"library_bars_off: no progress bars known for {library!r} "
                         "(transformers or datasets)")
    off()
    try:
        yield
    finally:
        if shown:
            on()
