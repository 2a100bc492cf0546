"""atomic_write: a writer interrupted mid-save (fault injection) leaves the old target intact."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo_course.infra import atomic
from grpo_course.infra.atomic import atomic_write, write_json_atomic, write_text_atomic
from tests.helpers import tiny_llama


class Boom(Exception):
    """The injected fault."""


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (relative path -> bytes)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def siblings(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir())


def test_file_is_replaced_whole_and_failure_keeps_the_old_one(tmp_path):
    target = tmp_path / "sub" / "result.json"
    write_json_atomic(target, {"a": 1})
    assert json.loads(target.read_text()) == {"a": 1}

    def half_then_crash(tmp: Path) -> None:
        tmp.write_text('{"a": 2, "b": ')          # half the new file is on disk
        raise Boom
    with pytest.raises(Boom):
        atomic_write(target, half_then_crash)
    assert json.loads(target.read_text()) == {"a": 1}
    assert siblings(target) == ["result.json"]        # no temporary left behind
    write_text_atomic(target, "new")
    assert target.read_text() == "new"


def test_folder_swap_keeps_the_old_folder_on_failure(tmp_path):
    target = tmp_path / "ckpt"
    atomic_write(target, lambda tmp: (tmp / "state.pt").write_bytes(b"old"), folder=True)
    before = snapshot(target)

    def crash(tmp: Path) -> None:
        (tmp / "state.pt").write_bytes(b"new, half")
        raise KeyboardInterrupt                      # Ctrl-C in the middle of a save
    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, crash, folder=True)
    assert snapshot(target) == before and siblings(target) == ["ckpt"]
    atomic_write(target, lambda tmp: (tmp / "other").write_bytes(b"x"), folder=True)
    assert snapshot(target) == {"other": b"x"}       # a folder is replaced, not merged


def test_failed_rename_puts_the_old_folder_back(tmp_path, monkeypatch):
    target = tmp_path / "model"
    atomic_write(target, lambda tmp: (tmp / "w").write_bytes(b"old"), folder=True)
    real, calls = os.replace, []

    def flaky(src, dst):
        calls.append((Path(src).name, Path(dst).name))
        if len(calls) == 2:                           # old -> backup worked; new -> target fails
            raise OSError("disk full")
        real(src, dst)
    monkeypatch.setattr(atomic.os, "replace", flaky)
    with pytest.raises(OSError, match="disk full"):
        atomic_write(target, lambda tmp: (tmp / "w").write_bytes(b"new"), folder=True)
    monkeypatch.undo()
    assert calls[0] == ("model", ".model.old")
    assert snapshot(target) == {"w": b"old"} and siblings(target) == ["model"]


def test_crash_between_the_two_renames_is_recovered(tmp_path):
    target = tmp_path / "model"
    target.with_name(".model.old").mkdir()           # what a kill -9 after old -> backup leaves
    (target.with_name(".model.old") / "w").write_bytes(b"old")

    def look(tmp: Path) -> None:
        assert (target / "w").read_bytes() == b"old"  # the old folder is back before writing
        raise Boom
    with pytest.raises(Boom):
        atomic_write(target, look, folder=True)
    assert snapshot(target) == {"w": b"old"} and siblings(target) == ["model"]


def test_keep_carries_other_entries_and_new_files_win(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoint").mkdir(parents=True)
    (run / "checkpoint" / "state.pt").write_bytes(b"ckpt")
    (run / "metrics.jsonl").write_text("{}\n")
    (run / "adapter.bin").write_bytes(b"v1")
    atomic_write(run, lambda tmp: (tmp / "adapter.bin").write_bytes(b"v2"), folder=True, keep=True)
    assert snapshot(run) == {"adapter.bin": b"v2", "checkpoint/state.pt": b"ckpt",
                             "metrics.jsonl": b"{}\n"}
    with pytest.raises(ValueError, match="folder=True"):
        atomic_write(tmp_path / "f", lambda tmp: None, keep=True)


def test_killed_process_leaves_the_old_file(tmp_path):
    """A hard crash (no exception handler runs) mid-write: the target still holds the old
    content; only a dot-temporary is left, which no reader opens."""
    target = tmp_path / "data.json"
    target.write_text('{"old": true}')
    code = ("import os, sys\n"
            "from grpo_course.infra.atomic import atomic_write\n"
            "def w(tmp):\n"
            "    tmp.write_text('{\"new\": ')\n"
            "    os._exit(9)\n"
            "atomic_write(sys.argv[1], w)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(target)], timeout=60)
    assert proc.returncode == 9
    assert json.loads(target.read_text()) == {"old": True}


# ---------------------------------------------------------------- the course's writers
def torn_save_file(monkeypatch, module) -> None:
    """Fault injection: safetensors' ``save_file``, as ``module`` calls it, writes the file,
    tears it, then raises."""
    import safetensors.torch
    real = safetensors.torch.save_file

    def torn(tensors, filename, metadata=None):
        real(tensors, filename, metadata)
        Path(filename).write_bytes(Path(filename).read_bytes()[:10])
        raise Boom
    monkeypatch.setattr(module, "save_file", torn)


@pytest.mark.heavy
def test_save_quantized_interrupted_keeps_the_old_variant(tmp_path, monkeypatch):
    from grpo_course.topics import quantize as Q

    model = Q.quantize(tiny_llama(), "dynamic")
    folder = Q.save_quantized(model, None, tmp_path / "dynamic", "dynamic")
    before = snapshot(folder)
    torn_save_file(monkeypatch, Q)
    with pytest.raises(Boom):
        Q.save_quantized(model, None, folder, "dynamic")
    assert snapshot(folder) == before and siblings(folder) == ["dynamic"]
    monkeypatch.undo()
    Q.load_quantized(folder)                           # still loads


def test_ewc_save_interrupted_keeps_the_old_file(tmp_path, monkeypatch):
    from grpo_course.topics import curriculum
    from grpo_course.topics.curriculum import EWC

    ewc = EWC({"w": torch.ones(3)}, {"w": torch.zeros(3)}, lam=2.0)
    path = ewc.save(tmp_path)
    before = path.read_bytes()
    torn_save_file(monkeypatch, curriculum)
    ewc.lam = 5.0
    with pytest.raises(Boom):
        ewc.save(tmp_path)
    assert path.read_bytes() == before and EWC.load(tmp_path).lam == 2.0
    assert siblings(path) == ["ewc.safetensors"]


@pytest.mark.parametrize("fault", ["tokenizer", "rename"])
def test_save_model_interrupted_keeps_the_old_model_not_a_mix(tmp_path, monkeypatch, fault):
    """CourseTrainer.save_model used to move its files in one by one: a failure between two
    renames left new weights beside an old tokenizer. Now the old set stays whole."""
    from tests.helpers import tiny_trainer as _trainer

    trainer = _trainer()
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text("{}\n")
    trainer.save_model(out)
    before = snapshot(out)
    assert "metrics.jsonl" in before and "adapter_config.json" in before
    with torch.no_grad():
        for n, p in trainer.model.named_parameters():
            if "lora_B" in n:
                p.add_(1.0)                            # new weights to save
    if fault == "tokenizer":
        def crash(folder):
            raise Boom
        monkeypatch.setattr(trainer.tokenizer, "save_pretrained", crash)
    else:                                              # the second rename fails (disk full)
        real, calls = os.replace, []

        def flaky(src, dst):
            calls.append(1)
            if len(calls) == 2:
                raise Boom
            real(src, dst)
        monkeypatch.setattr(os, "replace", flaky)
    with pytest.raises(Boom):
        trainer.save_model(out)
    monkeypatch.undo()
    assert snapshot(out) == before and siblings(out) == ["run"]


def test_model_cache_write_interrupted_keeps_the_old_cache(fake_gguf, tmp_path):
    from grpo_course.core import loading

    target = loading.bundled_model_dir()
    before = snapshot(target)
    fake_gguf["fail"] = True                                        # Ctrl-C while saving
    with pytest.raises(KeyboardInterrupt):
        loading.bundled_model_dir(refresh=True)
    assert snapshot(target) == before and siblings(target) == [loading.BUNDLED_NAME]
