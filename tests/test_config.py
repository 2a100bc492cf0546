import os

import pytest

from grpo_course.config import PROFILES, ConfigError, EvalConfig, GRPOConfig, check_group_config, get_profile


def test_default_profile_is_full(monkeypatch):
    monkeypatch.delenv("GRPO_COURSE_PROFILE", raising=False)
    assert get_profile().name == "full"


def test_profile_from_env(monkeypatch):
    monkeypatch.setenv("GRPO_COURSE_PROFILE", "smoke")
    assert get_profile().name == "smoke"
    monkeypatch.setenv("GRPO_COURSE_PROFILE", " FULL ")
    assert get_profile().name == "full"


def test_argument_beats_env(monkeypatch):
    monkeypatch.setenv("GRPO_COURSE_PROFILE", "full")
    assert get_profile("smoke").name == "smoke"


def test_unknown_profile(monkeypatch):
    monkeypatch.setenv("GRPO_COURSE_PROFILE", "huge")
    with pytest.raises(ConfigError, match="unknown profile 'huge'"):
        get_profile()


def test_smoke_is_smaller_than_full():
    from grpo_course.config import FULL_BY_CPU
    smoke, full = PROFILES["smoke"], PROFILES["full"]
    assert smoke.eval.n < full.eval.n
    assert smoke.grpo.max_steps < full.grpo.max_steps
    assert FULL_BY_CPU["large"].eval.n >= 200     # held-out evaluation on hundreds of problems
    assert FULL_BY_CPU["compact"].eval.n >= 64    # ... and where decoding is slower, still dozens


def test_a_profile_label_says_which_sizes_it_took():
    from grpo_course.config import FULL_BY_CPU
    assert FULL_BY_CPU["compact"].label == "full (compact sizes)"
    assert FULL_BY_CPU["large"].label == "full (large sizes)"
    assert PROFILES["binder"].label == f"binder ({PROFILES['full'].sizes} sizes)"   # binder follows full
    assert PROFILES["smoke"].label == "smoke"


@pytest.mark.parametrize("g, b, message", [
    (4, 6, "not divisible by num_generations=4"),
    (1, 8, "must be >= 2"),
    (4, 0, "not divisible"),
])
def test_group_config_errors(g, b, message):
    with pytest.raises(ConfigError, match=message):
        check_group_config(g, b)


def test_grpo_config_validation():
    with pytest.raises(ConfigError, match="not divisible"):
        GRPOConfig(num_generations=3, per_step_completions=8)
    with pytest.raises(ConfigError, match="max_completion_length"):
        GRPOConfig(max_completion_length=0)
    with pytest.raises(ConfigError, match="loss_type"):
        GRPOConfig(loss_type="ppo")
    assert GRPOConfig(num_generations=4, per_step_completions=8).prompts_per_step == 2


def test_eval_config_validation():
    with pytest.raises(ConfigError):
        EvalConfig(n=0)


def _sizes(profile) -> dict[str, int]:
    """Every integer size of a profile, by dotted name (``grpo.max_steps``, ``cl.eval_n``, ...)."""
    from dataclasses import fields, is_dataclass

    found = {}
    for f in fields(profile):
        section = getattr(profile, f.name)
        if is_dataclass(section):
            found.update({f"{f.name}.{g.name}": getattr(section, g.name) for g in fields(section)
                          if type(getattr(section, g.name)) is int})
    return found


def test_binder_is_never_larger_than_full_on_either_cpu():
    """Binder's 2 GB profile is built from this machine's full one: at the compact sizes it must not
    evaluate more problems than full does there (it did, before its sizes were clamped)."""
    from grpo_course import config

    for kind, full in config.FULL_BY_CPU.items():
        a, b = _sizes(full), _sizes(config._binder_profile(full))
        assert {k for k in a if b[k] > a[k]} == set(), kind
        assert all(bh - bl <= fh - fl for (bl, bh), (fl, fh) in
                   zip(config._binder_profile(full).start.slices, full.start.slices, strict=True)), kind


def test_the_full_profile_is_sized_to_the_cpu(monkeypatch):
    """Where the CPU decodes more slowly (fp32, or a 2-core Xeon with AMX), the full profile does the same lessons with smaller
    sizes: nothing grows, the seeds, the recipe (its warm-up included) and the test design stay
    (only the run's length and the size of chapter 3's pool shrink), the pass@k rows are the
    same, chapters 3 and 4 evaluate whole blocks of chapters 1-2's records, and every size stays
    above the smoke profile's. This machine's ``full`` is its kind's."""
    from dataclasses import replace

    from grpo_course import config
    from grpo_course.infra import hardware
    from grpo_course.measure.evaluate import EVAL_BLOCK

    fast, slow, smoke = config.FULL_BY_CPU["large"], config.FULL_BY_CPU["compact"], PROFILES["smoke"]
    a, b = _sizes(fast), _sizes(slow)
    changed = {k for k in a if a[k] != b[k]}
    assert changed and all(b[k] < a[k] for k in changed), {k: (a[k], b[k]) for k in changed}
    assert all(b[k] >= _sizes(smoke)[k] for k in changed if k in _sizes(smoke)), changed
    assert slow.grpo.max_steps > smoke.grpo.max_steps
    assert replace(slow.grpo, max_steps=fast.grpo.max_steps) == fast.grpo          # the same recipe
    differ = {k for k in fast.start.changes if slow.start.changes[k] != fast.start.changes[k]}
    assert differ <= {"pool_prompts"} and slow.start.changes["pool_prompts"] <= fast.start.changes["pool_prompts"]
    assert slow.ref.slices == fast.ref.slices and slow.ref.samples == fast.ref.samples   # the fixed test
    assert [lo for lo, _ in slow.start.slices] == [lo for lo, _ in fast.start.slices]
    assert slow.start.whole_problems <= slow.eval.n and slow.trl.eval_n <= slow.eval.n
    # records are cached a block at a time: chapters 3-4 reuse chapters 1-2's whole blocks
    assert all(n % EVAL_BLOCK == 0 for n in (slow.eval.n, slow.start.whole_problems, slow.trl.eval_n))
    monkeypatch.delenv(config.SIZES_ENV, raising=False)
    for native, amx, kind in ((True, False, "large"), (True, True, "compact"), (False, False, "compact")):
        monkeypatch.setattr(hardware, "native_bf16", lambda native=native: native)
        monkeypatch.setattr(hardware, "has_amx", lambda amx=amx: amx)
        assert config.cpu_kind() == kind, (native, amx)
    for chosen in ("large", "compact", " Large "):      # the override, whatever the CPU
        monkeypatch.setenv(config.SIZES_ENV, chosen)
        assert config.cpu_kind() == chosen.strip().lower()
    monkeypatch.setenv(config.SIZES_ENV, "huge")
    with pytest.raises(ConfigError, match="unknown full-profile sizes 'huge' .*GRPO_COURSE_SIZES"):
        config.cpu_kind()
    for name in ("full", "binder"):
        with pytest.raises(ConfigError, match="unknown full-profile sizes 'huge'"):
            get_profile(name)
    assert get_profile("smoke") is PROFILES["smoke"]       # the smoke profile has no CPU sizes
    monkeypatch.undo()
    assert PROFILES["full"] is config.FULL_BY_CPU[config.cpu_kind()]


@pytest.mark.heavy
def test_a_bad_sizes_value_is_one_line_from_a_command_not_an_import_traceback(tmp_path):
    """Importing the config never fails on ``$GRPO_COURSE_SIZES``: the modules that read a profile
    at import would give every command a traceback. The train CLI names the value in one line."""
    import subprocess
    import sys

    env = {**os.environ, "GRPO_COURSE_SIZES": "huge", "GRPO_COURSE_PROFILE": "full"}
    imported = subprocess.run([sys.executable, "-c", "import grpo_course.measure.reference"],
                              env=env, capture_output=True, text=True, timeout=300)
    assert imported.returncode == 0, imported.stderr
    run = subprocess.run([sys.executable, "-m", "grpo_course.core.train", "--out", str(tmp_path / "run")],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.strip().splitlines() == [
        "error: unknown full-profile sizes 'huge' (from $GRPO_COURSE_SIZES); choose one of large, compact"]


def test_every_profile_section_field_is_read_somewhere():
    """No dead fields: each chapter section's fields are read by a chapter or the package
    (``P.quant.eval_n``, ``self.short.num_generations``, ``profile.quant.policy_steps``)."""
    import dataclasses
    import re
    from pathlib import Path

    from grpo_course.config import Profile

    root = Path(__file__).resolve().parents[1]
    text = "\n".join(p.read_text() for pattern in ("notebooks/*.ipynb", "grpo_course/**/*.py")
                     for p in root.glob(pattern) if p.name != "config.py")
    text += (root / "grpo_course" / "config.py").read_text().split("class Profile:")[1]
    sections = [f for f in dataclasses.fields(Profile) if f.default_factory is not dataclasses.MISSING]
    assert {s.name for s in sections} == {"data", "rewards", "loop", "trl", "cl", "quant", "prof", "short",
                                          "start", "ref"}
    unread = [f"{s.name}.{f.name}" for s in sections for f in dataclasses.fields(s.default_factory)
              if not re.search(rf"\.{s.name}\.{f.name}\b", text)]
    assert not unread, unread


def test_main_run_is_the_recipe_at_the_reverse_curriculum_start():
    from grpo_course.config import REVERSE_CURRICULUM, START_BUDGETS
    assert REVERSE_CURRICULUM["lines_left"] == 1
    for name, profile in PROFILES.items():
        run = profile.main_run
        assert run.lines_left in START_BUDGETS and run.lines_left + 1 in START_BUDGETS, name
        assert run.dynamic_sampling_reward == "correctness" and not run.mask_truncated_completions
        assert run.sft_steps == profile.grpo.sft_steps and run.lora_r == profile.grpo.lora_r
        assert profile.grpo.lines_left is None            # chapters 4-7 train whole problems
        assert run.generation_batch_size % run.num_generations == 0
        assert profile.start.pass_k_problems <= min(hi - lo for lo, hi in profile.start.slices)
    from grpo_course.config import FULL_BY_CPU
    full = FULL_BY_CPU["large"].start                # the compact profile evaluates fewer rows
    assert all(hi - lo >= 256 for lo, hi in full.slices)  # McNemar on n >= 256 per slice
    assert all(f.start.slices[0][1] <= f.start.slices[1][0] for f in FULL_BY_CPU.values())   # disjoint
    assert PROFILES["full"].main_run.max_completion_length == START_BUDGETS[1]
    # the page's live run trains on a screened pool on the profiles that can keep one
    assert {n: p.main_run.prompt_pool for n, p in PROFILES.items()} == \
        {"smoke": "all", "full": "mixed", "binder": "mixed"}
    # ... and chapter 5's stages on each stage's own rows, whatever the main run screens
    assert all(p.curriculum_run.prompt_pool == "all" for p in PROFILES.values())


def test_chapter_5_takes_the_main_run_s_rewards_and_filter_and_nothing_else():
    """Chapter 5's steps take the fields named in CURRICULUM_TAKES from the main run's start; its
    other changes (the start, the pool, the sampling round's size) stay the short run's, and the
    budget is chapter 5's."""
    from grpo_course import config

    profiles = [*config.FULL_BY_CPU.values(), *(config._binder_profile(f) for f in config.FULL_BY_CPU.values()),
                config.PROFILES["smoke"]]
    for profile in profiles:
        run, short, main = profile.curriculum_run, profile.short_run(), profile.main_run
        assert {"reward_weights", "dynamic_sampling_reward"} <= set(profile.start.changes)
        for key in set(profile.start.changes) - {"max_completion_length"}:   # chapter 5's own
            want = getattr(main if key in config.CURRICULUM_TAKES else short, key)
            assert getattr(run, key) == want, (profile.name, key)
        assert (run.dynamic_sampling_reward, run.prompt_order) == ("correctness", main.prompt_order)
        assert (run.sft_steps, run.learning_rate) == (0, profile.cl.learning_rate)
        assert run.max_completion_length == profile.cl.max_completion_length


def test_chapter_6_times_int8_at_the_evaluation_batch():
    """Chapter 6 compares INT8's speed with the fastest decoder where its evaluations decode: its
    largest timed batch is the profile's evaluation batch (torchao's, whose prefill is slow, no
    larger)."""
    from grpo_course import config

    profiles = [*config.FULL_BY_CPU.values(), *(config._binder_profile(f) for f in config.FULL_BY_CPU.values())]
    for p in profiles:
        assert max(p.quant.batch_sizes) == p.eval.batch_size >= max(p.quant.torchao_batch_sizes), p.name
        assert p.quant.torchao_prompts >= 2 and p.quant.torchao_prompts <= p.quant.agreement_prompts, p.name


def test_every_profile_but_smoke_gives_ewc_a_step_to_act():
    """EWC's penalty and its gradient are zero at the anchor, so a stage's first step is the same
    with and without it: chapter 5's comparison needs at least two steps a stage."""
    from grpo_course import config

    profiles = [*config.FULL_BY_CPU.values(), *(config._binder_profile(f) for f in config.FULL_BY_CPU.values())]
    assert all(p.cl.steps_per_stage >= 2 for p in profiles), [p.cl.steps_per_stage for p in profiles]


def test_every_config_field_sits_under_a_topic_that_the_docstring_names():
    """Issue 85: the fields were one flat list of 46. As in TRL's GRPOConfig, they are grouped by
    topic: a banner comment in the class body heads each group, and the docstring lists the same
    topics in the same order."""
    import dataclasses
    import inspect
    import re

    topic, topics, placed = None, [], {}
    for line in inspect.getsource(GRPOConfig).splitlines():
        banner = re.match(r"    # -{10,} (.+)$", line)
        if banner:
            topic = banner.group(1)
            topics.append(topic)
        elif (name := re.match(r"    (\w+): ", line)) and topic:
            placed[name.group(1)] = topic
    fields = [f.name for f in dataclasses.fields(GRPOConfig)]
    assert [f for f in fields if f not in placed] == []
    headings = [h.split(" (")[0].lower() for h in re.findall(r"^> (.+)$", inspect.getdoc(GRPOConfig), re.M)]
    assert headings == [t.lower() for t in topics]
