"""grpo_course.book.glue: numbers into the prose, for the built book and a live kernel."""
import pytest


def test_glue_formats_numpy_and_torch_scalars_and_glues_the_text(monkeypatch):
    import myst_nb
    import numpy as np
    import torch

    from grpo_course.book import glue

    seen = {}
    monkeypatch.setattr(myst_nb, "glue", lambda name, value, display=True: seen.update({name: value}))
    glue.glue("a", np.float64(0.5), fmt=".1f")
    glue.glue("b", torch.tensor(3))
    glue.glue("c", "text")
    glue.glue("d", 0.123, fmt=".0%")
    assert seen == {"a": "0.5",  # not np.float64(0.5)
                    "b": "3", "c": "text", "d": "12%"}
    assert repr(seen["c"]) == "text"          # an inline {eval} shows it without quotes
    assert glue.glued.b == "3" and glue.glued["d"] == "12%"


def test_glue_without_myst_nb_keeps_the_value_for_the_table(monkeypatch):
    import sys

    from grpo_course.book import glue
    monkeypatch.setitem(sys.modules, "myst_nb", None)     # not installed: importing it raises
    glue.glue("no_myst", 0.25, fmt=".0%")
    assert glue.glued.no_myst == "25%"


def test_glued_names_an_unglued_value():
    from grpo_course.book import glue
    with pytest.raises(AttributeError, match="nothing is glued as 'never_glued' yet"):
        _ = glue.glued.never_glued


def test_glue_records_every_value_for_the_table_where_myst_is_not_rendered():
    import numpy as np

    from grpo_course.book import glue
    glue.glue("test_acc", np.float64(0.123456), fmt=".4g")
    glue.glue("test_text", "a sentence")
    table = glue.glued_values()
    assert table.loc["test_acc", "value"] == "0.1235" and table.loc["test_text", "value"] == "a sentence"
