"""What made a cached result: the code and the libraries behind it, as one short key.

A cache that outlives the code that filled it hides every change to that code: a warm start
trained by an older warm-up, an evaluation decoded by an older sampler. Each cache therefore
puts :func:`code_fingerprint` of the modules that produce it into its key, beside its own inputs:
the package version, a hash of the source files of the producing module and of every package
module it imports, transitively (:func:`package_imports`, read from the import statements, so a
new import cannot escape the key), and the versions of torch,
transformers, peft and trl; and :func:`data_hash` of the rows it read. Editing any of those
modules, upgrading a library or changing the data starts a new entry instead of reusing an old one.
"""
from __future__ import annotations

import ast
import hashlib
from functools import cache
from importlib import import_module
from importlib.metadata import PackageNotFoundError, version
from importlib.util import find_spec
from pathlib import Path

from grpo_course import __version__

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


def _source_file(module: str) -> Path | None:
    """The ``.py`` file of ``module`` (without importing it), or ``None`` for no such module."""
    try:
        spec = find_spec(module)
    except (ImportError, ValueError):
        return None
    origin = getattr(spec, "origin", None)
    return Path(origin) if origin and origin.endswith(".py") else None


def _direct_imports(module: str, package: str) -> set[str]:
    """The modules of ``package`` that ``module``'s source imports anywhere in the file (a
    function's own imports count too): ``from . import x``, ``from .x import y``, ``import
    package.x`` and their absolute forms."""
    path = _source_file(module)
    if path is None:
        return set()
    here = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = here.rsplit(".", node.level - 1)[0] if node.level > 1 else here
                base = f"{parent}.{base}" if base else parent
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)   # from pkg import module
    # the package's own __init__ is left out: it sets up the process, and the package version,
    # which every key records, stands for it
    return {name for name in found if name.startswith(package + ".") and _source_file(name) is not None}


@cache
def package_imports(module: str) -> tuple[str, ...]:
    """``module`` and every module of its package that it imports, transitively, sorted: the
    modules whose code can change what ``module`` computes (the set a cache key hashes)."""
    package = module.split(".")[0]
    seen: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(_direct_imports(name, package) - seen)
    return tuple(sorted(seen))


@cache
def source_hash(*modules: str) -> str:
    """A hash of the source files of ``modules`` (dotted names, e.g. ``"grpo_course.core.train"``)."""
    digest = hashlib.sha256()
    for name in sorted(set(modules)):
        path = Path(import_module(name).__file__)
        digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:20]


def code_fingerprint(module: str) -> dict[str, object]:
    """The package version, :func:`source_hash` of ``module`` and of everything it imports
    (:func:`package_imports`) and :func:`library_versions`: the part of a cache key that says
    which code made the entry. ``module`` is the one that holds the producing function, by its
    full name (not ``__name__``, which is ``"__main__"`` under ``python -m``)."""
    return {"package": __version__, "source": source_hash(*package_imports(module)),
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


def weights_fingerprint(model) -> str:
    """A hash of every tensor in ``model.state_dict()`` (names, dtypes, shapes and bytes): the part
    of a cache key that says which weights made the entry."""
    import torch

    digest = hashlib.blake2b(digest_size=16)
    for name, tensor in model.state_dict().items():
        t = tensor.detach().contiguous()
        digest.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        digest.update(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()
