"""Artifacts: the files a run writes into its attempt's folder (``$DEVICEQ_ARTIFACTS_DIR``,
``task.artifacts_dir``), kept in an artifact store after the attempt ends.

The store is an fsspec URL: ``file:///PATH`` (the default: ``STATE_DIR/artifacts`` on the
host) or ``s3://BUCKET/PREFIX`` through s3fs (``--artifact-store-option KEY=VALUE``, or
``DEVICEQ_S3_ENDPOINT_URL`` for a non-AWS endpoint; credentials from the usual AWS variables).
An attempt's files go to ``STORE/POOL/TASK/ATTEMPT/NAME``; the prefix is built from validated
ids only, and every name is checked (`safe_name`): relative, no ``..``, no symlink followed.

When an attempt ends the host writes a spool entry (``STATE_DIR/POOL/HOST/spool/*.json``) and
a background thread (`Uploader`) uploads the files, then records each file's name, size and
sha256 in the attempt record (``lua/attempt_artifacts.lua``). A failed upload is recorded
(``artifacts_error``) and retried with a growing delay (1 s doubling to 30 s, at most
`MAX_TRIES` tries); a restarted daemon picks up what its spool still lists. The report never
waits for the store. fsspec and s3fs are imported only here, lazily (``pip install
'deviceq[artifacts]'``)."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import stat
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ..core.config import check_store_url
from ..core.errors import ConfigError, DeviceqError
from ..core.models import validate_id

LOG = logging.getLogger("deviceq.artifacts")
MAX_FILES = 1000
MAX_NAME_BYTES = 255
MAX_TRIES = 50
MAX_ERROR = 2000
LOG_NAME = "log.txt"


def whole_log(folder: Path | None) -> Path | None:
    """Where the host keeps an attempt's whole log while it runs: beside its artifacts
    folder (never in it: the runner owns that), moved in as ``log.txt`` at the end."""
    return None if folder is None else Path(os.fspath(folder) + ".log")


CHUNK = 1 << 20


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/deviceq`` (else ``~/.local/state/deviceq``)."""
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


# -- the store ---------------------------------------------------------------------------------
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
        f: IO[bytes] = self.fs.open(self.path(pool, task_id, attempt, name), "rb")
        return f

    def remove_task(self, pool: str, task_id: str) -> None:
        """Remove every attempt folder of a task (nothing when there is none)."""
        folder = f"{self.root()}/{pool}/{validate_id(task_id, 'task id')}"
        with contextlib.suppress(FileNotFoundError):
            if self.fs.exists(folder):
                self.fs.rm(folder, recursive=True)


# -- what an attempt's folder holds ------------------------------------------------------------
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


# -- the spool and the uploads -----------------------------------------------------------------
@dataclass
class Job:
    """One attempt whose files are still to be uploaded (or recorded): a spool entry."""

    pool: str
    task_id: str
    attempt: int
    folder: str
    tries: int = 0
    next_at: float = 0.0
    uploaded: list[list[Any]] | None = None  # (name, size, sha256) once in the store
    note: str = ""  # skipped files
    spool: str = ""  # this entry's file

    def as_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d.pop("spool")
        return d


def retry_delay(tries: int) -> float:
    """Seconds before try ``tries + 1``: 1 s doubling to 30 s."""
    return float(min(30.0, 2.0 ** max(0, tries - 1)))


class Uploader:
    """A host's artifact folders, spool and upload thread (for one pool)."""

    def __init__(
        self,
        host: Any,
        pool: str,
        host_id: str,
        state_dir: Path,
        store_url: str | None,
        options: Mapping[str, str],
        closed: threading.Event,
    ) -> None:
        self.host, self.pool, self.host_id = host, pool, host_id
        base = Path(state_dir) / validate_id(pool, "pool") / validate_id(host_id, "host id")
        self.work, self.spool = base / "work", base / "spool"
        self._work = os.fspath(self.work)
        self.default_url = f"file://{Path(state_dir).resolve()}/artifacts"
        self.store_url, self.options = store_url, dict(options)
        self.closed = closed
        self.wake = threading.Event()
        self._store: ArtifactStore | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._pool_url, self._pool_url_at = "", 0.0

    # -- the attempt's folder ------------------------------------------------------------------
    def prepare(self, task_id: str, attempt: int) -> Path | None:
        """Where one attempt's folder goes; the runner's task makes it when first asked for
        (`deviceq.host.runners.Task.artifacts_dir`, and ``$DEVICEQ_ARTIFACTS_DIR`` for a
        command), so a run that writes nothing costs no folder and no file-system call here. A
        leftover of a run that died is removed when the folder is made."""
        return Path(f"{self._work}/{validate_id(task_id, 'task id')}/{int(attempt)}")

    def discard(self, folder: Path | None) -> None:
        """Remove an attempt's folder (kept nothing) and its whole log."""
        if folder is not None:
            with contextlib.suppress(OSError):
                whole_log(folder).unlink(missing_ok=True)  # type: ignore[union-attr]
            try:
                folder.rmdir()  # empty, or never made (most runs write nothing)
            except FileNotFoundError:
                pass
            except OSError:
                shutil.rmtree(folder, ignore_errors=True)
            with contextlib.suppress(OSError):
                folder.parent.rmdir()

    def configured(self) -> bool:
        """Is a store named (``--artifact-store`` or the pool's ``artifact_store``, read at
        most every 10 s)? Without one, an attempt whose run wrote no file keeps nothing (its
        output alone is not worth a write per task to the host's own disk)."""
        if self.store_url:
            return True
        now = time.monotonic()
        if now >= self._pool_url_at:
            with contextlib.suppress(Exception):
                self._pool_url = self.host.config().artifact_store
                self._pool_url_at = now + 10.0
        return bool(self._pool_url)

    def attempt_ended(
        self, task_id: str, attempt: int, folder: Path, log: str | None, wrote_output: bool = True
    ) -> None:
        """Queue the attempt's files for upload, with the run's whole log (`whole_log`, else
        the output's tail ``log``) as ``log.txt`` unless the run wrote one; nothing when
        there is nothing to keep. ``wrote_output`` False: the run printed nothing, so there is
        no whole log to look for (a silent run costs one ``stat`` here)."""
        if not os.path.isdir(folder):  # the run never asked for it
            if not (log and self.configured()):
                if wrote_output:  # drop the copy of its output
                    self.discard(folder)
                return
            try:
                folder.mkdir(parents=True, exist_ok=True)
            except OSError:
                self.discard(folder)
                return
        whole = whole_log(folder)
        if whole is not None and whole.exists():
            with contextlib.suppress(OSError):
                if log and not (folder / LOG_NAME).exists() and self.configured():
                    os.replace(whole, folder / LOG_NAME)
                    log = None
                whole.unlink(missing_ok=True)
        if not any(folder.iterdir()) and not (log and self.configured()):
            self.discard(folder)
            return
        if log and not (folder / LOG_NAME).exists():
            with contextlib.suppress(OSError):
                (folder / LOG_NAME).write_text(log)
        if not any(folder.iterdir()):
            self.discard(folder)
            return
        job = Job(self.pool, task_id, int(attempt), str(folder))
        self._save(job)
        self.start()
        self.wake.set()

    # -- spool ---------------------------------------------------------------------------------
    def _save(self, job: Job) -> None:
        self.spool.mkdir(parents=True, exist_ok=True)
        if not job.spool:
            job.spool = str(self.spool / f"{job.task_id}.{job.attempt}.{uuid.uuid4().hex[:8]}.json")
        tmp = Path(job.spool + ".tmp")
        tmp.write_text(json.dumps(job.as_dict()))
        os.replace(tmp, job.spool)

    def pending(self) -> list[Job]:
        """The spool's entries, oldest first (a broken one is dropped)."""
        out: list[Job] = []
        if not self.spool.is_dir():
            return out
        for p in sorted(self.spool.glob("*.json"), key=lambda q: q.stat().st_mtime):
            try:
                job = Job(**json.loads(p.read_text()), spool=str(p))
                validate_id(job.task_id, "task id")
            except (OSError, ValueError, TypeError, DeviceqError):
                LOG.warning("dropping a broken artifact spool entry %s", p.name)
                p.unlink(missing_ok=True)
                continue
            out.append(job)
        return out

    # -- the thread ----------------------------------------------------------------------------
    def start(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self.loop, name="artifacts", daemon=True)
                self._thread.start()

    def loop(self) -> None:
        while not self.closed.is_set():
            self.wake.clear()
            now = time.time()
            jobs = self.pending()
            due = [j for j in jobs if j.next_at <= now]
            for job in due:
                if self.closed.is_set():
                    return
                self.process(job)
            jobs = self.pending()
            if not jobs:
                self.wake.wait(5.0)
                continue
            wait = max(0.05, min(j.next_at for j in jobs) - time.time())
            self.wake.wait(min(wait, 5.0))

    def store(self) -> ArtifactStore:
        if self._store is None:
            url = self.store_url
            if not url:
                url = self.host.config().artifact_store or self.default_url
            self._store = ArtifactStore(url, self.options)
        return self._store

    def process(self, job: Job) -> None:
        """One try: upload (unless done), record, forget. A failure is recorded and retried."""
        folder = Path(job.folder)
        try:
            if job.uploaded is None:
                files, skipped = collect(folder)
                store = self.store()
                for f in files:
                    store.put(f.path, store.path(job.pool, job.task_id, job.attempt, f.name))
                job.uploaded = [[f.name, f.size, f.sha256] for f in files]
                job.note = ("skipped: " + ", ".join(skipped))[:MAX_ERROR] if skipped else ""
                self._save(job)
        except Exception as exc:  # noqa: BLE001 - any store failure: retried later
            self._failed(job, f"upload failed (try {job.tries + 1}): {type(exc).__name__}: {exc}")
            return
        try:
            self._record(job, [tuple(x) for x in job.uploaded], job.note)
        except DeviceqError as exc:  # refused (not this host's attempt, removed task): give up
            LOG.warning("artifacts of %s/%s not recorded: %s", job.task_id, job.attempt, exc)
        except Exception as exc:  # noqa: BLE001 - Redis unreachable: retried
            self._failed(job, None, f"{type(exc).__name__}: {exc}")
            return
        self._forget(job)

    def _record(self, job: Job, files: list[tuple[Any, ...]], error: str) -> None:
        record = getattr(self.host, "record_artifacts", None)
        if record is None:  # (the HTTP host link has no such call yet)
            LOG.warning("artifacts of %s uploaded but not recorded (host link)", job.task_id)
            return
        record(job.task_id, job.attempt, files, error[:MAX_ERROR])

    def _failed(self, job: Job, error: str | None, why: str = "") -> None:
        job.tries += 1
        LOG.warning("artifacts of %s/%s: %s", job.task_id, job.attempt, error or why)
        if error is not None:
            with contextlib.suppress(Exception):
                gave_up = job.tries >= MAX_TRIES
                self._record(job, [], (error + ("; giving up" if gave_up else ""))[:MAX_ERROR])
        if job.tries >= MAX_TRIES:
            self._forget(job, keep_files=True)
            return
        job.next_at = time.time() + retry_delay(job.tries)
        self._save(job)

    def _forget(self, job: Job, keep_files: bool = False) -> None:
        Path(job.spool).unlink(missing_ok=True)
        if not keep_files:
            self.discard(Path(job.folder))


def uploader(state: Any, host: Any) -> Uploader:
    """The `Uploader` of a host daemon's `HostState` (its settings and pool); its thread starts
    at once when the spool lists uploads a previous daemon left."""
    st = state.settings
    up = Uploader(
        host,
        state.pool or "default",
        st.host_id,
        Path(getattr(st, "state_dir", None) or default_state_dir()),
        getattr(st, "artifact_store", None) or None,
        getattr(st, "artifact_store_option", None) or {},
        state.closed,
    )
    if up.pending():
        up.start()
    return up


def iter_chunks(f: IO[bytes]) -> Iterator[bytes]:
    while chunk := f.read(CHUNK):
        yield chunk


# -- reading what an attempt recorded (CLI, dashboard) -------------------------------------------
@dataclass(frozen=True)
class Recorded:
    """What an attempt's record says about its artifacts."""

    attempt: int
    files: list[dict[str, Any]]
    error: str | None


def recorded(conn: Any, task_id: str, attempt: int | None = None) -> Recorded:
    """The artifacts recorded for one attempt of a task (default: its latest attempt), from
    ``conn`` (a `PoolConnection`). NotFound without the task or the attempt."""
    from ..core.errors import NotFound

    validate_id(task_id, "task id")
    raws = conn.redis.lrange(conn.keys.attempts(task_id), 0, -1)
    if not raws:
        if not conn.redis.exists(conn.keys.task(task_id)):
            raise NotFound(f"no task {task_id} in pool {conn.pool}")
        raise NotFound(f"task {task_id} has no attempt yet")
    n = len(raws) if attempt is None else int(attempt)
    if not 1 <= n <= len(raws):
        raise NotFound(f"task {task_id} has no attempt {n} (it has {len(raws)})")
    rec = json.loads(raws[n - 1])
    files = [f for f in rec.get("artifacts") or [] if isinstance(f, dict)]
    files = [f for f in files if safe_name(str(f.get("name", "")))]
    return Recorded(n, files, rec.get("artifacts_error") or None)


def recorded_all(conn: Any, task_id: str) -> dict[int, Recorded]:
    """Every attempt's recorded artifacts (attempts without any left out)."""
    validate_id(task_id, "task id")
    out = {}
    for i, raw in enumerate(conn.redis.lrange(conn.keys.attempts(task_id), 0, -1), start=1):
        rec = json.loads(raw)
        files = [f for f in rec.get("artifacts") or [] if isinstance(f, dict)]
        files = [f for f in files if safe_name(str(f.get("name", "")))]
        if files or rec.get("artifacts_error"):
            out[i] = Recorded(i, files, rec.get("artifacts_error") or None)
    return out


def store_for(
    conn: Any, url: str | None, options: Mapping[str, str] | None = None
) -> ArtifactStore:
    """The store named by ``url``, else by the pool's ``artifact_store`` setting."""
    return ArtifactStore(url or conn.config().artifact_store, options)


def download(
    store: ArtifactStore, pool: str, task_id: str, rec: Recorded, into: Path
) -> list[Path]:
    """Copy an attempt's recorded files into ``into`` (names checked again: nothing lands
    outside it), each checked against its recorded sha256 (ConfigError on a mismatch: the
    partial file is removed)."""
    into = into.resolve()
    out = []
    for f in rec.files:
        name = str(f["name"])
        dest = (into / name).resolve()
        if into not in dest.parents:
            raise ConfigError(f"artifact name {name!r} escapes {into}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        h = hashlib.sha256()
        tmp = dest.with_name(dest.name + ".part")
        with store.open(pool, task_id, rec.attempt, name) as src, open(tmp, "wb") as dst:
            for chunk in iter_chunks(src):
                h.update(chunk)
                dst.write(chunk)
        if h.hexdigest() != f.get("sha256"):
            tmp.unlink(missing_ok=True)
            raise ConfigError(f"{name}: sha256 {h.hexdigest()} does not match the record")
        os.replace(tmp, dest)
        out.append(dest)
    return out


# -- retention ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pruned:
    removed: list[str]  # task ids whose artifacts were removed
    scanned: int  # task folders looked at
    more: bool  # the call stopped at its limit: call again


def prune(conn: Any, store: ArtifactStore, limit: int = 100, now_ms: int | None = None) -> Pruned:
    """Remove the store's folders of tasks past the pool's ``artifact_retention`` (seconds
    after the task finished; 0: keep everything): a task gone from Redis (trimmed by
    ``retention``) or finished longer ago than that. At most ``limit`` tasks are removed per
    call (each is a delete in the store); the pool's folder is listed once per call."""
    keep_s = conn.config().artifact_retention
    if keep_s <= 0:
        return Pruned([], 0, False)
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    folder = f"{store.root()}/{validate_id(conn.pool, 'pool')}"
    try:
        entries = sorted(store.fs.ls(folder, detail=False))
    except FileNotFoundError:
        return Pruned([], 0, False)
    removed: list[str] = []
    scanned = 0
    for entry in entries:
        tid = str(entry).rstrip("/").rsplit("/", 1)[-1]
        if not safe_name(tid):
            continue
        try:
            validate_id(tid, "task id")
        except DeviceqError:
            continue
        if len(removed) >= limit:
            return Pruned(removed, scanned, True)
        scanned += 1
        h = conn.redis.hmget(conn.keys.task(tid), "status", "finished_at")
        finished = int(h[1]) if h[1] and str(h[1]).isdigit() else None
        if h[0] is None or (finished is not None and now - finished > keep_s * 1000):
            store.remove_task(conn.pool, tid)
            removed.append(tid)
    return Pruned(removed, scanned, False)
