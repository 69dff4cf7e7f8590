"""A script's items are declared once (`deviceq.core.script_args`): packed by Python, read by
name in Lua through the generated ``gen/args/NAME`` positions, named in the script's header.
Adding an optional field is one line of schema. Real Redis and fakeredis (the ``r``
fixture)."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import pytest
import redis

from deviceq import Client, DeviceReport, HostClient, PoolAdmin
from deviceq.core import script_args, scripts
from deviceq.core.script_args import HEARTBEAT, SCHEMAS, SUBMIT, Items, packb, text
from deviceq.core.scripts import assemble, lua_dir, read

FIELD_LINE = re.compile(r"^--   ([a-z_][a-z0-9_]*)\s")


def header_fields(script: str) -> list[str]:
    """The item fields a script's header names: its lines ``--   NAME  description``."""
    body = (lua_dir() / f"{script}.lua").read_text()
    return [m.group(1) for line in body.splitlines() if (m := FIELD_LINE.match(line))]


@pytest.mark.parametrize("script", sorted(SCHEMAS))
def test_each_scripts_header_names_its_item_fields_in_order(script: str) -> None:
    assert header_fields(script) == list(SCHEMAS[script].names)


@pytest.mark.parametrize("script", sorted(SCHEMAS))
def test_the_generated_positions_follow_the_schema(script: str) -> None:
    schema = SCHEMAS[script]
    body = read(f"gen/args/{script}")
    assert body is not None
    consts = dict(re.findall(r"^local ([A-Z_][A-Z0-9_]*) = (\d+)$", body, re.M))
    assert consts.pop(f"{schema.prefix}_N") == str(schema.width)
    assert consts == {f"{schema.prefix}_{n.upper()}": str(i) for i, n in
                      enumerate(schema.names, 1)}  # fmt: skip
    # the script includes its positions
    lua = (lua_dir() / f"{script}.lua").read_text()
    assert f'--- @include "gen/args/{script}"' in lua


def test_packing_is_strict_about_the_schema() -> None:
    task = {"id": "t1", "kind": "goal", "goal": "g", "workflow": "", "driver_type": "",
            "tags": "", "priority": 0}  # fmt: skip
    assert SUBMIT.flat([task])[:7] == ["t1", "goal", "g", "", "", "", 0]
    assert SUBMIT.flat([task])[7:] == [False] * (SUBMIT.width - 7)  # optional ones not given
    with pytest.raises(ValueError, match="required"):
        SUBMIT.flat([{**task, "id": None}])
    with pytest.raises(TypeError, match="priority"):
        SUBMIT.flat([{**task, "priority": "3"}])
    with pytest.raises(TypeError, match="priority"):
        SUBMIT.flat([{**task, "priority": True}])
    with pytest.raises(TypeError, match="goal"):
        SUBMIT.flat([{**task, "goal": b"g"}])
    with pytest.raises(ValueError, match="no field 'colour'"):
        SUBMIT.flat([{**task, "colour": "red"}])
    with pytest.raises(ValueError, match="twice"):
        Items("x", "X", (text("a"), text("a")))
    with pytest.raises(ValueError, match="plain name"):
        Items("x", "X", (text("a-b"),))


READ_BACK = """--- @include "lib/args"
--- @include "gen/args/submit"
local n = tonumber(ARGV[1])
local A = packed_items(ARGV[2], n, TASK_N)
if not A then return redis.error_reply('INVALID bad argument count') end
local out = {}
for i = 0, n - 1 do
  local b = i * TASK_N
  out[#out + 1] = A[b + TASK_ID]
  out[#out + 1] = A[b + TASK_PRIORITY]
  out[#out + 1] = A[b + TASK_SUITE] or 'not given'
end
return out
"""


def with_suite() -> Items:
    """SUBMIT with one more optional field, declared in one line."""
    return replace(SUBMIT, fields=(*SUBMIT.fields, text("suite", optional=True)))


def test_an_optional_field_added_in_one_line_arrives_by_name(
    r: redis.Redis, pool: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(script_args.SCHEMAS, "submit", with_suite())
    schema = script_args.SCHEMAS["submit"]
    tasks = [
        {"id": "a", "kind": "goal", "goal": "g", "workflow": "", "driver_type": "", "tags": "",
         "priority": 3, "suite": "nightly"},
        {"id": "b", "kind": "goal", "goal": "g", "workflow": "", "driver_type": "", "tags": "",
         "priority": 7},
    ]  # fmt: skip
    got = r.eval(assemble(READ_BACK), 1, f"dq:{{{pool}}}:", 2, schema.pack(tasks))
    assert got == ["a", 3, "nightly", "b", 7, "not given"]
    # a count that does not match the packed values is refused
    with pytest.raises(redis.ResponseError, match="INVALID"):
        r.eval(assemble(READ_BACK), 1, f"dq:{{{pool}}}:", 3, schema.pack(tasks))


def test_submit_with_a_field_added_still_reads_every_field_by_name(
    r: redis.Redis, pool: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """submit.lua sent with the longer schema's positions takes the longer items: each field
    it reads lands where the schema put it (the new one is there for a script to read)."""
    client = Client(r, pool)
    monkeypatch.setitem(script_args.SCHEMAS, "submit", with_suite())
    schema = script_args.SCHEMAS["submit"]
    text_ = assemble((lua_dir() / "submit.lua").read_text(), "submit")
    assert f"TASK_SUITE = {script_args.SUBMIT.width + 1}" in text_
    task = {"id": "t-suite", "kind": "goal", "goal": "hello", "workflow": "",
            "driver_type": "android", "tags": "wifi", "priority": 4, "max_attempts": 2,
            "tenant": "team-a", "by": "alice", "suite": "nightly"}  # fmt: skip
    assert r.eval(text_, 1, client.keys.prefix, 1, schema.pack([task])) == ["t-suite", 1]
    t = client.get("t-suite")
    assert (t.goal, t.driver_type, t.tags, t.priority, t.max_attempts) == (
        "hello", "android", ("wifi",), 4, 2)  # fmt: skip
    assert (t.tenant, t.submitted_by) == ("team-a", "alice")


def test_heartbeat_devices_arrive_as_packed_entries(r: redis.Redis, pool: str) -> None:
    admin = PoolAdmin(r, pool)
    token = admin.add_host("h1")
    h = HostClient(r, pool, "h1", token)
    h.heartbeat([DeviceReport("d1", "android", ("wifi",)), DeviceReport("d2", "web")])
    assert {d.device_id: d.tags for d in admin.devices()} == {"d1": ("wifi",), "d2": ()}
    # an entry of the wrong width (a field missing) is refused, nothing written
    args: list[Any] = ["h1", token, "", "delta", "x", "y", "2", "1",
                       packb(["d1", "android", "wifi", "idle"])]  # fmt: skip
    with pytest.raises(redis.ResponseError, match="INVALID bad argument count"):
        r.eval(assemble((lua_dir() / "heartbeat.lua").read_text(), "heartbeat"), 1,
               admin.keys.prefix, *args)  # fmt: skip
    assert HEARTBEAT.width == 6  # (attrs: optional)


def test_whole_numbers_arrive_typed_and_are_checked_as_numbers(r: redis.Redis, pool: str) -> None:
    """A packed whole-number field is a Lua number: text, a fraction or a value out of its
    range is refused by the script (no text parsed back)."""
    client = Client(r, pool)
    good = {"id": "t1", "kind": "goal", "goal": "g", "workflow": "", "driver_type": "",
            "tags": "", "priority": 1}  # fmt: skip
    body = assemble((lua_dir() / "submit.lua").read_text(), "submit")
    for bad in ({"priority": "1"}, {"priority": 1.5}, {"priority": 10}, {"max_attempts": 0},
                {"not_before": -1}, {"reject_unmatched": 2}):  # fmt: skip
        raw = packb([{**good, **bad}.get(n, False) for n in SUBMIT.names])
        with pytest.raises(redis.ResponseError, match="^INVALID"):
            r.eval(body, 1, client.keys.prefix, 1, raw)
    assert client.list() == []
    assert r.eval(body, 1, client.keys.prefix, 1, SUBMIT.pack([good])) == ["t1", 1]


def test_an_optional_device_field_added_in_one_line_needs_no_other_change(
    r: redis.Redis, pool: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A device entry with one more optional field, declared in one line: the host's rows
    (which stop short of it) still go through, and the script has the field's position."""
    longer = replace(HEARTBEAT, fields=(*HEARTBEAT.fields, text("extra", optional=True)))
    monkeypatch.setitem(script_args.SCHEMAS, "heartbeat", longer)
    monkeypatch.setattr("deviceq.host.redis_link.HEARTBEAT", longer)
    scripts.source.cache_clear()
    scripts.sha.cache_clear()
    try:
        assert "local DEV_EXTRA = 7" in scripts.source("heartbeat")
        admin = PoolAdmin(r, pool)
        h = HostClient(r, pool, "h1", admin.add_host("h1"))
        h.heartbeat([DeviceReport("d1", "android", ("wifi",)), DeviceReport("d2", "web")])
        assert {d.device_id: d.tags for d in admin.devices()} == {"d1": ("wifi",), "d2": ()}
    finally:
        scripts.source.cache_clear()
        scripts.sha.cache_clear()
