"""Assignment strategies as pure policy (snapshots built in memory), the registry, and the
``deviceq.scheduler.strategies`` entry-point group (a real installed distribution on sys.path)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deviceq.core.errors import ConfigError
from deviceq.scheduler import strategies as S
from deviceq.scheduler.strategies import (
    Bucket,
    IdleDevice,
    QueuedTask,
    Snapshot,
    get_strategy,
    register_strategy,
    registered_strategies,
)

BUILTINS = ("fifo_match", "priority_match", "lru_device")


def bucket(sig: str, driver: str | None, tags: str, seqs: list[int], prio: int = 0) -> Bucket:
    heads = tuple(QueuedTask(f"{sig}-{s}", s, sig, prio) for s in seqs)
    return Bucket(
        sig, driver, frozenset(t for t in tags.split(",") if t), prio, heads, seqs[0] if seqs else 0
    )


def dev(did: str, driver: str, tags: str = "", idle_since: int = 0, host: str = "h1") -> IdleDevice:
    return IdleDevice(did, host, driver, frozenset(t for t in tags.split(",") if t), idle_since)


def plan(name: str, buckets: list[Bucket], devices: list[IdleDevice], limit: int = 100):
    return list(get_strategy(name).propose(Snapshot.build(buckets, devices, limit)))


# -- registry ------------------------------------------------------------------------------------
def test_builtins_are_registered_and_satisfy_the_protocol():
    names = registered_strategies()
    for n in BUILTINS:
        assert n in names
        s = get_strategy(n)
        assert isinstance(s, S.AssignmentStrategy)
        assert s.name == n


def test_unknown_strategy_is_a_config_error_listing_registered_names():
    with pytest.raises(ConfigError) as exc:
        get_strategy("no_such_strategy")
    msg = str(exc.value)
    assert "no_such_strategy" in msg
    for n in BUILTINS:
        assert n in msg


def test_get_strategy_returns_fresh_instances():
    assert get_strategy("fifo_match") is not get_strategy("fifo_match")


def test_register_rejects_objects_without_propose():
    with pytest.raises(ConfigError):
        register_strategy("broken_obj")(object())
    assert "broken_obj" not in registered_strategies()


# -- fifo_match ----------------------------------------------------------------------------------
def test_fifo_oldest_task_first_across_buckets():
    b1 = bucket("s1", "android", "", [5, 9])
    b2 = bucket("s2", "android", "wifi", [3, 7])
    devices = [dev("d2", "android", "wifi"), dev("d1", "android", "wifi")]
    pairs = plan("fifo_match", [b1, b2], devices)
    # oldest two tasks (seq 3 and 5) get the devices; the first in device-id order goes first
    assert pairs == [("s2-3", "d1"), ("s1-5", "d2")]


def test_fifo_first_matching_device_is_smallest_device_id():
    b = bucket("s", "android", "", [1])
    devices = [dev("pixel-9", "android"), dev("pixel-10", "android"), dev("a-ios", "ios")]
    assert plan("fifo_match", [b], devices) == [("s-1", "pixel-10")]  # string order


def test_fifo_no_head_of_line_blocking():
    stuck = bucket("stuck", "gpu", "a100", [1, 2, 3])  # nobody can run these
    ok = bucket("ok", "android", "", [10, 11])
    pairs = plan("fifo_match", [stuck, ok], [dev("d1", "android"), dev("d2", "android")])
    assert pairs == [("ok-10", "d1"), ("ok-11", "d2")]


def test_fifo_respects_limit_and_never_reuses_a_device():
    b = bucket("s", None, "", list(range(1, 50)))
    pairs = plan("fifo_match", [b], [dev(f"d{i:02d}", "x") for i in range(10)], limit=4)
    assert [t for t, _ in pairs] == ["s-1", "s-2", "s-3", "s-4"]
    assert len({d for _, d in pairs}) == 4


def test_fifo_is_deterministic_whatever_the_input_order():
    b1 = bucket("s1", None, "", [4, 8])
    b2 = bucket("s2", None, "", [2, 6])
    devs = [dev("c", "x"), dev("a", "x"), dev("b", "x")]
    first = plan("fifo_match", [b1, b2], devs)
    assert first == plan("fifo_match", [b2, b1], list(reversed(devs)))
    assert first == [("s2-2", "a"), ("s1-4", "b"), ("s2-6", "c")]


# -- priority_match ------------------------------------------------------------------------------
def test_priority_higher_first_then_fifo_within_priority():
    low = bucket("low", None, "", [1, 2], prio=0)
    high = bucket("high", None, "", [5, 6], prio=9)
    mid = bucket("mid", None, "", [3, 4], prio=5)
    pairs = plan("priority_match", [low, high, mid], [dev(f"d{i}", "x") for i in range(5)])
    assert [t for t, _ in pairs] == ["high-5", "high-6", "mid-3", "mid-4", "low-1"]


def test_priority_unservable_high_priority_does_not_block_low():
    high = bucket("high", "gpu", "", [1], prio=9)
    low = bucket("low", "android", "", [2], prio=0)
    assert plan("priority_match", [high, low], [dev("d1", "android")]) == [("low-2", "d1")]


# -- lru_device ----------------------------------------------------------------------------------
def test_lru_gives_the_longest_idle_device():
    b = bucket("s", None, "", [1, 2, 3])
    devices = [
        dev("a", "x", idle_since=300),
        dev("b", "x", idle_since=100),
        dev("c", "x", idle_since=200),
    ]
    assert plan("lru_device", [b], devices) == [("s-1", "b"), ("s-2", "c"), ("s-3", "a")]


def test_lru_spreads_over_hosts_when_hosts_free_devices_in_turn():
    # devices became idle alternately on two hosts: LRU alternates hosts too
    devices = [
        dev(f"h{h}-d{i}", "x", idle_since=10 * i + h, host=f"h{h}")
        for i in range(3)
        for h in (1, 2)
    ]
    pairs = plan("lru_device", [bucket("s", None, "", [1, 2, 3, 4])], devices)
    hosts = [d.split("-")[0] for _, d in pairs]
    assert hosts == ["h1", "h2", "h1", "h2"]


# -- invariants of every built-in strategy (property test) ---------------------------------------
DRIVERS = ["android", "ios", "gpu"]
TAGS = ["wifi", "cam", "5g"]


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    nb = draw(st.integers(0, 6))
    buckets = []
    for i in range(nb):
        drv = draw(st.sampled_from([None, *DRIVERS]))
        tags = draw(st.sets(st.sampled_from(TAGS), max_size=2))
        n = draw(st.integers(1, 5))
        # seqs are unique pool-wide, as the submit counter makes them
        raw = draw(st.sets(st.integers(1, 1000), min_size=n, max_size=n))
        seqs = sorted(10 * s + i for s in raw)
        buckets.append(bucket(f"b{i}", drv, ",".join(tags), seqs, prio=draw(st.integers(0, 9))))
    nd = draw(st.integers(0, 8))
    devices = [
        dev(
            f"d{j}",
            draw(st.sampled_from(DRIVERS)),
            ",".join(draw(st.sets(st.sampled_from(TAGS)))),
            draw(st.integers(0, 50)),
        )
        for j in range(nd)
    ]
    return Snapshot.build(buckets, devices, draw(st.integers(1, 10)))


@settings(max_examples=150, deadline=None)
@given(snapshots(), st.sampled_from(BUILTINS))
def test_every_builtin_proposes_valid_maximal_pairs(snap: Snapshot, name: str):
    pairs = list(get_strategy(name).propose(snap))
    tasks = {t.task_id: b for b in snap.buckets for t in b.heads}
    devs = {d.device_id: d for d in snap.devices}
    assert len(pairs) <= snap.limit
    assert len({t for t, _ in pairs}) == len(pairs)
    assert len({d for _, d in pairs}) == len(pairs)
    for t, d in pairs:
        assert tasks[t].accepts(devs[d])
    # greedy maximality: below the limit, no unassigned task has a matching unused device
    if len(pairs) < snap.limit:
        used_t = {t for t, _ in pairs}
        used_d = {d for _, d in pairs}
        for tid, b in tasks.items():
            if tid not in used_t:
                assert not any(b.accepts(d) for did, d in devs.items() if did not in used_d)


@settings(max_examples=100, deadline=None)
@given(snapshots())
def test_fifo_never_skips_an_older_servable_task(snap: Snapshot):
    pairs = get_strategy("fifo_match").propose(snap)
    assigned = {t for t, _ in pairs}
    tasks = sorted(snap.tasks(), key=lambda t: t.seq)
    by_sig = {b.sig: b for b in snap.buckets}
    used: set[str] = set()
    # replay in seq order: when a task is skipped, no device it accepts may be unused yet
    order = {t: i for i, (t, _) in enumerate(pairs)}
    for t in tasks:
        if t.task_id in assigned:
            used.add(dict(pairs)[t.task_id])
            continue
        if len(used) >= snap.limit:
            break
        free = [d for d in snap.devices if d.device_id not in used]
        assert not any(by_sig[t.sig].accepts(d) for d in free), (t, order)


# -- entry points ----------------------------------------------------------------------------------
PLUGIN = textwrap.dedent(
    '''
    from deviceq.scheduler.strategies import Snapshot

    class Lifo:
        """Newest task first (a strategy shipped by another package)."""
        name = "plugin_lifo"

        def propose(self, snapshot: Snapshot):
            order = sorted(snapshot.tasks(), key=lambda t: -t.seq)
            return snapshot.greedy(order, device_key=lambda d: d.device_id)
    '''
)


def _install_plugin(root: Path) -> None:
    (root / "dq_plugin_mod.py").write_text(PLUGIN)
    info = root / "dq_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dq-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[deviceq.strategies]\nplugin_lifo = dq_plugin_mod:Lifo\n"
        "plugin_broken = dq_plugin_mod:DoesNotExist\n"
    )


def test_entry_point_strategy_is_found_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    _install_plugin(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(S._ENTRY_POINTS_LOADED, "done", False)
    try:
        assert "plugin_lifo" in registered_strategies()
        s = get_strategy("plugin_lifo")
        snap = Snapshot.build([bucket("s", None, "", [1, 2, 3])], [dev("d1", "x")], 10)
        assert list(s.propose(snap)) == [("s-3", "d1")]
        # a broken plugin is reported when used, and does not hide the others
        with pytest.raises(ConfigError, match="plugin_broken"):
            get_strategy("plugin_broken")
    finally:
        S._REGISTRY.pop("plugin_lifo", None)
        S._REGISTRY.pop("plugin_broken", None)


def test_entry_point_strategy_listed_by_the_cli(tmp_path: Path):
    _install_plugin(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run(
        [sys.executable, "-c", "from deviceq.cli import main; main()", "scheduler", "strategies"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    listed = out.stdout.split("\n")
    assert "plugin_lifo" in listed and "fifo_match (default)" in listed


@pytest.mark.parametrize("name", [*BUILTINS, "fair_share"])
def test_every_strategy_offers_a_device_with_recent_faults_last(name: str):
    """The pass corrects every strategy's choice: a device with consecutive device faults is
    used only when no fault-free matching device is free, the one with fewer faults first."""
    from dataclasses import replace

    from deviceq.scheduler.plan import plan as plan_pass

    b = bucket("s", "android", "", [1, 2, 3])
    devices = [
        replace(dev("a-phone1", "android", idle_since=1), faults=3),
        replace(dev("b-phone2", "android", idle_since=2), faults=1),
        dev("c-phone3", "android", idle_since=3),
    ]
    snap = Snapshot.build([b], devices, 100)
    one, _ = plan_pass(get_strategy(name), Snapshot.build([bucket("s", "android", "", [1])],
                                                         devices, 100), avoiding=False)  # fmt: skip
    assert one == [("s-1", "c-phone3")]
    two = Snapshot.build([bucket("s", "android", "", [1, 2])], devices, 100)
    pairs, _ = plan_pass(get_strategy(name), two, avoiding=False)
    assert sorted(d for _, d in pairs) == ["b-phone2", "c-phone3"]
    pairs, _ = plan_pass(get_strategy(name), snap, avoiding=False)  # every device is needed
    assert sorted(d for _, d in pairs) == ["a-phone1", "b-phone2", "c-phone3"]
