"""Plotting helpers: benchmark results, the cost curve and live training curves."""
import json

import matplotlib

matplotlib.use("Agg")

from grpo_course.book.plotting import plot_cost_curve, read_throughput

RESULT = {"config": {"num_generations": 4, "threads": 2},
          "ours": {"s_per_step": 10.0, "completions_per_s": 0.8, "step_seconds": [9.0, 10.0],
                   "skipped_backward_steps": 1},
          "trl": {"s_per_step": 40.0, "completions_per_s": 0.2},
          "ratio": 4.0, "ok": True,
          "sweep": [{"num_generations": g, "length": n, "s_per_step": g * n / 100,
                     "completions_per_s": 2 * g / (g * n / 100)}
                    for g, n in [(2, 128), (4, 128), (8, 128), (4, 32), (4, 64)]]}


def test_read_throughput_flattens_numbers_and_keeps_the_raw_file(tmp_path):
    path = tmp_path / "throughput.json"
    assert read_throughput(path) is None
    path.write_text(json.dumps(RESULT))
    flat = read_throughput(path)
    assert flat["ours/completions_per_s"] == 0.8 and flat["ratio"] == 4.0
    assert flat["config/threads"] == 2.0
    assert "ok" not in flat and not any(k.startswith("sweep") for k in flat)  # no bools, no lists
    assert read_throughput(path, flat=False) == RESULT


def test_cost_curve_has_one_point_per_matching_sweep_row():
    fig = plot_cost_curve(RESULT["sweep"])
    by_g, by_len = (ax.lines[0].get_xydata().tolist() for ax in fig.axes)
    assert by_g == [[2, 2.56], [4, 5.12], [8, 10.24]]
    assert by_len == [[32, 1.28], [64, 2.56], [128, 5.12]]


def test_live_curves_redraw_every_run_in_its_panels():
    import matplotlib
    matplotlib.use("Agg")
    from grpo_course.book.plotting import LiveCurves

    curves = LiveCurves({"reward": "mean reward", "kl": "KL"})
    for step in range(3):
        curves.add("plain", step, {"reward": 0.5 * step, "kl": 0.0, "ignored": 1.0})
        curves.add("beta", step, {"reward": 0.1 * step, "kl": None})
    assert curves.points["plain"]["reward"] == ([0, 1, 2], [0.0, 0.5, 1.0])
    assert "kl" not in curves.points["beta"]                         # None: no point drawn
    assert [len(curves.axes[k].lines) for k in ("reward", "kl")] == [2, 1]
    assert curves.axes["reward"].get_title() == "mean reward"


def test_side_by_side_escapes_each_source_in_its_own_column():
    from grpo_course.book.plotting import side_by_side

    html = side_by_side({"TRL <1.16>": "if a < b:\n    pass", "ours": "x & y"}).data
    assert html.count('<div style="flex:1') == 2
    assert "TRL &lt;1.16&gt;" in html and "if a &lt; b:" in html and "x &amp; y" in html


def test_a_metrics_figure_says_what_its_bands_are():
    """Issue 84: no page said what plot_band's faint line, line and band are."""
    from grpo_course.book.plotting import plot_metrics

    rows = [{"phase": "grpo", "step": i, "reward": float(i % 3)} for i in range(8)]
    fig = plot_metrics(None, keys=("reward",), window=4, runs={"run": rows})
    assert any("mean of the last 4 steps" in t.get_text() and "standard deviation" in t.get_text()
               for t in fig.texts)
    assert fig.axes[0].get_ylabel() == "weighted reward, mean"     # every panel says what it counts
