"""The chapters' result box (grpo_course.book.results): rows from data, the box at the top filled
by the chapter's last cells through IPython's display ids."""
from __future__ import annotations

import IPython.display

from grpo_course.book import results as R


def test_rows_name_their_source_and_the_box_is_filled_by_its_display_id(monkeypatch):
    rows = [R.result("pass@1 at one line left", "10.5 %", "rose", n=256, interval="+3 to +9 points"),
            R.result("sampler vs llama.cpp", "1.34×", "ahead",
                     source=R.shipped("data/sampler.json", {"cpu": "AMD EPYC", "date": "2026-12-03"}))]
    shown, updated = [], []
    monkeypatch.setattr(IPython.display, "display", lambda obj, display_id=None: shown.append(display_id))
    monkeypatch.setattr(IPython.display, "update_display",
                        lambda obj, display_id=None: updated.append((obj, display_id)))
    R.results_box()
    assert R.fill_results_box(rows) is None                  # shown at the top only, not again here
    table = updated[0][0].table
    assert shown == [R.RESULTS_ID] and updated[0][1] == R.RESULTS_ID
    assert list(table.columns) == ["value", "n", "95 % interval or pairs", "reading", "from"]
    assert table.loc["pass@1 at one line left", "from"] == "this page"
    assert table.loc["sampler vs llama.cpp", "from"] == "shipped: data/sampler.json (AMD EPYC, 2026-12-03)"
    assert R.shipped("data/x.json", None) == "shipped: data/x.json"


def test_the_box_shows_each_reading_whole(monkeypatch):
    """pandas cuts a table's cells at 50 characters by default: the box formats its rows without
    that limit (the readings are sentences)."""
    reading = "no detectable change, p = 0.18: a loss inside that interval is not ruled out " * 2
    html = []
    monkeypatch.setattr(IPython.display, "update_display",
                        lambda obj, display_id=None: html.append(obj._repr_html_()))
    R.fill_results_box([R.result("whole problems, greedy", "1.6 → 3.9 %", reading, n=256)])
    assert reading.strip() in html[0]
    # the measure keeps a readable width, and a wide table scrolls inside its own box
    assert 'class="grpo-results"' in html[0] and "overflow-x: auto" in html[0] and "min-width: 11em" in html[0]


def test_p_values_keep_their_digits_where_a_table_is_rounded():
    import pandas as pd
    table = pd.DataFrame({"change": [0.12345], "p": [5e-9], "McNemar p": [0.1834], "n": [256]})
    shown = R.p_values_as_text(table).round(3)     # before rounding the rest
    assert shown.loc[0, "p"] == "5e-09" and shown.loc[0, "McNemar p"] == "0.18" and shown.loc[0, "n"] == 256
    untested = R.p_values_as_text(pd.DataFrame({"step": [0, 5], "p": [None, 0.04]}))   # step 0: nothing to test
    assert list(untested["p"]) == ["–", "0.04"]


def test_a_shipped_file_without_a_date_gives_its_commit_date():
    """Issue 84: headroom.json and reference_test.json record no date, so their result-box rows
    named no date; the commit date bounds the measurement's."""
    from grpo_course.book.results import committed, shipped

    assert shipped("data/x.json", {"cpu": "AMD EPYC", "date": "2026-12-01"}) == "shipped: data/x.json (AMD EPYC, 2026-12-01)"
    day = committed("data/headroom.json")
    if day:                                   # a clone with history (not a Colab copy)
        assert shipped("data/headroom.json", {"cpu": "AMD EPYC"}) == f"shipped: data/headroom.json (AMD EPYC, committed {day})"
    assert committed("data/no_such_file.json") is None


def test_a_changed_file_claims_no_commit_date(tmp_path, monkeypatch):
    """A file changed since its last commit holds a newer measurement than that commit's date."""
    import subprocess

    import grpo_course.book.results as R

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)
    git("init", "-q")
    (tmp_path / "r.json").write_text("{}")
    git("add", "r.json")
    git("commit", "-qm", "r")
    monkeypatch.setattr(R, "project_root", lambda: tmp_path)
    assert R.committed("r.json")
    (tmp_path / "r.json").write_text('{"new": 1}')
    assert R.committed("r.json") is None


def test_a_benchmark_s_machine_is_one_line_not_a_dump():
    line = R.measured_on({"cpu": "AMD EPYC", "native_bf16": True, "threads": 2, "date": "2026-12-03",
                          "minutes": 61.26, "avx2": True}, "data/x.json")
    assert line == "data/x.json: measured on AMD EPYC, native bf16, 2 threads, 2026-12-03, 61 min"
    assert R.measured_on({"native_bf16": False}) == "measured on no native bf16 (fp32)"
    assert R.measured_on(None) == "measured on a machine it does not name"
