"""The README's figure, drawn from a shipped record (``data/learning_curve.json``).

    python tools/readme_figure.py          # -> book/images/readme_learning_curve.png

Each curve is a GRPO run of the reference recipe at one learning rate: its sampled pass@1 (8
answers to each of 128 validation problems, one line left) at each kept step, with the 95 %
interval over problems. Numbers come from the record; run it again after the record changes.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "data" / "learning_curve.json"
FIGURE = ROOT / "book" / "images" / "readme_learning_curve.png"


def draw(record: dict, out: Path) -> None:
    val = record["validation"]
    fig, ax = plt.subplots(figsize=(6.4, 3.4), dpi=110)
    for curve in record["curves"]:
        pts = curve["points"]
        steps = [p["step"] for p in pts]
        mean = [100 * p["pass_at_1"]["mean"] for p in pts]
        lo = [100 * p["pass_at_1"]["lo"] for p in pts]
        hi = [100 * p["pass_at_1"]["hi"] for p in pts]
        line, = ax.plot(steps, mean, marker="o", label=f"learning rate {curve['recipe']['learning_rate']:g}")
        ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.15)
    ax.set_xlabel("GRPO step (2 CPU cores)")
    ax.set_ylabel("sampled pass@1 (%)")
    ax.set_title(f"SmolLM2-135M, GSM8K validation rows (n = {val['n']}, {val['samples']} samples each),\n"
                 f"{val['lines_left']} line left to write; shaded: 95 % interval", fontsize=9)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, metadata={"Software": None})
    plt.close(fig)


if __name__ == "__main__":
    draw(json.loads(RECORD.read_text()), Path(sys.argv[1]) if len(sys.argv) > 1 else FIGURE)
    print(FIGURE.relative_to(ROOT))
