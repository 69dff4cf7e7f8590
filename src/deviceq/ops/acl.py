"""Redis ACL users for the four roles of a pool: ``deviceq acl``.

Each role gets a Redis user that can do its whole job and nothing else:

- **commands**: ``-@all`` and then exactly what the role's processes send (the Python side,
  redis-py's connection handling) **and** what the Lua scripts it runs call: Redis checks every
  ``redis.call`` of a script against the ACL of the user who ran it. Never a ``SCRIPT`` command
  (`deviceq.core.scripts` falls back to ``EVAL`` on ``NOSCRIPT``), never ``FLUSHALL``,
  ``FLUSHDB``, ``KEYS``, ``CONFIG``, ``FUNCTION``, ``DEBUG``, ``SHUTDOWN``, ``MONITOR``,
  ``SLOWLOG`` or ``ACL`` (`FORBIDDEN`).
- **keys**: only the pool's, ``dq:{POOL}:*``. The producer and host read every key of the
  pool but its private ones (``%R~dq:{POOL}:[^_]*``: ``_webhook_secrets``), the scheduler
  reads them all (``%R~``); they write only the key families their scripts and calls write: none of
  them can change ``config`` or add to ``hosts``, a producer cannot write a host's hash, and a
  host user bound to its host id (``--host-id``) cannot write another host's keys; the
  operator reads and writes the whole pool. ``~dq:{POOL}:`` itself is the pool prefix every
  script gets as ``KEYS[1]``: Redis checks it as a read-write key of ``EVAL``/``EVALSHA``,
  although no such key is ever written.
- **channels**: none (deviceq uses no pub/sub).

What each role runs:

==========  ==================================================================================
producer    `deviceq.producer.Client` (``deviceq submit``, ``task show|list|cancel|wait``,
            ``events``, ``workflow put|list|show``, ``suite``): ``submit.lua``, ``cancel.lua``,
            ``suite_submit.lua``, ``suite_cancel.lua`` and reads
scheduler   ``deviceq scheduler run`` (`TaskScheduler`, `SchedulerClient`, the snapshot reads,
            the wake-up ``BLPOP``, the metrics endpoint, the schedules' runs):
            ``leader.lua``, ``assign.lua``, ``expire.lua``, ``schedule_fire.lua``,
            ``submit.lua``, ``suite_shard.lua`` (the suites' results)
host        ``deviceq host run`` (`HostClient` in `HostWorker`): ``session.lua``,
            ``heartbeat.lua``, ``claim.lua``, ``renew.lua``, ``report.lua``, ``host_drain.lua``
            (its own ``stopping`` flag), ``progress.lua``, ``BLPOP`` on its wake and control
            lists, config and workflow reads
operator    the operator commands of ``deviceq`` (`PoolAdmin`, ``status``, ``explain``,
            ``events``, ``dispatch``, ``host add|list|remove|drain|undrain|rotate-token``,
            ``device list|quarantine|unquarantine``, ``config get|set``, ``workflow put``,
            ``task list|show|cancel|retry``, ``verify``)
==========  ==================================================================================

Roles are enforced by Redis per command and per key family, not per script: a user that may
run ``EVALSHA`` may run any script (and any Lua) whose commands and keys its ACL allows.
The host token the host scripts check keeps a producer from running them as a host, but
not from acting as one: it may write what they write itself (`DIRECT_MODE_LIMITS`; the HTTP
API is the boundary for producers and hosts that are not trusted). What stops a producer or
a host from changing settings is that it cannot write ``config``; what
stops a host from rotating another host's token (``host_add.lua`` writes ``host:ID``) is a
user bound to its own host id. A user that may write every ``host:*`` key (the scheduler, an
unbound host user) could. See docs/how-to/securing.md."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..core.errors import InvalidInput
from ..core.keys import PRIVATE_MARK, Keys
from ..core.limits import COUNTERS as LIMIT_COUNTERS
from ..core.validation import validate_id

ROLES: tuple[str, ...] = ("producer", "scheduler", "host", "operator")
"""The roles ``deviceq acl`` knows, in the order it prints them."""

PASSWORD_PLACEHOLDER = "<password>"
"""What stands for the password in the printed lines when no password file is given."""

FORBIDDEN: frozenset[str] = frozenset({
    "flushall", "flushdb", "keys", "config", "script", "function", "debug", "shutdown",
    "monitor", "slowlog", "acl", "save", "bgsave", "bgrewriteaof", "replicaof", "slaveof",
    "sync", "psync", "module", "cluster", "failover", "swapdb", "migrate", "client",
})  # fmt: skip
"""Commands no role is given (``client`` and ``cluster`` as a whole: only `SUBCOMMANDS`):
server administration, script and function management, whole-keyspace operations, and what
shows other clients' commands (``MONITOR``, ``SLOWLOG``, ``CLIENT LIST``:
script arguments carry host tokens)."""

SUBCOMMANDS: frozenset[str] = frozenset({"client|setinfo", "cluster|slots"})
"""The subcommands of forbidden commands a role may get: ``CLIENT SETINFO`` (redis-py names
its library on connect, Redis 7.2+) and the read-only ``CLUSTER SLOTS`` (is this a cluster,
which nodes to try on a failover)."""

# -- what the Lua scripts call -------------------------------------------------------------------
SCRIPT_COMMANDS: Mapping[str, frozenset[str]] = {
    name: frozenset(cmds.split())
    for name, cmds in {
        "attempt_artifacts": "hmget lindex lset",
        "assign": "del exists get hdel hget hincrby hmget hset lpush ltrim pexpire rpush time "
        "xadd zadd zrange zrem",
        "cancel": "del hdel hget hgetall hincrby hmget hset lindex lpush lrem lset ltrim pexpire "
        "sadd time xadd zadd zcard zrange zrem",
        "claim": "get hdel hget hgetall hincrby hmget hset lindex llen lpop lpush lrem lset "
        "ltrim pexpire sadd time xadd zadd zcard zrem",
        "device_quarantine": "hdel hget hincrby hmget hset lpush ltrim pexpire sadd srem time "
        "xadd zadd zrem",
        "device_health": "hdel hget hmget hset lpush ltrim time xadd zadd zrem",
        "device_attrs": "hdel hexists hget hgetall hincrby hlen hmget hset lpush ltrim time xadd "
        "zadd zrem",
        "gate_eval": "hget hgetall hmget hset lpush ltrim time xadd zadd zrangebyscore zrem",
        "gate_set": "hdel hexists hlen hset time",
        "device_reserve": "hdel hget hmget hset lpush ltrim time xadd zadd zrem",
        "expire": "del exists hdel hget hgetall hincrby hmget hset lindex lpush lrem lset ltrim "
        "pexpire sadd time xadd xtrim zadd zcard zrange zrangebyscore zrem",
        "gang_assign": "exists get hdel hget hgetall hincrby hmget hset lpush ltrim pexpire rpush "
        "time xadd zadd zrem zscore",
        "heads": "hget zrange",
        "heartbeat": "del exists hdel hexists hget hgetall hincrby hlen hmget hset incr lindex "
        "lpush lset ltrim pexpire sadd sdiffstore smembers spop srem time xadd zadd zcard zrem",
        "host_add": "exists hget hset lpush ltrim pexpire sadd time xadd",
        "host_drain": "exists hget hmget hset lpush ltrim xadd",
        "host_remove": "del exists hdel hget hgetall hincrby hkeys hmget hset incr lindex lpush "
        "lrem lset ltrim pexpire sadd smembers srem time xadd zadd zcard zrange zrem",
        "device_remove": "del hdel hget hgetall hincrby hkeys hmget hset incr lindex lpush lrem "
        "lset ltrim pexpire sadd srem time xadd zadd zcard zrange zrem",
        "leader": "del get hget incr pexpire set xadd",
        "login_attempt": "decr get incr pexpire pttl",
        "pool_pause": "del exists hget lpush ltrim set time xadd",
        "schedule_fire": "get hexists hget hset xadd",
        "preempt": "exists get hget hmget hset lpush ltrim pexpire time xadd zadd zcard "
        "zrem zremrangebyscore",
        "task_priority": "del hget hgetall hset lpush ltrim xadd zadd zcard zrange zrem",
        "renew": "hget hmget hset time zadd",
        "log_append": "exists hget hmget pexpire time xadd",
        "progress": "hget hmget hset time",
        "report": "del exists get hdel hget hgetall hincrby hmget hset lindex llen lpop lpush lrem "
        "lset ltrim pexpire rpush sadd time xadd zadd zcard zrange zrem",
        "plan_ahead": "get hexists hset",
        "session": "hdel hget hgetall hincrby hmget hset lindex lpush lrem lset ltrim pexpire sadd "
        "smembers time xadd zadd zcard zrem",
        "submit": "exists get hdel hget hkeys hmget hset incrby lpush ltrim pexpire set time "
        "xadd zadd zcard zrem",
        "suite_submit": "del exists hget hset sadd sismember time xadd zadd zcard zrange zrem",
        "suite_shard": "get hget hincrby hlen hmget hset srem time xadd",
        "suite_cancel": "hget hset srem time xadd",
        "suite_join": "get hget hincrby hlen hmget hset sadd scard sismember srem time xadd",
    }.items()
}
"""The commands each script may call, the ``lua/lib/`` helpers it uses included
(tests/lua/test_acl.py checks that it covers what the scripts call)."""

ROLE_SCRIPTS: Mapping[str, tuple[str, ...]] = {
    "producer": ("submit", "cancel", "suite_submit", "suite_cancel"),
    # schedule_fire claims a schedule's run, submit submits it; suite_shard records a suite's
    # shard (and submit its retry), suite_join a device joining its window; gate_eval lets
    # go the devices whose cooldown is up
    "scheduler": ("leader", "assign", "gang_assign", "expire", "heads", "schedule_fire",
                  "submit", "suite_shard", "suite_join", "preempt", "gate_eval", "plan_ahead"),
    "host": ("session", "heartbeat", "claim", "renew", "report", "host_drain", "device_health",
             "log_append", "attempt_artifacts", "progress", "device_attrs"),
    # task retry submits, task cancel cancels, dispatch commits through assign
    # reserve/release run device_reserve; the dashboard's login limit runs login_attempt
    "operator": ("host_add", "host_remove", "device_remove", "host_drain", "device_quarantine",
                 "device_reserve", "assign", "cancel", "submit", "pool_pause", "task_priority",
                 "login_attempt", "device_attrs", "gate_set", "gate_eval"),
}  # fmt: skip
"""The scripts each role runs."""

# -- what the Python side sends ------------------------------------------------------------------
_CONNECTION: dict[str, str] = {
    "ping": "redis-py's health check of a connection idle for 30 s; the daemons' start-up check",
    "select": "sent by redis-py on connect when the Redis URL names a database other than 0",
    "evalsha": "every state change is a Lua script, called by its digest",
    "eval": "the script sent whole when the server does not know its digest (NOSCRIPT after "
    "a restart, a failover or SCRIPT FLUSH: no SCRIPT LOAD needed), and in pipelines",
    "cluster|slots": "once per client: is this a Redis Cluster, and which nodes to try when "
    "the pool's node fails (a standalone server answers that it has no cluster)",
}

_START: dict[str, str] = {
    "info": "the start-up warning unless maxmemory-policy is noeviction "
    "(deviceq.core.durability: every daemon and the command line)",
}

_DURABLE: dict[str, str] = {
    "info": "the start-up warning unless maxmemory-policy is noeviction (every daemon and "
    "the command line); durability aof/replica: whether the server has WAITAOF (its version)",
    "hmget": "the pool's durability setting, read before a submission or a report",
    "wait": "durability aof/replica before Redis 7.2: WAIT 1 confirms the write reached a "
    "replica (in the write's pipeline)",
}

_TASK_READS: dict[str, str] = {
    "hgetall": "task hashes (task show/list/wait), the pool config",
    "get": "long goals (task:ID:goal), workflow definitions",
    "lrange": "a task's attempt history (task show)",
    "zrange": "tasks of a status, oldest first (task list)",
    "zrevrange": "finished tasks, newest first (task list)",
    "zcard": "tasks per status (Client.counts)",
    "xrevrange": "the newest event (where task wait and events start)",
    "xread": "task wait, events and task logs --follow block on the event or log stream",
    "xrange": "task logs reads an attempt's log stream (log:ID:ATTEMPT)",
    "exists": "the command line's check that --pool names a pool with keys (one EXISTS); "
    "task cancel/wait of several ids check them all first",
}

_WORKFLOW_WRITES: dict[str, str] = {
    "multi": "workflow put stores a definition and its name in one transaction",
    "exec": "workflow put stores a definition and its name in one transaction",
    "set": "workflow put (workflow:NAME)",
    "sadd": "workflow put (the workflows set)",
    "smembers": "workflow list",
}

_FLEET_READS: dict[str, str] = {
    "time": "Redis time for ages and deadlines (status, host list, explain)",
    "smembers": "every host, every device, a host's devices",
    "hmget": "host liveness fields, lease and failure rows",
    "hgetall": "device hashes, bucket constraints, the pool config",
    "hget": "the submission time of a bucket's head",
    "zrange": "queue buckets and their heads, the next leases to expire",
    "zcard": "queue depth per bucket, tasks per status, active leases",
    "echo": "a placeholder reply in status's pipelined bucket reads",
    "get": "the scheduler leader lease",
    "pttl": "what is left of the leader lease",
    "xrevrange": "the newest event (the metrics' event tail starts there)",
    "xread": "the metrics' event tail (counters and latency histograms)",
}

CLIENT_COMMANDS: Mapping[str, Mapping[str, str]] = {
    "producer": {**_CONNECTION, **_DURABLE, **_TASK_READS, **_WORKFLOW_WRITES},
    "scheduler": {
        **_CONNECTION,
        **_START,
        **_FLEET_READS,
        "time": "the snapshot's now (Redis time, never the client's clock); metrics ages",
        "hget": "host_timeout for the snapshot's host filter; a bucket head's submission time",
        "get": "the devgen counter (device cache), the leader lease",
        "zrange": "idle devices, non-empty buckets and their heads (WITHSCORES)",
        "hlen": "whether any queued task has an anti-affinity record",
        "hmget": "device rows, bucket constraints, host health, anti-affinity of heads",
        "hgetall": "the pool config (leader_ttl); metrics: bucket constraints, devices; the "
        "schedules and their last runs (schedules, schedules:last); device attributes (--where, "
        "prefer)",
        "lrange": "devices' recent attempts, with the pool setting prefer least_used",
        "blpop": "the leader blocks on sched:wake between passes",
        "pttl": "a standby sleeps until the leader lease could lapse",
        "lpush": "TaskScheduler.stop(wake=True) wakes a blocked leader",
        "ltrim": "TaskScheduler.stop(wake=True) keeps the wake list at one element",
        "exists": "scheduler run --once/--force-pass: the check that --pool names a pool "
        "with keys (one EXISTS); each pass: is the pool paused (deviceq pause)",
        "hset": "gang_holds: the devices kept for waiting multi-device tasks; a webhook's last "
        "delivery outcome",
        "sadd": "webhooks:dead: a host whose death was delivered (host_dead)",
        "srem": "webhooks:dead: that host is alive again",
        "spop": "ahead:want: the devices whose next-task hint a report used (scheduler run "
        "--plan-ahead chooses their next)",
        "set": "webhooks:cursor (the last event handed on); leader:strategy (a new leader's)",
        "hdel": "gang_holds: a multi-device task no longer keeps devices",
        "del": "gang_holds: a new leader rewrites it whole",
        "srandmember": "suites: the running suites the leader records shards of (at most 200 "
        "a look)",
        "lindex": "suites: the last attempt of a shard's task (its recorded artifacts)",
    },
    "host": {
        **_CONNECTION,
        **_DURABLE,
        "hmget": "the host's own session record before it starts a session; its devices' "
        "health at start (deviceq.host.health); the pool's durability setting, read before a "
        "report",
        "hgetall": "the pool config (lease_ttl, host_timeout) the daemon paces itself by",
        "get": "a workflow definition, for a workflow task",
        "blpop": "the daemon blocks on its wake list (inbox) and its control list",
        "lpop": "the daemon drains its control list with each wake-up (one LPOP with a count)",
        "lpush": "the daemon wakes its own blocked inbox wait when it stops",
        "hget": "the leader role of a multi-device task waits until every other role's part "
        "is claimed (their status)",
    },
    "operator": {
        **_CONNECTION,
        **_DURABLE,
        **_TASK_READS,
        **_WORKFLOW_WRITES,
        **_FLEET_READS,
        "info": "status shows the server's persistence (version, role, AOF, replicas, "
        "maxmemory-policy); the command line's start-up warning",
        "hmget": "host liveness fields, lease and failure rows, verify's task and device "
        "rows; the durability setting (task retry submits)",
        "multi": "workflow put stores a definition and its name in one transaction; verify "
        "reads a task's fields and attempts in one",
        "exec": "ends those transactions",
        "hgetall": "task, device and bucket hashes, the pool config (status, explain, config "
        "get, task show, verify)",
        "get": "long goals, workflow definitions, the leader lease",
        "zrange": "tasks of a status, queue buckets and heads, the next leases to expire, "
        "reservations (bookings: device list, status, explain, verify)",
        "smembers": "every host, every device, a host's devices, workflow list",
        "hset": "config set (the config hash); webhook add (the webhooks hash); schedule "
        "pause/resume (the schedules hash)",
        "hlen": "webhook add: at most 50 webhooks a pool; schedule add: at most 200 schedules; "
        "the dashboard: has the pool dashboard users",
        "hdel": "webhook remove; schedule remove (schedules, schedules:last); dashboard user "
        "remove",
        "hexists": "schedule add: is the name in use",
        "hsetnx": "schedule add (the schedules hash), dashboard user add (dashboard:users): a "
        "name is added once",
        "zrank": "explain: a task's place in its bucket",
        "zcount": "explain: older queued tasks",
        "scan": "verify: the pool's keys (SCAN MATCH dq:{POOL}:*)",
        "sscan": "verify: the devices set",
        "hscan": "verify: hashes read in bounded pages",
        "exists": "verify: whether keys an index names still exist",
        "xrange": "verify: the event stream, in bounded pages",
        "llen": "verify: attempt histories and inboxes, before reading them in pages",
        "time": "Redis time for ages and deadlines (status, host list, explain, verify)",
        "hget": "the submission time of a bucket's head; verify: the retention setting; the "
        "dashboard: a user's role and password hash (dashboard:users)",
        "zcard": "queue depth per bucket, tasks per status, active leases; verify: index sizes",
    },
}
"""Per role, the commands its Python side sends and why."""

WAITAOF = "waitaof"
"""Durability ``aof``/``replica`` on Redis 7.2+ confirms a write with ``WAITAOF``: given to
the roles that submit or report from 7.2 (an ACL rule naming it is an error before that)."""

CLIENT_SETINFO = "client|setinfo"
"""redis-py sends ``CLIENT SETINFO LIB-NAME/LIB-VER`` on connect (ignoring a refusal): given
to every role from Redis 7.2, where the subcommand exists (an ACL rule naming it is an error
before that)."""

# -- which keys each role writes (everything else of the pool it only reads) --------------------
ROLE_WRITES: Mapping[str, tuple[str, ...]] = {
    # submit.lua, cancel.lua, workflow put, suite_submit.lua, suite_cancel.lua
    "producer": ("seq", "task:*", "idem:*", "queue:*", "queues", "sig:*", "status:*",
                 "deadlines", "avoid", "leases", "device:*", "idle", "idle:c:*",
                 "host:*:inbox",
                 "host:*:ctl", "events", "sched:wake", "workflow:*", "workflows", "retries",
                 *LIMIT_COUNTERS, "gangs", "suite:*", "suites", "suites:running",
                 "preemptible", "cooling"),
    # leader.lua, assign.lua, expire.lua (which also ends reservations: bookings), the wake
    # list; expire marks hosts suspect and assign
    # fills inboxes and wake lists, so every host key (host:*)
    "scheduler": ("leader", "leader:epoch", "leader:strategy", "task:*", "queue:*", "queues",
                  "sig:*", "status:*", "deadlines", "avoid", "leases", "device:*", "idle",
                  "idle:c:*", "bookings", "host:*",
                  "events", "sched:wake", "retries", *LIMIT_COUNTERS, "gangs",
                  "gang_holds", "webhooks", "webhooks:*", "_webhook_secrets", "seq", "idem:*",
                  "schedules:last", "suite:*", "suites:running", "suite_durations:*",
                  "preemptible", "preempt:*", "cooling", "ahead:want"),
    # session, heartbeat, claim, renew, report, host_drain, device_health; host:* becomes
    # host:ID and host:ID:* for a user bound to one host id
    # (a part of a multi-device task that ends ends every part and tells their hosts: their
    # control lists are written, also by a user bound to one host id; a message there only
    # makes a daemon renew and heartbeat at once)
    "host": ("host:*", "device:*", "devices", "idle", "idle:c:*", "caps", "drivers", "qdrivers",
             "faults", "devgen",
             "task:*", "queue:*", "queues", "sig:*", "status:*", "deadlines", "avoid",
             "leases", "events", "sched:wake", "retries", *LIMIT_COUNTERS, "gangs",
             "host:*:ctl", "log:*", "preemptible", "attr_names", "cooling",
             # report.lua assigns a freed device its next-task hint (lib/assignment.lua)
             "preempt:handover", "ahead:want"),
    "operator": ("*",),
}  # fmt: skip
"""Per role, the key patterns (after ``dq:{POOL}:``) it may write. ``device:*`` covers a
device's ``device:ID:history`` (every script that ends an attempt writes it: cancel, claim,
expire, report, session) and ``device:ID:log`` (device_quarantine, device_reserve,
device_health, report's automatic quarantine, expire's end of a reservation) and its
attributes ``device:ID:attrs``/``device:ID:attrs_at`` (device_attrs: a host's own devices;
``attr_names`` counts the names)."""

PRIVATE_READERS: frozenset[str] = frozenset({"scheduler", "operator"})
"""The roles that read the pool's private keys (``dq:{POOL}:_*``: the webhooks' signing
secrets, which the scheduler signs deliveries with); the producer and the host read every
other key of the pool (``%R~dq:{POOL}:[^_]*``)."""


DIRECT_MODE_LIMITS: Mapping[str, str] = {
    "producer": (
        "this Redis user does NOT confine a producer: Redis runs a script with its caller's "
        "rights, and a producer's user may run EVAL and write task, status, lease, device, "
        "host_held and event keys, so with one EVAL it can end any running task as if its "
        "host had reported it (status done, attempt closed, lease dropped, device idle "
        "again, a done event) without any host token. `deviceq verify` detects some such "
        "forgeries, not all (`deviceq verify --scope`). Give a producer you do not trust the "
        "HTTP API (`deviceq api`, `deviceq api token add NAME --role producer`), never a "
        "Redis user."
    ),
    "host": (
        "this Redis user does NOT confine a host: Redis runs a script with its caller's "
        "rights, and a host's user (--host-id or not) may run EVAL and write every task's "
        "hash and attempt records, the leases, devices, counters and the event stream, so it "
        "can rewrite another host's task (host_id, session, its attempt record) and report "
        "it with its own token, or end it outright; --host-id only keeps it from writing "
        "other hosts' own keys (token, inbox). `deviceq verify` detects some such forgeries, "
        "not all (`deviceq verify --scope`). Give a host you do not trust the HTTP API "
        "(`deviceq host run --api-url URL` with its host token), where a host can act only "
        "as itself."
    ),
}
"""What the direct-Redis users of the producer and host roles do NOT prevent (``deviceq acl``
prints it on stderr and as ``does_not_prevent`` in ``--json``): only the HTTP API is a
boundary for producers and hosts that are not trusted."""


@dataclass(frozen=True)
class RoleAcl:
    """The Redis user of one role on one pool: its name, commands (with why) and keys."""

    pool: str
    role: str
    user: str
    commands: dict[str, str]
    read_keys: tuple[str, ...]
    write_keys: tuple[str, ...]
    host_id: str | None = None
    scripts: tuple[str, ...] = field(default=())

    def key_rules(self) -> list[str]:
        """``%R~`` (read only) and ``~`` (read and write) patterns, in that order."""
        return [f"%R~{p}" for p in self.read_keys] + [f"~{p}" for p in self.write_keys]

    def rules(self, password: str = f">{PASSWORD_PLACEHOLDER}") -> list[str]:
        """The ``ACL SETUSER`` arguments after the user name. ``password`` is the password
        rule (``>PASSWORD`` or ``#SHA256``): see `password_rule`."""
        return [
            "reset",
            "on",
            password,
            "resetkeys",
            *self.key_rules(),
            "resetchannels",
            "-@all",
            *(f"+{c}" for c in self.commands),
        ]

    def line(self, password: str = f">{PASSWORD_PLACEHOLDER}") -> str:
        """The whole ``ACL SETUSER`` command as one line (for ``redis-cli``)."""
        return " ".join(["ACL", "SETUSER", self.user, *self.rules(password)])

    def as_dict(self, password: str = f">{PASSWORD_PLACEHOLDER}") -> dict[str, Any]:
        return {
            "pool": self.pool,
            "role": self.role,
            "user": self.user,
            "host_id": self.host_id,
            "scripts": list(self.scripts),
            "read_keys": list(self.read_keys),
            "write_keys": list(self.write_keys),
            "commands": dict(self.commands),
            "line": self.line(password),
            "does_not_prevent": DIRECT_MODE_LIMITS.get(self.role),
        }


def parse_version(text: str) -> tuple[int, int]:
    """``"7.2"`` (or ``"7.2.4"``) as ``(7, 2)``; InvalidInput unless it is at least 7.0."""
    parts = str(text).strip().split(".")
    try:
        version = (int(parts[0]), int(parts[1]) if len(parts) > 1 else 0)
    except ValueError:
        raise InvalidInput(f"a Redis version is MAJOR.MINOR, e.g. 7.2, not {text!r}") from None
    if version < (7, 0):
        raise InvalidInput(
            f"deviceq's ACL users need Redis 7.0 or later (read-only key patterns), not {text}"
        )
    return version


def role_acl(
    pool: str, role: str, *, host_id: str | None = None, redis_version: tuple[int, int] = (7, 0)
) -> RoleAcl:
    """The ACL user of ``role`` on ``pool``. A host user may be bound to one ``host_id``
    (user ``dq-POOL-host-HOST``): it can then write only that host's keys, so it cannot
    rotate another host's token or register a host, even by calling those scripts itself."""
    validate_id(pool, "pool name")
    if role not in ROLES:
        raise InvalidInput(f"unknown role {role!r}; one of: {', '.join(ROLES)}")
    if host_id is not None:
        if role != "host":
            raise InvalidInput("a host id only applies to the host role")
        validate_id(host_id, "host id")
    prefix = Keys(pool).prefix
    scripts = ROLE_SCRIPTS[role]
    commands = _commands(role, scripts, redis_version)
    leaked = set(commands) & FORBIDDEN
    if leaked:  # a programming error in the tables above
        raise AssertionError(f"role {role} would get forbidden commands {sorted(leaked)}")
    writes = list(ROLE_WRITES[role])
    if host_id is not None:
        i = writes.index("host:*")
        writes[i : i + 1] = [f"host:{host_id}", f"host:{host_id}:*"]
    if writes == ["*"]:
        reads: tuple[str, ...] = ()
        write_keys: tuple[str, ...] = (prefix + "*",)
    else:
        # a private key (its name starting with PRIVATE_MARK: the webhooks' secrets) is read
        # by the roles of PRIVATE_READERS only
        reads = (prefix + ("*" if role in PRIVATE_READERS else f"[^{PRIVATE_MARK}]*"),)
        write_keys = (prefix, *(prefix + w for w in writes))
    user = f"dq-{pool}-{role}" + (f"-{host_id}" if host_id else "")
    return RoleAcl(pool, role, user, commands, reads, write_keys, host_id, scripts)


def _commands(role: str, scripts: Iterable[str], version: tuple[int, int]) -> dict[str, str]:
    """The role's commands, each with why: the connection and scripting ones first, then the
    others in alphabetical order (its client's reads and writes, and what its scripts call)."""
    used_by: dict[str, list[str]] = {}
    for s in scripts:
        for c in sorted(SCRIPT_COMMANDS[s]):
            used_by.setdefault(c, []).append(f"{s}.lua")
    client = CLIENT_COMMANDS[role]
    why: dict[str, str] = {}
    for c in (*client, *sorted(set(used_by) - set(client))):
        parts = [client[c]] if c in client else []
        if c in used_by:
            parts.append("inside " + ", ".join(used_by[c]))
        why[c] = "; ".join(parts)
    if version >= (7, 2):
        why[CLIENT_SETINFO] = "redis-py names its library on connect (Redis 7.2+)"
        if "wait" in why:
            why[WAITAOF] = (
                "durability aof/replica: WAITAOF confirms the write is fsynced (Redis 7.2+)"
            )
    first = [c for c in _CONNECTION if c in why]
    return {c: why[c] for c in (*first, *sorted(set(why) - set(first)))}


def password_rule(password: str | None) -> str:
    """The password rule of a printed line: ``><password>`` (the placeholder) without a
    password; with one, ``#`` + its SHA-256, so the printed line never contains it."""
    if password is None:
        return f">{PASSWORD_PLACEHOLDER}"
    if not password or any(c.isspace() for c in password):
        raise InvalidInput("the password must be non-empty and contain no whitespace")
    return "#" + hashlib.sha256(password.encode()).hexdigest()


def read_password_file(path: str) -> str:
    """The password in ``path`` (its first line, without the line end)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.readline().rstrip("\r\n")
    except OSError as exc:
        raise InvalidInput(f"cannot read the password file {path}: {exc.strerror}") from None
    if not text:
        raise InvalidInput(f"the password file {path} is empty")
    return text


def acl_users(
    pool: str,
    roles: Iterable[str] = ROLES,
    *,
    host_id: str | None = None,
    redis_version: tuple[int, int] = (7, 0),
) -> list[RoleAcl]:
    """The users of ``roles`` (every role by default) on ``pool``."""
    return [
        role_acl(pool, r, host_id=host_id if r == "host" else None, redis_version=redis_version)
        for r in roles
    ]


__all__ = [
    "DIRECT_MODE_LIMITS",
    "FORBIDDEN",
    "SUBCOMMANDS",
    "PRIVATE_READERS",
    "ROLES",
    "ROLE_SCRIPTS",
    "ROLE_WRITES",
    "SCRIPT_COMMANDS",
    "RoleAcl",
    "acl_users",
    "password_rule",
    "read_password_file",
    "role_acl",
]
