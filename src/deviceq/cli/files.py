"""The files a command writes: its output written atomically only on success (``-o``), and
``--redis-password-file`` (its input is read bounded by `deviceq.core.input_files`)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from ..core.errors import InvalidInput

F = TypeVar("F", bound=Callable[..., Any])
"""A command function, as the option decorators take and return it."""


def check_output_path(path: str) -> None:
    """Before a command changes anything: InvalidInput unless `write_output_file` can create
    ``path`` (its folder exists, is a folder and is writable; ``path`` is not a folder), so a
    token is never minted (or rotated) only to be lost."""
    target = Path(path)
    folder = target.parent
    if target.is_dir():
        raise InvalidInput(f"cannot write {path}: it is a directory")
    if not folder.exists():
        raise InvalidInput(f"cannot write {path}: no such directory {folder}")
    if not folder.is_dir():
        raise InvalidInput(f"cannot write {path}: {folder} is not a directory")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InvalidInput(f"cannot write {path}: directory {folder} is not writable")


def use_password_file(path: str) -> None:
    """``--redis-password-file``: every client this process makes, and every daemon it
    starts, reads the Redis password from ``path`` (`deviceq.core.redis_urls.redis_password`,
    through ``DEVICEQ_REDIS_PASSWORD_FILE``); the password itself is never on a command line.
    It replaces a ``DEVICEQ_REDIS_PASSWORD`` of the environment."""
    from ..core.redis_urls import PASSWORD_ENV, PASSWORD_FILE_ENV

    os.environ.pop(PASSWORD_ENV, None)
    os.environ[PASSWORD_FILE_ENV] = os.path.abspath(path)


def write_output_file(path: str, text: str) -> None:
    """Write ``text`` to ``path`` only now that the command succeeded, atomically (a temporary
    file in the same directory, renamed over ``path``) and readable by its owner only (it may
    hold a secret): an error never leaves an empty or partial file behind."""
    target = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent or Path("."))
    except OSError as exc:
        raise InvalidInput(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:  # mkstemp: mode 0600
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise InvalidInput(f"cannot write {path}: {exc.strerror or exc}") from None


def output_option(what: str) -> Callable[[F], F]:
    """``-o/--output FILE``: write ``what`` to FILE (atomically, mode 0600) instead of stdout."""
    return click.option(
        "-o",
        "--output",
        "output",
        type=click.Path(dir_okay=False, writable=False),
        help=f"Write {what} to FILE (created only on success, atomically, mode 0600) instead "
        "of stdout: unlike a shell redirect (> FILE), an error leaves no empty file behind.",
    )
