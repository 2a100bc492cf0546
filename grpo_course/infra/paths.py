"""Where the course keeps its files: the cache (converted model, warm starts, evaluations, runs)
and the checkout itself."""
from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def shown_path(path: str | os.PathLike) -> str:
    """``path`` as a record or a page shows it: relative to the checkout, or to the cache as
    ``$GRPO_COURSE_CACHE/...``, else its last two parts; never the machine's absolute path."""
    path = Path(path).expanduser()
    if not path.is_absolute():
        return str(path)
    path = path.resolve()
    for root, shown in ((project_root(), ""), (cache_dir().resolve(), f"${CACHE_ENV}/")):
        try:
            rest = path.relative_to(root)
        except ValueError:
            continue
        return f"{shown}{rest}" if str(rest) != "." else (shown.rstrip("/") or ".")
    return str(Path(*path.parts[-2:]))


def keyed_cache_file(kind: str, key: dict[str, Any], digits: int = 24) -> Path:
    """``cache_dir()/<kind>/<name>.json``, ``name`` a hash of ``key`` (everything the stored result
    depends on, as JSON): one file per distinct ``key``."""
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:digits]
    return cache_dir() / kind / f"{name}.json"


def read_cached(path: Path, usable: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
    """The JSON object stored at ``path`` when there is one and ``usable`` accepts it, else
    ``None``: then the caller computes the result again and rewrites the file. A file that exists
    but cannot be used (cut short by a full disk, say) gets one line on stderr saying so."""
    if not path.exists():
        return None
    try:
        stored = json.loads(path.read_text(encoding="utf-8"))
        if usable(stored):
            return stored
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    print(f"cache: {shown_path(path)} is unreadable or stale; computing it again", file=sys.stderr)
    return None
