"""One way to write a file or a folder so that an interruption never leaves it half-written.

:func:`atomic_write` has ``write_fn`` write the new content to a temporary path beside the
target (same folder, so the same file system), flushes it to disk (``fsync``) and renames
it over the target. Until that rename the target keeps its old content; if ``write_fn``
raises (an error, Ctrl-C) the temporary is removed and the old target is untouched.

A file is replaced by one ``os.replace``. A folder cannot be renamed over a non-empty
folder on POSIX, so the old one is renamed to a backup (``.NAME.old``), the new one into
place, then the backup is removed; a failure in between renames the backup back. A crash
(kill -9, power loss) between the two renames leaves the backup, which the next
:func:`atomic_write` of that folder puts back before it starts.

Every writer of the course uses it: evaluation caches, checkpoints and saved models,
the model cache, quantized variants, EWC state and the benchmarks' JSON.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: names of this module's own temporaries and backups (never carried over by ``keep``)
_LEFTOVER = re.compile(r"^\..+\.(tmp|old)$")


def _fsync(path: Path, directory: bool = False) -> None:
    """Flush ``path``'s data (or a folder's entries) to disk; a no-op where unsupported."""
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    for folder, _, files in os.walk(root):
        for name in files:
            if not os.path.islink(os.path.join(folder, name)):
                _fsync(Path(folder, name))
        _fsync(Path(folder), directory=True)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except FileNotFoundError:
            pass


def _link_or_copy(src: str, dst: str) -> str:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
    return dst


def _carry_over(old: Path, new: Path) -> None:
    """Put the entries of ``old`` that ``new`` lacks into ``new`` (hard links, else copies),
    leaving ``old`` as it is."""
    for entry in old.iterdir():
        dest = new / entry.name
        if _LEFTOVER.match(entry.name) or dest.exists() or dest.is_symlink():
            continue
        if entry.is_symlink():
            os.symlink(os.readlink(entry), dest)
        elif entry.is_dir():
            shutil.copytree(entry, dest, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(str(entry), str(dest))


def _backup(target: Path) -> Path:
    return target.with_name(f".{target.name}.old")


def _recover(target: Path) -> None:
    """Undo a crash between a folder swap's two renames (the backup is the old folder)."""
    backup = _backup(target)
    if backup.exists():
        if target.exists() or target.is_symlink():
            _remove(backup)
        else:
            os.replace(backup, target)


def _swap_folder(new: Path, target: Path) -> None:
    """Rename ``new`` to ``target``; an existing ``target`` survives any failure."""
    if not (target.exists() or target.is_symlink()):
        os.replace(new, target)
        return
    backup = _backup(target)
    os.replace(target, backup)
    try:
        os.replace(new, target)
    except BaseException:
        os.replace(backup, target)
        raise
    _remove(backup)


def atomic_write(path: str | os.PathLike, write_fn: Callable[[Path], Any], *,
                 folder: bool = False, keep: bool = False) -> Path:
    """Write ``path`` all at once: ``write_fn(tmp)`` writes the new content to ``tmp``, which
    then replaces ``path``; returns ``Path(path)``.

    ``folder=False``: ``tmp`` is a file path that ``write_fn`` creates. ``folder=True``:
    ``tmp`` is an empty folder that ``write_fn`` fills. ``keep=True`` (folders only) carries
    the old folder's other entries over (hard links, so cheap), so a writer that updates
    some files of a folder (a model beside a run's logs) still swaps the whole folder.
    If ``write_fn`` raises, ``path`` keeps its old content and the temporary is removed.
    """
    if keep and not folder:
        raise ValueError("keep=True needs folder=True")
    target = Path(os.path.abspath(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    if folder:
        _recover(target)
    tmp = target.with_name(f".{target.name}.{os.getpid()}-{secrets.token_hex(4)}.tmp")
    try:
        if folder:
            tmp.mkdir()
        write_fn(tmp)
        if folder:
            if keep and target.is_dir():
                _carry_over(target, tmp)
            _fsync_tree(tmp)
            _swap_folder(tmp, target)
        else:
            _fsync(tmp)
            os.replace(tmp, target)
    except BaseException:
        _remove(tmp)
        raise
    _fsync(target.parent, directory=True)
    return Path(path)


def write_text_atomic(path: str | os.PathLike, text: str, encoding: str = "utf-8") -> Path:
    """``Path(path).write_text(text)``, atomically (see :func:`atomic_write`)."""
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding=encoding))


def write_json_atomic(path: str | os.PathLike, obj: Any, **dumps_kwargs: Any) -> Path:
    """``obj`` as JSON in ``path``, atomically; ``dumps_kwargs`` go to :func:`json.dumps`."""
    return write_text_atomic(path, json.dumps(obj, **dumps_kwargs))
