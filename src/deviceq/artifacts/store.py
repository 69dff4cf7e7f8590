"""An artifact store: an fsspec URL (``file:///PATH`` or ``s3://BUCKET/PREFIX`` through s3fs)
and the folders of attempts under it, ``STORE/POOL/TASK/ATTEMPT/NAME``, built from validated
ids and checked names only (`safe_name`: relative, no ``..``, the same rule as ``valid_name``
in lua/attempt_artifacts.lua); what an attempt's local folder holds (`collect`: symlinks never
followed). fsspec and s3fs are imported lazily, when a store is first used (``pip install
'deviceq[artifacts]'``)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import importlib.util
import os
import stat
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..core.config import check_store_url
from ..core.errors import ConfigError, DeviceqError
from ..core.validation import validate_id

MAX_FILES = 1000  # files one attempt keeps, at most
MAX_NAME_BYTES = 255
LOG_NAME = "log.txt"  # the attempt's whole log
CHUNK = 1 << 20  # bytes read at once (hashing, streaming, downloads)


def default_state_dir() -> Path:
    """A host daemon's default ``--state-dir``: ``$XDG_STATE_HOME/deviceq`` (else
    ``~/.local/state/deviceq``); with no store named, its ``artifacts`` folder is the store."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "deviceq"


def safe_name(name: str) -> bool:
    """A file name an attempt may record: 1-255 bytes of text, relative, ``/``-separated, no
    empty, ``.`` or ``..`` segment, no control character or backslash (the same rule as
    ``valid_name`` in lua/attempt_artifacts.lua)."""
    try:
        size = len(name.encode())
    except UnicodeEncodeError:
        return False
    if not 1 <= size <= MAX_NAME_BYTES or name.startswith("/") or "\\" in name:
        return False
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return False
    return all(seg not in ("", ".", "..") for seg in name.split("/"))


def parse_store_options(items: Any) -> dict[str, str]:
    """``KEY=VALUE`` texts (``--artifact-store-option``, repeatable) as a mapping."""
    out: dict[str, str] = {}
    for item in [items] if isinstance(items, str) else list(items or ()):
        key, sep, value = str(item).partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"bad --artifact-store-option {item!r}: use KEY=VALUE")
        out[key.strip()] = value
    return out


def check_store_settings(url: str | None, options: Any) -> dict[str, str]:
    """Check a host's ``--artifact-store`` and its options; the options as a mapping. An
    ``s3://`` store without s3fs installed is refused here, before anything starts."""
    opts = dict(options) if isinstance(options, Mapping) else parse_store_options(options)
    if url is None:
        return opts
    try:
        check_store_url(url)
    except ValueError as exc:
        raise ConfigError(f"bad --artifact-store {url!r}: {exc}") from None
    if url.startswith("s3://") and importlib.util.find_spec("s3fs") is None:
        raise ConfigError("--artifact-store s3:// needs s3fs: pip install 'deviceq[artifacts]'")
    if importlib.util.find_spec("fsspec") is None:
        raise ConfigError("--artifact-store needs fsspec: pip install 'deviceq[artifacts]'")
    return opts


SPOOL_IN_MEMORY = 8 << 20
"""Bytes of a file being checked kept in memory (beyond: a temporary file)."""


class StoredFileRefused(DeviceqError):
    """A file in the artifact store is not what the attempt recorded: a link (never
    followed), a folder, or bytes whose size or sha256 differ from the record. Nothing of it
    is served."""

    code = "CORRUPT"


class ArtifactStore:
    """An fsspec filesystem and the root under which each pool's attempts have folders."""

    def __init__(self, url: str, options: Mapping[str, str] | None = None) -> None:
        if not url:
            raise ConfigError("no artifact store: give --artifact-store URL or set the pool's "
                              "artifact_store")  # fmt: skip
        try:
            check_store_url(url)
        except ValueError as exc:
            raise ConfigError(f"bad artifact store {url!r}: {exc}") from None
        self.url = url.rstrip("/")
        self.options = dict(options or {})
        self.s3 = url.startswith("s3://")
        self._fs: Any = None

    @property
    def fs(self) -> Any:
        if self._fs is None:
            self._fs, _ = self._open()
        return self._fs

    def _open(self) -> tuple[Any, str]:
        try:
            import fsspec
        except ImportError:
            raise ConfigError(
                "the artifact store needs fsspec: pip install 'deviceq[artifacts]'"
            ) from None
        opts: dict[str, Any] = {"skip_instance_cache": True}
        if self.s3:
            try:
                import s3fs  # noqa: F401
            except ImportError:
                raise ConfigError(
                    "--artifact-store s3:// needs s3fs: pip install 'deviceq[artifacts]'"
                ) from None
            o = dict(self.options)
            endpoint = o.pop("endpoint_url", None) or os.environ.get("DEVICEQ_S3_ENDPOINT_URL")
            if endpoint:
                opts["endpoint_url"] = endpoint
            opts["config_kwargs"] = {
                "connect_timeout": float(o.pop("connect_timeout", 5)),
                "read_timeout": float(o.pop("read_timeout", 60)),
                "retries": {"max_attempts": int(o.pop("max_attempts", 2))},
            }
            opts.update(o)
        else:
            opts.update(self.options)
        return fsspec.core.url_to_fs(self.url, **opts)

    def root(self) -> str:
        """The store's root as a path of its filesystem (``BUCKET/PREFIX`` or ``/PATH``)."""
        return self.url[len("s3://") :] if self.s3 else self.url[len("file://") :]

    def prefix(self, pool: str, task_id: str, attempt: int) -> str:
        """An attempt's folder: ``ROOT/POOL/TASK/ATTEMPT`` from validated ids only."""
        validate_id(pool, "pool")
        validate_id(task_id, "task id")
        if not 1 <= int(attempt) <= 9999:
            raise ConfigError(f"bad attempt {attempt}")
        return f"{self.root()}/{pool}/{task_id}/{int(attempt)}"

    def path(self, pool: str, task_id: str, attempt: int, name: str) -> str:
        if not safe_name(name):
            raise ConfigError(f"bad artifact name {name!r}")
        return f"{self.prefix(pool, task_id, attempt)}/{name}"

    def put(self, local: Path, remote: str) -> None:
        if not self.s3:
            self.fs.makedirs(remote.rsplit("/", 1)[0], exist_ok=True)
        self.fs.put_file(str(local), remote)

    def open(self, pool: str, task_id: str, attempt: int, name: str) -> IO[bytes]:
        """One stored file, to read. In a ``file://`` store every folder below the root and
        the file itself are opened without following a link (StoredFileRefused for a link
        or a folder; FileNotFoundError when it is not there)."""
        path = self.path(pool, task_id, attempt, name)
        if not self.s3:
            return _open_no_links(self.root(), path[len(self.root()) + 1 :], name)
        f: IO[bytes] = self.fs.open(path, "rb")
        return f

    def open_verified(self, pool: str, task_id: str, attempt: int, name: str, size: int,
                      sha256: str) -> IO[bytes]:  # fmt: skip
        """A checked copy of one stored file: read whole from the store (at most ``size`` + 1
        bytes) into a spool (memory up to `SPOOL_IN_MEMORY`, then a temporary file) while
        hashed; answered, rewound, only when its size and sha256 are the recorded ones
        (else StoredFileRefused). What is served from it is exactly the bytes checked."""
        spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY)  # noqa: SIM115
        try:
            h = hashlib.sha256()
            got = 0
            with self.open(pool, task_id, attempt, name) as src:
                while chunk := src.read(min(CHUNK, size + 1 - got)):
                    got += len(chunk)
                    h.update(chunk)
                    spool.write(chunk)
                    if got > size:
                        break
            if got != size or not hmac.compare_digest(h.hexdigest(), sha256):
                raise StoredFileRefused(
                    f"artifact {name[:80]!r} in the store does not match its record (size or "
                    "sha256): not served"
                )
            spool.seek(0)
            return spool
        except BaseException:
            spool.close()
            raise

    def remove_task(self, pool: str, task_id: str) -> None:
        """Remove every attempt folder of a task (nothing when there is none)."""
        folder = f"{self.root()}/{pool}/{validate_id(task_id, 'task id')}"
        with contextlib.suppress(FileNotFoundError):
            if self.fs.exists(folder):
                self.fs.rm(folder, recursive=True)


def _open_no_links(root: str, rel: str, name: str) -> IO[bytes]:
    """``root/rel`` opened one component at a time below ``root`` (``openat`` with
    ``O_NOFOLLOW``): a link anywhere below the root is refused, never followed; so is
    anything but a regular file."""
    parts = rel.split("/")
    nofollow = os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(root, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            flags = os.O_RDONLY | nofollow | (0 if last else getattr(os, "O_DIRECTORY", 0))
            try:
                nxt = os.open(part, flags, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK) and (
                    os.path.islink(os.path.join(root, *parts[: i + 1]))
                ):
                    raise StoredFileRefused(
                        f"artifact {name[:80]!r}: the store holds a link there (never "
                        "followed): not served"
                    ) from None
                raise
            os.close(fd)
            fd = nxt
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise StoredFileRefused(
                f"artifact {name[:80]!r} is a folder or special file in the store, not a file"
            )
        f = os.fdopen(fd, "rb")
        fd = -1
        return f
    finally:
        if fd >= 0:
            os.close(fd)


@dataclass(frozen=True)
class LocalFile:
    name: str
    path: Path
    size: int
    sha256: str


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


def collect(folder: Path) -> tuple[list[LocalFile], list[str]]:
    """The regular files under ``folder`` (symlinks never followed: a link is skipped, as is
    a name `safe_name` refuses), at most `MAX_FILES`; and what was skipped, with why."""
    files: list[LocalFile] = []
    skipped: list[str] = []
    if not folder.is_dir():
        return files, skipped
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        base = Path(dirpath)
        for d in list(dirnames):
            if (base / d).is_symlink():
                dirnames.remove(d)
                skipped.append(f"{(base / d).relative_to(folder).as_posix()} (symlink)")
        for fn in sorted(filenames):
            p = base / fn
            name = p.relative_to(folder).as_posix()
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                skipped.append(f"{name} (symlink)")
            elif not stat.S_ISREG(st.st_mode):
                skipped.append(f"{name} (not a regular file)")
            elif not safe_name(name):
                skipped.append(f"{name!r} (bad name)")
            elif len(files) >= MAX_FILES:
                skipped.append(f"{name} (more than {MAX_FILES} files)")
            else:
                files.append(LocalFile(name, p, st.st_size, sha256_of(p)))
    return files, skipped


def iter_chunks(f: IO[bytes]) -> Iterator[bytes]:
    while chunk := f.read(CHUNK):
        yield chunk
