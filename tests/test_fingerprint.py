"""Caches keyed by the code that made them (grpo_course.infra.fingerprint): editing the warm-up's or
the sampler's source starts a new warm start or evaluation instead of reusing a stale one, and
an unreadable cached evaluation is decoded again."""
from __future__ import annotations

import importlib
import os
import shutil

import pytest

from grpo_course.config import GRPOConfig
from grpo_course.infra import fingerprint


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
    fingerprint.package_imports.cache_clear()
    yield
    fingerprint.source_hash.cache_clear()
    fingerprint.package_imports.cache_clear()


def test_a_key_follows_the_imports_so_a_new_import_cannot_escape_it(tmp_path, monkeypatch):
    """The module set of a key is read from the import statements: editing a module the producer
    does not import leaves its key alone; once an import reaches that module, its edits count."""
    pkg = tmp_path / "keypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "producer.py").write_text("from .helper import f\n")
    (pkg / "helper.py").write_text("def f():\n    from keypkg import deep\n    return deep.g()\n")
    (pkg / "deep.py").write_text("def g():\n    return 1\n")
    (pkg / "later.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def key() -> str:
        fingerprint.source_hash.cache_clear()
        fingerprint.package_imports.cache_clear()
        return fingerprint.code_fingerprint("keypkg.producer")["source"]

    assert fingerprint.package_imports("keypkg.producer") == \
        ("keypkg.deep", "keypkg.helper", "keypkg.producer")   # a function's import counts
    before = key()
    (pkg / "later.py").write_text("X = 2\n")
    assert key() == before                                   # not imported: not in the key
    (pkg / "deep.py").write_text("from . import later\n\ndef g():\n    return later.X\n")
    with_import = key()
    assert with_import != before and "keypkg.later" in fingerprint.package_imports("keypkg.producer")
    (pkg / "later.py").write_text("X = 3\n")
    assert key() != with_import                              # imported now: its edits count


def test_the_course_keys_cover_what_their_producers_import():
    """Before: the evaluation key named its modules by hand and left out models (which loads the
    weights it decodes) and train (which it imported then)."""
    evaluation = fingerprint.package_imports("grpo_course.measure.evaluate")
    assert {"grpo_course.core.loading", "grpo_course.core.sampling", "grpo_course.core.answers",
            "grpo_course.core.rewards", "grpo_course.core.data"} <= set(evaluation)
    assert {"grpo_course.core.train", "grpo_course.core.sampling", "grpo_course.core.rewards",
            "grpo_course.core.precision"} <= set(fingerprint.package_imports("grpo_course.core.warmstart"))


def test_code_fingerprint_names_version_source_and_libraries():
    key = fingerprint.code_fingerprint("grpo_course.core.train")
    assert key["package"] and len(key["source"]) == 20
    assert set(key["libraries"]) == {"torch", "transformers", "peft", "trl"}
    assert key["libraries"]["torch"].startswith("2.")
    assert fingerprint.source_hash("grpo_course.core.train", "grpo_course.core.grpo") == \
        fingerprint.source_hash("grpo_course.core.grpo", "grpo_course.core.train")


def test_changing_the_sft_code_changes_the_warm_start_key(course_rows, tmp_path, monkeypatch):
    from grpo_course.core.warmstart import warm_start_key
    cfg = GRPOConfig(sft_steps=2, sft_batch_size=1)
    before = warm_start_key(cfg, course_rows)
    assert warm_start_key(cfg, course_rows) == before
    edited("grpo_course.core.sft", tmp_path, monkeypatch)             # the SFT loop lives there
    assert warm_start_key(cfg, course_rows) != before


@pytest.fixture
def evaluate_tiny(gsm8k_dir, tmp_path, monkeypatch):
    """``run()``: a cached greedy evaluation of a tiny model on two rows, in a fresh cache."""
    from grpo_course.core.data import load_gsm8k
    from grpo_course.measure import evaluate as ev
    from tests.helpers import tiny_model, tiny_tokenizer

    monkeypatch.setenv("GRPO_COURSE_CACHE", str(tmp_path / "cache"))
    model, tok = tiny_model(), tiny_tokenizer()
    rows = load_gsm8k("test", data_dir=gsm8k_dir, limit=2)
    return lambda: ev.evaluate_model(model, tok, rows, batch_size=2, max_new_tokens=4,
                                     progress=False, cache=True, sampling_dtype="float32")


def test_changing_the_sampler_changes_the_evaluation_key(evaluate_tiny, tmp_path, monkeypatch):
    first = evaluate_tiny()
    assert not first.cached and evaluate_tiny().cached
    edited("grpo_course.core.sampling", tmp_path, monkeypatch)
    again = evaluate_tiny()
    assert not again.cached and again.records == first.records
    assert len(list((tmp_path / "cache" / "evals").glob("*.json"))) == 2


def test_a_truncated_cached_evaluation_is_decoded_again(evaluate_tiny, tmp_path, capsys):
    first = evaluate_tiny()
    (stored,) = (tmp_path / "cache" / "evals").glob("*.json")
    stored.write_text(stored.read_text()[:40])                    # cut short, as a full disk leaves it
    again = evaluate_tiny()
    assert not again.cached and again.records == first.records
    assert "unreadable" in capsys.readouterr().err
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


def test_a_keyed_cache_file_is_read_back_only_when_whole_and_usable(tmp_path, monkeypatch, capsys):
    from grpo_course.infra.atomic import write_json_atomic
    from grpo_course.infra.paths import keyed_cache_file, read_cached

    monkeypatch.setenv("GRPO_COURSE_CACHE", str(tmp_path))
    key = {"weights": "abc", "rows": [1, 2]}
    path = keyed_cache_file("pools", key)
    assert path.parent == tmp_path / "pools"
    assert keyed_cache_file("pools", dict(reversed(key.items()))) == path     # key order is not a key
    assert keyed_cache_file("pools", {**key, "rows": [1, 3]}) != path

    def usable(s):
        return s["rows"] == [1, 2]

    assert read_cached(path, usable) is None and capsys.readouterr().err == ""  # none yet: silent
    write_json_atomic(path, {"rows": [1, 2], "value": 7})
    assert read_cached(path, usable) == {"rows": [1, 2], "value": 7}
    assert read_cached(path, lambda s: s["missing"]) is None                # stale: computed again
    path.write_text(path.read_text()[:9])                                   # cut short
    assert read_cached(path, usable) is None
    assert capsys.readouterr().err.count("unreadable") == 2
