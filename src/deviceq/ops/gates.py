"""The operator's side of gates (`deviceq.core.gates`): add, remove, list, and checking every
device against the gates after a change, in bounded batches (``gate_eval.lua``)."""

from __future__ import annotations

from collections.abc import Iterable

from ..core.connection import PoolConnection
from ..core.gates import MAX_GATES, Gate, make_gate

EVAL_BATCH = 500
"""Devices per ``gate_eval.lua`` call."""


def add_gate(
    conn: PoolConnection,
    name: str,
    when: Iterable[str],
    until: Iterable[str] = (),
    driver_type: str | None = None,
    cooldown: int | None = None,
) -> tuple[Gate, int]:
    """Add a gate (InvalidInput for bad clauses or past `MAX_GATES`, AlreadyExists) and check
    every device against it. Returns the gate and how many devices it holds now (a cooldown
    gate: those whose last run ended less than ``cooldown`` seconds ago)."""
    gate = make_gate(name, when, until, driver_type, cooldown)
    conn._run("gate_set", ["add", gate.name, gate.stored(), str(MAX_GATES)])
    held, _ = check_all(conn)
    return gate, held


def remove_gate(conn: PoolConnection, name: str) -> int:
    """Remove a gate (NotFound) and release the devices it held (unless another gate holds
    them now). Returns how many were released."""
    from ..core.validation import validate_id

    conn._run("gate_set", ["remove", validate_id(name, "gate name")])
    _, freed = check_all(conn)
    return freed


def gates(conn: PoolConnection) -> list[Gate]:
    """The pool's gates, by name."""
    raw: dict[str, str] = conn.redis.hgetall(conn.keys.gates)  # type: ignore[assignment]
    out = [g for _, text in sorted(raw.items()) if (g := Gate.from_stored(text))]
    return out


def check_all(conn: PoolConnection) -> tuple[int, int]:
    """Check every device against the gates (SSCAN of ``devices``, `EVAL_BATCH` a call).
    Returns (devices newly held, devices released)."""
    held = freed = 0
    batch: list[str] = []
    for did in conn.redis.sscan_iter(conn.keys.devices, count=EVAL_BATCH):
        batch.append(str(did))
        if len(batch) == EVAL_BATCH:
            h, f = conn._run("gate_eval", batch)
            held, freed, batch = held + int(h), freed + int(f), []
    if batch:
        h, f = conn._run("gate_eval", batch)
        held, freed = held + int(h), freed + int(f)
    return held, freed


def held_devices(conn: PoolConnection) -> dict[str, list[str]]:
    """Gate name -> the devices it holds now (one pipelined read of every device's
    ``gated``)."""
    ids = sorted(str(d) for d in conn.redis.smembers(conn.keys.devices))
    pipe = conn.redis.pipeline(transaction=False)
    for d in ids:
        pipe.hget(conn.keys.device(d), "gated")
    out: dict[str, list[str]] = {}
    for d, g in zip(ids, pipe.execute(), strict=True):
        if g:
            out.setdefault(str(g), []).append(d)
    return out
