"""The course sampler against the CPU inference engines, at the shapes GRPO and evaluation use.

    python bench/sampler.py                        # every engine, every shape -> data/sampler.json
    python bench/sampler.py --before 6497cba       # also the course sampler at that commit (paired)
    python bench/sampler.py --engines course --shapes one_line

Engines, each in its own subprocess (its own memory, nothing else on the cores):
- ``course``: :func:`grpo_course.core.sampling.sample_completions` in fp32, and in bf16 where the
  CPU has native bf16 (elsewhere bf16 products are emulated and slower);
- ``calculator``: the course sampler with GSM8K's calculator on (:mod:`grpo_course.core.calculator`:
  a token-flag lookup every step, the tool's result forced where an annotation reaches ``=``), at
  the same precisions; ``--model`` names a warm start that writes annotations (``make sft-run``'s),
  so the tool fires as often as in a calculator run, and each result says how many tokens it forced;
- ``before``: the same sampler at another commit (``--before``; a git worktree of it), so a change
  is measured against the code it replaces on the same machine in the same run;
- ``generate``: transformers' ``generate`` (what TRL samples with on a CPU) with fp32 weights, and
  with bf16 weights where the CPU has native bf16;
- ``llama_cpp``: llama.cpp (``llama-cpp-python``, the optional ``bench`` extra) on the bundled GGUF
  and on files its own quantizer makes from it (F32, BF16, Q8_0; the bundled file is Q4_1, so every
  file holds the weights the course's fp32 copy was dequantized from), with batched decoding: every
  sequence of a shape in one ``llama_decode`` per step, its threads on this process's cores.

Equal work: every sequence decodes the whole budget (EOS is never a stop: vLLM's ``ignore_eos``
for benchmarking), the same GSM8K train prompts in the same chat template, sampled at T = 1 from
the whole distribution, or greedy. Every setting of every engine runs ``--repeats`` times (the
faster run counts, for the course sampler and its peers alike); each engine's fastest setting is
taken per shape, and the ratios compare fastest with fastest. FLOPs are 2 x parameters per token (the output layer included,
attention left out); the roof is this machine's matmul peak (bf16 where native), measured in the
same run beside the oneDNN products at decoding's width over the model's own weight shapes.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: name -> (prompts, completions per prompt, new tokens, temperature)
SHAPES = {"one_line": (8, 8, 64, 1.0),      # GRPO at one line left: 8 prompts x G = 8
          "whole": (8, 8, 256, 1.0),        # GRPO on whole problems
          "greedy": (32, 1, 256, 0.0)}      # greedy evaluation, 32 problems a call
if os.environ.get("SAMPLER_BENCH_NEW_TOKENS"):     # --max-new-tokens, in the workers
    SHAPES = {k: (P, G, int(os.environ["SAMPLER_BENCH_NEW_TOKENS"]), t)
              for k, (P, G, _, t) in SHAPES.items()}
ENGINES = ("course", "calculator", "generate", "llama_cpp")
TOOL = "+calculator"           # a setting of the calculator engine: its dtype, then this
LLAMA_FILES = ("Q4_1", "Q8_0", "BF16", "F32")


def _prompts(shape: str, tokenizer) -> list[str]:
    """The shape's prompts: the first GSM8K train problems, with all but the last line of the
    gold solution given at one line left (GRPO's start there), whole otherwise."""
    from grpo_course.core.data import load_gsm8k, start_prompts
    n = SHAPES[shape][0]
    rows = load_gsm8k("train", limit=n)[:n]
    return start_prompts(rows, tokenizer, lines_left=1 if shape == "one_line" else None)


def _result(shape: str, seconds: float) -> dict:
    P, G, T, _ = SHAPES[shape]
    return {"shape": shape, "seconds": seconds, "tokens": P * G * T,
            "tokens_per_s": P * G * T / seconds}


# ---------------------------------------------------------------- workers (one per subprocess)
def worker_course(shape: str, dtype: str) -> dict:
    """The course sampler; runs against whichever ``grpo_course`` is first on ``sys.path``."""
    import torch

    import grpo_course.core.sampling as sampling
    from grpo_course.core.loading import load_model
    from grpo_course.infra.hardware import set_threads

    set_threads()
    model, tok = load_model(os.environ.get("SAMPLER_BENCH_MODEL") or None)
    P, G, T, temperature = SHAPES[shape]
    prompts = _prompts(shape, tok)
    dtype, tool = dtype.removesuffix(TOOL), dtype.endswith(TOOL)
    # equal work: no token ends a sequence (the same in every version of the sampler)
    sampling._eos_ids = lambda model, tokenizer: torch.tensor([-1])
    extra = {"calculator": True} if tool else {}     # (a sampler at another commit may lack it)
    run = lambda n, seed: sampling.sample_completions(
        model, tok, prompts, G, n, temperature=temperature, seed=seed, sampling_dtype=dtype, **extra)
    run(4, 0)                                   # warm-up: threads, allocator, weight packing
    t0 = time.perf_counter()
    out = run(T, 1)
    seconds = time.perf_counter() - t0
    assert int(out.completion_mask.sum()) == P * G * T
    forced = {"forced_tokens": int((1 - out.tool_mask).sum())} if tool else {}
    return {**_result(shape, seconds), **forced}


def worker_generate(shape: str, dtype: str) -> dict:
    import torch

    from grpo_course.core.loading import load_model
    from grpo_course.infra.hardware import set_threads

    set_threads()
    model, tok = load_model(dtype=getattr(torch, dtype))
    P, G, T, temperature = SHAPES[shape]
    tok.padding_side = "left"
    enc = tok(_prompts(shape, tok), return_tensors="pt", padding=True, add_special_tokens=False)
    sampled = {"do_sample": True, "temperature": 1.0, "top_k": 0, "top_p": 1.0} \
        if temperature > 0 else {"do_sample": False}

    def run(n: int) -> torch.Tensor:
        return model.generate(**enc, max_new_tokens=n, min_new_tokens=n,
                              num_return_sequences=G, pad_token_id=tok.pad_token_id, **sampled)
    with torch.inference_mode():
        run(4)
        t0 = time.perf_counter()
        out = run(T)
        seconds = time.perf_counter() - t0
    assert out.shape[1] - enc["input_ids"].shape[1] == T
    return _result(shape, seconds)


def _gguf(kind: str, folder: Path) -> Path:
    """The bundled GGUF (Q4_1), or a file llama.cpp's quantizer makes from it."""
    import llama_cpp

    from grpo_course.core.loading import bundled_gguf_path
    source = bundled_gguf_path()
    if kind == "Q4_1":
        return source
    target = folder / f"smollm2-135m-{kind}.gguf"
    if not target.exists():
        folder.mkdir(parents=True, exist_ok=True)
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{kind}" if kind != "F32"
                               else "LLAMA_FTYPE_ALL_F32")
        params.allow_requantize = True
        tmp = target.with_suffix(".tmp")
        if llama_cpp.llama_model_quantize(str(source).encode(), str(tmp).encode(), params) != 0:
            raise RuntimeError(f"llama.cpp could not write a {kind} file")
        tmp.replace(target)
    return target


def worker_llama_cpp(shape: str, kind: str) -> dict:
    """Batched decoding with llama.cpp's own API: each prompt decoded once into its first
    sequence, its cache copied to the other G - 1 (the same prompt work as the course sampler),
    then one ``llama_decode`` per step for every sequence, sampled by llama.cpp's samplers."""
    import llama_cpp

    from grpo_course.core.loading import load_model
    from grpo_course.infra.hardware import available_cores

    _, tok = load_model()
    P, G, T, temperature = SHAPES[shape]
    prompts = [tok(p, add_special_tokens=False)["input_ids"] for p in _prompts(shape, tok)]
    folder = Path(os.environ.get("GRPO_COURSE_CACHE", Path.home() / ".cache/grpo_course"))
    path = _gguf(kind, folder / "bench_gguf")
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(str(path).encode(),
                                                 llama_cpp.llama_model_default_params())
    B = P * G
    longest = max(len(p) for p in prompts)
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx = B * (longest + T + 8)
    cp.n_batch = max(longest, B)
    cp.n_ubatch = cp.n_batch
    cp.n_seq_max = B
    cp.n_threads = cp.n_threads_batch = available_cores()
    if hasattr(cp, "kv_unified"):
        cp.kv_unified = False          # one cache per sequence (a shared one was slower)
    ctx = llama_cpp.llama_init_from_model(model, cp)
    memory = llama_cpp.llama_get_memory(ctx)
    batch = llama_cpp.llama_batch_init(cp.n_batch, 0, 1)

    def put(entries: list[tuple[int, int, int, bool]]) -> None:
        batch.n_tokens = len(entries)
        for i, (token, pos, seq, logits) in enumerate(entries):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
            batch.seq_id[i][0], batch.logits[i] = seq, logits
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")

    def samplers() -> list:
        made = []
        for seq in range(B):
            chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
            one = llama_cpp.llama_sampler_init_dist(seq) if temperature > 0 \
                else llama_cpp.llama_sampler_init_greedy()
            llama_cpp.llama_sampler_chain_add(chain, one)
            made.append(chain)
        return made

    def run(n: int) -> None:
        llama_cpp.llama_memory_clear(memory, True)
        chains = samplers()
        tokens = []
        for p, ids in enumerate(prompts):            # prefill: once per prompt
            put([(t, i, p * G, i == len(ids) - 1) for i, t in enumerate(ids)])
            for g in range(1, G):
                llama_cpp.llama_memory_seq_cp(memory, p * G, p * G + g, -1, -1)
            # each of the G sequences samples its first token from the prompt's last logits
            tokens += [llama_cpp.llama_sampler_sample(chains[p * G + g], ctx, -1) for g in range(G)]
        positions = [len(prompts[s // G]) for s in range(B)]
        for step in range(n - 1):          # the n-th token is sampled from the last step's logits
            put([(tokens[s], positions[s] + step, s, True) for s in range(B)])
            tokens = [llama_cpp.llama_sampler_sample(chains[s], ctx, s) for s in range(B)]
        for chain in chains:
            llama_cpp.llama_sampler_free(chain)

    run(4)
    t0 = time.perf_counter()
    run(T)
    seconds = time.perf_counter() - t0
    info = llama_cpp.llama_print_system_info().decode()
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    return {**_result(shape, seconds), "system_info": info, "threads": cp.n_threads}


WORKERS = {"course": worker_course, "before": worker_course, "calculator": worker_course,
           "generate": worker_generate,
           "llama_cpp": worker_llama_cpp}


# ---------------------------------------------------------------- the driver
def run_worker(engine: str, shape: str, setting: str, pythonpath: Path = ROOT,
               max_new_tokens: int | None = None, timeout: float = 3600) -> dict:
    """One measurement in a fresh process; ``pythonpath`` decides which ``grpo_course`` runs."""
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    if max_new_tokens:
        env["SAMPLER_BENCH_NEW_TOKENS"] = str(max_new_tokens)
    # the bench module puts this checkout first on sys.path; the package under test goes before it
    code = (f"import sys, json; sys.path.insert(0, {str(ROOT / 'bench')!r}); import sampler; "
            f"sys.path.insert(0, {str(pythonpath)!r}); "
            f"print('RESULT' + json.dumps(sampler.WORKERS[{engine!r}]({shape!r}, {setting!r})))")
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=pythonpath)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT")), None)
    if proc.returncode != 0 or line is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"engine": engine, "setting": setting, "shape": shape, "error": tail[0]}
    return {"engine": engine, "setting": setting, **json.loads(line[len("RESULT"):])}


@contextmanager
def worktree_of(commit: str):
    """A detached git worktree of ``commit`` (its ``grpo_course`` to run beside this checkout's),
    removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="sampler-before-"))
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(folder), commit],
                   check=True, capture_output=True)
    try:
        yield folder
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(folder)],
                       capture_output=True)


def linear_roof(cfg, width: int = 64, repeats: int = 3) -> float:
    """GFLOP/s of oneDNN's products with prepacked fp32 weights at ``width`` rows, over the weight
    shapes of a model of config ``cfg`` in its order (each weight read cold, as in decoding)."""
    import torch

    from grpo_course.measure.profiling import _best_time
    d, inter = cfg.hidden_size, cfg.intermediate_size
    kv = cfg.num_key_value_heads * (d // cfg.num_attention_heads)
    shapes = [(d + 2 * kv, d), (d, d), (2 * inter, d), (d, inter)] * cfg.num_hidden_layers
    shapes.append((cfg.vocab_size, d))
    weights = [torch.ops.mkldnn._reorder_linear_weight(torch.randn(n, k), width)
               for n, k in shapes]
    inputs = {k: torch.randn(width, k) for _, k in shapes}

    def step() -> None:
        for (_, k), w in zip(shapes, weights, strict=True):
            torch.ops.mkldnn._linear_pointwise(inputs[k], w, None, "none", [], "")
    return sum(2 * width * n * k for n, k in shapes) / _best_time(step, repeats) / 1e9


def check_options(ap, out: Path, before: str | None, **counts: int | None) -> None:
    """Reject, before any minutes are spent, what would fail at the end: an ``--out`` that is no
    file in an existing folder, a ``--before`` that names no commit, a count under 1."""
    if out.is_dir() or not out.parent.is_dir():
        ap.error(f"--out {str(out)!r} must name a file in an existing folder")
    for name, value in counts.items():
        if value is not None and value < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1; got {value}")
    if before is not None and subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{before}^{{commit}}"],
            capture_output=True).returncode != 0:
        ap.error(f"--before {before!r} names no commit of this repository")


def fastest(results: list[dict], shape: str, engine: str) -> str | None:
    timed = [r for r in results if r["engine"] == engine and r["shape"] == shape and "error" not in r]
    return max(timed, key=lambda r: r["tokens_per_s"])["setting"] if timed else None


def settings(engine: str, native_bf16: bool) -> list[str]:
    if engine in ("course", "before", "generate", "calculator"):
        # without native bf16 its products are emulated: several times slower than fp32
        dtypes = ["float32", "bfloat16"] if native_bf16 else ["float32"]
        return [d + TOOL for d in dtypes] if engine == "calculator" else dtypes
    return list(LLAMA_FILES)


def summarize(results: list[dict], shapes: list[str], flops_per_token: float,
              roof: float) -> dict:
    """Per shape: each engine's fastest setting, its GFLOP/s and fraction of the roof, and the
    course sampler's ratio to each peer's fastest."""
    out = {}
    for shape in shapes:
        best = {}
        for r in results:
            if r["shape"] == shape and "error" not in r and \
                    r["tokens_per_s"] > best.get(r["engine"], {}).get("tokens_per_s", 0):
                best[r["engine"]] = r
        row = {e: {"setting": r["setting"], "tokens_per_s": r["tokens_per_s"],
                   "gflops": r["tokens_per_s"] * flops_per_token / 1e9,
                   "fraction_of_roof": r["tokens_per_s"] * flops_per_token / 1e9 / roof}
               for e, r in best.items()}
        if "course" in best:
            for peer in ("before", "generate", "llama_cpp"):
                if peer in best:
                    row[f"course_vs_{peer}"] = best["course"]["tokens_per_s"] / best[peer]["tokens_per_s"]
            if "calculator" in best:      # the tool's cost: decode speed lost, fastest against fastest
                row["calculator_cost"] = 1 - best["calculator"]["tokens_per_s"] / best["course"]["tokens_per_s"]
        out[shape] = row
    return out


def main(argv: list[str] | None = None) -> dict:
    from grpo_course.infra.atomic import write_json_atomic
    from grpo_course.infra.errors import OneLineArgumentParser
    from grpo_course.infra.hardware import bench_facts, native_bf16

    ap = OneLineArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", default=",".join(ENGINES))
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--before", default=None, help="a commit whose course sampler runs beside")
    ap.add_argument("--repeats", type=int, default=2,
                    help="runs of every engine per setting (the fastest counts), peers as the course")
    ap.add_argument("--max-new-tokens", type=int, default=None,
                    help="a shorter budget for every shape (a quick check of the bench itself)")
    ap.add_argument("--model", default=None,
                    help="the course engines' model: an adapter folder (e.g. the calculator's warm "
                         "start, whose annotations make the tool fire); default the bundled model")
    ap.add_argument("--out", type=Path, default=ROOT / "data" / "sampler.json")
    args = ap.parse_args(argv)
    if args.model:
        if not Path(args.model, "adapter_config.json").is_file():
            ap.error(f"--model {args.model!r} is not an adapter folder")
        os.environ["SAMPLER_BENCH_MODEL"] = str(Path(args.model).resolve())
    engines, shapes = args.engines.split(","), args.shapes.split(",")
    for name, given, known in (("engine", engines, ENGINES), ("shape", shapes, SHAPES)):
        bad = [x for x in given if x not in known]
        if bad:
            ap.error(f"unknown {name} {bad[0]!r}; choose from {', '.join(known)}")
    check_options(ap, args.out, args.before, repeats=args.repeats,
                  max_new_tokens=args.max_new_tokens)

    from grpo_course.core.loading import load_model
    from grpo_course.measure.profiling import measure_limits
    model, _ = load_model()
    n_params, cfg = sum(p.numel() for p in model.parameters()), model.config
    del model
    limits = measure_limits()
    roof = limits.bf16_gflops or limits.gflops
    facts = {**bench_facts(), "cores": os.cpu_count(),
             "roof": {"fp32_gflops": limits.gflops, "bf16_gflops": limits.bf16_gflops,
                      "copy_gb_s": limits.bandwidth, "linear_fp32_gflops_at_64": linear_roof(cfg)}}
    print(json.dumps(facts), flush=True)
    results = []
    with ExitStack() as stack:
        worktree = stack.enter_context(worktree_of(args.before)) if args.before else None
        if args.before:
            engines = ["before", *engines]
        for i, shape in enumerate(shapes):
            for engine in engines:
                tried = settings(engine, native_bf16())
                if i > 0 and engine not in ("course", "before", "calculator"):
                    # a peer's settings are all timed at the first shape; its fastest there
                    # runs at the others (a sweep at 256 tokens would take an hour per peer)
                    tried = [fastest(results, shapes[0], engine) or tried[0]]
                where = worktree if engine == "before" else ROOT
                for setting in tried:
                    runs = [run_worker(engine, shape, setting, where, args.max_new_tokens)
                            for _ in range(args.repeats)]     # best-of-N for every engine alike
                    ok = [r for r in runs if "error" not in r]
                    r = min(ok, key=lambda r: r["seconds"]) if ok else runs[0]
                    r["repeat_seconds"] = [x.get("seconds") for x in runs]
                    print(json.dumps(r), flush=True)
                    results.append(r)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    used = {s: (*SHAPES[s][:2], args.max_new_tokens or SHAPES[s][2], SHAPES[s][3]) for s in shapes}
    record = {"date": datetime.now(UTC).strftime("%Y-%m-%d"), "commit": commit,
              "before": args.before, "model": args.model or "bundled", "machine": facts,
              "n_params": n_params,
              "flops_per_token": 2 * n_params, "shapes": used,
              "summary": summarize(results, shapes, 2 * n_params, roof), "results": results}
    write_json_atomic(args.out, record)
    print(json.dumps(record["summary"]))
    return record


if __name__ == "__main__":
    main()
