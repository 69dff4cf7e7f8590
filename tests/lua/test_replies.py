"""Per-item replies parsed into typed results (``deviceq.core.replies``), and the scripts'
reply words held to the vocabulary (``deviceq.core.vocabulary``): every code and reason a
script can answer is one the Python side knows."""

from __future__ import annotations

import json
import re

import pytest

from deviceq.core import vocabulary as v
from deviceq.core.errors import InvalidInput
from deviceq.core.replies import Reply, parse
from deviceq.core.scripts import lua_dir
from deviceq.core.vocabulary import ReplyCode

# -- the parser --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("ok:t1-a1", Reply(ReplyCode.ok, "t1-a1")),  # assign: the lease id
        ("ok:3", Reply(ReplyCode.ok, "3")),  # gang_assign: the attempt
        ("ok:queued", Reply(ReplyCode.ok, "queued")),  # report: the status
        ("ok", Reply(ReplyCode.ok)),  # log_append, task_priority
        ("same", Reply(ReplyCode.same)),
        ("dup:done", Reply(ReplyCode.dup, "done")),
        ("err:task_not_queued", Reply(ReplyCode.err, "task_not_queued")),
        ("err:missing_tag:sim", Reply(ReplyCode.err, "missing_tag:sim")),  # the tag kept
        ("err:device_not_idle@phone", Reply(ReplyCode.err, "device_not_idle", "phone")),
        ("err:missing_tag:sim@phone", Reply(ReplyCode.err, "missing_tag:sim", "phone")),
        ("rejected:superseded", Reply(ReplyCode.rejected, "superseded")),
        (b"ok:t1-a1", Reply(ReplyCode.ok, "t1-a1")),  # a client without decode_responses
        ("whatever", Reply(ReplyCode.err, "whatever")),  # unknown: refused, the text shown
        ("", Reply(ReplyCode.err, "")),
    ],
)
def test_parse(raw: str | bytes, want: Reply) -> None:
    assert parse(raw) == want


def test_reply_properties() -> None:
    ok, dup, same = parse("ok:L"), parse("dup:done"), parse("same")
    assert ok.ok and not ok.refused and ok.reason == "" and ok.value == "L"
    assert not dup.ok and not dup.refused and dup.reason == ""
    assert not same.ok and not same.refused
    err, rej = parse("err:device_held@web"), parse("rejected:expired")
    assert err.refused and err.reason == "device_held" and err.role == "web"
    assert rej.refused and rej.reason == "expired" and not rej.device_refusal


@pytest.mark.parametrize(
    ("raw", "device"),
    [
        ("err:device_not_idle", True),
        ("err:device_quarantined@phone", True),
        ("err:driver_type_mismatch@phone", True),
        ("err:missing_tag:wifi", True),
        ("err:task_not_queued", False),
        ("err:host_dead", False),
        ("err:tenant_cap", False),
        ("err:pool_paused", False),
        ("ok:device_x", False),  # an ok's value is no reason
    ],
)
def test_device_refusal(raw: str, device: bool) -> None:
    assert parse(raw).device_refusal is device


def test_a_reply_is_frozen() -> None:
    r = parse("ok:L")
    with pytest.raises(AttributeError):
        r.value = "other"  # type: ignore[misc]


# -- the scripts answer only in the vocabulary -------------------------------------------------


def lua(name: str) -> str:
    return (lua_dir() / f"{name}.lua").read_text()


_REPLY = re.compile(r"'(ok|err|dup|rejected|same)(?::([a-z_]*))?'")

REASONS = {
    "assign": v.ASSIGN_REFUSALS,
    "gang_assign": v.GANG_REFUSALS,
    "task_priority": v.PRIORITY_REFUSALS,
    "report": v.REPORT_REJECTIONS,
    "log_append": v.LOG_REJECTIONS,
    "progress": v.LOG_REJECTIONS,
}


@pytest.mark.parametrize("name", sorted(REASONS))
def test_reply_literals_are_in_the_vocabulary(name: str) -> None:
    """Every ``'CODE:REASON'`` literal a per-item script answers with names a known code and,
    for a refusal, one of that script's known reasons."""
    seen = set()
    for code, reason in _REPLY.findall(lua(name)):
        assert code in set(ReplyCode), (name, code)
        if code in ("err", "rejected") and reason:
            assert reason in REASONS[name], f"{name}: {code}:{reason} is not in the vocabulary"
            seen.add(reason)
    assert seen, name


def test_assign_reasons_from_the_helpers_are_in_the_vocabulary() -> None:
    """assign.lua's ``'err:' .. why`` reasons come from its own checks and its helpers
    (placement, liveness, constraints): each is an ASSIGN_REFUSALS reason, and a gang's device
    reasons are GANG_REFUSALS ones."""
    found = set()
    word = re.compile(r"(?:return (?:nil, |false, )?|or )'([a-z_]+):?'")  # a reason returned
    for name in ("assign", "lib/placement", "lib/liveness", "lib/constraints"):
        code = re.sub(r"--[^\n]*", "", lua(name))  # (comments dropped)
        found |= set(word.findall(code))
    found |= set(v.ASSIGN_REFUSAL_OF_BLOCKER.values())
    assert "device_not_idle" in found and "missing_tag" in found and "host_dead" in found
    assert found <= set(v.ASSIGN_REFUSALS), found - set(v.ASSIGN_REFUSALS)
    device_side = {r for r in found if r.startswith(("device_", "host_"))}
    assert device_side | {"driver_type_mismatch", "missing_tag"} <= set(v.GANG_REFUSALS)


def test_replies_on_redis_parse_as_typed(real_fleet) -> None:
    """The real scripts' answers, parsed: a commit's lease, a refusal's reason, a gang's role,
    a report's status and its duplicate, a rejection."""
    f = real_fleet
    h = f.add_host("h1", ("d1", "android", ("wifi",)), ("p1", "android", ()))
    tid = f.client.submit("x", driver_type="android", tags=["wifi"])
    assert parse(f.store.commit([(tid, "p1")])[0]) == Reply(ReplyCode.err, "missing_tag:wifi")
    assert parse(f.store.commit([(tid, "p1")])[0]).device_refusal
    ok = parse(f.store.commit([(tid, "d1")])[0])
    assert ok.ok and ok.value == f.r.hget(f.admin.keys.task(tid), "lease_id")
    assert parse(f.store.commit([(tid, "d1")])[0]) == Reply(ReplyCode.err, "task_not_queued")
    (a,) = h.claim(1)
    assert parse(h.report(tid, a.lease_id, "done", None, "r")) == Reply(ReplyCode.ok, "done")
    assert parse(h.report(tid, a.lease_id, "done", None, "r")) == Reply(ReplyCode.dup, "done")
    assert parse(h.report(tid, "other", "done", None, "r")) == Reply(
        ReplyCode.rejected, "superseded"
    )
    gang = f.client.submit("g", roles={"web": "android:wifi", "phone": "android:wifi"})
    got = parse(f.store.commit_gang(gang, ["d1", "p1"]))
    assert got == Reply(ReplyCode.err, "missing_tag:wifi", "phone") and got.device_refusal
    with pytest.raises(InvalidInput, match="cannot dispatch nope to d1: task_not_found"):
        f.admin.dispatch("nope", "d1")


def test_set_priority_command_reads_the_replies(real_fleet, redis_url: str) -> None:
    """``deviceq task set-priority`` tells each reply apart: changed, already so, refused (with
    the reason in words, exit 1); ``--json`` prints the replies as the scripts gave them."""
    from harness import deviceq

    f = real_fleet
    a = f.client.submit("a", driver_type="x")
    b = f.client.submit("b", driver_type="x", priority=3)
    out = deviceq(redis_url, f.pool, "task", "set-priority", a, b, "nope", "3")
    assert out.returncode == 1, out.stderr
    assert out.stdout.splitlines() == [f"{a} priority 3", f"{b} already has priority 3"]
    # (and, first, that the strategy in force, the default fifo_match, ignores priority)
    *warned, error = out.stderr.strip().splitlines()
    assert error == "error: nope: task not found"
    assert len(warned) == 1 and warned[0].startswith("warning: priority has no effect")
    out = deviceq(redis_url, f.pool, "task", "set-priority", a, "--json", "5")
    assert out.returncode == 0 and json.loads(out.stdout) == {a: "ok"}, out.stderr
