"""The vocabulary is defined once (``deviceq.core.vocabulary``): the scripts get the sets they
test names against from it as generated includes (``gen/NAME``), and no Lua file restates
them. Checked on real Redis through the loader, against the scripts' own texts, and by the
scripts' behaviour."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import redis

from deviceq.core import vocabulary as v
from deviceq.core.errors import InvalidInput
from deviceq.core.script_args import REPORT, SCHEMAS
from deviceq.core.scripts import IncludeError, assemble, library, lua_dir, names, read, source
from deviceq.core.vocabulary import FailureKind, TaskStatus
from packed import raw_submit


def lua_text(name: str) -> str:
    return (lua_dir() / f"{name}.lua").read_text()


def every_lua_file() -> list[str]:
    return [*names(), *sorted(f"lib/{p.stem}" for p in (lua_dir() / "lib").glob("*.lua"))]


# -- the Python groups -------------------------------------------------------------------------


def test_status_groups_are_the_enum_and_its_properties() -> None:
    assert tuple(s.value for s in TaskStatus) == v.STATUSES
    assert tuple(s.value for s in TaskStatus if s.terminal) == v.TERMINAL_STATUSES
    assert tuple(s.value for s in TaskStatus if s.leased) == v.LEASED_STATUSES
    assert ("queued", *v.LEASED_STATUSES, *v.TERMINAL_STATUSES) == v.STATUSES
    assert v.REPORT_OUTCOMES == ("done", "failed", "cancelled", "released", "preempted")


def test_failure_kind_groups() -> None:
    kinds = {k.value for k in FailureKind}
    assert set(v.SERVER_ONLY_KINDS) == {"lease_expired", "unschedulable"}
    # a host reports every kind but the scripts' own, and `cancelled` (an outcome of its own)
    assert (
        tuple(k.value for k in FailureKind if not k.server_only and k is not FailureKind.cancelled)
        == v.HOST_FAILURE_KINDS
    )
    assert [k for k in FailureKind if k.host_reported] == list(v.HOST_FAILURE_KINDS)
    assert set(v.DEVICE_FAULT_KINDS) <= set(v.HOST_FAILURE_KINDS)
    assert {k.value for k in FailureKind if k.device_fault} == set(v.DEVICE_FAULT_KINDS)
    assert set(v.RETRY_KINDS) <= kinds and "rejected" not in v.RETRY_KINDS
    assert set(v.RETRY_KINDS) - set(v.HOST_FAILURE_KINDS) == {"lease_expired"}


def test_blockers_and_assign_refusals() -> None:
    assert set(v.BLOCKERS) == set(v.DEVICE_BLOCKERS) | set(v.HOST_BLOCKERS)
    own = [b for b in v.BLOCKERS if b in v.DEVICE_BLOCKERS]
    assert own == list(v.DEVICE_BLOCKERS), "BLOCKERS keeps the device's own order"
    mapped = set(v.ASSIGN_REFUSAL_OF_BLOCKER)
    assert mapped == set(v.DEVICE_BLOCKERS) - {"busy", "offline"}  # these: device_not_idle
    assert set(v.ASSIGN_REFUSAL_OF_BLOCKER.values()) <= set(v.ASSIGN_REFUSALS)
    assert set(v.HOST_BLOCKERS) <= set(v.ASSIGN_REFUSALS)


def test_other_modules_take_the_vocabulary_from_here() -> None:
    from deviceq import FailureKind as PublicKind
    from deviceq import TaskStatus as PublicStatus
    from deviceq.core import config, eligibility, models
    from deviceq.ops import verify

    assert models.TaskStatus is TaskStatus is PublicStatus
    assert models.FailureKind is FailureKind is PublicKind
    assert config.RETRY_KINDS is v.RETRY_KINDS
    assert eligibility.DEVICE_REASONS is v.DEVICE_BLOCKERS and eligibility.REASONS is v.BLOCKERS
    assert verify.STATUSES is v.STATUSES and verify.ACTIVE is v.LEASED_STATUSES
    assert verify.TERMINAL is v.TERMINAL_STATUSES
    from deviceq.cli import task_cmds
    from deviceq.core import live_logs
    from deviceq.host import health

    assert set(v.DEVICE_FAULT_KINDS) == health.INFRA_KINDS
    assert live_logs.ACTIVE is v.LEASED_STATUSES
    assert task_cmds.CANCELLABLE == task_cmds.WAITABLE == ("queued", *v.LEASED_STATUSES)


# -- the generated Lua -------------------------------------------------------------------------


def test_generated_lua_text() -> None:
    assert v.lua_table("X", ("a", "b")) == "local X = {a = true, b = true}\n"
    assert v.lua_table("Y", {"a": "x_y"}) == "local Y = {a = 'x_y'}\n"
    for bad in ("end", "a-b", "a'b", "ä"):
        with pytest.raises(ValueError, match="no plain Lua name"):
            v.lua_table("Z", (bad,))
    assert v.lua_table("T", "a, b or c") == "local T = 'a, b or c'\n"
    with pytest.raises(ValueError, match="no plain Lua text"):
        v.lua_table("T", "it's")
    assert v.lua_include("gen/nope") is None
    assert read("gen/nope") is None
    # what a script is sent with every call: the generated includes it carries
    gen = {n: v.lua_include(n) or "" for n in v.LUA_INCLUDES}
    for name in names():
        text = "".join(t for t in gen.values() if t in source(name))
        assert len(text) < 1400, f"{name}: the generated text stays small (sent with every call)"


def test_a_missing_generated_include_is_an_include_error() -> None:
    with pytest.raises(IncludeError, match="'gen/nope': there is no generated include"):
        assemble('--- @include "gen/nope"\nreturn 1')


@pytest.mark.parametrize("include", sorted(v.LUA_INCLUDES))
def test_lua_sees_exactly_the_python_vocabulary(real_r: redis.Redis, include: str) -> None:
    """Each generated include, sent by the loader as a script sends it, defines on Redis the
    tables the Python vocabulary holds: every name, nothing more."""
    tables = v.LUA_INCLUDES[include]
    body = (
        f'--- @include "{include}"\n'
        "local out = {}\n"
        + "".join(f"out['{n}'] = {n}\n" for n in tables)
        + "return cjson.encode(out)"
    )
    got = json.loads(real_r.eval(assemble(body, "probe"), 1, "dq:{vocab}:"))
    for name, value in tables.items():
        if isinstance(value, tuple):
            assert got[name] == dict.fromkeys(value, True), name
        elif isinstance(value, str):  # a text (the words an error lists)
            assert got[name] == value, name
        else:
            assert got[name] == dict(value), name
    assert set(got) == set(tables)


def test_the_scripts_carry_the_generated_text_they_include() -> None:
    users: dict[str, set[str]] = {}
    for name in names():
        gens = {lib for lib in library(name, lua_text(name)) if lib.startswith("gen/")}
        for g in gens:
            assert v.lua_include(g) in source(name), (name, g)
        for g in set(v.LUA_INCLUDES) - gens:
            assert str(v.lua_include(g)) not in source(name), (name, g)
        for g in gens:
            users.setdefault(g, set()).add(name)
    assert set(users) == set(v.GENERATED_INCLUDES), "every generated include is used"
    assert users["gen/reports"] == {"report"}
    assert {"assign", "gang_assign"} <= users["gen/assign_refusals"]
    # (heads.lua carries none of the vocabulary: only its own items' positions)
    assert "heads" not in set().union(
        *(u for g, u in users.items() if not g.startswith("gen/args/"))
    )
    # a script's positions are its own; a heartbeat's leases are renew.lua's (lib/renewals)
    shared = {"renew": {"renew", "heartbeat"}}
    assert all(users[f"gen/args/{s}"] == shared.get(s, {s}) for s in SCHEMAS), "positions"


_SET = re.compile(r"\{\s*(\w+\s*=\s*true(?:\s*,\s*\w+\s*=\s*true)*)\s*,?\s*\}")
_LOCAL = re.compile(
    r"^local (" + "|".join(n for t in v.LUA_INCLUDES.values() for n in t) + r")\b", re.M
)


@pytest.mark.parametrize("name", every_lua_file())
def test_no_lua_file_restates_the_vocabulary(name: str) -> None:
    """No hand-written set of statuses or failure kinds, and no generated table defined again."""
    text = lua_text(name)
    assert not _LOCAL.search(text), name
    pair = r"[=~]= '(?:assigned|dispatched)' (?:or|and) [\w.\[\]]+ [=~]= '(?:assigned|dispatched)'"
    assert not re.search(pair, text), f"{name} spells out the leased statuses: use LEASED"
    words = set(v.STATUSES) | {k.value for k in FailureKind} | set(v.REPORT_OUTCOMES)
    for m in _SET.finditer(text):
        keys = set(re.findall(r"(\w+)\s*=\s*true", m.group(1)))
        assert not keys <= words, f"{name} restates {sorted(keys)}: use a gen/ include"


def test_messages_naming_the_vocabulary_name_all_of_it(real_fleet: Any) -> None:
    """The error messages that list a set (shown to users, kept word for word) list exactly the
    vocabulary's, in its order: the scripts get the lists generated (gen/reports,
    gen/retry_kinds) and answer with them."""

    def listing(words: tuple[str, ...]) -> str:
        return ", ".join(words[:-1]) + " or " + words[-1]

    h = real_fleet.add_host("h1", ("d1", "android", ()))
    tid = real_fleet.client.submit("x", driver_type="android")
    assert real_fleet.store.commit([(tid, "d1")])[0].startswith("ok:")
    (a,) = h.claim(1)
    for outcome, kind, text in (
        ("failed", "nope", f"failure_kind must be {listing(v.HOST_FAILURE_KINDS)}"),
        ("nope", "", f"outcome must be {listing(v.REPORT_OUTCOMES)}"),
    ):
        item = {"task_id": tid, "lease_id": a.lease_id, "outcome": outcome, "failure_kind": kind,
                "payload": ""}  # fmt: skip
        with pytest.raises(InvalidInput, match=f"^{re.escape(text)}$"):
            h._run("report", [*h._auth(), "1", REPORT.pack([item])])
    text = f"retry_on must be none or a csv of {', '.join(v.RETRY_KINDS)}"
    with pytest.raises(InvalidInput, match=f"^{re.escape(text)}$"):
        real_fleet.client._run("submit", raw_submit(retry_on="nope"))


# -- the scripts behave by it ------------------------------------------------------------------


@pytest.mark.parametrize("kind", list(FailureKind))
def test_report_accepts_exactly_the_host_reported_kinds(real_fleet, kind: FailureKind) -> None:
    """report.lua takes a failure kind a host may report and refuses every other (nothing
    written); a device fault counts against the device, a task's own failure does not."""
    h = real_fleet.add_host("h1", ("d1", "android", ()))
    tid = real_fleet.client.submit("x", driver_type="android", max_attempts=1)
    assert real_fleet.store.commit([(tid, "d1")])[0].startswith("ok:")
    (a,) = h.claim(1)
    if not kind.host_reported:
        with pytest.raises(InvalidInput, match="failure_kind must be"):
            h.report(tid, a.lease_id, "failed", kind.value, "p")
        assert real_fleet.client.get(tid).status is TaskStatus.dispatched
        return
    assert h.report(tid, a.lease_id, "failed", kind.value, "p") == "ok:failed"
    faults = real_fleet.r.hget(real_fleet.admin.keys.device("d1"), "consecutive_failures")
    assert int(faults or 0) == (1 if kind.device_fault else 0), kind
