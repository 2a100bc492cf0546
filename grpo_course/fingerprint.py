"""What made a cached result: the code and the libraries behind it, as one short key.

A cache that outlives the code that filled it hides every change to that code: a warm start
trained by an older warm-up, an evaluation decoded by an older sampler. Each cache therefore
puts :func:`code_fingerprint` of the modules that produce it into its key, beside its own inputs:
the package version, a hash of those modules' source files, and the versions of torch,
transformers, peft and trl; and :func:`data_hash` of the rows it read. Editing any of those
modules, upgrading a library or changing the data starts a new entry instead of reusing an old one.
"""
from __future__ import annotations

import hashlib
from functools import cache
from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from . import __version__

LIBRARIES = ("torch", "transformers", "peft", "trl")


def library_versions() -> dict[str, str | None]:
    """The installed versions of :data:`LIBRARIES` (``None`` where one is missing)."""
    found = {}
    for name in LIBRARIES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


@cache
def source_hash(*modules: str) -> str:
    """A hash of the source files of ``modules`` (dotted names, e.g. ``"grpo_course.train"``)."""
    digest = hashlib.sha256()
    for name in sorted(set(modules)):
        path = Path(import_module(name).__file__)
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:20]


def code_fingerprint(*modules: str) -> dict[str, object]:
    """The package version, :func:`source_hash` of ``modules`` and :func:`library_versions`:
    the part of a cache key that says which code made the entry."""
    return {"package": __version__, "source": source_hash(*modules),
            "libraries": library_versions()}


def file_hash(path: str | Path) -> str:
    """A hash of the bytes of the file at ``path`` (computed once per process for a given size
    and modification time)."""
    stat = Path(path).stat()
    return _file_hash(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


@cache
def _file_hash(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:20]


def data_hash(rows, fields: tuple[str, ...] = ("question", "answer")) -> str:
    """A hash of every row's ``fields`` (a list of dicts or a ``datasets.Dataset``), in order:
    the part of a cache key that says which data made the entry."""
    digest = hashlib.sha256()
    columns = [rows[f] for f in fields] if hasattr(rows, "column_names") else \
        [[row[f] for row in rows] for f in fields]
    for values in zip(*columns, strict=True):
        for value in values:
            digest.update(str(value).encode() + b"\0")
    return digest.hexdigest()[:20]
