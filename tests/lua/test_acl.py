"""Redis ACL users per role (``deviceq acl``) on a real ``redis-server``.

The users are made by running the exact lines ``deviceq acl`` prints, as the administrator
(through redis-py or ``redis-cli``), for a fresh pool, so their names (``dq-POOL-ROLE``) are
unique; every test deletes them (``ACL DELUSER``). Each role does its whole job as its own user
(real ``deviceq scheduler run`` and ``deviceq host run`` processes, the producer's client and
command line, the operator's commands) and the server's ACL LOG then holds no refusal for any
of them, not even one the code ignores; outside its job each role is refused."""

from __future__ import annotations

import fnmatch
import json
import re
import secrets
import shlex
import signal
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

import docs_pages
from deviceq import (
    AuthError,
    Client,
    DeviceReport,
    HostClient,
    PoolAdmin,
    SchedulerClient,
    TaskScheduler,
    TaskStatus,
)
from deviceq.cli import main
from deviceq.core.errors import NotConfirmed, NotFound
from deviceq.core.keys import Keys
from deviceq.core.limits import COUNTERS as LIMIT_COUNTERS
from deviceq.core.redis_server import RedisServer
from deviceq.core.scripts import lua_dir, names, sha, source
from deviceq.host.redis_link import token_digest
from deviceq.ops.acl import (
    FORBIDDEN,
    ROLE_SCRIPTS,
    ROLE_WRITES,
    ROLES,
    SCRIPT_COMMANDS,
    SUBCOMMANDS,
    role_acl,
)
from harness import Deployment, free_port, wait_for

NoPermission = redis.exceptions.NoPermissionError


# -- helpers ---------------------------------------------------------------------------------
def acl_lines(*args: str) -> list[str]:
    """What ``deviceq acl ARGS`` prints on stdout (it must succeed)."""
    res = CliRunner().invoke(main, ["acl", *args])
    assert res.exit_code == 0, res.output
    return res.stdout.splitlines()


def cli(url: str, pool: str, *args: str) -> Result:
    return CliRunner().invoke(main, ["--redis-url", url, "--pool", pool, *args])


class Users:
    """ACL users of one pool on one server, each made from the line ``deviceq acl --role R
    --password-file F`` prints; ``close()`` deletes them all."""

    def __init__(self, server: RedisServer, pool: str, tmp: Path) -> None:
        self.server, self.pool, self.tmp = server, pool, tmp
        self.admin = redis.Redis.from_url(server.url, decode_responses=True)
        self.passwords: dict[str, str] = {}

    def add(self, role: str, host_id: str | None = None) -> str:
        """Create the user of ``role`` (bound to ``host_id``) and return its Redis URL."""
        password = secrets.token_hex(16)
        pw_file = self.tmp / f"{role}-{host_id or 'any'}.pw"
        pw_file.write_text(password + "\n")
        args = ["--pool", self.pool, "--role", role, "--password-file", str(pw_file)]
        (line,) = acl_lines(*args, *(["--host-id", host_id] if host_id else []))
        assert password not in line  # only its SHA-256 is printed
        user = line.split()[2]
        self.passwords[user] = password
        assert self.admin.execute_command(*shlex.split(line)) in ("OK", b"OK", True)
        return self.url(user)

    def add_via_redis_cli(self, role: str) -> str:
        """The same, the printed line piped into ``redis-cli`` as it is."""
        password = secrets.token_hex(16)
        pw_file = self.tmp / f"{role}-cli.pw"
        pw_file.write_text(password)
        (line,) = acl_lines("--pool", self.pool, "--role", role, "--password-file", str(pw_file))
        user = line.split()[2]
        self.passwords[user] = password
        out = subprocess.run(["redis-cli", "-p", str(self.server.port)], input=line + "\n",
                             capture_output=True, text=True, timeout=10, check=True)  # fmt: skip
        assert out.stdout.strip() == "OK", out
        return self.url(user)

    def url(self, user: str) -> str:
        return f"redis://{user}:{self.passwords[user]}@127.0.0.1:{self.server.port}/0"

    def conn(self, url: str) -> redis.Redis:
        return redis.Redis.from_url(url, decode_responses=True, socket_timeout=30)

    def denials(self) -> list[dict[str, Any]]:
        """The server's ACL LOG entries for these users (refused commands and keys)."""
        out = []
        for entry in self.admin.acl_log(count=1000):
            e = {str(k): v for k, v in dict(entry).items()}
            if e.get("username") in self.passwords:
                out.append(e)
        return out

    def close(self) -> None:
        for user in self.passwords:
            self.admin.execute_command("ACL", "DELUSER", user)
        self.admin.close()


@pytest.fixture
def users(redis_server: RedisServer, pool: str, tmp_path: Path) -> Iterator[Users]:
    u = Users(redis_server, pool, tmp_path)
    try:
        yield u
    finally:
        u.close()


# -- what deviceq acl prints -----------------------------------------------------------------
def test_acl_prints_one_setuser_line_per_role_with_only_the_pools_keys() -> None:
    lines = acl_lines("--pool", "lab")
    assert [ln.split()[2] for ln in lines] == [f"dq-lab-{r}" for r in ROLES]
    for line in lines:
        tokens = line.split()
        assert tokens[:2] == ["ACL", "SETUSER"]
        assert tokens[3:7] == ["reset", "on", "><password>", "resetkeys"]
        assert "resetchannels" in tokens and "-@all" in tokens
        keys = [t for t in tokens if "~" in t]
        assert keys and all(re.fullmatch(r"(%R)?~dq:\{lab\}:\S*", k) for k in keys), keys
        granted = [t[1:] for t in tokens if t.startswith("+")]
        assert granted and not any(g.startswith("@") for g in granted)  # no categories
        assert not {g.split("|")[0] for g in granted if g not in SUBCOMMANDS} & FORBIDDEN
        assert tokens.index("-@all") < tokens.index("+evalsha")
        assert {"evalsha", "eval", "ping"} <= set(granted)
    producer, scheduler, host, operator = (ln.split() for ln in lines)
    assert "~dq:{lab}:*" in operator and "%R~dq:{lab}:*" not in operator
    # read the pool (producer and host: but its private keys, dq:{POOL}:_*), write only
    # some of it
    for tokens, reads in ((producer, "%R~dq:{lab}:[^_]*"), (scheduler, "%R~dq:{lab}:*"),
                          (host, "%R~dq:{lab}:[^_]*")):  # fmt: skip
        assert reads in tokens and "~dq:{lab}:*" not in tokens
        assert "~dq:{lab}:config" not in tokens and "~dq:{lab}:hosts" not in tokens
    assert "~dq:{lab}:host:*" in host and "~dq:{lab}:host:*" not in producer

    # the global --pool works too; a bad pool or version is one line and exit 1
    assert acl_lines("--role", "producer", "--role", "producer")[0].split()[2] == (
        "dq-default-producer"
    )
    res = CliRunner().invoke(main, ["--pool", "lab2", "acl", "--role", "host"])
    assert res.stdout.split()[2] == "dq-lab2-host"
    assert "--host-id" in res.stderr  # the note about an unbound host user
    for bad in (["--pool", "no way"], ["--redis-version", "6.2"], ["--redis-version", "x"],
                ["--role", "producer", "--host-id", "h1"]):  # fmt: skip
        res = CliRunner().invoke(main, ["acl", *bad])
        assert res.exit_code == 1 and res.stderr.startswith("error: "), (bad, res.output)


def test_acl_password_file_host_binding_version_and_json(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_text("s3cret-pass\n")
    (line,) = acl_lines("--pool", "lab", "--role", "host", "--host-id", "lab-1",
                        "--password-file", str(pw))  # fmt: skip
    tokens = line.split()
    assert tokens[2] == "dq-lab-host-lab-1"
    assert "s3cret-pass" not in line and "#" + _sha256("s3cret-pass") in tokens
    assert "~dq:{lab}:host:lab-1" in tokens and "~dq:{lab}:host:lab-1:*" in tokens
    # another host's keys: only its control list (a multi-device task's part that ends tells
    # the other parts' hosts), never its hash, inbox or token
    assert [t for t in tokens if t.startswith("~dq:{lab}:host:*")] == ["~dq:{lab}:host:*:ctl"]
    # each role its own password: a file needs exactly one role
    res = CliRunner().invoke(main, ["acl", "--pool", "lab", "--password-file", str(pw)])
    assert res.exit_code == 1 and "exactly one --role" in res.stderr
    res = CliRunner().invoke(main, ["acl", "--role", "host", "--password-file", str(tmp_path)])
    assert res.exit_code != 0

    # Redis 7.2: CLIENT SETINFO (redis-py's library name) and WAITAOF (durability)
    by_role = {ln.split()[2]: ln.split() for ln in acl_lines("--pool", "lab", "--redis-version",
                                                             "7.2.4")}  # fmt: skip
    assert all("+client|setinfo" in t for t in by_role.values())
    assert "+waitaof" in by_role["dq-lab-producer"] and "+waitaof" in by_role["dq-lab-host"]
    assert "+waitaof" not in by_role["dq-lab-scheduler"]
    assert not any("setinfo" in ln or "waitaof" in ln for ln in acl_lines("--pool", "lab"))

    data = json.loads("\n".join(acl_lines("--pool", "lab", "--json")))
    assert [d["role"] for d in data] == list(ROLES)
    for d in data:
        granted = {t[1:] for t in d["line"].split() if t.startswith("+")}
        assert granted == set(d["commands"]), d["role"]
        assert all(why.strip() for why in d["commands"].values())
        assert d["scripts"] == list(ROLE_SCRIPTS[d["role"]])


def test_the_docs_show_the_real_host_line() -> None:
    _, section = docs_pages.section("Redis users, one per role")
    shown = section.split("$ deviceq acl --pool lab --role host\n", 1)[1].splitlines()[0]
    assert shown.strip() == acl_lines("--pool", "lab", "--role", "host")[0]


def _sha256(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()


# -- the tables against the scripts ----------------------------------------------------------
def _lua_commands() -> dict[str, set[str]]:
    """Every command each script may call: the ``redis.call``s of the text sent for it (its
    own and those of the helpers it reaches: `deviceq.core.scripts.source`)."""
    call = re.compile(r"redis\.p?call\(\s*['\"](\w+)['\"]")
    return {name: {c.lower() for c in call.findall(source(name))} for name in names()}


def _written_keys(name: str) -> set[str]:
    """The keys a script's ``-- Keys`` header says it writes (``ID``-like parts as ``h1``)."""
    text = (lua_dir() / f"{name}.lua").read_text()
    m = re.search(r"^-- Keys(.*?)^-- (Returns|Errors)", text, re.S | re.M)
    assert m, name
    mode, out = "", set()
    for tok in re.split(r"[,;\s]+", re.sub(r"^--", " ", m.group(1), flags=re.M)):
        if tok == "reads":
            mode = "r"
        elif tok in ("writes", "reads/writes"):
            mode = "w"
        elif tok == "LIMIT_COUNTERS" and mode == "w":  # every declared limit's count hash
            out.update(LIMIT_COUNTERS)
        elif (
            tok
            and mode == "w"
            and tok not in {"on", "a", "hand-back", "or", "hint", "also", "and", "(lib/limits)"}
        ):
            out.add(":".join("h1" if p in {"ID", "SIG", "KEY", "NAME", "STATUS", "*"} else p
                             for p in tok.split(":")))  # fmt: skip
    return out


def test_the_role_tables_match_the_lua_scripts() -> None:
    """``SCRIPT_COMMANDS`` covers what the scripts call; each role may run every command of its
    scripts and write every key their headers say they write (a host bound to host h1 its
    own host's keys); nobody but the operator may write ``config`` or ``hosts``."""
    calls = _lua_commands()
    assert set(SCRIPT_COMMANDS) == set(calls)
    for name, cmds in calls.items():
        assert cmds <= SCRIPT_COMMANDS[name], (name, cmds - SCRIPT_COMMANDS[name])
    extra = {
        "producer": {"workflow:h1", "workflows"},  # workflow put
        "scheduler": {"sched:wake"},  # BLPOP
        "host": {"host:h1:wake", "host:h1:ctl"},  # BLPOP, the nudge
        "operator": {"config", "workflow:h1", "workflows"},
    }
    for role in ROLES:
        acl = role_acl("p", role, host_id="h1" if role == "host" else None)
        granted = set(acl.commands)
        for script in ROLE_SCRIPTS[role]:
            assert calls[script] <= granted, (role, script, calls[script] - granted)
        patterns = [k.removeprefix("dq:{p}:") for k in acl.write_keys]
        written = set().union(*(_written_keys(s) for s in ROLE_SCRIPTS[role])) | extra[role]
        for key in written:
            assert any(fnmatch.fnmatchcase(key, p) for p in patterns), (role, key)
        if role != "operator":
            # the scheduler marks hosts suspect (expire.lua): it writes every host:* key
            others = ("host:h2", "host:h2:devices", "host:h2:wake") if role != "scheduler" else ()
            for key in ("config", "hosts", "leader", "h", *others):
                if role == "scheduler" and key == "leader":
                    continue
                assert not any(fnmatch.fnmatchcase(key, p) for p in patterns), (role, key)
            assert "dq:{p}:" in acl.write_keys  # KEYS[1] of every script
    assert ROLE_WRITES["operator"] == ("*",)


# -- every role does its whole job as its own user ---------------------------------------------
def test_a_task_goes_submit_to_done_with_every_role_on_its_own_user(
    users: Users, redis_server: RedisServer, pool: str, tmp_path: Path
) -> None:
    op_url, prod_url = users.add("operator"), users.add("producer")
    sched_url, host_url = users.add("scheduler"), users.add("host", "h1")

    def op(*args: str) -> str:
        res = cli(op_url, pool, *args)
        assert res.exit_code == 0, (args, res.output)
        return res.stdout

    token = op("host", "add", "h1").strip()
    (tmp_path / "h1.token").write_text(token)
    op("config", "set", "lease_ttl", "5")
    wf = tmp_path / "two.json"
    wf.write_text(json.dumps({"name": "two", "steps": [{"goal": "one"}, {"goal": "two"}]}))
    op("workflow", "put", str(wf))

    deploy = Deployment(redis_server.url, pool, tmp_path)  # its own client is only used to kill
    admin = PoolAdmin(op_url, pool)
    producer = Client(prod_url, pool)
    try:
        host = deploy.spawn("h1", "host", "run", "--host-id", "h1", "--token-file",
                            str(tmp_path / "h1.token"), "--device", "d1:android:wifi",
                            "--command", "echo ran {goal} on {device_id}",
                            env={"DEVICEQ_REDIS_URL": host_url})  # fmt: skip
        wait_for(lambda: any(d.state.value == "idle" for d in admin.devices()), 20, "d1 idle")

        # the operator dispatches by hand (no scheduler yet), the host runs it
        first = producer.submit("by-hand", driver_type="android")
        assert op("dispatch", first, "--device", "d1").strip()
        assert producer.wait(first, timeout=30).result == "ran by-hand on d1\n"

        # the scheduler daemon (with its metrics endpoint) assigns the rest
        port = free_port()
        sched = deploy.spawn("scheduler", "scheduler", "run", "--tick", "0.2", "--metrics-port",
                             str(port), env={"DEVICEQ_REDIS_URL": sched_url})  # fmt: skip
        second = producer.submit("hello", driver_type="android", tags=["wifi"])
        wf_task = producer.submit(workflow="two")
        t2, t_wf = producer.wait(second, timeout=30), producer.wait(wf_task, timeout=30)
        assert (t2.status, t2.result, t_wf.status) == (TaskStatus.done, "ran hello on d1\n",
                                                      TaskStatus.done)  # fmt: skip

        # the producer's command line: submit, wait, show, list, events, workflows
        res = cli(prod_url, pool, "submit", "from-cli", "--json")
        assert res.exit_code == 0, res.output
        cli_task = json.loads(res.stdout)["id"]
        for args in (["task", "wait", cli_task, "--timeout", "30"], ["task", "show", cli_task],
                     ["task", "list", "--json"], ["events", "--task", cli_task],
                     ["workflow", "list"], ["workflow", "show", "two"]):  # fmt: skip
            res = cli(prod_url, pool, *args)
            assert res.exit_code == 0, (args, res.output)

        # a task nothing can run: the operator explains it, the producer cancels it, the
        # operator retries and cancels the retry
        stuck = producer.submit("never", driver_type="nothing")
        assert "nothing" in op("explain", stuck)
        assert producer.cancel(stuck) == "cancelled"
        retry = op("task", "retry", stuck).split()[0]
        op("task", "cancel", retry)
        assert producer.get(retry).status is TaskStatus.cancelled

        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        assert f'deviceq_redis_up{{pool="{pool}"}} 1.0' in text
        assert "deviceq_queue_depth" in text and "deviceq_devices" in text

        # the operator's commands
        for args in (["status"], ["status", "--json"], ["events", "--limit", "5"],
                     ["host", "list"], ["device", "list", "--json"], ["config", "get"],
                     ["task", "list"], ["task", "show", second], ["workflow", "list"],
                     ["device", "quarantine", "d1"], ["device", "unquarantine", "d1"],
                     ["host", "drain", "h1"], ["host", "undrain", "h1"]):  # fmt: skip
            op(*args)
        assert json.loads(op("status", "--json"))["counts"]["done"] >= 4
        op("host", "add", "h2")
        op("host", "rotate-token", "h2")
        op("host", "remove", "h2")
        if "verify" in main.commands:
            assert "0 violation" in op("verify") or " ok " in op("verify")

        # still working after all that; then both daemons stop cleanly as their users
        last = producer.submit("after", driver_type="android")
        assert producer.wait(last, timeout=30).status is TaskStatus.done
        for proc in (host, sched):
            proc.send_signal(signal.SIGTERM)
        assert (host.wait(30), sched.wait(30)) == (0, 0)
    finally:
        deploy.close()
        admin.close()
        producer.close()
    assert users.denials() == []
    for name in ("h1", "scheduler"):
        assert "NOPERM" not in deploy.log(name) and "permission" not in deploy.log(name)


def test_every_transition_runs_under_its_roles_user(users: Users, pool: str) -> None:
    """The paths the happy path does not take: hand-backs in claim and report, automatic
    quarantine, lease and queue-deadline expiry, cancels in every state, session takeover
    and recovery, host removal, durable (pipelined) submissions and reports. A script that
    met a refused key or command half-way would leave half a transition: none does."""
    op = PoolAdmin(users.add("operator"), pool)
    prod = Client(users.add("producer"), pool)
    sched = SchedulerClient(users.add("scheduler"), pool)
    ts = TaskScheduler(sched, owner="s1")
    h1_url, h2_url = users.add("host", "h1"), users.add("host", "h2")
    for k, v in (("claim_ttl", 1), ("lease_ttl", 1), ("quarantine_after", 1),
                 ("max_quarantine_fraction", 1), ("max_attempts", 2)):  # fmt: skip
        op.set_config(k, v)
    tok1, tok2 = op.add_host("h1"), op.add_host("h2")
    h1 = HostClient(h1_url, pool, "h1", tok1)
    h1.start_session("s1", "start", "owner-1", "")
    devices = [DeviceReport("d1", "android", ("wifi",)), DeviceReport("d2", "android")]

    def beat() -> None:
        h1.heartbeat(devices)

    def assign_one() -> tuple[str, str]:
        res = ts.assign()
        assert res.assigned == 1, res
        task_id, device_id, _ = res.assignments[0]
        return task_id, device_id

    beat()
    assert ts.try_lead()
    prod.put_workflow({"name": "wf", "steps": [{"goal": "a"}]})
    long_goal = "g" * 100  # kept in task:ID:goal
    t1 = prod.submit(long_goal, tags=["wifi"], idempotency_key="k1", queue_timeout=60)
    assert prod.submit(long_goal, tags=["wifi"], idempotency_key="k1") == t1
    assert assign_one() == (t1, "d1")
    (a,) = h1.claim(1)
    assert a.task.goal == long_goal
    assert h1.renew([(t1, a.lease_id)])[0].status == "ok"
    assert h1.report(t1, a.lease_id, "done", None, "fine") == "ok:done"

    # claim hands back an assignment whose device was quarantined meanwhile
    t2 = prod.submit("q", tags=["wifi"])
    assign_one()
    assert op.quarantine("d1") == "quarantined"
    assert h1.claim(1) == []
    op.quarantine("d1", False)
    beat()
    # a report hands one back; a runner_error report quarantines the device (after 1)
    assign_one()
    (a,) = h1.claim(1)
    assert h1.release(t2, a.lease_id) == "ok:queued"
    beat()
    assign_one()
    (a,) = h1.claim(1)
    assert h1.report(t2, a.lease_id, "failed", "runner_error", "boom") == "ok:failed"
    assert op.device("d1").quarantined
    op.quarantine("d1", False)
    beat()

    # lease expiry: an unclaimed assignment is requeued, an expired run fails (2 attempts)
    t3 = prod.submit("e", tags=["wifi"])
    assign_one()
    time.sleep(1.2)
    assert ts.expire()["requeued"] == 1
    beat()
    assign_one()
    (a,) = h1.claim(1)
    time.sleep(1.2)
    assert ts.expire()["failed"] == 1
    assert prod.get(t3).failure_kind.value == "lease_expired"
    beat()
    # a queue deadline passes
    t4 = prod.submit("dl", driver_type="nothing", queue_timeout=0.3)
    time.sleep(0.5)
    assert ts.expire()["unschedulable"] == 1
    assert prod.get(t4).status is TaskStatus.failed

    # cancels: queued, assigned, dispatched (the host stops and reports it)
    assert prod.cancel(prod.submit("c1", driver_type="nothing")) == "cancelled"
    op.set_config("claim_ttl", 30)
    op.set_config("lease_ttl", 30)
    t6 = prod.submit("c2", tags=["wifi"])
    assign_one()
    assert prod.cancel(t6) == "cancelled"
    beat()
    t7 = prod.submit("c3", tags=["wifi"])
    assign_one()
    (a,) = h1.claim(1)
    assert prod.cancel(t7) == "requested"
    assert h1.renew([(t7, a.lease_id)])[0].status == "cancel"
    assert h1.report(t7, a.lease_id, "cancelled") == "ok:cancelled"
    beat()

    # sessions: a takeover fences s1; a dead daemon's running attempt is handed back at once
    h1b = HostClient(h1_url, pool, "h1", tok1)
    assert h1b.start_session("s2", "takeover", "owner-2", "s1").replaced == "s1"
    h1b.heartbeat(devices)
    t8 = prod.submit("s", tags=["wifi"])
    assign_one()
    assert len(h1b.claim(1)) == 1
    h1c = HostClient(h1_url, pool, "h1", tok1)
    assert h1c.start_session("s3", "dead", "owner-3", "s2").handed_back == 1
    assert prod.get(t8).status is TaskStatus.queued
    assert h1c.set_draining(True) == "stopping"
    assert h1c.set_draining(False) == "running"
    # a device changes its tags (devgen) and one leaves the snapshot (offline)
    h1c.heartbeat([DeviceReport("d1", "android", ("wifi", "5g"))])
    assert op.device("d2").state.value == "offline"
    assert h1c.end_session()

    # the operator: drain, manual dispatch, another host's token, its removal
    assert op.drain("h1") == "draining" and op.drain("h1", False) == "active"
    h1d = HostClient(h1_url, pool, "h1", tok1)
    h1d.heartbeat(devices)
    assert op.dispatch(t8, "d1")
    h2 = HostClient(h2_url, pool, "h2", tok2)
    h2.heartbeat([DeviceReport("e1", "ios")])
    tok2 = op.rotate_token("h2")
    HostClient(h2_url, pool, "h2", tok2).heartbeat([DeviceReport("e1", "ios")])
    assert op.remove_host("h2") == 1
    lead = sched.lead("s9", 5000)
    assert not lead.leads and sched.leader() == ("s1", lead.epoch)
    assert sched.step_down("s1")

    # reservations: reserve, extend, release (operator); the expiry scan ends one (scheduler)
    assert op.reserve("d2", 60_000, "alice").reserved_by == "alice"
    op.extend("d2", 1000)
    op.release("d2")
    op.reserve("d2", 1000, "bob")
    time.sleep(1.1)
    sched.expire(100)
    assert op.reservation("d2") is None

    # durable mode: submissions and reports go through a pipeline with WAIT (no replica here:
    # applied, not confirmed)
    op.set_config("durability", "replica")
    op.set_config("durability_timeout", 0.05)
    time.sleep(1.1)  # each client reads the setting at most once a second
    with pytest.raises(NotConfirmed) as got:
        prod.submit("durable", driver_type="nothing")
    assert prod.get(got.value.result[0]).status is TaskStatus.queued
    (a,) = h1d.claim(1)
    with pytest.raises(NotConfirmed):
        h1d.report(t8, a.lease_id, "done", None, "ok")
    assert prod.get(t8).status is TaskStatus.done
    op.set_config("durability", "none")

    for c in (op, prod, sched, h1, h1b, h1c, h1d, h2):
        c.close()
    assert users.denials() == []


# -- and nothing outside it ----------------------------------------------------------------------
def test_each_role_is_refused_outside_its_job(users: Users, pool: str, real_r: redis.Redis) -> None:
    op_url, prod_url = users.add("operator"), users.add("producer")
    sched_url, host_url = users.add("scheduler"), users.add("host", "h1")
    keys = Keys(pool)
    op = PoolAdmin(op_url, pool)
    tok1, _ = op.add_host("h1"), op.add_host("h2")
    HostClient(host_url, pool, "h1", tok1).heartbeat([DeviceReport("d1", "android")])
    tid = Client(prod_url, pool).submit("x", driver_type="android")
    SchedulerClient(sched_url, pool).commit([(tid, "d1")])
    digest_h2 = real_r.hget(keys.host("h2"), "token_digest")
    before = real_r.hgetall(keys.config)

    # a producer cannot claim: only the digest of a token is in Redis, and it cannot write one
    with pytest.raises(AuthError):
        HostClient(prod_url, pool, "h1", "not-the-token-of-h1").claim(1)
    assert Client(prod_url, pool).get(tid).status is TaskStatus.assigned
    prod_r = users.conn(prod_url)
    with pytest.raises(NoPermission):
        prod_r.hset(keys.host("h1"), "token_digest", token_digest("mine-now-0123456789"))
    # nobody but the operator changes settings
    for url in (prod_url, host_url, sched_url):
        res = cli(url, pool, "config", "set", "lease_ttl", "7")
        assert res.exit_code == 1 and "(ACL)" in res.stderr, res.output
        with pytest.raises(NoPermission):
            PoolAdmin(url, pool).set_config("max_attempts", 9)
    # neither a producer nor a host registers a host, rotates or drains another one
    for url in (prod_url, host_url):
        res = cli(url, pool, "host", "add", "h9")
        assert res.exit_code == 1 and res.stderr.startswith("error: "), res.output
        with pytest.raises(redis.ResponseError):
            PoolAdmin(url, pool).rotate_token("h2")
        with pytest.raises(redis.ResponseError):
            PoolAdmin(url, pool).drain("h2")
    assert not real_r.exists(keys.host("h9")) and not real_r.sismember(keys.hosts, "h9")
    assert real_r.hget(keys.host("h2"), "token_digest") == digest_h2
    assert real_r.hget(keys.host("h2"), "draining") == "0"
    assert real_r.hgetall(keys.config) == before
    # a producer cannot take the scheduler's leader lease
    with pytest.raises(redis.ResponseError):
        SchedulerClient(prod_url, pool).lead("intruder", 5000)
    assert not real_r.exists(keys.leader)

    # no role reads or writes another pool's keys (or a key of no pool)
    other = "o" + uuid.uuid4().hex[:12]
    ok = Keys(other)
    real_r.hset(ok.config, "max_attempts", "5")
    real_r.set(ok.workflow("w"), "{}")
    try:
        for url in (op_url, prod_url, sched_url, host_url):
            r = users.conn(url)
            for cmd in (("HGETALL", ok.config), ("GET", ok.workflow("w")), ("GET", "other")):
                with pytest.raises(NoPermission):
                    r.execute_command(*cmd)
            with pytest.raises(NoPermission):
                r.hset(ok.config, "max_attempts", "1")
            with pytest.raises(NoPermission):
                r.set(ok.seq, "1")
            with pytest.raises(NoPermission):  # KEYS[1] of the other pool
                Client(r, other).submit("x")
            with pytest.raises(redis.ResponseError):  # a key the script names itself
                r.eval(f"return redis.call('HGETALL', '{ok.config}')", 1, keys.prefix)
            with pytest.raises(redis.ResponseError):
                r.eval(f"return redis.call('DEL', '{ok.config}')", 1, keys.prefix)
            r.close()
        assert real_r.hgetall(ok.config) == {"max_attempts": "5"}
        assert real_r.get(ok.workflow("w")) == "{}" and not real_r.exists(ok.seq)
    finally:
        real_r.delete(ok.config, ok.workflow("w"))
    prod_r.close()
    op.close()


ADMIN_COMMANDS: list[tuple[str, ...]] = [
    ("FLUSHALL",), ("FLUSHDB",), ("KEYS", "*"), ("CONFIG", "GET", "maxmemory"),
    ("CONFIG", "SET", "maxmemory-policy", "allkeys-lru"), ("SCRIPT", "FLUSH"),
    ("SCRIPT", "LOAD", "return 1"), ("SCRIPT", "EXISTS", "0" * 40), ("FUNCTION", "LIST"),
    ("FUNCTION", "FLUSH"), ("DEBUG", "SLEEP", "0"), ("SHUTDOWN", "NOSAVE"), ("MONITOR",),
    ("SLOWLOG", "GET"), ("ACL", "LIST"), ("ACL", "SETUSER", "intruder", "on"), ("CLIENT", "LIST"),
    ("CLIENT", "KILL", "TYPE", "normal"), ("SAVE",), ("BGREWRITEAOF",), ("SWAPDB", "0", "1"),
    ("REPLICAOF", "127.0.0.1", "1"),
]  # fmt: skip


def test_no_role_can_run_server_administration(private_redis: RedisServer, pool: str,
                                               tmp_path: Path) -> None:  # fmt: skip
    """On a server of its own (were one allowed, it would FLUSHALL or SHUTDOWN it): every role,
    made from ``deviceq acl``'s line piped into redis-cli, is refused every administration
    command, directly or from a script."""
    u = Users(private_redis, pool, tmp_path)
    try:
        urls = [u.add_via_redis_cli(role) for role in ROLES]
        u.admin.set("keep", "1")
        prefix = Keys(pool).prefix
        for url in urls:
            r = u.conn(url)
            assert r.ping()
            user = url.split("//")[1].split(":")[0]
            for cmd in ADMIN_COMMANDS:
                verdict = u.admin.execute_command("ACL", "DRYRUN", user, *cmd)
                assert "no permissions" in str(verdict), (user, cmd, verdict)
                # DEBUG is refused by enable-debug-command even before the ACL
                with pytest.raises(redis.ResponseError if cmd[0] == "DEBUG" else NoPermission):
                    r.execute_command(*cmd)
            for cmd in ("FLUSHALL", "FLUSHDB", "KEYS', '*", "DEBUG', 'SLEEP', '0"):
                with pytest.raises(redis.ResponseError):
                    r.eval(f"return redis.call('{cmd}')", 1, prefix)
            r.close()
        assert u.admin.get("keep") == "1" and u.admin.ping()
        assert u.admin.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
    finally:
        u.close()


def test_scripts_run_after_script_flush_for_users_without_script(
    private_redis: RedisServer, pool: str, tmp_path: Path
) -> None:
    """The NOSCRIPT fallback is EVAL (no SCRIPT LOAD, which no role may run): after the
    administrator's SCRIPT FLUSH, direct calls, pipelines and transactions all work, the
    script is cached again, and error replies still map to typed errors."""
    u = Users(private_redis, pool, tmp_path)
    try:
        op = PoolAdmin(u.add("operator"), pool)
        prod = Client(u.add("producer"), pool)
        token = op.add_host("h1")
        host = HostClient(u.add("host", "h1"), pool, "h1", token)

        def cached(name: str) -> bool:
            return bool(u.admin.script_exists(sha(name))[0])

        first = prod.submit("a", driver_type="nothing")
        assert cached("submit")
        u.admin.script_flush()
        assert not cached("submit")
        second = prod.submit("b", driver_type="nothing")  # EVALSHA: NOSCRIPT, then EVAL
        assert cached("submit")
        u.admin.script_flush()
        with pytest.raises(NotFound):  # an error reply through the fallback
            prod.cancel("0123456789abcdef")
        assert host.heartbeat([DeviceReport("d1", "android")]).devices == 1

        for transaction in (False, True):
            u.admin.script_flush()
            pipe = prod.redis.pipeline(transaction=transaction)
            prod.scripts.run("cancel", prod.keys.prefix, [first if transaction else second,
                                                          "by pipeline"], client=pipe)  # fmt: skip
            pipe.hgetall(prod.keys.task(first))
            assert pipe.execute()[0] == "cancelled"
        assert cached("cancel")
        stats = u.admin.info("commandstats")
        assert "cmdstat_eval" in stats and "cmdstat_script|load" not in stats
        assert u.denials() == []
        for c in (op, prod, host):
            c.close()
    finally:
        u.close()


def test_webhook_secrets_are_read_by_the_scheduler_and_operator_only(
    users: Users, pool: str, real_r: redis.Redis, tmp_path: Path
) -> None:
    """The producer's and a host's users read the webhooks (URL, events) but not their
    signing secrets, neither directly nor from a script; the scheduler signs with them. A
    record stored with its secret inline (as before the secrets moved) is moved over by the
    scheduler's first read, after which no role but those two can read it either."""
    from deviceq.services.webhooks import WebhookStore

    op_url, prod_url = users.add("operator"), users.add("producer")
    sched_url, host_url = users.add("scheduler"), users.add("host", "h1")
    keys = Keys(pool)
    secret = "s3cret-" + secrets.token_hex(12)
    (tmp_path / "hook.secret").write_text(secret + "\n")
    res = cli(op_url, pool, "webhook", "add", "http://127.0.0.1:9/hook", "--event", "failed",
              "--secret-file", str(tmp_path / "hook.secret"), "--json")  # fmt: skip
    assert res.exit_code == 0, res.output
    hook_id = json.loads(res.stdout)["id"]
    legacy = {
        "id": "wh-legacy0001",
        "url": "http://127.0.0.1:9/old",
        "events": ["done"],
        "created_at": 1,
        "secret": "legacy-" + secrets.token_hex(12),
        "since": "0-0",
    }
    real_r.hset(keys.webhooks, legacy["id"], json.dumps(legacy))  # as an older release stored it

    # the scheduler (its Deliverer's store) reads both secrets, moving the old one over
    got = {h.id: h.secret for h in WebhookStore(users.conn(sched_url), keys).all()}
    assert got == {hook_id: secret, legacy["id"]: legacy["secret"]}
    for url in (prod_url, host_url):
        r = users.conn(url)
        hooks = r.hgetall(keys.webhooks)
        assert set(hooks) == {hook_id, legacy["id"]}
        assert secret not in str(hooks) and legacy["secret"] not in str(hooks)
        assert all("secret" not in json.loads(v) for v in hooks.values())
        with pytest.raises(NoPermission):
            r.hgetall(keys.webhook_secrets)
        with pytest.raises(NoPermission):
            r.hget(keys.webhook_secrets, hook_id)
        with pytest.raises(redis.ResponseError):  # nor from a script of its own
            r.eval(f"return redis.call('HGETALL', '{keys.webhook_secrets}')", 1, keys.prefix)
        r.close()
    op_r = users.conn(op_url)
    assert op_r.hgetall(keys.webhook_secrets) == {hook_id: secret,
                                                  legacy["id"]: legacy["secret"]}  # fmt: skip
    # the commands still work, and a removed webhook's secret goes with it
    listed = cli(op_url, pool, "webhook", "list", "--json")
    assert listed.exit_code == 0 and secret not in listed.stdout, listed.output
    assert {h["id"] for h in json.loads(listed.stdout)} == {hook_id, legacy["id"]}
    assert cli(op_url, pool, "webhook", "remove", hook_id).exit_code == 0
    assert op_r.hkeys(keys.webhook_secrets) == [legacy["id"]]
    op_r.close()
    assert users.denials() == [] or all(
        d.get("username") in (f"dq-{pool}-producer", f"dq-{pool}-host-h1") for d in users.denials()
    )
