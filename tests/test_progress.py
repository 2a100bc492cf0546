"""The course's progress bars: in an executed notebook each bar is saved as its final line of text,
and libraries' own bars are turned off around short steps and then restored."""
from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient

from grpo_course.infra.progress import library_bars_off, tqdm


def test_outside_a_notebook_it_is_tqdm_auto_s_bar(capsys):
    assert [x for x in tqdm(range(3), desc="here")] == [0, 1, 2]
    assert "here: 100%" in capsys.readouterr().err


@pytest.mark.heavy
def test_an_executed_notebook_keeps_each_bar_s_last_line_in_order():
    """What the built book and an executed .ipynb show: the prints and the bars in the order they
    ran, each bar at 100 % (kept or not, leave=False), and no widget that would need its state."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "from grpo_course.infra.progress import tqdm\n"
        "print('before')\n"
        "for _ in tqdm(range(4), desc='kept'): pass\n"
        "for _ in tqdm(range(2), desc='gone', leave=False): pass\n"
        "for _ in tqdm(range(2), desc='off', disable=True): pass\n"
        "print('after')")]
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    outputs = nb.cells[0].outputs
    shown = [o.text.strip() if o.output_type == "stream" else o.data["text/plain"] for o in outputs]
    assert [s.split(":")[0] if ":" in s else s for s in shown] == ["before", "kept", "gone", "after"], shown
    assert all("100%" in s for s in shown[1:3]), shown
    assert not any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs)


@pytest.mark.parametrize("library", ["transformers", "datasets"])
def test_library_bars_off_turns_them_off_then_back_as_they_were(library):
    if library == "transformers":
        from transformers.utils import logging as hf
        shown, on, off = hf.is_progress_bar_enabled, hf.enable_progress_bar, hf.disable_progress_bar
    else:
        from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
        shown, on, off = (lambda: not are_progress_bars_disabled()), enable_progress_bars, disable_progress_bars
    before = shown()
    try:
        for start in (on, off):
            start()
            was = shown()
            with library_bars_off(library):
                assert not shown()
            assert shown() == was
        on()
        with pytest.raises(RuntimeError), library_bars_off(library):
            raise RuntimeError("a failed load")
        assert shown()                   # restored after an error too
    finally:
        (on if before else off)()


def test_library_bars_off_names_an_unknown_library():
    with pytest.raises(ValueError, match="'tqdm'"), library_bars_off("tqdm"):
        pass
