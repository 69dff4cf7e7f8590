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
waits for the store. The store itself is `deviceq.artifacts.store` (fsspec and s3fs are
imported lazily: ``pip install 'deviceq[artifacts]'``)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import stat
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..artifacts.store import LOG_NAME, ArtifactStore, collect, default_state_dir
from ..core.errors import DeviceqError
from ..core.validation import validate_id

LOG = logging.getLogger("deviceq.artifacts")
MAX_TRIES = 50
MAX_ERROR = 2000
LOG_FILE_MAX = 64 << 20
"""Bytes of an attempt's ``log.txt`` kept by default (the host's ``log_file_max``)."""


WHOLE_LOG_SUFFIX = ".log"
"""An attempt's whole log is its folder's path with this added (`whole_log`)."""
TESTS_SUFFIX = ".tests"
"""A run's list of tests is its folder's path with this added (`tests_path`)."""


def whole_log(folder: Path | None) -> Path | None:
    """Where the host keeps an attempt's whole log while it runs: beside its artifacts
    folder (never in it: the runner owns that), moved in as ``log.txt`` at the end."""
    return None if folder is None else Path(os.fspath(folder) + WHOLE_LOG_SUFFIX)


def tests_path(folder: Path | None) -> Path | None:
    """Where the host writes a run's list of tests (``$DEVICEQ_TESTS_FILE``): beside its
    artifacts folder (never in it: the runner owns that, and the list is no artifact)."""
    return None if folder is None else Path(os.fspath(folder) + TESTS_SUFFIX)


def write_tests(folder: str | Path | None, tests: list[str] | None) -> Path | None:
    """Write ``tests`` (a claimed task's test ids) one a line beside the attempt's folder
    (`tests_path`), replacing what a run of this attempt that died left; the file's path, or
    None without a list or a folder. OSError when it cannot be written (the run then does not
    start: its runner would miss its tests)."""
    if folder is None or tests is None:
        return None
    path = Path(os.fspath(folder) + TESTS_SUFFIX)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(os.fspath(path) + ".tmp")
    tmp.write_text("".join(f"{t}\n" for t in tests), encoding="utf-8")
    os.replace(tmp, path)
    return path


def cap_log_file(path: Path, limit: int) -> bool:
    """Cut ``path`` (an attempt's ``log.txt``, a regular file: a link is left to `collect`,
    which skips it) to ``limit`` bytes plus one line that says so; True when it was longer.
    Cutting again gives the same file."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False  # none, a link, or not ours to change
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size <= limit:
            return False
        os.ftruncate(fd, limit)
        os.lseek(fd, limit, os.SEEK_SET)
        os.write(fd, f"\n[deviceq] log.txt cut here: {limit:,} bytes kept (log_file_max)\n"
                 .encode())  # fmt: skip
        return True
    finally:
        os.close(fd)


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
        log_file_max: int = LOG_FILE_MAX,
    ) -> None:
        self.host, self.pool, self.host_id = host, pool, host_id
        self.log_file_max = log_file_max
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
    def prepare(self, task_id: str, attempt: int) -> str:
        """Where one attempt's folder goes, as text (a `Path` is made only where the folder
        is used); the runner's task makes it when first asked for
        (`deviceq.host.runners.Task.artifacts_dir`, and ``$DEVICEQ_ARTIFACTS_DIR`` for a
        command), so a run that writes nothing costs no folder and no file-system call here. A
        leftover of a run that died is removed when the folder is made."""
        return f"{self._work}/{validate_id(task_id, 'task id')}/{int(attempt)}"

    def discard(self, folder: str | Path | None) -> None:
        """Remove an attempt's folder (kept nothing), its whole log and its list of tests."""
        if folder is not None:
            text = os.fspath(folder)
            for leftover in (text + WHOLE_LOG_SUFFIX, text + TESTS_SUFFIX):
                with contextlib.suppress(OSError):
                    os.unlink(leftover)
            try:
                os.rmdir(text)  # empty, or never made (most runs write nothing)
            except FileNotFoundError:
                pass
            except OSError:
                shutil.rmtree(text, ignore_errors=True)
            with contextlib.suppress(OSError):
                os.rmdir(os.path.dirname(text))

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
        self,
        task_id: str,
        attempt: int,
        folder: str | Path,
        log: str | None,
        wrote_output: bool = True,
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
                os.makedirs(folder, exist_ok=True)
            except OSError:
                self.discard(folder)
                return
        folder = Path(folder)
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
                cut = cap_log_file(folder / LOG_NAME, self.log_file_max)
                files, skipped = collect(folder)
                store = self.store()
                for f in files:
                    store.put(f.path, store.path(job.pool, job.task_id, job.attempt, f.name))
                job.uploaded = [[f.name, f.size, f.sha256] for f in files]
                notes = [f"{LOG_NAME} cut at {self.log_file_max:,} bytes (log_file_max)"] * cut
                notes += ["skipped: " + ", ".join(skipped)] if skipped else []
                job.note = "; ".join(notes)[:MAX_ERROR]
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
        int(getattr(st, "log_file_max", None) or LOG_FILE_MAX),
    )
    if up.pending():
        up.start()
    return up
