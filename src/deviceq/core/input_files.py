"""Input read bounded and parsed safely, for every reader of a user's file: a file (or
stdin) read up to a size cap, so ``/dev/zero`` or a runaway pipe is an error, not a hang;
JSON or YAML parsed under a nesting guard, so a deeply nested input is one error line, never
a RecursionError traceback. The command line (``submit --file``, ``workflow put``, ``host
run --config``) and the host's devices file read through it."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from .errors import DeviceqError, InvalidInput

MAX_INPUT_BYTES = 64 * 1024 * 1024
"""The largest file (or stdin) a command reads as its input (``submit --file``, ``workflow
put``): read bounded, so ``/dev/zero`` or a runaway pipe is an error, not a hang."""


def read_input(path: str, limit: int = MAX_INPUT_BYTES) -> str:
    """A file's text ('-' = stdin), at most ``limit`` bytes; InvalidInput when it cannot be
    read, is larger or is not UTF-8."""
    name = "<stdin>" if path == "-" else path
    try:
        if path == "-":
            data = sys.stdin.buffer.read(limit + 1)
        else:
            with open(path, "rb") as f:
                data = f.read(limit + 1)
    except OSError as exc:
        raise InvalidInput(f"cannot read {name}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise InvalidInput(f"{name} is larger than {limit // (1024 * 1024)} MiB: not read")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"cannot read {name}: not UTF-8 text ({exc.reason})") from None


@contextlib.contextmanager
def nesting_guard(source: str, error: type[DeviceqError] = InvalidInput) -> Iterator[None]:
    """Parse JSON/YAML inside this: input nested deeper than the parser's recursion allows
    (``[[[[...``) is one ``error`` naming ``source``, never a RecursionError traceback."""
    try:
        yield
    except RecursionError:
        raise error(f"{source}: nested too deeply to parse") from None
