"""The Redis key layout of a pool: the one place that names keys.

Every key of a pool starts with ``dq:{POOL}:``. The braces are a Redis Cluster hash tag, so a
whole pool lives in one slot and every Lua script may touch any of its keys atomically.
The Lua scripts derive the same names from the prefix they receive (see ``lua/README.md``);
keep both in step.

=================================  =========  ==================================================
key                                type       holds
=================================  =========  ==================================================
``config``                         hash       pool settings (``max_queue_depth``, ttls, ...)
``seq``                            string     submission counter (task order, ids)
``task:ID``                        hash       one task (see ``deviceq.core.models.ScheduledTask``)
``task:ID:attempts``               list       JSON record per attempt, expired ones included
``log:ID:ATTEMPT``                  stream     one attempt's live output, chunks ``{s: stdout|
                                              stderr|log, t: TEXT}`` (log_append.lua: only the
                                              lease holder; capped by ``log_maxlen``; expires
                                              ``retention`` after the attempt ends)
``task:ID:goal``                   string     the goal when longer than 64 bytes (the hash
                                              then holds ``goal`` empty: it stays a listpack)
``task:ID:tests``                  string     the task's list of test ids, one a line (a suite's
                                              shard; the hash's ``tests``: how many): returned
                                              with its claim, written by the host into
                                              ``$DEVICEQ_TESTS_FILE``
``queue:SIG``                      zset       queued task ids of one constraint bucket, by seq
``queues``                         zset       non-empty bucket ids, scored by their head's seq
``sig:SIG``                        hash       a bucket's constraints (driver_type, tags, prio)
``deadlines``                      zset       queued task ids with a queue timeout, by deadline
``retries``                        zset       queued task ids waiting out a retry's backoff, by
                                              the time they become eligible (ms; the task's
                                              ``eligible_at``): expire.lua then enqueues them
``gangs``                          zset       queued multi-device task ids (their ``roles``), by
                                              seq: the scheduler places every role at once
                                              (gang_assign.lua); their parts are tasks
                                              ``ID.ROLE`` (field ``gang``), in no status index
``gang_holds``                     hash       multi-device task id -> ``UNTIL_MS|DEV,DEV``: idle
                                              devices the scheduler keeps for it (written by the
                                              scheduler past ``gang_reserve_after``, at most
                                              ``gang_hold_seconds``)
``tenants``                        hash       tenant -> ``WEIGHT:MAX_DEVICES`` (fair share weight,
                                              cap on devices held at once; 0 = none)
``tenant_held``                    hash       tenant -> devices its tasks hold (leases)
``host_held``                      hash       host id -> leases its devices hold (assigned or
                                              running; ``max_tasks_per_host``)
``tenant_host_held``               hash       ``TENANT|HOST`` -> leases a tenant's tasks hold on
                                              the host's devices (``max_tasks_per_tenant_per_host``)
                                              (each declared limit's count hash:
                                              `deviceq.core.limits`, ``counter``)
``pclasses``                       hash       class name -> ``PRIO:PREEMPTS:PREEMPTIBLE:MS``
                                              (priority, 0/1, 0/1, grace in ms; see
                                              deviceq.core.priority_classes)
``preemptible``                    zset       leased tasks of a priority class, by the time they
                                              were assigned (ms): the scheduler reads the newest
                                              (shortest running) first when looking for a victim;
                                              assign.lua adds, every lease end removes
``preempt:handover``               zset       urgent task ids waiting for the device of the task
                                              they preempted (task field ``preempting``, device
                                              field ``preempt_for``), by decision time (ms)
``preempt:recent``                 zset       the preemptions of the last minute (members
                                              ``VICTIM:MS``, by time), for the pool setting
                                              ``max_preemptions_per_minute``
``avoid``                          hash       queued task id -> ``DEVICES|HOSTS`` (csv) it lost an
                                              attempt on: a retry prefers others (anti-affinity)
``status:STATUS``                  zset       task ids by status (queued/active by seq,
                                              terminal by finish time, trimmed by retention)
``idem:KEY``                       string     idempotency key -> task id (expires)
``device:ID``                      hash       one device (host, driver_type, tags, state and
                                              its reason, reserved_by, quarantined, held,
                                              health and health_checked_at/_output/_reason:
                                              its host's health check, ...)
``device:ID:history``               list       the device's last 20 attempt ends, newest first:
                                              JSON ``{task, attempt, outcome, failure_kind,
                                              at}`` (close_attempt, lua/lib/attempts.lua)
``device:ID:log``                   list       the device's last 20 quarantine, health check and
                                              booking changes, newest first: JSON ``{event,
                                              at, ...}`` (device_log in lua/lib/history.lua)
``device:ID:attrs``                 hash       the device's attributes: name -> ``KIND:TEXT``
                                              (``n:34``, ``v:14.1.2``, ``b:1``, ``s:Pixel 8``;
                                              `deviceq.core.attributes`; device_attrs.lua)
``device:ID:attrs_at``              hash       name -> when the attribute was last sent (ms)
``device:ID:attrs_host``            hash       what the host reports of attributes an operator
                                              set (device field ``attrs_op``: their names,
                                              csv; the operator's value wins until unset,
                                              then this one comes back; lua/lib/attrs.lua)
``attr_names``                     hash       attribute name -> devices that have it (a
                                              --where naming none is likely a typo)
``devices``                        set        every registered device id
``gates``                          hash       gate name -> JSON ``{name, when, until, driver_type,
                                              when_c, until_c, created_at}`` (``deviceq gate``;
                                              `deviceq.core.gates`; a held device's hash has
                                              ``gated``, ``gated_reason``, ``gated_at``, and
                                              under a cooldown gate ``cool_until``)
``cooling``                        zset       devices a cooldown gate holds, scored by the end
                                              of their cooldown (ms; gate_eval.lua ``:due``)
``idle``                           zset       idle, unreserved, assignable device ids, scored
                                              by the time they became idle (ms)
``idle:c:CLASS``                   zset       the members of ``idle`` of one device class
                                              (same scores): CLASS = `class_id` of the profile
                                              ``DRIVER|TAGS`` (``caps`` lists the profiles), so
                                              the scheduler reads only the classes its queued
                                              buckets can use (lua/lib/idle.lua keeps both)
``host:ID``                        hash       one host (sha1 token digest, heartbeat,
                                              draining, stopping, suspect, session, ...)
``host:ID:devices``                set        device ids owned by the host
``host:ID:quarantined``            set        the host's quarantined device ids (its heartbeat
                                              answers them without reading every device)
``host:ID:held_devices``           set        the host's devices given a held mark since its last
                                              heartbeat (which clears the marks and the set)
``host:ID:sync``                   set        devices listed so far by a full snapshot sent in
                                              chunks (heartbeat.lua mode full)
``host:ID:leftout``                set        the devices the host owns but left out of its full
                                              snapshot, still to be put offline (mode commit)
``host:ID:inbox``                  list       task ids assigned to the host, awaiting claim
``host:ID:wake``                   list       one-element signal list a worker BLPOPs on
``host:ID:ctl``                    list       messages to the host's daemon (cancel requested,
                                              quarantine changed, session superseded, removed)
``hosts``                          set        every host id
``caps``                           hash       device profile ``DRIVER|TAGS`` -> device count
``drivers``                        hash       driver type -> registered devices
``qdrivers``                       hash       driver type -> quarantined devices (the cap of
                                              automatic quarantine, ``max_quarantine_fraction``)
``faults``                         hash       device id -> its consecutive device faults
                                              (infrastructure, runner_error, timeout) while
                                              above 0: the scheduler offers it last
``devgen``                         string     bumped when a device registers, changes its
                                              driver type/tags or is removed (scheduler caches)
``leases``                         zset       task ids with an active lease, by expiry (ms)
``bookings``                       zset       device ids reserved for a person (``deviceq
                                              reserve``), by the reservation's end (ms); the
                                              device hash holds ``booked_by`` (the note),
                                              ``booked_until``, ``booked_at``
``events``                         stream     every transition (capped by ``event_maxlen``)
``sched:wake``                     list       one-element signal list the scheduler BLPOPs on
``ahead:want``                   set        devices whose next-task hint a report used (they
                                              run it now, with no hint): the scheduler (run with
                                              ``--plan-ahead``) chooses their next. A hint is the
                                              device field ``next_task`` = ``FENCE|TASK_ID``
                                              (plan_ahead.lua writes it, report.lua takes it)
``leader``                         string     scheduler leader lease ``OWNER:EPOCH`` (PX ttl)
``paused``                         string     present while the pool is paused (``deviceq pause``):
                                              JSON ``{at, reason}``; scheduler commits refused
``leader:epoch``                   string     fencing counter, bumped at each new leadership
``leader:strategy``                string     the strategy the last elected leader runs:
                                              ``NAME:1`` (it orders by priority) or ``NAME:0``
``workflow:NAME``                  string     a ``WorkflowDefinition`` as JSON
``workflows``                      set        every workflow name
``api_tokens``                     hash       HTTP API token digest (sha256 hex) -> JSON
                                              ``{name, role, created_at}`` (``deviceq api
                                              token``; the token itself is never stored)
``api_token_names``                hash       HTTP API token name -> its digest (add, remove)
``webhooks``                       hash       webhook id -> JSON ``{id, url, events,
                                              created_at, last_ok_at, last_error}`` (``deviceq
                                              webhook``)
``_webhook_secrets``               hash       webhook id -> its signing secret. A key whose name
                                              starts with ``_`` is private: the producer and
                                              host ACL users cannot read it (only the scheduler
                                              and the operator)
``webhooks:cursor``                string     the last event id the leading scheduler handed to
                                              the webhooks
``webhooks:dead``                  set        hosts whose death was delivered (``host_dead``)
``schedules``                      hash       schedule name -> JSON ``{name, cron, spec, paused,
                                              created_at, changed_at}`` (``deviceq schedule``)
``schedules:last``                 hash       schedule name -> JSON ``{run, task | error}``: the
                                              last run the leading scheduler claimed (pending
                                              until its task is submitted; schedule_fire.lua)
``suites``                         zset       suite id -> submit time (ms): every kept suite
                                              (``deviceq suite``; the oldest finished one is
                                              dropped past ``SUITES_KEPT``, suite_submit.lua)
``suites:running``                 set        running suite ids (the leading scheduler watches
                                              their shards: deviceq.services.suite_watch)
``suite:ID``                       hash       one suite: name, status, spec (JSON), counts,
                                              eta_at, submitted_at, finished_at; join_until
                                              (ms) and join_closed of a joining window
``suite:ID:shards``                hash       shard index -> JSON ``{task, tests, round, pin,
                                              joined, done, device, status, counts}``
``suite:ID:devices``               set        the devices of a suite on every device that have
                                              their shard (suite_submit.lua, then each device
                                              joining in its window: suite_join.lua)
``suite:ID:results``               hash       test id -> JSON ``{s, d, dev, tries}``: its
                                              final status and every try (suite_shard.lua)
``suite_durations:NAME``           hash       test id -> ms it took last (weighted), per suite
                                              name: what shards are balanced on
``dashboard:users``                hash       dashboard user name -> JSON ``{role, hash}`` (an
                                              argon2 hash; ``deviceq dashboard user``)
``dashboard:login:SCOPE:DIGEST``   string     login attempts of one client address (SCOPE
                                              ``addr``) or user name (``user``) in the current
                                              window (PX ttl); DIGEST: sha256 hex of the value
=================================  =========  ==================================================
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from .limits import COUNTERS

PRIVATE_MARK = "_"
"""The first character of a private key's name after the pool prefix: keys holding secrets
(the webhooks' signing secrets). The producer and host ACL users read the pool's keys but
these (``%R~dq:{POOL}:[^_]*``): `deviceq.ops.acl`."""


def class_id(profile: str) -> str:
    """The id of a device class, from its profile ``DRIVER|TAGS`` (tags sorted, comma
    separated, as counted in ``caps``): the first 12 hex digits of its sha1, as
    lua/lib/idle.lua computes it."""
    return hashlib.sha1(profile.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Keys:
    """Key names of one pool. ``pool`` must already be validated (see ``models.validate_id``)."""

    pool: str

    @property
    def prefix(self) -> str:
        return f"dq:{{{self.pool}}}:"

    def _k(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    # pool-wide
    @property
    def config(self) -> str:
        return self._k("config")

    @property
    def seq(self) -> str:
        return self._k("seq")

    @property
    def deadlines(self) -> str:
        return self._k("deadlines")

    @property
    def retries(self) -> str:
        return self._k("retries")

    @property
    def gangs(self) -> str:
        return self._k("gangs")

    @property
    def gang_holds(self) -> str:
        return self._k("gang_holds")

    @property
    def tenants(self) -> str:
        return self._k("tenants")

    @property
    def tenant_held(self) -> str:
        return self._k("tenant_held")

    @property
    def host_held(self) -> str:
        return self._k("host_held")

    def counter(self, name: str) -> str:
        """The count hash ``name`` of a declared limit (`deviceq.core.limits.Limit.counter`)."""
        if name not in COUNTERS:
            raise ValueError(f"{name!r} is no declared limit's count hash")
        return self._k(name)

    @property
    def devgen(self) -> str:
        return self._k("devgen")

    @property
    def caps(self) -> str:
        return self._k("caps")

    @property
    def drivers(self) -> str:
        return self._k("drivers")

    @property
    def qdrivers(self) -> str:
        return self._k("qdrivers")

    @property
    def faults(self) -> str:
        return self._k("faults")

    @property
    def pclasses(self) -> str:
        return self._k("pclasses")

    @property
    def preemptible(self) -> str:
        return self._k("preemptible")

    @property
    def preempt_handover(self) -> str:
        return self._k("preempt", "handover")

    @property
    def ahead_want(self) -> str:
        return self._k("ahead", "want")

    @property
    def preempt_recent(self) -> str:
        return self._k("preempt", "recent")

    @property
    def avoid(self) -> str:
        return self._k("avoid")

    @property
    def queues(self) -> str:
        return self._k("queues")

    @property
    def devices(self) -> str:
        return self._k("devices")

    @property
    def attr_names(self) -> str:
        return self._k("attr_names")

    @property
    def gates(self) -> str:
        return self._k("gates")

    @property
    def cooling(self) -> str:
        return self._k("cooling")

    @property
    def idle(self) -> str:
        return self._k("idle")

    def idle_class(self, cid: str) -> str:
        """The idle set of device class ``cid`` (`class_id`)."""
        return self._k("idle", "c", cid)

    @property
    def hosts(self) -> str:
        return self._k("hosts")

    @property
    def leases(self) -> str:
        return self._k("leases")

    @property
    def bookings(self) -> str:
        return self._k("bookings")

    @property
    def events(self) -> str:
        return self._k("events")

    @property
    def sched_wake(self) -> str:
        return self._k("sched", "wake")

    @property
    def leader(self) -> str:
        return self._k("leader")

    @property
    def leader_epoch(self) -> str:
        return self._k("leader", "epoch")

    @property
    def leader_strategy(self) -> str:
        return self._k("leader", "strategy")

    @property
    def workflows(self) -> str:
        return self._k("workflows")

    @property
    def api_tokens(self) -> str:
        return self._k("api_tokens")

    @property
    def api_token_names(self) -> str:
        return self._k("api_token_names")

    @property
    def paused(self) -> str:
        return self._k("paused")

    @property
    def webhooks(self) -> str:
        return self._k("webhooks")

    @property
    def webhook_secrets(self) -> str:
        """The webhooks' signing secrets: a private key (``_``: see `PRIVATE_MARK`)."""
        return self._k(PRIVATE_MARK + "webhook_secrets")

    @property
    def webhook_cursor(self) -> str:
        return self._k("webhooks", "cursor")

    @property
    def webhook_dead(self) -> str:
        return self._k("webhooks", "dead")

    @property
    def schedules(self) -> str:
        return self._k("schedules")

    @property
    def schedule_last(self) -> str:
        return self._k("schedules", "last")

    @property
    def suites(self) -> str:
        return self._k("suites")

    @property
    def suites_running(self) -> str:
        return self._k("suites", "running")

    def suite(self, suite_id: str) -> str:
        return self._k("suite", suite_id)

    def suite_shards(self, suite_id: str) -> str:
        return self._k("suite", suite_id, "shards")

    def suite_devices(self, suite_id: str) -> str:
        return self._k("suite", suite_id, "devices")

    def suite_results(self, suite_id: str) -> str:
        return self._k("suite", suite_id, "results")

    def suite_durations(self, name: str) -> str:
        return self._k("suite_durations", name)

    @property
    def dashboard_users(self) -> str:
        return self._k("dashboard", "users")

    def login_attempts(self, scope: str, digest: str) -> str:
        """``scope`` ``addr`` or ``user``; ``digest`` the sha256 hex of the address or name."""
        return self._k("dashboard", "login", scope, digest)

    # per entity
    def task(self, task_id: str) -> str:
        return self._k("task", task_id)

    def goal(self, task_id: str) -> str:
        return self._k("task", task_id, "goal")

    def task_tests(self, task_id: str) -> str:
        return self._k("task", task_id, "tests")

    def attempts(self, task_id: str) -> str:
        return self._k("task", task_id, "attempts")

    def log(self, task_id: str, attempt: int | str) -> str:
        return self._k("log", task_id, str(attempt))

    def queue(self, sig: str) -> str:
        return self._k("queue", sig)

    def sig(self, sig: str) -> str:
        return self._k("sig", sig)

    def status(self, status: str) -> str:
        return self._k("status", status)

    def idem(self, key: str) -> str:
        return self._k("idem", key)

    def device(self, device_id: str) -> str:
        return self._k("device", device_id)

    def device_history(self, device_id: str) -> str:
        return self._k("device", device_id, "history")

    def device_log(self, device_id: str) -> str:
        return self._k("device", device_id, "log")

    def device_attrs(self, device_id: str) -> str:
        return self._k("device", device_id, "attrs")

    def device_attrs_at(self, device_id: str) -> str:
        return self._k("device", device_id, "attrs_at")

    def device_attrs_host(self, device_id: str) -> str:
        return self._k("device", device_id, "attrs_host")

    def host(self, host_id: str) -> str:
        return self._k("host", host_id)

    def host_devices(self, host_id: str) -> str:
        return self._k("host", host_id, "devices")

    def host_quarantined(self, host_id: str) -> str:
        return self._k("host", host_id, "quarantined")

    def host_held_devices(self, host_id: str) -> str:
        return self._k("host", host_id, "held_devices")

    def host_sync(self, host_id: str) -> str:
        return self._k("host", host_id, "sync")

    def host_leftout(self, host_id: str) -> str:
        return self._k("host", host_id, "leftout")

    def inbox(self, host_id: str) -> str:
        return self._k("host", host_id, "inbox")

    def host_wake(self, host_id: str) -> str:
        return self._k("host", host_id, "wake")

    def host_ctl(self, host_id: str) -> str:
        return self._k("host", host_id, "ctl")

    def workflow(self, name: str) -> str:
        return self._k("workflow", name)
