"""Bad input gets a clear, typed error (``deviceq.core.errors``) and writes nothing: the pool's keys
(and their values) and the database size are compared before and after every attempt.
Runs on the real private redis-server and on fakeredis."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from deviceq import (
    AuthError,
    Client,
    ConfigError,
    DeviceqError,
    DeviceReport,
    HostClient,
    InvalidInput,
    NotFound,
    PoolAdmin,
    TaskStatus,
    Unmatchable,
)
from deviceq.core.bounds import MAX_GOAL_BYTES
from deviceq.host.link import Report

BAD_IDS = [
    "",
    " ",
    "a b",
    "a:b",
    "a*",
    "{x}",
    "x}",
    "{",
    "-lead",
    ".lead",
    "ä",
    "a\nb",
    "a/b",
    "x" * 129,
]
BAD_TAGS = ["a:b", "{x}", "}", "{", "*", "a*", "a b", " ", "x" * 65, "-lead", "é", "a,b"]


def snapshot(fleet: Any) -> dict[str, Any]:
    """Every key of the test's pool with its content (not DBSIZE: other tests' keys expire on
    the shared server at any moment, e.g. a leader lease or a short retention)."""
    r = fleet.r
    keys: dict[str, Any] = {}
    for key in r.scan_iter(match=f"dq:{{{fleet.pool}}}:*", count=1000):
        kind = r.type(key)
        readers: dict[str, Callable[[str], Any]] = {
            "hash": r.hgetall,
            "string": r.get,
            "list": lambda k: r.lrange(k, 0, -1),
            "set": lambda k: sorted(r.smembers(k)),
            "zset": lambda k: r.zrange(k, 0, -1, withscores=True),
            "stream": r.xrange,
        }
        keys[key] = readers[kind](key) if kind in readers else kind
    return keys


@contextmanager
def unchanged(fleet: Any) -> Iterator[None]:
    before = snapshot(fleet)
    yield
    assert snapshot(fleet) == before, "bad input must not write anything"


def refused(fleet: Any, exc: type[DeviceqError], fn: Callable[[], Any]) -> DeviceqError:
    with unchanged(fleet), pytest.raises(exc) as info:
        fn()
    assert str(info.value).strip(), "the error says what was wrong"
    assert "\n" not in str(info.value).strip()
    return info.value


@pytest.fixture
def ready(fleet: Any) -> Any:
    """A pool with a host, a device, a queued and a running task."""
    fleet.add_host("h1", ("d1", "android", ("wifi",)), ("d2", "android", ()))
    fleet.queued = fleet.client.submit("queued one")
    fleet.running = fleet.client.submit("running one")
    fleet.store.commit([(fleet.running, "d1")])
    (fleet.assignment,) = fleet.host("h1").claim(1)
    return fleet


# -- ids -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", BAD_IDS)
def test_malformed_task_ids(ready: Any, bad: str) -> None:
    c = ready.client
    refused(ready, InvalidInput, lambda: c.get(bad))
    refused(ready, InvalidInput, lambda: c.cancel(bad))
    refused(ready, InvalidInput, lambda: c.wait(bad, timeout=0.1))
    refused(ready, InvalidInput, lambda: c.get_many([ready.queued, bad]))
    refused(ready, InvalidInput, lambda: ready.store.commit([(ready.queued, "d2"), (bad, "d2")]))
    refused(ready, InvalidInput, lambda: ready.store.commit([(ready.queued, bad)]))
    refused(ready, InvalidInput, lambda: c.submit("g", idempotency_key=bad))


@pytest.mark.parametrize("bad", BAD_IDS)
def test_malformed_host_device_pool_and_workflow_names(ready: Any, bad: str) -> None:
    a = ready.admin
    refused(ready, InvalidInput, lambda: a.add_host(bad))
    refused(ready, InvalidInput, lambda: a.rotate_token(bad))
    refused(ready, InvalidInput, lambda: a.remove_host(bad))
    refused(ready, InvalidInput, lambda: a.drain(bad))
    refused(ready, InvalidInput, lambda: a.quarantine(bad))
    refused(ready, InvalidInput, lambda: a.device(bad))
    refused(ready, InvalidInput, lambda: Client(ready.r, bad))
    refused(ready, InvalidInput, lambda: HostClient(ready.r, ready.pool, bad, "token"))
    h = ready.host("h1")
    refused(ready, InvalidInput, lambda: h.heartbeat([DeviceReport(bad, "android")]))
    refused(ready, InvalidInput, lambda: h.heartbeat([DeviceReport("d1", bad)]))
    refused(ready, InvalidInput, lambda: ready.client.submit(workflow=bad))
    refused(ready, InvalidInput, lambda: ready.client.submit("g", driver_type=bad.strip() or "a b"))
    refused(
        ready,
        InvalidInput,
        lambda: ready.client.put_workflow({"name": bad, "steps": [{"goal": "x"}]}),
    )


@pytest.mark.parametrize("bad", ["a:b", "{x}", "a b", "*", "x" * 129])
def test_malformed_ids_in_host_calls(ready: Any, bad: str) -> None:
    """renew/report take task and lease ids that become key names: they are validated too."""
    h = ready.host("h1")
    refused(ready, InvalidInput, lambda: h.renew([(bad, ready.assignment.lease_id)]))
    refused(ready, InvalidInput, lambda: h.report(bad, ready.assignment.lease_id, "done"))
    refused(
        ready,
        InvalidInput,
        lambda: h.report_many(
            [Report(ready.running, ready.assignment.lease_id, "done"), Report(bad, "x-a1", "done")]
        ),
    )


def test_non_string_ids(ready: Any) -> None:
    refused(ready, InvalidInput, lambda: ready.client.get(123))  # type: ignore[arg-type]
    refused(ready, InvalidInput, lambda: ready.admin.add_host(None))  # type: ignore[arg-type]


# -- tags ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", BAD_TAGS)
def test_tags_with_special_characters(ready: Any, bad: str) -> None:
    refused(ready, InvalidInput, lambda: ready.client.submit("g", tags=["ok", bad]))
    refused(
        ready,
        InvalidInput,
        lambda: ready.client.submit_many([{"goal": "fine"}, {"goal": "g", "tags": [bad]}]),
    )
    h = ready.host("h1")
    refused(ready, InvalidInput, lambda: h.heartbeat([DeviceReport("d2", "android", (bad,))]))


def test_too_many_tags(ready: Any) -> None:
    many = [f"t{i}" for i in range(33)]
    refused(ready, InvalidInput, lambda: ready.client.submit("g", tags=many))
    assert ready.client.get(ready.client.submit("g", tags=[f"t{i}" for i in range(32)])).tags


# -- goals, workflows, options -------------------------------------------------------------------


@pytest.mark.parametrize("goal", ["", "   ", "\n\t", None])
def test_empty_goal(ready: Any, goal: str | None) -> None:
    refused(ready, InvalidInput, lambda: ready.client.submit(goal))


def test_oversized_goal(ready: Any) -> None:
    err = refused(ready, InvalidInput, lambda: ready.client.submit("x" * (MAX_GOAL_BYTES + 1)))
    assert str(MAX_GOAL_BYTES) in str(err)
    # multi-byte characters are counted in bytes
    refused(ready, InvalidInput, lambda: ready.client.submit("é" * (MAX_GOAL_BYTES // 2 + 1)))
    assert ready.client.submit("x" * MAX_GOAL_BYTES)


def test_goal_and_workflow_together(ready: Any) -> None:
    ready.client.put_workflow({"name": "wf", "steps": [{"goal": "s"}]})
    refused(ready, InvalidInput, lambda: ready.client.submit("g", workflow="wf"))


def test_unknown_workflow(ready: Any) -> None:
    err = refused(ready, NotFound, lambda: ready.client.submit(workflow="nope"))
    assert "nope" in str(err)
    refused(
        ready, NotFound, lambda: ready.client.submit_many([{"goal": "fine"}, {"workflow": "nope"}])
    )
    refused(ready, NotFound, lambda: ready.client.get_workflow("nope"))


def test_unmatchable_submission_when_rejecting(ready: Any) -> None:
    err = refused(
        ready,
        Unmatchable,
        lambda: ready.client.submit("g", driver_type="nokia", reject_unmatched=True),
    )
    assert "nokia" in str(err)
    refused(
        ready,
        Unmatchable,
        lambda: ready.client.submit_many(
            [{"goal": "fine"}, {"goal": "g", "tags": ["camera"], "reject_unmatched": True}]
        ),
    )
    assert ready.client.submit("g", tags=["wifi"], reject_unmatched=True)


def test_bad_workflow_definition(ready: Any) -> None:
    refused(ready, InvalidInput, lambda: ready.client.put_workflow({"name": "wf", "steps": []}))
    refused(
        ready,
        InvalidInput,
        lambda: ready.client.put_workflow({"name": "wf", "steps": [{"goal": ""}]}),
    )
    refused(ready, InvalidInput, lambda: ready.client.put_workflow({"name": "wf"}))


@pytest.mark.parametrize("priority", [-1, 10, "high", 1.5, None])
def test_bad_priority(ready: Any, priority: Any) -> None:
    refused(ready, InvalidInput, lambda: ready.client.submit("g", priority=priority))


@pytest.mark.parametrize(
    "field,value",
    [
        ("max_attempts", 0),
        ("max_attempts", 1001),
        ("max_attempts", "many"),
        ("queue_timeout", 0),
        ("queue_timeout", -1),
    ],
)
def test_bad_submit_options(ready: Any, field: str, value: Any) -> None:
    refused(ready, InvalidInput, lambda: ready.client.submit("g", **{field: value}))


def test_unknown_submit_field(ready: Any) -> None:
    refused(ready, InvalidInput, lambda: ready.client.submit_many([{"goal": "g", "colour": 1}]))


# -- host side -----------------------------------------------------------------------------------


def test_wrong_token_everywhere(ready: Any) -> None:
    bad = HostClient(ready.r, ready.pool, "h1", "definitely-not-it")
    lease = ready.assignment.lease_id
    for call in (
        lambda: bad.heartbeat([DeviceReport("d1", "android")]),
        lambda: bad.claim(1),
        lambda: bad.renew([(ready.running, lease)]),
        lambda: bad.report(ready.running, lease, "done"),
        lambda: bad.release(ready.running, lease),
        lambda: bad.set_draining(True),
    ):
        err = refused(ready, AuthError, call)
        assert "definitely-not-it" not in str(err)
    # another host's token is wrong too, and an unknown host is refused the same way
    cross = HostClient(ready.r, ready.pool, "h1", ready.tokens["h1"] + "x")
    refused(ready, AuthError, lambda: cross.claim(1))
    refused(ready, AuthError, lambda: HostClient(ready.r, ready.pool, "ghost", "t").claim(1))
    refused(ready, InvalidInput, lambda: HostClient(ready.r, ready.pool, "h1", ""))


def test_bad_device_state(ready: Any) -> None:
    h = ready.host("h1")
    refused(
        ready, InvalidInput, lambda: h.heartbeat([DeviceReport("d1", "android", (), "exploded")])
    )  # type: ignore


def test_device_listed_twice_in_a_snapshot(ready: Any) -> None:
    h = ready.host("h1")
    refused(
        ready,
        InvalidInput,
        lambda: h.heartbeat([DeviceReport("d2", "android"), DeviceReport("d2", "ios")]),
    )


def test_bad_report_and_claim_arguments(ready: Any) -> None:
    h = ready.host("h1")
    lease = ready.assignment.lease_id
    refused(ready, InvalidInput, lambda: h.report(ready.running, lease, "finished"))
    refused(ready, InvalidInput, lambda: h.report(ready.running, lease, "failed", "meh"))
    refused(ready, InvalidInput, lambda: h.claim(0))
    refused(ready, InvalidInput, lambda: h.claim(-5))
    refused(ready, InvalidInput, lambda: ready.store.expire(0))


# -- config --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key,value",
    [
        ("lease_ttl", 0),
        ("lease_ttl", -1),
        ("lease_ttl", "abc"),
        ("lease_ttl", "nan"),
        ("lease_ttl", "inf"),
        ("claim_ttl", "1e400"),
        ("host_timeout", "-inf"),
        ("max_queue_depth", 0),
        ("max_queue_depth", "1.5"),
        ("max_queue_depth", "ten"),
        ("max_attempts", 0),
        ("max_attempts", 1001),
        ("event_maxlen", 10),
        ("quarantine_after", -1),
        ("reject_unmatchable", 2),
        ("no_such_setting", 1),
        ("", 1),
    ],
)
def test_bad_config_values(ready: Any, key: str, value: Any) -> None:
    before = ready.admin.get_config()
    err = refused(ready, ConfigError, lambda: ready.admin.set_config(key, value))
    assert key in str(err) or "unknown setting" in str(err)
    assert ready.admin.get_config() == before


def test_unknown_config_key_on_get(ready: Any) -> None:
    refused(ready, ConfigError, lambda: ready.admin.get_config("no_such_setting"))


def test_stored_config_keeps_tasks_readable(ready: Any) -> None:
    """The extreme values set_config accepts still give tasks that commit, read and cancel
    (values past the bounds are refused: test_bad_config_values)."""
    for key, value in (("claim_ttl", "31536000"), ("lease_ttl", "31536000"),
                       ("claim_ttl", "1"), ("max_attempts", "1000")):  # fmt: skip
        assert ready.admin.set_config(key, value) == float(value)
        tid = ready.client.submit("g")
        lease = ready.store.commit([(tid, "d2")])[0]
        assert lease.startswith("ok:"), (key, value, lease)
        t = ready.client.get(tid)
        assert t.status is TaskStatus.assigned and t.lease_expires_at
        assert ready.client.cancel(tid) == "cancelled"


def test_pool_admin_validates_its_pool(ready: Any) -> None:
    refused(ready, InvalidInput, lambda: PoolAdmin(ready.r, "bad pool"))
