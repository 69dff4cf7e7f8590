"""What an attempt's record says about its artifacts (read by the CLI, the dashboard and the
HTTP API), and fetching them from the store with their sha256 checked."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import ConfigError, DeviceqError, NotFound
from ..core.validation import validate_id
from .store import ArtifactStore, default_state_dir, iter_chunks, safe_name


@dataclass(frozen=True)
class Recorded:
    """What an attempt's record says about its artifacts."""

    attempt: int
    files: list[dict[str, Any]]
    error: str | None


def recorded(conn: Any, task_id: str, attempt: int | None = None) -> Recorded:
    """The artifacts recorded for one attempt of a task (default: its latest attempt), from
    ``conn`` (a `PoolConnection`). NotFound without the task or the attempt."""
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


def local_default_url(pool: str, task_id: str, attempt: int) -> str | None:
    """Where a host daemon of this machine and user keeps artifacts when no store is named
    (its default ``--state-dir``'s ``artifacts`` folder, `deviceq.host.artifacts`), as a
    ``file://`` URL, when it holds this attempt's folder and can be read; else None."""
    root = default_state_dir() / "artifacts"
    folder = root / pool / task_id / str(int(attempt))
    if folder.is_dir() and os.access(folder, os.R_OK | os.X_OK):
        return f"file://{root.resolve()}"
    return None


def store_for(
    conn: Any,
    url: str | None,
    options: Mapping[str, str] | None = None,
    attempt: tuple[str, int] | None = None,
) -> ArtifactStore:
    """The store named by ``url``, else by the pool's ``artifact_store`` setting, else, for
    the ``attempt`` (task id, number) to download, the artifacts folder a host daemon of this
    machine uploads to when nothing is configured (`local_default_url`: a one-machine lab
    downloads without configuring anything)."""
    chosen = url or conn.config().artifact_store
    if not chosen and attempt is not None:
        chosen = local_default_url(conn.pool, attempt[0], attempt[1]) or ""
    if not chosen:
        where = default_state_dir() / "artifacts"
        raise ConfigError(
            "no artifact store: give --artifact-store URL or set the pool's artifact_store "
            f"(a host of this machine with no store keeps them in {where}: not here)"
        )
    return ArtifactStore(chosen, options)


@dataclass
class Downloaded:
    """What `download` got: the files written, and one line per file that was not (its
    name and why)."""

    paths: list[Path] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)


def download(
    store: ArtifactStore, pool: str, task_id: str, rec: Recorded, into: Path
) -> Downloaded:
    """Copy an attempt's recorded files into ``into`` (names checked again: nothing lands
    outside it), each checked against its recorded sha256 (a mismatch leaves nothing of that
    file). A file that cannot be had (not in the store, a link or a folder there, its sha256
    not the record's, its place in ``into`` taken by a folder) is one line of
    ``failed``; the others are still downloaded."""
    into = into.resolve()
    out = Downloaded()
    for f in rec.files:
        name = str(f["name"])
        try:
            out.paths.append(_download_one(store, pool, task_id, rec.attempt, f, into))
        except FileNotFoundError:
            out.failed.append(f"{name}: not in the artifact store")
        except IsADirectoryError:
            out.failed.append(f"{name}: a folder, not a file (another recorded name is "
                              "inside it)")  # fmt: skip
        except NotADirectoryError:
            out.failed.append(f"{name}: a folder on its path is a file (another recorded "
                              "name)")  # fmt: skip
        except DeviceqError as exc:
            out.failed.append(f"{name}: {str(exc).splitlines()[0] if str(exc) else exc.code}")
        except OSError as exc:
            out.failed.append(f"{name}: {exc.strerror or type(exc).__name__}")
    return out


def _download_one(store: ArtifactStore, pool: str, task_id: str, attempt: int,
                  f: Mapping[str, Any], into: Path) -> Path:  # fmt: skip
    name = str(f["name"])
    dest = (into / name).resolve()
    if into not in dest.parents:
        raise ConfigError(f"artifact name {name!r} escapes {into}")
    if dest.is_dir():
        raise IsADirectoryError(name)
    dest.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    tmp = dest.with_name(dest.name + ".part")
    try:
        with store.open(pool, task_id, attempt, name) as src, open(tmp, "wb") as dst:
            for chunk in iter_chunks(src):
                h.update(chunk)
                dst.write(chunk)
        if h.hexdigest() != f.get("sha256"):
            raise ConfigError(f"sha256 {h.hexdigest()} does not match the record")
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest
