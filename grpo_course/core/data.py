"""GSM8K: loading, difficulty strata and chat prompts (answers are normalized by
:mod:`grpo_course.core.answers`).

Source order for :func:`load_gsm8k`: the ``data_dir`` argument, then the
environment variable ``GSM8K_DIR`` (a folder with ``train.jsonl`` and
``test.jsonl``), then ``datasets.load_dataset("openai/gsm8k", "main")``.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from grpo_course.core.answers import extract_hash_answer, normalize_number
from grpo_course.core.calculator import calculator_solution
from grpo_course.infra.errors import CourseError
from grpo_course.infra.progress import library_bars_off

DATA_ENV = "GSM8K_DIR"
SPLITS = ("train", "test")
STRATA = ("basic", "intermediate", "advanced")

#: The answer format the course teaches: GSM8K's own final line ``#### <number>``.
SYSTEM_PROMPT = (
    "You are a careful math tutor. Solve the problem step by step, one short "
    "calculation per line. Then write the final answer on its own last line as "
    "'#### <number>' with nothing after it."
)

_CALC = re.compile(r"<<[^<>]*>>")
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


class DataError(CourseError, ValueError):
    """Missing or malformed data (the message names the file and line)."""


# ---------------------------------------------------------------- numbers
def last_number(text: str) -> str | None:
    """The last number written in free text, normalized (``None`` if there is none)."""
    found = _NUMBER.findall(text or "")
    for candidate in reversed(found):
        value = normalize_number(candidate)
        if value is not None:
            return value
    return None


# ---------------------------------------------------------------- rows
def count_steps(solution: str) -> int:
    """Reasoning steps of a GSM8K solution: its non-empty lines before ``####``."""
    work = solution.rsplit("####", 1)[0]
    return sum(1 for line in work.splitlines() if line.strip())


def difficulty(num_steps: int) -> str:
    """Stratum by step count: basic (<= 2), intermediate (3-4), advanced (>= 5)."""
    if num_steps <= 2:
        return "basic"
    return "intermediate" if num_steps <= 4 else "advanced"


def parse_row(raw: dict[str, Any], where: str = "row") -> dict[str, Any]:
    """One raw GSM8K record ``{"question", "answer"}`` -> the course's columns."""
    if not isinstance(raw, dict) or "question" not in raw or "answer" not in raw:
        keys = sorted(raw) if isinstance(raw, dict) else type(raw).__name__
        raise DataError(f"{where}: expected keys 'question' and 'answer', got {keys}")
    question, solution = raw["question"], raw["answer"]
    if not isinstance(question, str) or not question.strip():
        raise DataError(f"{where}: 'question' is empty or not text")
    if not isinstance(solution, str) or "####" not in solution:
        raise DataError(f"{where}: the solution has no '#### <answer>' line")
    tail = solution.rsplit("####", 1)[1].strip()
    answer = normalize_number(tail)
    if answer is None:
        raise DataError(f"{where}: the final answer {tail!r} is not a number")
    steps = count_steps(solution)
    return {"question": question.strip(), "solution": solution.strip(), "answer": answer,
            "num_steps": steps, "num_calculations": len(_CALC.findall(solution)),
            "difficulty": difficulty(steps)}


def read_jsonl(path: Path, limit: int | None = None, offset: int = 0) -> list[dict[str, Any]]:
    """Parse a GSM8K jsonl file; a malformed line raises :class:`DataError` naming it."""
    rows: list[dict[str, Any]] = []
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise DataError(f"{path} cannot be read: {exc.strerror or exc}") from None
    with fh:
        for lineno, raw_line in enumerate(fh, start=1):
            where = f"{path}:{lineno}"
            try:
                line = raw_line.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(f"{where}: not UTF-8 text (byte {raw_line[exc.start]:#04x} at "
                                f"column {exc.start + 1})") from None
            if not line.strip():
                continue
            if lineno <= offset:
                continue
            try:
                raw = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{where}: not valid JSON ({exc.msg})") from None
            rows.append(parse_row(raw, where))
            if limit is not None and len(rows) >= limit:
                break
    return rows


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path | None:
    """The local GSM8K folder to read, or ``None`` to use the Hugging Face hub."""
    chosen = data_dir if data_dir is not None else os.environ.get(DATA_ENV) or None
    if chosen is None:
        return None
    path = Path(chosen).expanduser()
    source = "data_dir" if data_dir is not None else f"${DATA_ENV}"
    if not path.is_dir():
        raise DataError(f"GSM8K folder {str(path)!r} (from {source}) does not exist; point "
                        f"{source} at a folder holding train.jsonl and test.jsonl")
    return path


def load_gsm8k(split: str = "train", data_dir: str | os.PathLike | None = None,
               limit: int | None = None, offset: int = 0):
    """GSM8K ``split`` as a :class:`datasets.Dataset` with columns ``question``,
    ``solution``, ``answer`` (normalized gold number as a string), ``num_steps``,
    ``num_calculations``, ``difficulty`` and ``idx`` (row number in the split)."""
    import datasets

    if split not in SPLITS:
        raise DataError(f"split must be one of {SPLITS}, got {split!r}")
    if offset < 0 or (limit is not None and limit <= 0):
        raise DataError(f"the first row (offset) must be >= 0 and the number of rows > 0; got "
                        f"offset={offset}, limit={limit}")
    folder = resolve_data_dir(data_dir)
    if folder is not None:
        path = folder / f"{split}.jsonl"
        if not path.is_file():
            raise DataError(f"{path} is missing: the GSM8K folder needs {split}.jsonl")
        rows = read_jsonl(path, limit=limit, offset=offset)
    else:
        try:
            hub = datasets.load_dataset("openai/gsm8k", "main", split=split)
        except Exception as exc:  # offline, no cache
            raise DataError(
                f"could not load openai/gsm8k from the Hugging Face hub ({type(exc).__name__}); "
                f"offline, set ${DATA_ENV} to a folder with train.jsonl and test.jsonl") from exc
        stop = len(hub) if limit is None else min(len(hub), offset + limit)
        rows = [parse_row(hub[i], f"openai/gsm8k[{split}][{i}]") for i in range(offset, stop)]
    for i, row in enumerate(rows):
        row["idx"] = offset + i
    return datasets.Dataset.from_list(rows)


# ---------------------------------------------------------------- prompts
def chat_messages(question: str, system_prompt: str = SYSTEM_PROMPT) -> list[dict[str, str]]:
    """The conversation the model sees (TRL's conversational prompt format)."""
    return [{"role": "system", "content": system_prompt},
            {"role": "user", "content": question}]


def chat_prompt(question: str, tokenizer, system_prompt: str = SYSTEM_PROMPT) -> str:
    """The chat-template text of one problem, ending where the assistant starts."""
    return tokenizer.apply_chat_template(chat_messages(question, system_prompt),
                                         tokenize=False, add_generation_prompt=True)


def chat_prompts(questions: Iterable[str], tokenizer,
                 system_prompt: str = SYSTEM_PROMPT) -> list[str]:
    return [chat_prompt(q, tokenizer, system_prompt) for q in questions]


def solution_results(solution: str) -> list[str]:
    """The normalized results of a GSM8K solution's steps, in order: each ``<<a*b=c>>``
    calculator annotation's ``c``, then the final answer (duplicates kept once).

    >>> solution_results("She sold 48/2 = <<48/2=24>>24 in May.\\n48+24 = <<48+24=72>>72\\n#### 72")
    ['24', '72']
    """
    found = [normalize_number(m[2:-2].split("=")[-1]) for m in _CALC.findall(solution or "")]
    final = extract_hash_answer(solution or "")
    out: list[str] = []
    for value in found + [final]:
        if value is not None and value not in out:
            out.append(value)
    return out


def strip_calculations(solution: str) -> str:
    """A GSM8K solution without its ``<<a*b=c>>`` calculator annotations."""
    return _CALC.sub("", solution).strip()


# ---------------------------------------------------------------- reverse-curriculum starts
def work_lines(solution: str, calculator: bool = False) -> list[str]:
    """The work lines of a GSM8K solution (before ``####``), calculator annotations removed, or
    with ``calculator`` kept as the calculator writes them
    (:func:`~grpo_course.core.calculator.calculator_solution`).

    >>> work_lines("48/2 = <<48/2=24>>24\\n48+24 = <<48+24=72>>72\\n#### 72")
    ['48/2 = 24', '48+24 = 72']
    """
    work = (solution or "").rsplit("####", 1)[0]
    work = calculator_solution(work) if calculator else strip_calculations(work)
    return [line.strip() for line in work.splitlines() if line.strip()]


def gold_start(solution: str, lines_left: int | None, calculator: bool = False) -> str | None:
    """The beginning of the assistant's answer that leaves ``lines_left`` work lines (and the
    ``#### N`` line) to write: the gold solution's first lines, one per line, each ending in a
    newline (R3's reverse curriculum, arXiv 2402.05808). ``None`` (or as many lines as the
    solution has) is the whole problem: an empty start. A solution with fewer work lines than
    ``lines_left`` has no such start: ``None``. ``calculator``: the lines keep their annotations."""
    lines = work_lines(solution, calculator)
    if lines_left is None:
        return ""
    check_lines_left(lines_left)
    if lines_left > len(lines):
        return None
    return "".join(line + "\n" for line in lines[:len(lines) - lines_left])


def check_lines_left(lines_left) -> int:
    """``lines_left`` as a positive integer, or a :class:`DataError` naming the bad value."""
    if isinstance(lines_left, bool) or not isinstance(lines_left, int) or lines_left < 1:
        raise DataError(f"lines_left must be a whole number >= 1 (work lines the model writes "
                        f"itself) or none for whole problems; got {lines_left!r}")
    return lines_left


def gold_starts(dataset, lines_left: int | None, strata: Iterable[str] | None = None,
                calculator: bool = False):
    """The rows of ``dataset`` (from :func:`load_gsm8k`) as starts: a ``start`` column (the
    answer's given beginning, see :func:`gold_start`) and a ``lines_left`` column (work lines
    the model writes; a whole problem's is its ``num_steps``). Rows of other ``strata`` and rows
    with fewer work lines than ``lines_left`` are left out (``len(dataset) - len(result)`` says
    how many)."""
    if strata is not None:
        strata = set(strata)
        unknown = strata - set(STRATA)
        if unknown:
            raise DataError(f"unknown stratum {sorted(unknown)[0]!r}; choose from {', '.join(STRATA)}")
    keep, starts, left = [], [], []
    for i, row in enumerate(dataset):
        if strata is not None and row["difficulty"] not in strata:
            continue
        start = gold_start(row["solution"], lines_left, calculator)
        if start is None:
            continue
        keep.append(i)
        starts.append(start)
        left.append(len(work_lines(row["solution"])) if lines_left is None else lines_left)
    return _with_columns(dataset.select(keep), {"start": starts, "lines_left": left})


def mixed_starts(dataset, starts: list[int | None], calculator: bool = False):
    """``dataset``'s problems, each at each of ``starts`` (``lines_left`` values, ``None`` for the
    whole problem): R3's mix (arXiv 2402.05808), one row a (problem, start) pair, problem by
    problem, with :func:`gold_starts`' ``start`` and ``lines_left`` columns and a ``problem``
    column (the row of ``dataset``). A start a problem has not (more lines left than it has) is
    left out, and so is a start whose text another of its starts has (a problem of K lines at K
    lines left is its whole problem)."""
    if not hasattr(dataset, "select"):          # a list of rows
        from datasets import Dataset
        dataset = Dataset.from_list(list(dataset))
    keep, texts, left, problem = [], [], [], []
    for i, row in enumerate(dataset):
        seen = set()
        for k in starts:
            start = gold_start(row["solution"], k, calculator)
            if start is None or start in seen:
                continue
            seen.add(start)
            keep.append(i)
            texts.append(start)
            left.append(len(work_lines(row["solution"])) if start == "" else k)
            problem.append(i)
    return _with_columns(dataset.select(keep), {"start": texts, "lines_left": left, "problem": problem})


def _with_columns(dataset, columns: dict[str, list]):
    """``dataset`` with ``columns`` added, each replacing a column of its name. On a selection
    ``add_column`` first copies the selected rows, with a progress bar of its own: hidden here,
    since a page would keep it as a stray line beside its results."""
    with library_bars_off("datasets"):
        for name, values in columns.items():
            if name in dataset.column_names:
                dataset = dataset.remove_columns(name)
            dataset = dataset.add_column(name, values)
    return dataset


def start_names(rows: dict[str, list]) -> list[str]:
    """Each row's start as ``start_mix`` names it: ``whole`` (an empty start) or its lines left;
    ``[]`` for rows without starts (a run at one start)."""
    if "start" not in rows or "lines_left" not in rows:
        return []
    return ["whole" if not s else str(k) for s, k in zip(rows["start"], rows["lines_left"], strict=True)]


def start_prompt(row: dict[str, Any], tokenizer, system_prompt: str = SYSTEM_PROMPT) -> str:
    """The prompt text of one row: its chat prompt, then its ``start`` (if it has one), so
    the model continues the answer from there."""
    return chat_prompt(row["question"], tokenizer, system_prompt) + (row.get("start") or "")


def start_prompts(rows: dict[str, list], tokenizer, system_prompt: str = SYSTEM_PROMPT,
                  lines_left: int | None = None, calculator: bool = False) -> list[str]:
    """:func:`start_prompt` of each row of a column batch (``{"question": [...], ...}``): each
    chat prompt, continued by the row's ``start`` column where the batch has one, else by the
    gold start of ``lines_left`` (a problem with that many lines or fewer starts whole)."""
    if lines_left is not None and "start" not in rows:
        rows = {**rows, "start": [gold_start(sol, lines_left, calculator) or ""
                                  for sol in rows["solution"]]}
    starts = rows.get("start") or [""] * len(rows["question"])
    return [start_prompt({"question": q, "start": s}, tokenizer, system_prompt)
            for q, s in zip(rows["question"], starts, strict=True)]


def sft_text(question: str, solution: str, tokenizer,
             system_prompt: str = SYSTEM_PROMPT, calculator: bool = False) -> tuple[str, str]:
    """(prompt, target) for supervised warm-up: the target is the GSM8K solution
    without calculator annotations (with ``calculator``: with them, each result written as the
    calculator writes it), ending with ``#### N`` and the end-of-turn token."""
    work = calculator_solution(solution).strip() if calculator else strip_calculations(solution)
    end = tokenizer.eos_token or ""
    return chat_prompt(question, tokenizer, system_prompt), work + end


def prompt_order(dataset, shuffled: list[int], how: str) -> list[int]:
    """GRPO's prompt order over ``dataset``: ``"random"``, the ``shuffled`` row numbers;
    ``"easy_first"``, the same shuffle sorted by difficulty stratum, basic first (a stable sort
    keeps the shuffle within a stratum); ``"sequential"``, the data set's own order, as TRL's
    ``shuffle_dataset=False`` (chapter 4: the two trainers then draw the same prompts)."""
    if how == "random":
        return shuffled
    if how == "sequential":
        return list(range(len(dataset)))
    column = dataset["difficulty"] if hasattr(dataset, "column_names") else \
        [r["difficulty"] for r in dataset]
    rank = {s: k for k, s in enumerate(STRATA)}
    return sorted(shuffled, key=lambda i: rank.get(column[i], len(STRATA)))


def select_columns(dataset, ids: list[int]) -> dict[str, list]:
    """Rows ``ids`` of ``dataset`` (a ``datasets.Dataset`` or a list of dicts) as columns."""
    rows = list(dataset.select(ids) if hasattr(dataset, "select") else [dataset[i] for i in ids])
    return {k: [r[k] for r in rows] for k in rows[0]}
