import json

import pytest

from grpo_course.core.answers import extract_hash_answer, normalize_number
from grpo_course.core.data import (
    DataError,
    count_steps,
    difficulty,
    last_number,
    load_gsm8k,
    parse_row,
    read_jsonl,
)
from tests.helpers import ROWS, write_jsonl


@pytest.mark.parametrize("text, expected", [
    ("72", "72"), ("1,000", "1000"), ("1,000.50", "1000.5"), ("$1,200", "1200"),
    ("-3", "-3"), ("\u22123", "-3"), ("0.50", "0.5"), (".5", "0.5"), ("7.0", "7"),
    ("3/4", "0.75"), ("12%", "12"), ("1e3", "1000"), ("-0", "0"), ("5.", "5"),
    ("", None), ("seven", None), ("1/0", None), ("1.2.3", None), (None, None),
])
def test_normalize_number(text, expected):
    assert normalize_number(text) == expected


@pytest.mark.parametrize("completion, expected", [
    ("so 9*2=18\n#### 18", "18"),
    ("#### $1,250.00", "1250"),
    ("#### -2 dollars", "-2"),
    ("#### 5\nthen\n#### 7", "7"),
    ("The answer is 18.", None),
    ("####", None),
    ("", None),
])
def test_extract_hash_answer(completion, expected):
    assert extract_hash_answer(completion) == expected


def test_last_number():
    assert last_number("first 3, then 4,500.25 total.") == "4500.25"
    assert last_number("no digits") is None


def test_steps_and_strata():
    assert count_steps("a\nb\n#### 3") == 2
    assert [difficulty(n) for n in (1, 2, 3, 4, 5, 8)] == [
        "basic", "basic", "intermediate", "intermediate", "advanced", "advanced"]


def test_parse_row_columns():
    row = parse_row(ROWS[4])
    assert row["answer"] == "15" and row["num_steps"] == 5 and row["difficulty"] == "advanced"
    assert row["num_calculations"] == 4
    assert parse_row(ROWS[5])["answer"] == "2000"


def test_load_from_dir_argument(gsm8k_dir):
    ds = load_gsm8k("test", data_dir=gsm8k_dir)
    assert len(ds) == len(ROWS)
    assert {"question", "solution", "answer", "num_steps", "difficulty", "idx"} <= set(ds.column_names)
    assert ds["answer"] == ["7", "950", "-3", "0.75", "15", "2000"]
    assert ds["idx"] == list(range(len(ROWS)))


def test_limit_offset_and_env(gsm8k_dir, monkeypatch):
    monkeypatch.setenv("GSM8K_DIR", str(gsm8k_dir))
    ds = load_gsm8k("train", limit=2, offset=1)
    assert ds["answer"] == ["950", "-3"] and ds["idx"] == [1, 2]


@pytest.mark.parametrize("bad, message", [
    ({"question": "q?", "answer": "no marker 5"}, "no '#### <answer>' line"),
    ({"question": "q?", "answer": "work\n#### five"}, "is not a number"),
    ({"question": "q?"}, "expected keys"),
    ({"question": "", "answer": "#### 1"}, "empty"),
])
def test_malformed_row_names_file_and_line(tmp_path, bad, message):
    path = write_jsonl(tmp_path / "train.jsonl", [ROWS[0], bad])
    with pytest.raises(DataError) as err:
        read_jsonl(path)
    assert f"{path}:2" in str(err.value) and message in str(err.value)


def test_invalid_json_line(tmp_path):
    path = tmp_path / "test.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n{not json\n")
    with pytest.raises(DataError, match=r"test.jsonl:2: not valid JSON"):
        read_jsonl(path)


def test_missing_data_dir(tmp_path, monkeypatch):
    with pytest.raises(DataError, match="does not exist"):
        load_gsm8k("test", data_dir=tmp_path / "nowhere")
    monkeypatch.setenv("GSM8K_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(DataError, match=r"\$GSM8K_DIR"):
        load_gsm8k("test")


def test_missing_split_file(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", ROWS)
    with pytest.raises(DataError, match="test.jsonl is missing"):
        load_gsm8k("test", data_dir=tmp_path)


def test_unknown_split(gsm8k_dir):
    with pytest.raises(DataError, match="split must be one of"):
        load_gsm8k("validation", data_dir=gsm8k_dir)


def test_real_gsm8k_parses(real_gsm8k_dir):
    ds = load_gsm8k("test", data_dir=real_gsm8k_dir)
    assert len(ds) == 1319
    assert set(ds["difficulty"]) == {"basic", "intermediate", "advanced"}
    assert all(normalize_number(a) == a for a in ds["answer"])


def test_strip_calculations():
    from grpo_course.core.data import strip_calculations
    assert strip_calculations(ROWS[0]["answer"]) == "Tom has 3 + 4 = 7 apples.\n#### 7"


# ---------------------------------------------------------------- reverse-curriculum starts
def _rows(raw=ROWS):
    import datasets
    return datasets.Dataset.from_list([{**parse_row(r), "idx": i} for i, r in enumerate(raw)])


def test_work_lines_drop_annotations_and_the_answer_line():
    from grpo_course.core.data import work_lines
    assert work_lines(ROWS[4]["answer"]) == ["First 2 * 3 = 6 km.", "Then 4 * 2 = 8 km.", "Then 1 km.",
                                             "In total 6 + 8 = 14.", "And 14 + 1 = 15 km."]
    assert work_lines("#### 3") == [] and work_lines("") == []


@pytest.mark.parametrize("lines_left, expected", [
    (1, "First 2 * 3 = 6 km.\nThen 4 * 2 = 8 km.\nThen 1 km.\nIn total 6 + 8 = 14.\n"),
    (4, "First 2 * 3 = 6 km.\n"),
    (5, ""),            # as many lines left as the solution has: the whole problem
    (6, None),          # more than it has: no such start
    (None, ""),
])
def test_gold_start_leaves_the_last_lines(lines_left, expected):
    from grpo_course.core.data import gold_start
    assert gold_start(ROWS[4]["answer"], lines_left) == expected


def test_gold_start_of_a_one_line_solution():
    from grpo_course.core.data import gold_start
    one = ROWS[0]["answer"]
    assert gold_start(one, 1) == "" and gold_start(one, 2) is None and gold_start(one, None) == ""


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_gold_start_rejects_a_bad_lines_left(bad):
    from grpo_course.core.data import gold_start
    with pytest.raises(DataError, match="lines_left must be a whole number >= 1"):
        gold_start(ROWS[4]["answer"], bad)


def test_gold_starts_add_columns_and_skip_short_solutions():
    from grpo_course.core.data import gold_starts
    rows = _rows()
    two = gold_starts(rows, 2)
    assert list(two["idx"]) == [2, 4]                    # the two solutions with >= 2 work lines
    assert list(two["lines_left"]) == [2, 2]
    assert two[0]["start"] == "" and two[1]["start"].count("\n") == 3
    whole = gold_starts(rows, None)
    assert len(whole) == len(rows) and set(whole["start"]) == {""}
    assert list(whole["lines_left"]) == list(rows["num_steps"])
    again = gold_starts(two, 1)                           # a start of starts replaces the columns
    assert list(again["lines_left"]) == [1, 1] and again[1]["start"].count("\n") == 4


def test_gold_starts_by_stratum():
    from grpo_course.core.data import gold_starts
    rows = _rows()
    basic = gold_starts(rows, 1, strata=["basic"])
    assert set(basic["difficulty"]) == {"basic"} and len(basic) == 5
    with pytest.raises(DataError, match="unknown stratum 'easy'"):
        gold_starts(rows, 1, strata=["easy"])


def test_start_prompt_continues_the_answer():
    from grpo_course.core.data import chat_prompt, gold_starts, start_prompt, start_prompts
    from tests.helpers import tiny_tokenizer
    tok = tiny_tokenizer()
    row = gold_starts(_rows(), 1)[4]
    assert start_prompt(row, tok) == chat_prompt(row["question"], tok) + row["start"]
    assert start_prompt({"question": "q"}, tok) == chat_prompt("q", tok)
    batch = {"question": ["q", "r"], "start": ["a\n", ""]}
    assert start_prompts(batch, tok) == [chat_prompt("q", tok) + "a\n", chat_prompt("r", tok)]
    assert start_prompts({"question": ["q"]}, tok) == [chat_prompt("q", tok)]
