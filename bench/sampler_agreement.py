"""Does a change to the sampler change what it samples? Greedy answers before and after.

    python bench/sampler_agreement.py --before 6497cba          # -> data/sampler_agreement.json
    python bench/sampler_agreement.py --before 6497cba --n 16   # a quick check of the bench

Kernels may change the numerics but not the distribution. Greedy decoding makes that testable: the
course sampler at ``--before`` (a git worktree of that commit, its own process) and at this checkout
decode the same whole GSM8K test problems (rows 0..n-1, 256 tokens, the bundled model, each at its
``sampling_dtype="auto"``). Where two completions differ, the bundled model in fp32 (transformers'
own forward, neither sampler) scores the first token where they part: the gap between its
log-probs of the two candidates. A gap under ``NEAR_TIE`` is a near-tie that rounding may flip; a
larger one would be a real change of the distribution. The threshold is fixed here, before any run.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from sampler import check_options, worktree_of  # the bench's own folder, on the path above

#: nats: the gap under which two greedy candidates are a near-tie. fp32 kernels that sum in another
#: order move a logit by about 1e-5 of its size (logits near 20: a few 1e-4), bf16 weights by about
#: 2^-8 of it (0.1); the threshold takes the bf16 case with room, and fp32 divergences meet it easily.
NEAR_TIE = 0.25


def worker(n: int, out: str) -> None:
    """Greedy completions of test rows 0..n-1 with whichever ``grpo_course`` is first on the path."""
    from grpo_course.core.data import chat_prompt, load_gsm8k
    from grpo_course.core.loading import load_model
    from grpo_course.core.sampling import sample_completions
    from grpo_course.infra.hardware import set_threads

    set_threads()
    model, tok = load_model()
    rows = load_gsm8k("test", limit=n)
    prompts = [chat_prompt(r["question"], tok) for r in rows]
    ids, texts = [], []
    for first in range(0, n, 32):
        batch = sample_completions(model, tok, prompts[first:first + 32], 1, 256, temperature=0.0,
                                   sampling_dtype="auto")
        for row, mask, text in zip(batch.completion_ids, batch.completion_mask, batch.completions,
                                   strict=True):
            ids.append(row[mask.bool()].tolist())
            texts.append(text)
    Path(out).write_text(json.dumps({"ids": ids, "texts": texts}))


def run(pythonpath: Path, n: int) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    code = (f"import sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); import sampler_agreement as a; "
            f"sys.path.insert(0, {str(pythonpath)!r}); a.worker({n}, {out!r})")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=pythonpath,
                   env={**os.environ, "PYTHONPATH": str(pythonpath)})
    return json.loads(Path(out).read_text())


def main(argv: list[str] | None = None) -> dict:
    import torch

    from grpo_course.core.answers import answers_match, extract_answer
    from grpo_course.core.data import chat_prompt, load_gsm8k
    from grpo_course.core.loading import load_model
    from grpo_course.infra.atomic import write_json_atomic
    from grpo_course.infra.errors import OneLineArgumentParser
    from grpo_course.infra.hardware import bench_facts

    ap = OneLineArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="the commit whose sampler is compared")
    ap.add_argument("--n", type=int, default=128, help="test rows 0..n-1")
    ap.add_argument("--out", type=Path, default=ROOT / "data" / "sampler_agreement.json")
    args = ap.parse_args(argv)
    check_options(ap, args.out, args.before, n=args.n)
    with worktree_of(args.before) as worktree:
        before = run(worktree, args.n)
    after = run(ROOT, args.n)

    model, tok = load_model()
    rows = load_gsm8k("test", limit=args.n)
    same_tokens = same_answer = 0
    gaps, correct = [], {"before": 0, "after": 0}
    for i, row in enumerate(rows):
        a, b = before["ids"][i], after["ids"][i]
        gold = row["answer"]
        ans = [extract_answer(before["texts"][i]), extract_answer(after["texts"][i])]
        correct["before"] += answers_match(ans[0], gold)
        correct["after"] += answers_match(ans[1], gold)
        same_answer += ans[0] == ans[1]
        if a == b:
            same_tokens += 1
            continue
        k = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        if k >= min(len(a), len(b)):
            gaps.append(None)              # one stopped (EOS) where the other went on
            continue
        prompt = tok(chat_prompt(row["question"], tok), add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([prompt + a[:k]])).logits[0, -1].float()
        logps = torch.log_softmax(logits, -1)
        gaps.append(abs(float(logps[a[k]] - logps[b[k]])))
    scored = [g for g in gaps if g is not None]
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    record = {"date": datetime.now(UTC).strftime("%Y-%m-%d"), "commit": commit,
              "before": args.before, "machine": bench_facts(), "rows": f"test 0..{args.n - 1}",
              "max_new_tokens": 256, "near_tie_nats": NEAR_TIE, "n": args.n,
              "same_tokens": same_tokens, "same_answer": same_answer,
              "correct_before": correct["before"], "correct_after": correct["after"],
              "diverged": len(gaps), "near_ties": sum(g < NEAR_TIE for g in scored),
              "beyond_near_tie": sum(g >= NEAR_TIE for g in scored),
              "diverged_at_eos": gaps.count(None), "gaps": gaps}
    write_json_atomic(args.out, record)
    print(json.dumps({k: v for k, v in record.items() if k != "gaps"}))
    return record


if __name__ == "__main__":
    main()
