"""Where the course keeps its files: the cache (converted model, warm starts, evaluations, runs)
and the checkout itself."""
from __future__ import annotations

import os
from pathlib import Path

from grpo_course.config import get_profile

CACHE_ENV = "GRPO_COURSE_CACHE"


def cache_dir() -> Path:
    """``$GRPO_COURSE_CACHE`` or ``~/.cache/grpo_course``."""
    root = os.environ.get(CACHE_ENV) or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "grpo_course"
    return Path(root).expanduser()


def runs_dir(profile: str | None = None) -> Path:
    """Where chapters keep trained models and logs: ``cache_dir()/runs/<profile>``.

    Outside the repository, and one folder per profile, so a smoke run never
    stands in for a full one (chapter 6 reuses chapter 3's policy from here).
    """

    return cache_dir() / "runs" / get_profile(profile).name


def project_root() -> Path:
    """The checkout holding ``grpo_course`` (the package is installed with ``pip install -e .``)."""
    return Path(__file__).resolve().parents[2]
