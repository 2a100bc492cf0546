"""Caches keyed by the code that made them (grpo_course.fingerprint): editing the warm-up's or
the sampler's source starts a new warm start or evaluation instead of reusing a stale one, and
an unreadable cached evaluation is decoded again."""
from __future__ import annotations

import importlib
import os
import shutil

import pytest

from grpo_course import fingerprint
from grpo_course.config import GRPOConfig


def edited(module_name: str, tmp_path, monkeypatch) -> None:
    """Point ``module_name``'s ``__file__`` at a copy of its source with one line added."""
    module = importlib.import_module(module_name)
    copy = tmp_path / (module_name.replace(".", "_") + ".py")
    shutil.copy(module.__file__, copy)
    with open(copy, "a", encoding="utf-8") as fh:
        fh.write("\n# an edit\n")
    monkeypatch.setattr(module, "__file__", str(copy))
    fingerprint.source_hash.cache_clear()


@pytest.fixture(autouse=True)
def fresh_hashes():
    fingerprint.source_hash.cache_clear()
    yield
    fingerprint.source_hash.cache_clear()


def test_code_fingerprint_names_version_source_and_libraries():
    key = fingerprint.code_fingerprint("grpo_course.train")
    assert key["package"] and len(key["source"]) == 20
    assert set(key["libraries"]) == {"torch", "transformers", "peft", "trl"}
    assert key["libraries"]["torch"].startswith("2.")
    assert fingerprint.source_hash("grpo_course.train", "grpo_course.grpo") == \
        fingerprint.source_hash("grpo_course.grpo", "grpo_course.train")


def test_changing_the_sft_code_changes_the_warm_start_key(course_rows, tmp_path, monkeypatch):
    from grpo_course.warmstart import warm_start_key
    cfg = GRPOConfig(sft_steps=2, sft_batch_size=1)
    before = warm_start_key(cfg, course_rows)
    assert warm_start_key(cfg, course_rows) == before
    edited("grpo_course.train", tmp_path, monkeypatch)           # the SFT loop lives there
    assert warm_start_key(cfg, course_rows) != before


@pytest.fixture
def evaluate_tiny(gsm8k_dir, tmp_path, monkeypatch):
    """``run()``: a cached greedy evaluation of a tiny model on two rows, in a fresh cache."""
    from grpo_course import evaluate as ev
    from grpo_course.data import load_gsm8k
    from tests.helpers import tiny_model, tiny_tokenizer

    monkeypatch.setenv("GRPO_COURSE_CACHE", str(tmp_path / "cache"))
    model, tok = tiny_model(), tiny_tokenizer()
    rows = load_gsm8k("test", data_dir=gsm8k_dir, limit=2)
    return lambda: ev.evaluate_model(model, tok, rows, batch_size=2, max_new_tokens=4,
                                     progress=False, cache=True, sampling_dtype="float32")


def test_changing_the_sampler_changes_the_evaluation_key(evaluate_tiny, tmp_path, monkeypatch):
    first = evaluate_tiny()
    assert not first.cached and evaluate_tiny().cached
    edited("grpo_course.sampling", tmp_path, monkeypatch)
    again = evaluate_tiny()
    assert not again.cached and again.records == first.records
    assert len(list((tmp_path / "cache" / "evals").glob("*.json"))) == 2


def test_a_truncated_cached_evaluation_is_decoded_again(evaluate_tiny, tmp_path, capsys):
    first = evaluate_tiny()
    (stored,) = (tmp_path / "cache" / "evals").glob("*.json")
    stored.write_text(stored.read_text()[:40])                    # cut short, as a full disk leaves it
    again = evaluate_tiny()
    assert not again.cached and again.records == first.records
    assert "unreadable" in capsys.readouterr().out
    assert evaluate_tiny().cached                                  # rewritten whole


def test_file_hash_follows_the_bytes(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"a" * 1000)
    first = fingerprint.file_hash(path)
    assert fingerprint.file_hash(path) == first
    path.write_bytes(b"b" * 1000)              # same size, other bytes, another mtime
    os.utime(path, ns=(1, 1))
    assert fingerprint.file_hash(path) != first


def test_data_hash_follows_every_row():
    rows = [{"question": "q1", "answer": "1"}, {"question": "q2", "answer": "2"}]
    assert fingerprint.data_hash(rows) == fingerprint.data_hash([dict(r) for r in rows])
    assert fingerprint.data_hash(rows) != fingerprint.data_hash([rows[0], {**rows[1], "answer": "3"}])
    assert fingerprint.data_hash(rows) != fingerprint.data_hash(rows[:1])
