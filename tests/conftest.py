"""Shared fixtures: a temporary GSM8K folder of the rows in :mod:`tests.helpers`, the real one,
the bundled model's tokenizer, a fake GGUF conversion (``fake_gguf``); and the ``needs_model`` mark on every test that reads the converted
model (``pytest -m "not needs_model"`` runs without it)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.helpers import ROWS, write_jsonl


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
    """The rows above with the course's columns (``grpo_course.core.data.parse_row``)."""
    from grpo_course.core.data import parse_row
    return [parse_row(r) for r in ROWS]


@pytest.fixture(scope="session")
def bundled_tokenizer():
    """The bundled model's tokenizer (left padding), read from the converted model's cache."""
    from transformers import AutoTokenizer

    from grpo_course.core.loading import bundled_model_dir

    tok = AutoTokenizer.from_pretrained(bundled_model_dir())
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def pytest_collection_modifyitems(items):
    """The tests that read the converted model: every ``slow`` one (it loads the real model) and
    every one that takes :func:`bundled_tokenizer`."""
    for item in items:
        if item.get_closest_marker("slow") or "bundled_tokenizer" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.needs_model)


@pytest.fixture
def fake_gguf(monkeypatch, tmp_path):
    """Replace the GGUF conversion by a tiny model, in a fresh cache, so the model cache's logic is
    tested in milliseconds. Returns a state: set ``["fail"] = True`` and the next tokenizer save
    is interrupted (a Ctrl-C while the converted copy is written)."""
    import transformers

    from grpo_course.core import loading
    from tests.helpers import FakeTokenizer, tiny_llama

    monkeypatch.setenv("GRPO_COURSE_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "pkg" / loading.GGUF_FILE
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(loading, "bundled_gguf_path", lambda: gguf)
    state = {"fail": False}
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        lambda *a, **k: FakeTokenizer(state["fail"]))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **k: tiny_llama())
    return state
