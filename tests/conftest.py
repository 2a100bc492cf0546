"""Shared fixtures: small GSM8K-style rows written here, a temporary GSM8K folder."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

ROWS = [
    {"question": "Tom has 3 apples and buys 4 more. How many apples does he have?",
     "answer": "Tom has 3 + 4 = <<3+4=7>>7 apples.\n#### 7"},
    {"question": "A book costs $1,200 and is discounted by $250. What is the new price?",
     "answer": "The price is 1200 - 250 = <<1200-250=950>>950 dollars.\n#### 950"},
    {"question": "It is 2 degrees and gets 5 degrees colder. What is the temperature?",
     "answer": "2 - 5 = <<2-5=-3>>-3.\nSo it is -3 degrees.\n#### -3"},
    {"question": "Ann splits 3 pizzas among 4 friends. How much pizza does each get?",
     "answer": "Each gets 3 / 4 = <<3/4=0.75>>0.75 pizzas.\n#### 0.75"},
    {"question": "Bob walks 2 km a day for 3 days, then 4 km a day for 2 days, then rests. "
                 "Then he walks 1 km. How far did he walk?",
     "answer": "First 2 * 3 = <<2*3=6>>6 km.\nThen 4 * 2 = <<4*2=8>>8 km.\nThen 1 km.\n"
               "In total 6 + 8 = <<6+8=14>>14.\nAnd 14 + 1 = <<14+1=15>>15 km.\n#### 15"},
    {"question": "A shop sells 1,000 pens at $2 each. How much money does it make?",
     "answer": "1000 * 2 = <<1000*2=2000>>2,000\n#### 2,000"},
]


def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture
def gsm8k_dir(tmp_path: Path) -> Path:
    """A GSM8K folder with the rows above as both train and test."""
    write_jsonl(tmp_path / "train.jsonl", ROWS)
    write_jsonl(tmp_path / "test.jsonl", ROWS)
    return tmp_path


@pytest.fixture
def real_gsm8k_dir() -> Path:
    """The real GSM8K folder from $GSM8K_DIR (skips where it is not set)."""
    folder = os.environ.get("GSM8K_DIR")
    if not folder or not Path(folder, "test.jsonl").is_file():
        pytest.skip("GSM8K_DIR is not set")
    return Path(folder)


@pytest.fixture(scope="session")
def course_rows() -> list[dict]:
    """The rows above with the course's columns (``grpo_course.data.parse_row``)."""
    from grpo_course.data import parse_row
    return [parse_row(r) for r in ROWS]
