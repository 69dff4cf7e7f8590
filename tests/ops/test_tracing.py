"""OpenTelemetry traces (``deviceq.core.tracing``): one trace per task, from its submission
through each attempt's queue time, assignment, claim, run and report (a retry: another attempt
span), across the producer, the scheduler, the host and the API. In process with the SDK's
``InMemorySpanExporter``; with real daemons (``scheduler run``, ``host run``, ``api``, the
``submit`` command) exporting over OTLP/HTTP to a real receiver on loopback; and off by
default: without an endpoint nothing imports ``opentelemetry``."""

from __future__ import annotations

import gzip
import http.server
import json
import os
import subprocess
import sys
import threading
import zlib
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from deviceq import Client, TaskStatus
from deviceq.api.tokens import TokenStore
from deviceq.core import tracing
from deviceq.host.runners import Outcome, Task
from deviceq.scheduler import TaskScheduler
from harness import CLI, REPO_DIR, SRC_DIR, TESTS_PATH, Deployment, deviceq, free_port, wait_for

LIFECYCLE = {"deviceq.submit", "deviceq.queued", "deviceq.assign", "deviceq.attempt",
             "deviceq.claim", "deviceq.run", "deviceq.report"}  # fmt: skip


def fails_first(task: Task) -> Outcome:
    """A runner whose first attempt fails (``runner_failed``) and whose retry succeeds."""
    return Outcome.failure("first try") if task.attempt == 1 else Outcome.success("ok")


# -- in process, into the SDK's in-memory exporter ----------------------------------------------
@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    try:
        yield exporter
    finally:
        tracing.reset()


def test_one_trace_per_task_with_an_attempt_span_per_retry(
    deploy: Deployment, spans: InMemorySpanExporter
) -> None:
    from deviceq.host.daemon import HostWorker
    from deviceq.host.runners.registry import RunnerSpec
    from deviceq.host.settings import WorkerSettings

    d = deploy
    token = d.admin.add_host("h1")
    settings = WorkerSettings("h1", ["d1:x"], RunnerSpec("test_tracing:fails_first"),
                              isolation="thread", grace=5, poll_interval=0.5)  # fmt: skip
    worker = HostWorker(d.url, d.pool, settings, token)
    runner = threading.Thread(target=worker.run)
    runner.start()
    try:
        wait_for(lambda: d.alive("h1"), 20, "h1 alive")
        ids = [d.client.submit(f"g{i}", driver_type="x", max_attempts=2,
                               retry_on="runner_failed") for i in range(2)]  # fmt: skip
        sched = TaskScheduler(d.admin)

        def finished() -> bool:
            sched.assign()
            return all(d.status(t) is TaskStatus.done for t in ids)

        wait_for(finished, 60, "both tasks done")
    finally:
        worker.stop()
        runner.join(20)
    by_trace: dict[int, list[Any]] = defaultdict(list)
    for s in spans.get_finished_spans():
        by_trace[s.context.trace_id].append(s)
    for tid in ids:
        task = d.client.get(tid)
        assert task.traceparent is not None
        _, trace_hex, root_hex, _ = task.traceparent.split("-")
        mine = by_trace[int(trace_hex, 16)]
        names = [s.name for s in mine]
        assert set(names) == LIFECYCLE, names
        # two attempts: each with its queue time, assignment, claim, run and report
        for name in LIFECYCLE - {"deviceq.submit"}:
            assert names.count(name) == 2, (name, names)
        (root,) = [s for s in mine if s.name == "deviceq.submit"]
        assert root.parent is None and root.context.span_id == int(root_hex, 16)
        assert root.attributes["deviceq.task_id"] == tid
        attempts = {s.attributes["deviceq.attempt"]: s for s in mine if s.name == "deviceq.attempt"}
        assert sorted(attempts) == [1, 2]
        assert attempts[1].attributes["deviceq.outcome"] == "failed"
        assert attempts[1].attributes["deviceq.failure_kind"] == "runner_failed"
        assert attempts[2].attributes["deviceq.outcome"] == "done"
        for s in mine:
            if s.name in ("deviceq.queued", "deviceq.assign", "deviceq.attempt"):
                assert s.parent.span_id == root.context.span_id, s.name
            elif s.name != "deviceq.submit":  # claim, run, report: inside their attempt
                parent = next(a for a in attempts.values() if a.context.span_id == s.parent.span_id)
                assert parent.start_time <= s.start_time and s.end_time <= parent.end_time
            assert s.attributes.get("deviceq.task_id", tid) == tid
        queued = sorted((s for s in mine if s.name == "deviceq.queued"), key=lambda s: s.start_time)
        assert [s.attributes["deviceq.attempt"] for s in queued] == [1, 2]
        # the retry waited from the end of the first attempt, not from the submission
        assert queued[1].start_time >= attempts[1].start_time
    # the two tasks are two traces
    assert len({d.client.get(t).traceparent.split("-")[1] for t in ids}) == 2  # type: ignore[union-attr]


def test_a_bad_traceparent_is_refused_by_the_submit_script(deploy: Deployment) -> None:
    from deviceq.core.errors import InvalidInput
    from deviceq.producer.submission import TaskSpec, chunk_args

    for bad in ("00-xyz", "01-" + "a" * 32 + "-" + "b" * 16 + "-01", "00-" + "A" * 32 + "-" +
                "b" * 16 + "-01"):  # fmt: skip
        with pytest.raises(InvalidInput, match="malformed traceparent"):
            deploy.client._run("submit", chunk_args([TaskSpec(goal="x")], [bad]))
    assert deploy.client.counts().get("queued", 0) == 0


# -- real daemons, a real OTLP/HTTP receiver ------------------------------------------------------
class Receiver:
    """An OTLP/HTTP trace receiver on loopback: every ``POST /v1/traces`` body decoded."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                enc = (self.headers.get("Content-Encoding") or "").lower()
                if enc == "gzip":
                    body = gzip.decompress(body)
                elif enc == "deflate":
                    body = zlib.decompress(body)
                ok = self.path == "/v1/traces"
                if ok:
                    req = ExportTraceServiceRequest()
                    req.ParseFromString(body)
                    with outer.lock:
                        outer.requests.append(req)
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def spans(self) -> list[tuple[str, Any]]:
        """(service name, span) of everything received."""
        out = []
        with self.lock:
            for req in self.requests:
                for rs in req.resource_spans:
                    service = next((a.value.string_value for a in rs.resource.attributes
                                    if a.key == "service.name"), "")  # fmt: skip
                    out += [(service, s) for ss in rs.scope_spans for s in ss.spans]
        return out

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def attr(span: Any, key: str) -> Any:
    for a in span.attributes:
        if a.key == key:
            v = a.value
            return v.string_value or v.int_value or v.bool_value
    return None


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.close()


def test_daemons_export_one_trace_per_task_over_otlp_http(
    deploy: Deployment, receiver: Receiver
) -> None:
    d = deploy
    env = {"OTEL_BSP_SCHEDULE_DELAY": "100"}  # (flush a batch every 0.1 s)
    otel = ("--otel-endpoint", receiver.url)
    d.spawn("scheduler", "scheduler", "run", "--tick", "0.2", *otel, env=env)
    d.host("h1", "d1:x", extra=("--goal-runner", "command", "--command", "sh -c {goal}", *otel),
           env=env)  # fmt: skip
    port = free_port()
    d.spawn("api", "api", "--port", str(port), *otel, env=env)
    wait_for(lambda: d.alive("h1"), 30, "h1 alive")
    # one task through the submit command (the standard variable), one through the HTTP API
    sub = subprocess.run(
        [*CLI, "submit", "exit 0", "--driver-type", "x"],
        env={**os.environ, "DEVICEQ_REDIS_URL": d.url, "DEVICEQ_POOL": d.pool,
             "PYTHONPATH": os.pathsep.join((TESTS_PATH, SRC_DIR, REPO_DIR)),
             "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert sub.returncode == 0, sub.stderr
    by_cli = sub.stdout.split()[0]
    token = TokenStore(d.r, d.client.keys).add("tester", "producer")
    api_url = f"http://127.0.0.1:{port}"
    wait_for(lambda: _serving(api_url), 30, "the API")
    by_api = Client(api_url, token=token).submit("exit 0", driver_type="x")
    assert all(t.status is TaskStatus.done for t in d.wait_all([by_cli, by_api], timeout=60))

    def complete() -> dict[str, list[tuple[str, Any]]]:
        got: dict[str, list[tuple[str, Any]]] = {}
        for tid in (by_cli, by_api):
            trace_hex = d.client.get(tid).traceparent.split("-")[1]  # type: ignore[union-attr]
            got[tid] = [(svc, s) for svc, s in receiver.spans() if s.trace_id.hex() == trace_hex]
            if {s.name for _, s in got[tid]} != LIFECYCLE:
                return {}
        return got

    traces = wait_for(complete, 30, "every span of both tasks at the receiver")
    for tid, spans in traces.items():
        services = {s.name: svc for svc, s in spans}
        assert services["deviceq.submit"] == ("deviceq-producer" if tid == by_cli
                                              else "deviceq-api")  # fmt: skip
        assert services["deviceq.queued"] == services["deviceq.assign"] == "deviceq-scheduler"
        for name in ("deviceq.attempt", "deviceq.claim", "deviceq.run", "deviceq.report"):
            assert services[name] == "deviceq-host", name
        (root,) = [s for _, s in spans if s.name == "deviceq.submit"]
        assert attr(root, "deviceq.task_id") == tid and not root.parent_span_id
        (attempt,) = [s for _, s in spans if s.name == "deviceq.attempt"]
        assert attempt.parent_span_id == root.span_id and attr(attempt, "deviceq.attempt") == 1
    # the trace context is on the task for anyone to find its trace
    shown = json.loads(deviceq(d.url, d.pool, "task", "show", by_cli, "--json").stdout)
    assert shown["traceparent"].startswith("00-")


def _serving(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url + "/api/v1/openapi.json", timeout=2):  # noqa: S310
            return True
    except OSError:
        return False


# -- off by default ------------------------------------------------------------------------------
NO_OTEL = r"""
import sys, threading, time, traceback

# the otel extra is absent: every import of opentelemetry fails, and who asked is recorded
asked = []
class Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] != "opentelemetry":
            return None
        frames = [f for f in traceback.extract_stack()[:-1] if not f.filename.startswith("<")]
        asked.append(frames[-1].filename)
        raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, Absent())

import deviceq
from deviceq import Client, PoolAdmin, TaskStatus
from deviceq.host.daemon import HostWorker
from deviceq.host.runners.registry import RunnerSpec
from deviceq.host.settings import WorkerSettings
from deviceq.scheduler import TaskScheduler

url, pool = sys.argv[1], sys.argv[2]
admin, client = PoolAdmin(url, pool), Client(url, pool)
token = admin.add_host("h1")
worker = HostWorker(url, pool, WorkerSettings("h1", ["d1:sim"], RunnerSpec("sim"),
                                              grace=5, poll_interval=0.5), token)
t = threading.Thread(target=worker.run)
t.start()
tid = client.submit("hello", driver_type="sim")
sched = TaskScheduler(admin)
deadline = time.monotonic() + 60
while client.get(tid).status is not TaskStatus.done and time.monotonic() < deadline:
    sched.assign()
    time.sleep(0.05)
worker.stop()
t.join(20)
task = client.get(tid)
loaded = sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")
ours = sorted({f for f in asked if "/deviceq/" in f})
print(task.status.value, task.traceparent, loaded, ours)
"""


def test_without_the_extra_a_lifecycle_runs_and_deviceq_never_imports_opentelemetry(
    deploy: Deployment,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["PYTHONPATH"] = os.pathsep.join((SRC_DIR, REPO_DIR))
    res = subprocess.run([sys.executable, "-c", NO_OTEL, deploy.url, deploy.pool], env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert res.returncode == 0, res.stderr
    # (redis-py looks for the SDK on import, for metrics of its own: refused, it goes on)
    assert res.stdout.split() == ["done", "None", "[]", "[]"], res.stdout


def test_an_endpoint_without_the_extra_or_a_bad_url_is_one_line_and_exit_2(
    deploy: Deployment,
) -> None:
    code = ("import sys; sys.modules['opentelemetry'] = None; from deviceq.cli import main; "
            "sys.exit(main())")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((SRC_DIR, REPO_DIR)),
           "DEVICEQ_REDIS_URL": deploy.url, "DEVICEQ_POOL": deploy.pool}  # fmt: skip
    for args, says in (
        (["scheduler", "run", "--once", "--otel-endpoint", "http://127.0.0.1:9"],
         "needs the otel extra: pip install 'deviceq[otel]'"),
        (["scheduler", "run", "--once", "--otel-endpoint", "ftp://x"],
         "must be an http(s):// URL"),
    ):  # fmt: skip
        res = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True,
                             text=True, timeout=60)  # fmt: skip
        assert res.returncode == 2, res.stderr
        assert says in res.stderr and "Traceback" not in res.stderr, res.stderr
