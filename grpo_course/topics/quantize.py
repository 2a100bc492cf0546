"""INT8 quantization of the ``Linear`` layers on the CPU: variants, measures, persistence.

Two ways to get INT8 ``Linear`` layers:

* ``"dynamic"`` -- ``torch.ao.quantization.quantize_dynamic`` (per-channel int8 weights, fbgemm
  kernels). This is how CPU GRPO set-ups did it; PyTorch now marks ``torch.ao.quantization``
  deprecated (it warns on first use) in favour of torchao.
* ``"torchao"`` -- torchao's ``quantize_(model, Int8DynamicActivationInt8WeightConfig())``, the
  maintained API. Weights become ``Int8Tensor`` subclasses; matrix products run ``aten::_int_mm``.

Both quantize the activations on the fly (per row/token) and keep everything else fp32.
Persistence uses safetensors for both: quantized tensors cannot be written directly, so
:func:`save_quantized` flattens them into plain int8/fp32 tensors plus JSON metadata.

CLI (one variant per process, for a clean peak RSS)::

    python -m grpo_course.topics.quantize --folder runs/quant/dynamic --json
"""
from __future__ import annotations

import copy
import json
import logging
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from grpo_course.core.loading import _prepare, no_loading_bar, quiet_torchao
from grpo_course.core.sampling import has_plain_linear_weights, sample_completions
from grpo_course.infra.atomic import atomic_write
from grpo_course.infra.errors import CourseError, OneLineArgumentParser, report
from grpo_course.infra.hardware import rss_bytes, set_threads
from grpo_course.infra.progress import library_bars_off
from grpo_course.measure.attribution import held_out_rewards, paired_mcnemar
from grpo_course.measure.stats import paired_difference

VARIANTS = ("fp32", "dynamic", "torchao")
WEIGHTS_FILE = "model.safetensors"
INFO_FILE = "quantization.json"


class QuantizeError(CourseError, RuntimeError):
    """A variant that cannot be made, saved or loaded (the message says why)."""


# ---------------------------------------------------------------- making the variants
def quantize_dynamic_int8(model: torch.nn.Module, inplace: bool = False,
                          skip: Sequence[str] = ()) -> torch.nn.Module:
    """Every ``nn.Linear`` (except names ending in one of ``skip``) -> ``torch.ao`` dynamic
    INT8 Linear with per-channel weight scales; activations get one scale per tensor.

    Emits PyTorch's ``DeprecationWarning`` for ``torch.ao.quantization``.
    """
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    def convert(model: torch.nn.Module) -> torch.nn.Module:
        spec = {name: per_channel_dynamic_qconfig for name, module in model.named_modules()
                if isinstance(module, torch.nn.Linear) and not name.endswith(tuple(skip))}
        return quantize_dynamic(model, spec, dtype=torch.qint8, inplace=True)

    return convert(model) if inplace else quantized_copy(model, convert)


def quantize_torchao_int8(model: torch.nn.Module, inplace: bool = False) -> torch.nn.Module:
    """Every ``nn.Linear`` weight -> torchao ``Int8Tensor`` (int8 weights per row, int8
    activations per token, quantized on the fly)."""
    quiet_torchao()
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    def convert(model: torch.nn.Module) -> torch.nn.Module:
        quantize_(model, Int8DynamicActivationInt8WeightConfig())
        return model

    return convert(model) if inplace else quantized_copy(model, convert)


def quantized_copy(model: torch.nn.Module, convert) -> torch.nn.Module:
    """``convert`` (an in-place quantization) applied to a copy of ``model``; ``model`` is left
    as it was. The copy shares the original's ``nn.Linear`` weights until ``convert`` replaces
    them by their int8 versions: a full fp32 copy of them would
    live only to be thrown away. A Linear that ``convert`` leaves in fp32 gets its own copy of its
    weight afterwards, as do the embedding and a weight tied to it."""
    tied = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    shared = {id(m.weight): m.weight for m in model.modules()
              if isinstance(m, torch.nn.Linear) and id(m.weight) not in tied}
    converted = convert(copy.deepcopy(model, dict(shared)))    # memo: "the copy of w is w"
    for module in converted.modules():
        w = module._parameters.get("weight") if hasattr(module, "_parameters") else None
        if w is not None and id(w) in shared:                # left in fp32: its own weight
            module.weight = torch.nn.Parameter(w.detach().clone(), requires_grad=w.requires_grad)
    return converted


def quantize(model: torch.nn.Module, variant: str, inplace: bool = False,
             skip: Sequence[str] = ()) -> torch.nn.Module:
    """``model`` as ``variant`` (one of :data:`VARIANTS`); ``"fp32"`` returns it (or a copy).
    ``skip``: Linear names (suffixes) kept fp32 by the ``"dynamic"`` variant."""
    if variant not in VARIANTS:
        raise QuantizeError(f"unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    if variant == "fp32":
        return model if inplace else copy.deepcopy(model)
    if variant == "dynamic":
        return quantize_dynamic_int8(model, inplace, skip)
    return quantize_torchao_int8(model, inplace)


def _is_dynamic_linear(module: torch.nn.Module) -> bool:
    return isinstance(module, torch.ao.nn.quantized.dynamic.Linear)


def _is_plain(t: torch.Tensor) -> bool:
    return type(t) in (torch.Tensor, torch.nn.Parameter) and not t.is_quantized


def has_plain_weights(model: torch.nn.Module) -> bool:
    """True when every Linear holds a plain float tensor. The sampler's compact decoder
    concatenates raw ``.weight`` tensors, so it is only used for such models; quantized
    ones fall back to the transformers forward pass automatically."""

    return has_plain_linear_weights(model)


# ---------------------------------------------------------------- sizes
def _tensor_bytes(t: torch.Tensor) -> int:
    """Bytes actually stored: inner tensors of a subclass, int8 + scales of a qtensor."""
    if hasattr(t, "__tensor_flatten__") and not _is_plain(t):
        names, _ = t.__tensor_flatten__()
        return sum(_tensor_bytes(getattr(t, n)) for n in names)
    if t.is_quantized:
        extra = 0
        if t.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
            extra = t.q_per_channel_scales().numel() * 8 + t.q_per_channel_zero_points().numel() * 8
        return t.numel() * t.element_size() + extra
    return t.numel() * t.element_size()


def storage_bytes(model: torch.nn.Module, head: str = "lm_head") -> dict[str, int]:
    """Bytes stored, counting each tensor once (a tied output head costs nothing) and quantized
    data at its real size: ``linear`` (the decoder's Linear layers), ``head`` (the output
    projection ``head``), ``other`` (embeddings, norms) and ``total``."""
    seen: set[int] = set()
    out = {"linear": 0, "head": 0, "other": 0}
    for name, module in model.named_modules():
        key = "head" if name.endswith(head) else "linear"
        if _is_dynamic_linear(module):
            w, b = module._packed_params._weight_bias()
            out[key] += _tensor_bytes(w) + (_tensor_bytes(b) if b is not None else 0)
            continue
        for t in list(module.parameters(recurse=False)) + list(module.buffers(recurse=False)):
            if id(t) in seen:
                continue
            seen.add(id(t))
            out[key if isinstance(module, torch.nn.Linear) else "other"] += _tensor_bytes(t)
    out["total"] = sum(out.values())
    return out


# ---------------------------------------------------------------- persistence
def _flat_dynamic_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Plain tensors for a ``quantize_dynamic`` model: int8 weight, per-channel scales and
    zero points, bias of each quantized Linear; fp32 tensors of every other module."""
    out: dict[str, torch.Tensor] = {}
    seen: dict[int, str] = {}
    for name, module in model.named_modules():
        prefix = f"{name}." if name else ""
        if _is_dynamic_linear(module):
            w, b = module._packed_params._weight_bias()
            if w.qscheme() != torch.per_channel_affine:
                raise QuantizeError(f"{name}: only per-channel weights are saved, got {w.qscheme()}")
            out[prefix + "weight_int8"] = w.int_repr().contiguous()
            out[prefix + "weight_scales"] = w.q_per_channel_scales().float().contiguous()
            out[prefix + "weight_zero_points"] = w.q_per_channel_zero_points().to(torch.int32)
            if b is not None:
                out[prefix + "bias"] = b.detach().contiguous()
            continue
        for key, t in list(module.named_parameters(recurse=False)) + \
                list(module.named_buffers(recurse=False)):
            if id(t) in seen:        # tied: safetensors refuses shared storage, keep one copy
                continue
            seen[id(t)] = prefix + key
            out[prefix + key] = t.detach().contiguous()
    return out


def restore_int8_weights(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Rebuild each dynamically quantized linear's packed weight from its flat tensors
    (``int8`` data, per-row ``scales`` and ``zero_points``), popping them from ``tensors``."""
    for name, module in model.named_modules():
        if not _is_dynamic_linear(module):
            continue
        q = torch._make_per_channel_quantized_tensor(
            tensors.pop(f"{name}.weight_int8"), tensors.pop(f"{name}.weight_scales").double(),
            tensors.pop(f"{name}.weight_zero_points").long(), 0)
        module.set_weight_bias(q, tensors.pop(f"{name}.bias", None))


def empty_dynamic_linears(model: torch.nn.Module, skip: Sequence[str] = ()) -> torch.nn.Module:
    """``model`` with every ``nn.Linear`` (except names ending in one of ``skip``) replaced by an
    empty ``torch.ao`` dynamic INT8 Linear of its shape: the module structure of
    :func:`quantize_dynamic_int8`, built without reading the float weights (a skeleton that
    :func:`restore_int8_weights` fills)."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    for name, module in list(model.named_modules()):
        if type(module) is torch.nn.Linear and not name.endswith(tuple(skip)):
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child,
                    DynamicLinear(module.in_features, module.out_features,
                                  bias_=module.bias is not None, dtype=torch.qint8))
    return model


def _restore_float_tensors(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Copy the remaining (float) parameters and buffers; every one must be there, once."""
    missing, filled = [], set()
    with torch.no_grad():
        for name, module in model.named_modules():
            if _is_dynamic_linear(module):
                continue
            prefix = f"{name}." if name else ""
            for key, t in list(module.named_parameters(recurse=False)) + \
                    list(module.named_buffers(recurse=False)):
                if id(t) in filled:   # a tied weight, filled under its first name
                    continue
                filled.add(id(t))
                if prefix + key in tensors:
                    t.copy_(tensors.pop(prefix + key))
                else:
                    missing.append(prefix + key)
    if tensors or missing:
        raise QuantizeError(f"checkpoint does not fit the model: missing {missing[:5]}, "
                            f"unexpected {list(tensors)[:5]}")


def _restore_dynamic(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    restore_int8_weights(model, tensors)
    _restore_float_tensors(model, tensors)


def save_quantized(model: torch.nn.Module, tokenizer, folder: str | Path, variant: str) -> Path:
    """Write ``variant`` of ``model`` to ``folder`` as safetensors + config + tokenizer. The
    folder is replaced as a whole (:func:`~grpo_course.infra.atomic.atomic_write`): an interrupted
    save leaves the previous one."""
    if variant not in VARIANTS:
        raise QuantizeError(f"unknown variant {variant!r}; choose one of {', '.join(VARIANTS)}")
    return atomic_write(folder, lambda tmp: _write_variant(model, tokenizer, tmp, variant),
                        folder=True)


def _write_variant(model: torch.nn.Module, tokenizer, folder: Path, variant: str) -> None:

    metadata: dict[str, str] = {"format": "pt"}
    info: dict[str, Any] = {"variant": variant}
    if variant == "fp32":
        with library_bars_off("transformers"):       # its shard-writing bar, a widget in the page
            model.save_pretrained(folder, safe_serialization=True)
    else:
        if variant == "dynamic":
            tensors = _flat_dynamic_state(model)
            info["float_linears"] = [n for n, m in model.named_modules()
                                     if type(m) is torch.nn.Linear]
        else:  # torchao
            quiet_torchao()
            from torchao.prototype.safetensors.safetensors_support import flatten_tensor_state_dict

            tensors, metadata = flatten_tensor_state_dict(
                {k: v.detach() for k, v in model.state_dict().items()})
            metadata = {**metadata, "format": "pt"}
        save_file({k: v.contiguous() for k, v in tensors.items()}, folder / WEIGHTS_FILE,
                  metadata=metadata)
        model.config.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    (folder / INFO_FILE).write_text(json.dumps(info))


def load_quantized(folder: str | Path):
    """``(model, tokenizer)`` from a folder written by :func:`save_quantized`."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer


    folder = Path(folder)
    if not (folder / INFO_FILE).is_file():
        raise QuantizeError(f"{folder} has no {INFO_FILE}: not written by save_quantized")
    try:
        info = json.loads((folder / INFO_FILE).read_text())
        variant = info["variant"]
    except (ValueError, KeyError, TypeError) as exc:
        raise QuantizeError(f"{folder / INFO_FILE} is not a readable variant description "
                            f"({type(exc).__name__}: {exc})") from None
    tokenizer = AutoTokenizer.from_pretrained(folder) if any(
        (folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")) else None
    if variant == "fp32":
        with no_loading_bar():
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        return _prepare(model, tokenizer, "cpu") if tokenizer is not None else (model.eval(), None)
    from transformers.initialization import no_init_weights

    # the same module structure as the saved model, without an fp32 copy of it: uninitialised
    # float storage (never written, so it takes no memory) that the saved tensors fill below
    with no_init_weights():
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder),
                                                 dtype=torch.float32)
    model.tie_weights()                          # (no_init_weights skips the tying too)
    if variant == "dynamic":
        model = empty_dynamic_linears(model, skip=info.get("float_linears", ()))
        with safe_open(folder / WEIGHTS_FILE, "pt") as fh:   # one tensor in memory at a time
            _restore_dynamic(model, _TensorsOnDemand(fh))
    else:
        from torchao.prototype.safetensors.safetensors_support import unflatten_tensor_state_dict

        for module in [m for m in model.modules() if isinstance(m, torch.nn.Linear)]:
            module.weight.data.zero_()           # defined values to quantize, one Linear at a time
            quantize_torchao_int8(module, inplace=True)
        with safe_open(folder / WEIGHTS_FILE, "pt") as fh:
            state, leftover = unflatten_tensor_state_dict(
                {key: fh.get_tensor(key) for key in fh.keys()}, fh.metadata())
        if leftover:
            raise QuantizeError(f"{folder}: unreadable tensors {list(leftover)[:5]}")
        model.load_state_dict(state, assign=True, strict=True)
    return _prepare(model, tokenizer, "cpu") if tokenizer is not None else (model.eval(), None)


class _TensorsOnDemand:
    """The tensors of an open safetensors file, each read when it is popped: what
    :func:`restore_int8_weights` and :func:`_restore_float_tensors` take from a dict (``in``,
    ``pop``; true while some are left, iterating over those)."""

    def __init__(self, handle):
        self.handle, self.left = handle, set(handle.keys())

    def __contains__(self, key: str) -> bool:
        return key in self.left

    def pop(self, key: str, *default):
        if key not in self.left:
            if default:
                return default[0]
            raise KeyError(key)
        self.left.remove(key)
        return self.handle.get_tensor(key)

    def __bool__(self) -> bool:
        return bool(self.left)

    def __iter__(self):
        return iter(sorted(self.left))


def folder_bytes(folder: str | Path, pattern: str = "*.safetensors") -> int:
    """Total size of the weight files in ``folder``."""
    return sum(p.stat().st_size for p in Path(folder).glob(pattern))


# ---------------------------------------------------------------- measures
@torch.inference_mode()
def prompt_logits(model, tokenizer, prompts: Sequence[str], last_k: int = 16) -> torch.Tensor:
    """Next-token logits at the last ``last_k`` positions of each prompt, ``[P*last_k, V]``
    (prompts run one at a time, so no padding enters the comparison)."""
    rows = []
    for text in prompts:
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        if ids.shape[1] < last_k:       # every prompt gives last_k rows: cosine_change groups them
            raise ValueError(f"a prompt of {ids.shape[1]} tokens has fewer than last_k = {last_k} positions")
        rows.append(model(input_ids=ids, logits_to_keep=last_k).logits[0].float())
    return torch.cat(rows)


@torch.no_grad()
def activation_outliers(model, tokenizer, prompts: Sequence[str],
                        kinds: Sequence[str] = ("q_proj", "o_proj", "gate_proj", "down_proj", "lm_head")
                        ) -> dict[str, float]:
    """How far a few input channels of each kind of ``Linear`` stand above the rest: per layer,
    the largest input channel's absolute maximum over every token of ``prompts`` divided by the
    median channel's, then the median over the layers of that kind. One scale per activation
    tensor (``torch.ao``'s) spends its int8 grid on the largest channel, so a large ratio is
    what flattens the other channels."""
    absmax: dict[str, torch.Tensor] = {}

    def hook(name):
        def record(module, args):
            x = args[0].detach().float().abs().reshape(-1, args[0].shape[-1]).amax(0)
            absmax[name] = x if name not in absmax else torch.maximum(absmax[name], x)
        return record

    handles = [m.register_forward_pre_hook(hook(name)) for name, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in kinds]
    try:
        for text in prompts:
            ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
            model(input_ids=ids)            # every position's hidden state reaches the head too
    finally:
        for h in handles:
            h.remove()
    by_kind: dict[str, list[float]] = {}
    for name, x in absmax.items():
        by_kind.setdefault(name.rsplit(".", 1)[-1], []).append(float(x.max() / x.median().clamp_min(1e-12)))
    return {k: statistics.median(by_kind[k]) for k in kinds if k in by_kind}


def outlier_sentences(outliers: dict[str, float], kept: Sequence[str] = ("lm_head", "down_proj"),
                      near: float = 0.9) -> tuple[str, str]:
    """:func:`activation_outliers` in words: each kind's ratio, then which kinds have the largest.
    One measurement on a few prompts, so every kind within ``near`` of the largest is named with it;
    the second part also says whether those kinds are among ``kept`` (the layers left in fp32)."""
    if not outliers:
        raise ValueError("no Linear layers were measured: activation_outliers returned nothing")
    ratios = "; ".join(f"`{k}` {v:.1f}×" for k, v in outliers.items())
    largest = max(outliers.values())
    top = [k for k, v in sorted(outliers.items(), key=lambda kv: -kv[1]) if v >= near * largest]
    within = f"within {100 * (1 - near):.0f} % of each other"
    widest = (f"`{top[0]}`'s input has the largest ratio" if len(top) == 1 else
              ", ".join(f"`{k}`'s" for k in top[:-1]) + f" and `{top[-1]}`'s inputs have the largest ratios, {within}")
    if not set(top) & set(kept):
        count = {2: "two", 3: "three", 4: "four"}.get(len(kept), str(len(kept)))
        layers = f"one of the {count} layers" if len(kept) > 1 else "the layer"
        widest += (f", not {layers} kept in fp32 below" if len(top) == 1 else
                   f", none of them {layers} kept in fp32 below")
    return ratios, widest


def position_cosines(reference: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """The cosine similarity of two models' logit vectors at each position (``[positions]``)."""
    if reference.shape != other.shape:
        raise ValueError(f"logit shapes differ: {tuple(reference.shape)} vs {tuple(other.shape)}")
    return torch.nn.functional.cosine_similarity(reference, other, dim=-1)


def logits_agreement(reference: torch.Tensor, other: torch.Tensor) -> dict[str, float]:
    """Cosine similarity of logit vectors (mean, min), top-1 agreement, max |diff|."""
    cos = position_cosines(reference, other)
    top1 = (reference.argmax(-1) == other.argmax(-1)).float()
    return {"cosine_mean": cos.mean().item(), "cosine_min": cos.min().item(),
            "top1_agreement": top1.mean().item(), "max_abs_diff": (reference - other).abs().max().item(),
            "positions": int(reference.shape[0])}


def cosine_change(reference: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
                  positions_per_prompt: int) -> dict[str, float]:
    """How much closer ``b``'s logits are to ``reference``'s than ``a``'s: the paired difference
    of their cosines (:func:`~grpo_course.measure.stats.paired_difference`, b - a) over prompts,
    each prompt's cosines averaged over its ``positions_per_prompt`` rows first (the layout of
    :func:`prompt_logits`). The positions of one prompt share its text, so they are not
    independent draws: ``n`` is the number of prompts, and a handful gets the wide interval it
    deserves."""
    rows = reference.shape[0]
    if positions_per_prompt < 1 or rows % positions_per_prompt:
        raise ValueError(f"{rows} logit rows are not whole prompts of {positions_per_prompt} positions")
    per_prompt = [position_cosines(reference, x).reshape(-1, positions_per_prompt).mean(1).tolist()
                  for x in (a, b)]
    return paired_difference(*per_prompt)


def paired_rows(results: dict[str, Any], dataset, weights: dict[str, float],
                reference: str = "fp32") -> list[dict[str, Any]]:
    """Each variant of ``results`` (``EvalResult`` by name, the same problems) against
    ``reference``, problem by problem: format and accuracy with McNemar's p, and the recipe's
    reward (``weights``) of each greedy answer with the 95 % interval of the paired difference."""

    ref = results[reference]
    ref_reward = held_out_rewards(ref, dataset, weights)
    rows = []
    for name, r in results.items():
        if name == reference:
            continue
        fmt, acc = paired_mcnemar(ref, r, "formatted"), paired_mcnemar(ref, r, "correct")
        reward = paired_difference(ref_reward, held_out_rewards(r, dataset, weights))
        rows.append({"variant": name, "n": r.n,
                     f"format % ({reference})": 100 * ref.format_rate, "format %": 100 * r.format_rate,
                     "format lost / gained": f"{fmt['a_only']} / {fmt['b_only']}",
                     "format p": fmt["p_value"],
                     f"reward ({reference})": reward["mean_a"], "reward": reward["mean_b"],
                     "reward change": reward["difference"],
                     "reward 95 % CI": f"[{reward['lo']:+.3f}, {reward['hi']:+.3f}]",
                     "reward_lo": reward["lo"], "reward_hi": reward["hi"],
                     f"accuracy % ({reference})": 100 * ref.accuracy, "accuracy %": 100 * r.accuracy,
                     "accuracy lost / gained": f"{acc['a_only']} / {acc['b_only']}",
                     "accuracy p": acc["p_value"]})
    return rows


def time_decoding(model, tokenizer, prompts: Sequence[str], batch_size: int,
                  max_new_tokens: int, fast: bool = False, repeats: int = 1,
                  sampling_dtype: str | None = None) -> dict[str, Any]:
    """Time to first token (prefill + one pick) and decode tokens/s of greedy decoding of
    ``batch_size`` prompts with :func:`~grpo_course.core.sampling.sample_completions`.

    ``fast=False`` runs the transformers forward pass (the only one quantized models take);
    ``sampling_dtype`` is the fast sampler's weight copy (``None``: its default). The best of
    ``repeats`` runs is ``decode_tok_s`` (other processes share the cores); every run's rate is
    kept in ``rates``, so a reader sees the spread. A run's decoding time is its full run less the
    fastest 1-token run (the prefill): a 1-token run slowed by another process, subtracted from a
    full run that was not, would otherwise inflate that run's rate many times over.
    """

    batch = list(prompts[:batch_size])
    if len(batch) < batch_size:
        raise ValueError(f"need {batch_size} prompts, got {len(prompts)}")
    kw = {"temperature": 0.0, "fast": fast, "sampling_dtype": sampling_dtype}
    sample_completions(model, tokenizer, batch[:1], 1, 2, **kw)  # warm-up
    firsts, runs = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        sample_completions(model, tokenizer, batch, 1, 1, **kw)
        firsts.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        out = sample_completions(model, tokenizer, batch, 1, max_new_tokens, **kw)
        runs.append((time.perf_counter() - t0, out.completion_ids.shape[1],
                     int(out.completion_mask.sum())))
    first = min(firsts)                      # the prefill, least disturbed
    timed = [(batch_size * (steps - 1) / (total - first), tokens) for total, steps, tokens in runs
             if steps > 1 and total > first]
    # the fastest run's rate, and the tokens that run decoded
    best_rate, tokens = max(timed) if timed else (float("nan"), runs[-1][2])
    return {"batch_size": batch_size, "ttft_s": first, "decode_tok_s": best_rate,
            "rates": [rate for rate, _ in timed], "new_tokens": tokens}


class PeakRSS:
    """Sample this process's resident memory (:func:`~grpo_course.infra.hardware.rss_bytes`) every
    ``interval`` s in a thread."""

    def __init__(self, interval: float = 0.01):
        self.interval = interval
        self.peak = rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())

    @property
    def now(self) -> int:
        return rss_bytes()


def peak_change(peak: int, fp32_peak: int) -> str:
    """A variant's peak resident memory against fp32's, in words: "12 % below fp32's"."""
    percent = 100 * (peak - fp32_peak) / fp32_peak
    if round(abs(percent)) == 0:
        return "level with fp32's (within 0.5 %)"
    return f"{abs(percent):.0f} % {'below' if percent < 0 else 'above'} fp32's"


def measure_folder(folder: str | Path, prompts: Sequence[str], batch_sizes: Sequence[int] = (1, 8),
                   max_new_tokens: int = 32, repeats: int = 1,
                   threads: int | None = None) -> dict[str, Any]:
    """Load a saved variant and time it; RSS after loading and peak RSS (load + decode)."""

    set_threads(threads)
    with PeakRSS() as rss:
        start = rss.now
        t0 = time.perf_counter()
        model, tokenizer = load_quantized(folder)
        load_s = time.perf_counter() - t0
        after_load = rss.now
        timings = [time_decoding(model, tokenizer, prompts, b, max_new_tokens, repeats=repeats)
                   for b in batch_sizes]
    variant = json.loads((Path(folder) / INFO_FILE).read_text())["variant"]
    return {"variant": variant, "load_s": load_s, "rss_start": start, "rss_after_load": after_load,
            "rss_peak": rss.peak, "timings": timings, "storage": storage_bytes(model),
            "file_bytes": folder_bytes(folder)}


def measure_in_subprocess(folder: str | Path, prompts: Sequence[str],
                          batch_sizes: Sequence[int] = (1, 8), max_new_tokens: int = 32,
                          repeats: int = 1, timeout: float = 1200) -> dict[str, Any]:
    """:func:`measure_folder` in a fresh Python process (a clean peak RSS per variant)."""

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(list(prompts), fh)
    cmd = [sys.executable, "-m", "grpo_course.topics.quantize", "--folder", str(folder),
           "--prompts", fh.name, "--max-new-tokens", str(max_new_tokens),
           "--repeats", str(repeats), "--batch-sizes", *map(str, batch_sizes)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    Path(fh.name).unlink(missing_ok=True)
    if proc.returncode != 0:
        raise QuantizeError(f"measuring {folder} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineArgumentParser(prog="python -m grpo_course.topics.quantize",
                                     description="Load a saved variant, time decoding, report RSS.")
    parser.add_argument("--folder", required=True, help="a folder written by save_quantized")
    parser.add_argument("--prompts", required=True, help="JSON file with a list of prompt texts")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args(argv)
    for flag, values in (("--batch-sizes", args.batch_sizes), ("--max-new-tokens", [args.max_new_tokens]),
                         ("--repeats", [args.repeats])):
        if min(values) < 1:
            parser.error(f"{flag} must be >= 1; got {min(values)}")
    quiet_torchao()
    warnings.simplefilter("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    try:
        try:
            prompts = json.loads(Path(args.prompts).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:     # missing, not UTF-8, not JSON
            raise QuantizeError(f"--prompts {args.prompts!r} is not a readable JSON file "
                                f"({type(exc).__name__}: {exc})") from None
        if not isinstance(prompts, list) or not prompts or \
                not all(isinstance(p, str) for p in prompts):
            raise QuantizeError(f"--prompts {args.prompts!r} must hold a non-empty JSON list of "
                                f"prompt texts")
        result = measure_folder(args.folder, prompts, args.batch_sizes, args.max_new_tokens,
                                args.repeats)
    except (CourseError, ValueError, OSError) as exc:
        return report(exc)
    except Exception as exc:      # a corrupt weights file: safetensors' / torch's own errors
        return report(f"{args.folder} cannot be loaded ({type(exc).__name__}: {exc})")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
