"""Chapter 7: phase timer, RSS sampler, profiler table, machine limits, thread demos.

The step profiled here is a small stand-in GRPO step made of the real pieces:
``sampling.sample_completions``, a forward/backward on the completion tokens and an
optimizer step, on a tiny random Llama with the bundled tokenizer.
"""
from __future__ import annotations

import os
import threading
import time
from contextlib import nullcontext

import pytest
import torch
import torch.nn.functional as F

from grpo_course.core.sampling import sample_completions
from grpo_course.measure import profiling as prof
from tests import helpers

PROMPTS = ["What is 2 + 3?", "Tom has 4 apples and eats one. How many are left?"]



def tiny_llama(tokenizer, seed: int = 0):
    return helpers.tiny_llama(seed, vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                              max_position_embeddings=256, eos_token_id=tokenizer.eos_token_id,
                              pad_token_id=tokenizer.pad_token_id)


class NullTimer:
    def phase(self, name):
        return nullcontext()


def stand_in_step(model, tokenizer, optimizer, timer, G: int = 2, T: int = 6, seed: int = 0):
    """Sample, score, forward+backward on completion tokens, optimizer step."""
    with timer.phase("sampling"):
        batch = sample_completions(model, tokenizer, PROMPTS, num_generations=G,
                                   max_new_tokens=T, seed=seed)
    with timer.phase("rewards"):
        rewards = torch.tensor([float(len(c) % 3) for c in batch.completions])
        grouped = rewards.view(-1, G)
        advantages = (grouped - grouped.mean(1, keepdim=True)).view(-1)
    model.train()
    with timer.phase("forward_backward"):
        # the sampler runs in inference mode: clone its tensors before autograd sees them
        completion_ids, m = batch.completion_ids.clone(), batch.completion_mask.clone().float()
        prompt_ids = batch.prompt_ids.clone().repeat_interleave(G, 0)
        prompt_mask = batch.prompt_mask.clone().repeat_interleave(G, 0)
        ids = torch.cat([prompt_ids, completion_ids], 1)
        mask = torch.cat([prompt_mask, m.long()], 1)
        logits = model(input_ids=ids, attention_mask=mask).logits[:, prompt_ids.shape[1] - 1:-1]
        logps = -F.cross_entropy(logits.transpose(1, 2), completion_ids, reduction="none")
        loss = -((advantages[:, None] * logps * m).sum(1) / m.sum(1).clamp(min=1)).mean()
        loss.backward()
    with timer.phase("optimizer"):
        optimizer.step()
        optimizer.zero_grad()
    return float(loss)


# ---------------------------------------------------------------- phase timer
@pytest.mark.heavy
def test_phases_sum_to_step_time(bundled_tokenizer):
    model = tiny_llama(bundled_tokenizer)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    timer = prof.PhaseTimer()
    for _ in range(3):
        with timer.step():
            stand_in_step(model, bundled_tokenizer, opt, timer)
    assert len(timer.records) == 3
    for rec in timer.records:
        assert set(rec.phases) == {"sampling", "rewards", "forward_backward", "optimizer"}
        assert all(s > 0 for s in rec.phases.values())
        covered = sum(rec.phases.values())
        assert covered <= rec.wall
        assert rec.other < 0.05 * rec.wall + 0.005, (rec.wall, rec.phases)
    frame = timer.to_frame()
    assert list(frame.index) == [0, 1, 2]
    assert frame["wall"].sum() == pytest.approx(sum(r.wall for r in timer.records))
    summary = timer.summary()
    assert summary.loc["wall", "share"] == pytest.approx(1.0)
    assert summary["share"].drop(["wall"]).sum() == pytest.approx(1.0)
    assert timer.totals["sampling"] == pytest.approx(frame["sampling"].sum())
    assert timer.counts["optimizer"] == 3


@pytest.mark.heavy
def test_timer_does_not_change_training(bundled_tokenizer):
    results = []
    for timer in (NullTimer(), prof.PhaseTimer()):
        model = tiny_llama(bundled_tokenizer, seed=1)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses = [stand_in_step(model, bundled_tokenizer, opt, timer, seed=s) for s in range(2)]
        results.append((losses, [p.detach().clone() for p in model.parameters()]))
    (l0, p0), (l1, p1) = results
    assert l0 == l1
    assert all(torch.equal(a, b) for a, b in zip(p0, p1, strict=False))


def test_timer_standalone_nested_and_errors():
    timer = prof.PhaseTimer()
    with timer.phase("x"):
        assert timer.current == "x"
        with timer.phase("y"):
            assert timer.current == "x/y"
            time.sleep(0.01)
    assert timer.current is None
    assert timer.totals["x"] >= timer.totals["x/y"] >= 0.01
    assert timer.records == []
    with timer.step():
        with timer.phase("a"):
            with timer.phase("b"):
                time.sleep(0.005)
    rec = timer.records[0]
    assert set(rec.phases) == {"a"}          # nested time is not counted twice
    assert rec.other >= 0
    with pytest.raises(ValueError, match="non-empty name"):
        with timer.phase(""):
            pass
    with pytest.raises(RuntimeError, match="do not nest"):
        with timer.step():
            with timer.step():
                pass
    with pytest.raises(ValueError, match="no steps"):
        prof.PhaseTimer().summary()


def test_timer_records_phase_when_body_raises():
    timer = prof.PhaseTimer()
    with pytest.raises(KeyError):
        with timer.step():
            with timer.phase("rewards"):
                raise KeyError("boom")
    assert "rewards" in timer.records[0].phases and timer.current is None


# ---------------------------------------------------------------- RSS sampler
def test_without_kineto_notices_passes_on_every_other_line(capfd):
    with prof.without_kineto_notices():
        os.write(2, b"USDT:2026-12-06 profiler_start\na real warning\nSTAGE:2026 Completed Stage\n")
    assert capfd.readouterr().err == "a real warning\n"


def test_rss_sampler_starts_and_stops_cleanly():
    before = threading.active_count()
    timer = prof.PhaseTimer()
    with prof.RSSSampler(interval=0.005, timer=timer) as sampler:
        assert threading.active_count() == before + 1
        with timer.phase("alloc"):
            block = torch.ones(64 * 2**20 // 4)    # 64 MiB, touched
            time.sleep(0.05)
        del block
        time.sleep(0.02)
    assert threading.active_count() == before
    assert sampler.peak >= sampler.start_rss
    table = sampler.peak_by_phase()
    assert "alloc" in table.index and table.loc["alloc", "samples"] >= 2
    assert table.loc["alloc", "peak_mib"] * 2**20 >= sampler.start_rss
    assert prof.BETWEEN_PHASES in table.index       # the samples after the phase, named in words
    frame = sampler.to_frame()
    assert frame["t"].is_monotonic_increasing and len(frame) >= 5
    sampler.stop()                                 # a second stop is harmless
    with pytest.raises(ValueError, match="interval"):
        prof.RSSSampler(interval=0)


def test_rss_sampler_stops_on_exception():
    before = threading.active_count()
    with pytest.raises(ZeroDivisionError):
        with prof.RSSSampler(interval=0.005):
            _ = 1 / 0
    assert threading.active_count() == before


def test_cpu_utilization_is_a_fraction_of_the_cores():
    a = torch.randn(512, 512)      # ~0.1 s of work: CPU-time clocks tick in 10 ms steps
    out = prof.cpu_utilization(lambda: [a @ a for _ in range(100)], cores=2)
    assert out["wall"] > 0 and out["cpu"] > 0 and out["cores"] == 2
    assert 0 <= out["utilization"] <= 1.2  # allow timer granularity


# ---------------------------------------------------------------- torch.profiler
def test_top_ops_on_tiny_llama(bundled_tokenizer, tmp_path, capfd):
    model = tiny_llama(bundled_tokenizer).eval()
    ids = torch.randint(0, 100, (2, 12))
    trace = tmp_path / "trace.json"
    with torch.no_grad():
        table = prof.top_ops(lambda: model(input_ids=ids), row_limit=5, trace_path=trace)
    assert not any(line.startswith(prof.KINETO_NOTICES) for line in capfd.readouterr().err.splitlines())
    assert 0 < len(table) <= 5
    assert list(table.columns) == ["op", "self_ms", "total_ms", "calls", "self_share"]
    assert table["self_ms"].is_monotonic_decreasing and (table["calls"] > 0).all()
    assert any("mm" in op or "linear" in op for op in table["op"])
    assert trace.stat().st_size > 0


# ---------------------------------------------------------------- limits, roofline
def test_machine_limits_and_roofline():
    limits = prof.Limits(gflops=prof.matmul_gflops(256, repeats=2),
                         bandwidth=prof.copy_bandwidth(16, repeats=2))
    assert limits.gflops > 0.1 and limits.bandwidth > 0.1 and limits.ridge > 0
    dec = prof.decode_point(n_params=1000, tokens=32, decode_steps=4, seconds=1.0)
    assert dec.intensity == pytest.approx(2 * 1000 * 32 / (4 * 1000 * 4))
    train = prof.training_point(n_params=1000, tokens=64, seconds=2.0)
    assert train.gflops == pytest.approx(6 * 1000 * 64 / 2.0 / 1e9)
    assert train.bound(limits) <= limits.gflops
    # a bf16 pass reads half the bytes and is read against the bf16 roof where one was measured
    bf16 = prof.training_point(n_params=1000, tokens=64, seconds=2.0, dtype="bfloat16")
    assert bf16.intensity == pytest.approx(2 * train.intensity)
    both = prof.Limits(gflops=100.0, bandwidth=10.0, bf16_gflops=400.0)
    assert bf16.peak(both) == 400.0 and train.peak(both) == 100.0
    import matplotlib
    matplotlib.use("Agg")
    ax = prof.plot_roofline(limits, [dec, train])
    assert len(ax.lines) >= 3


# ---------------------------------------------------------------- threads
@pytest.mark.slow
def test_run_with_threads_and_omp_order():
    out = prof.run_with_threads("import json; print(json.dumps({'n': torch.get_num_threads()}))", 1)
    assert out == {"n": 1}
    demo = prof.omp_order_demo(threads=1)
    by = demo.set_index("OMP_NUM_THREADS set")["torch_threads"]
    assert by["before import torch"] == 1
    with pytest.raises(RuntimeError, match="subprocess failed"):
        prof.run_with_threads("raise SystemExit(3)", 1)


# ---------------------------------------------------------------- the course trainer
@pytest.mark.heavy
def test_course_trainer_phases_and_unchanged_results(bundled_tokenizer):
    train = pytest.importorskip("grpo_course.core.train")
    from grpo_course.config import GRPOConfig

    rows = {"question": ["What is 2 + 3?", "What is 10 - 4?"], "answer": ["5", "6"]}
    cfg = GRPOConfig(num_generations=2, per_step_completions=4, max_completion_length=6,
                     lora_r=2, lora_alpha=4)
    results = []
    for timer in (None, prof.PhaseTimer()):
        model = tiny_llama(bundled_tokenizer, seed=2)
        trainer = train.CourseTrainer(model, bundled_tokenizer, cfg, [dict(question=q, answer=a)
                                      for q, a in zip(rows["question"], rows["answer"], strict=False)],
                                      skip_zero_variance=False, timer=timer)
        for _ in range(2):
            with (timer.step() if timer is not None else nullcontext()):
                trainer.step(rows)
        results.append([p.detach().clone() for p in trainer.model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=False))
    assert len(timer.records) == 2
    for rec in timer.records:
        assert set(rec.phases) <= set(prof.PHASES)
        assert {"sampling", "rewards", "forward_backward", "optimizer"} <= set(rec.phases)
        assert rec.phases["forward_backward"] > 0
        assert 0 <= rec.other < 0.1 * rec.wall + 0.01, (rec.wall, rec.phases)


def test_bf16_decode_point_reads_half_the_bytes_and_meets_the_bf16_roof():
    fp32 = prof.decode_point(n_params=1000, tokens=32, decode_steps=4, seconds=1.0)
    bf16 = prof.decode_point(n_params=1000, tokens=32, decode_steps=4, seconds=1.0, dtype="bfloat16")
    assert bf16.bytes == fp32.bytes / 2 and bf16.intensity == pytest.approx(2 * fp32.intensity)
    limits = prof.Limits(gflops=10.0, bandwidth=1.0, bf16_gflops=40.0)
    compute_bound = prof.RooflinePoint("x", flops=1e12, bytes=1.0, seconds=1.0, dtype="bfloat16")
    assert compute_bound.bound(limits) == 40.0
    assert prof.RooflinePoint("y", flops=1e12, bytes=1.0, seconds=1.0).bound(limits) == 10.0
    assert prof.Limits(gflops=10.0, bandwidth=1.0).bf16_gflops is None
    assert prof.matmul_gflops(64, repeats=1, dtype=torch.bfloat16) > 0


def test_sampler_table_and_sentence_read_the_words_from_the_ratios():
    from grpo_course.measure.profiling import sampler_sentence, sampler_table
    engine = lambda tps, setting="float32": {"setting": setting, "tokens_per_s": tps,
                                             "gflops": tps * 0.27, "fraction_of_roof": tps / 1000}
    record = {"shapes": {"one_line": [8, 8, 64, 1.0], "greedy": [32, 1, 256, 0.0]},
              "summary": {
                  "one_line": {"course": engine(300), "generate": engine(100, "bfloat16"),
                               "llama_cpp": engine(400, "Q8_0"), "before": engine(290),
                               "course_vs_generate": 3.0, "course_vs_llama_cpp": 0.75,
                               "course_vs_before": 300 / 290},
                  "greedy": {"course": engine(120), "generate": engine(80), "course_vs_generate": 1.5}}}
    table = sampler_table(record)
    assert list(table["engine"]) == ["course sampler", "course sampler, before",
                                     "transformers generate", "llama.cpp", "course sampler",
                                     "transformers generate"]
    assert table.loc[3, "setting"] == "Q8_0" and table.loc[0, "% of roof"] == 30.0
    record["before"] = "abc1234"
    text = sampler_sentence(record)
    assert text.startswith("At one line left (8 prompts × 8, 64 tokens) the course sampler "
                           "decodes 300 tokens/s (30 % of the roof), ")
    assert "ahead of transformers' generate with bfloat16 weights (3.00×)" in text
    assert "behind llama.cpp on its Q8_0 file (0.75×)" in text
    assert "level with this sampler at commit abc1234 (1.03×)" in text
    assert "In greedy evaluation (32 prompts × 1, 256 tokens)" in text


def test_the_throughput_sentence_leads_with_equal_work_against_trl_at_its_fastest():
    from grpo_course.measure.profiling import throughput_sentence
    bench = {"measured": {"cpu": "AMD EPYC", "cpus": 2, "native_bf16": False, "date": "2026-12-03"},
             "ours": {"s_per_step": 2.0, "frac_groups_dropped": 0.9},
             "ours_all_groups": {"s_per_step": 4.0, "peak_rss_mib": 900},
             "trl_best": {"mode": "fp32", "s_per_step": 16.0, "peak_rss_mib": 1800},
             "ratio": 8.0, "ratio_vs_best": 8.0, "ratio_all_groups_vs_best": 4.0,
             "rss_ratio_all_groups_vs_best": 0.5,
             "sampling_32": {"tokens_per_s": 140.0, "sampling_dtype": "float32"}}
    text = throughput_sentence(bench)
    assert text.startswith("at equal work") and text.index("4.0×") < text.index("8.0×")
    assert "fastest setting (fp32; AMD EPYC with 2 cores, no native bf16, 2026-12-03)" in text
    assert "0.50× its peak memory (900 against 1800 MiB)" in text and "90 % of this" in text
    # an old file without TRL's fastest setting says the ratio is against fp32, not the fastest
    old = {k: v for k, v in bench.items() if k not in ("trl_best", "ratio_all_groups_vs_best")}
    assert "not its fastest setting" in throughput_sentence(old)
    # a file that recorded only "auto" names what auto chose on the benchmark's CPU
    auto = {**bench, "sampling_32": {"tokens_per_s": 396.0, "sampling_dtype": "auto"},
            "sampling_32_fp32": {"tokens_per_s": 285.0, "sampling_dtype": "float32"}}
    assert text.endswith("decodes 140 tokens/s with 32 sequences at once, with float32 weights")
    native = {**auto, "measured": {**bench["measured"], "native_bf16": True}}
    assert throughput_sentence(auto).endswith("with float32 weights")
    assert throughput_sentence(native).endswith("with bfloat16 weights (285 with float32 weights)")


def test_trl_modes_frame_lists_every_mode_fastest_first_with_its_spread():
    from grpo_course.measure.profiling import trl_modes_frame
    modes = {"fp32": {"s_per_step": 31.0, "completions_per_s": 0.26, "step_seconds": [28.0, 34.0, 31.0],
                      "steps": 3, "weights": "float32", "bf16": False, "peak_rss_mib": 8630.0},
             "bf16_weights": {"s_per_step": 25.0, "completions_per_s": 0.32, "step_seconds": [21.0, 25.0, 26.0],
                              "steps": 3, "weights": "bfloat16", "bf16": True, "peak_rss_mib": 6477.0}}
    frame = trl_modes_frame({"trl_modes": modes})
    assert list(frame.index) == ["bf16_weights", "fp32"]
    assert frame.loc["fp32", "fastest step s"] == 28.0 and frame.loc["fp32", "slowest step s"] == 34.0
    assert trl_modes_frame({}).empty


def test_a_bf16_point_is_measured_against_the_bf16_peak():
    from grpo_course.measure.profiling import Limits, decode_point
    limits = Limits(gflops=100.0, bandwidth=20.0, bf16_gflops=400.0)
    point = decode_point(1000, tokens=64, decode_steps=2, seconds=1e-6, dtype="bfloat16")
    assert point.peak(limits) == 400.0 and decode_point(1000, 64, 2, 1e-6).peak(limits) == 100.0
    assert point.peak(Limits(gflops=100.0, bandwidth=20.0)) == 100.0   # bf16 not measured
    # the ridge is the point's own peak over the bandwidth: 400 / 20 for bf16, 100 / 20 for fp32
    assert point.ridge(limits) == 20.0 and decode_point(1000, 64, 2, 1e-6).ridge(limits) == 5.0


def test_roofline_frame_gives_each_point_s_work_and_its_share_of_both_roofs():
    from grpo_course.measure.profiling import Limits, decode_point, roofline_frame
    limits = Limits(gflops=100.0, bandwidth=20.0, bf16_gflops=400.0)
    # 1e9 params x 8 tokens x 2 FLOPs in 2 s, 2 steps of 2-byte weights: 16 GFLOP, 4 GB, 4 FLOP/byte
    frame = roofline_frame(limits, [decode_point(10**9, tokens=8, decode_steps=2, seconds=2.0, dtype="bfloat16")])
    row = frame.loc["sampling (decode)"]
    assert (row["GFLOP"], row["GB of weights read"], row["seconds"], row["FLOP/byte"]) == (16.0, 4.0, 2.0, 4.0)
    assert row["GFLOP/s"] == 8.0 and row["bound GFLOP/s"] == 80.0        # memory-bound: 4 x 20
    assert row["% of bound"] == 10.0 and row["% of its peak"] == 2.0       # 8 of 80, 8 of bf16's 400


def test_band_word_reads_a_ratio_within_the_level_band_as_level():
    words = ("level", "ahead", "behind")
    assert prof.band_word(1.0, *words) == "level"
    assert prof.band_word(1 + prof.LEVEL_BAND / 2, *words) == "level"
    assert prof.band_word(1 - prof.LEVEL_BAND / 2, *words) == "level"
    assert prof.band_word(1 + 2 * prof.LEVEL_BAND, *words) == "ahead"
    assert prof.band_word(1 - 2 * prof.LEVEL_BAND, *words) == "behind"
    # a single timing's wider band: the same ratio that reads "ahead" above reads level here
    assert prof.band_word(1 + 2 * prof.LEVEL_BAND, *words, band=prof.SINGLE_TIMING_BAND) == "level"
    assert prof.band_word(1 + 2 * prof.SINGLE_TIMING_BAND, *words, band=prof.SINGLE_TIMING_BAND) == "ahead"
    # symmetric: 0.79 is 1.27 the other way round, past a 25 % band either way (chapter 7's phases)
    assert prof.band_word(0.79, *words, band=0.25) == "behind"
    assert prof.band_word(1 / 0.79, *words, band=0.25) == "ahead"
    assert prof._against(1.95, "TRL") == "ahead of TRL (1.95×)"
    # a peer that was not run (NaN) or a broken timing is never read as level or ahead
    assert prof.band_word(float("nan"), *words) == "behind"
    assert prof.band_word(0.0, *words) == "behind"


def test_against_repeats_reads_a_difference_only_beyond_the_repeats_spread():
    read = lambda runs, other: prof.against_repeats("It took", runs, other, "s", ".1f")
    assert read([1.0, 1.2], 1.3).endswith("within the spread of LoRA's two runs, so these runs show no difference")
    assert read([1.0, 1.2], 2.0).endswith("higher than both LoRA runs by more than their spread")
    assert read([1.0, 1.2], 0.5).endswith("lower than both LoRA runs by more than their spread")
    assert read([1.0], 2.0).endswith("(one run each: no repeat to size the noise)")
    assert read([1.0, 1.2], float("nan")).endswith("full fine-tuning was not run on this profile")
    assert read([1.0, 1.2], 2.0).startswith("It took 1.0 s and 1.2 s with LoRA (the same step, run twice")


def test_runs_compare_calls_a_winner_only_where_every_run_beats_every_other():
    assert prof.runs_compare([10.0, 11.0], [8.0, 9.5], "fp32") == "faster than fp32 in every run"
    assert prof.runs_compare([7.0, 7.5], [8.0, 9.5], "fp32") == "slower than fp32 in every run"
    # one run of each side inside the other's range: no order is claimed
    assert prof.runs_compare([9.0, 11.0], [8.0, 9.5], "fp32").startswith("not told apart from fp32")
    assert prof.runs_compare([9.0], [9.0], "it").startswith("not told apart from it")
