"""The course's progress bar: in an executed notebook each bar is saved as its final line of text."""
from __future__ import annotations

import nbformat
import pytest
from nbclient import NotebookClient

from grpo_course.infra.progress import tqdm


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
