"""``lib/queue.lua``: one call that puts many tasks into buckets, in any seq order and with tasks
leaving buckets in between, leaves the bucket index as if each had been enqueued alone (the
index holds each non-empty bucket at its head's seq; a bucket's constraints exist exactly while
it is non-empty), though it checks a bucket's size and head score once per call."""

from __future__ import annotations

import uuid

import redis

from deviceq.core.scripts import assemble

PROBE = """--- @include "lib/base"
--- @include "lib/queue"
-- ARGV: ops, each 'e ID SIG SEQ' (enqueue) or 'd ID SIG' (dequeue)
local i = 1
while i <= #ARGV do
  if ARGV[i] == 'e' then
    enqueue(ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], 'drv', '', '0', '')
    i = i + 4
  else
    dequeue(ARGV[i + 1], ARGV[i + 2])
    i = i + 3
  end
end
return redis.call('ZCARD', k('queues'))
"""


def _check(r: redis.Redis, prefix: str, want: dict[str, dict[str, int]]) -> None:
    index = dict(r.zrange(prefix + "queues", 0, -1, withscores=True))
    heads = {s: min(m.values()) for s, m in want.items() if m}
    assert {s: int(v) for s, v in index.items()} == heads
    for sig, members in want.items():
        got = {m: int(v) for m, v in r.zrange(prefix + "queue:" + sig, 0, -1, withscores=True)}
        assert got == members
        assert r.exists(prefix + "sig:" + sig) == (1 if members else 0), sig


def test_one_call_of_many_enqueues_and_dequeues_keeps_the_index_exact(real_r: redis.Redis) -> None:
    prefix = f"dq:{{q{uuid.uuid4().hex[:10]}}}:"
    sha = real_r.script_load(assemble(PROBE))
    try:
        # rising seqs (a submit), then lower ones (retries put back), a bucket emptied and
        # refilled within the call, and a second bucket interleaved
        ops = [
            "e", "t5", "A", "5", "e", "t6", "A", "6", "e", "t9", "B", "9",
            "e", "t3", "A", "3", "e", "t4", "A", "4", "e", "t1", "A", "1",
            "d", "t9", "B", "e", "t12", "B", "12", "e", "t10", "B", "10",
            "d", "t1", "A", "d", "t3", "A", "e", "t2", "A", "2",
        ]  # fmt: skip
        assert real_r.evalsha(sha, 1, prefix, *ops) == 2
        _check(real_r, prefix, {"A": {"t2": 2, "t4": 4, "t5": 5, "t6": 6},
                                "B": {"t10": 10, "t12": 12}})  # fmt: skip
        # a later call: a bucket emptied, another given an older task
        ops = ["d", "t10", "B", "d", "t12", "B", "e", "t0", "A", "0", "e", "t7", "A", "7"]
        assert real_r.evalsha(sha, 1, prefix, *ops) == 1
        _check(real_r, prefix, {"A": {"t0": 0, "t2": 2, "t4": 4, "t5": 5, "t6": 6, "t7": 7},
                                "B": {}})  # fmt: skip
    finally:
        for key in real_r.scan_iter(match=prefix + "*"):
            real_r.delete(key)
