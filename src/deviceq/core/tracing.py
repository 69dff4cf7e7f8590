"""OpenTelemetry traces: one trace per task, across the producer, the scheduler, the host and
the API. Off by default, and then nothing here imports ``opentelemetry`` (the ``otel`` extra:
``pip install 'deviceq[otel]'``).

With ``--otel-endpoint URL`` on ``host run``, ``scheduler run`` and ``api`` (or
``Client(..., otel_endpoint=URL)``; or the standard ``OTEL_EXPORTER_OTLP_ENDPOINT``), a process
exports its spans over OTLP/HTTP to ``URL/v1/traces`` (batched; the standard ``OTEL_BSP_*``
settings apply). The spans of one task:

* ``deviceq.submit`` (producer, or the API for an HTTP producer): the trace's root. Its W3C
  ``traceparent`` is stored on the task (hash field ``traceparent``, set by submit.lua), which
  is how every later span finds its trace.
* ``deviceq.queued`` (scheduler): from the time the task became eligible (submitted, or put
  back after a failed attempt) to the commit that assigned it; ``deviceq.assign``: that
  commit. Both carry ``deviceq.attempt``.
* ``deviceq.attempt`` (host), one per attempt (a retry is a new one), from its assignment to
  its report, with children ``deviceq.claim``, ``deviceq.run`` and ``deviceq.report``.

`current()` is what the components ask: `NoTracing` (every call a no-op) unless `setup` (or,
in tests, `install` with an SDK ``TracerProvider``) configured this process."""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .errors import ConfigError

if TYPE_CHECKING:
    from .models import Assignment

ENV_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"
TRACES_PATH = "/v1/traces"
EXTRA_HINT = "pip install 'deviceq[otel]'"
_LOG = logging.getLogger("deviceq.tracing")
_LOCK = threading.Lock()


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of ``endpoint``: a base URL gets ``/v1/traces`` (as the
    standard ``OTEL_EXPORTER_OTLP_ENDPOINT`` does); a URL ending in it is kept."""
    url = endpoint.strip()
    if not url.lower().startswith(("http://", "https://")) or len(url) > 2048:
        raise ConfigError(f"the OTLP endpoint must be an http(s):// URL, not {url[:80]!r}")
    url = url.rstrip("/")
    return url if url.endswith(TRACES_PATH) else url + TRACES_PATH


# -- the no-op default ---------------------------------------------------------------------------
class NoSubmits:
    """The spans of one submit call (none here)."""

    traceparents: list[str] | None = None

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` (the submit call), the spans ended by its answer or its error."""
        try:
            flat = fn(*args)
        except Exception as exc:
            self.end(getattr(exc, "result", None), exc)
            raise
        self.end(flat)
        return flat

    def end(self, flat: Sequence[Any] | None, error: BaseException | None = None) -> None:
        """The call returned (``flat``: submit.lua's answer) or raised ``error``."""


class NoAssign:
    """The spans of one commit of assignments (none here)."""

    def committed(self, answers: Sequence[str]) -> None:
        """The commit answered (per pair ``ok:LEASE`` or ``err:REASON``)."""


class NoAttempt:
    """The spans of one attempt on its host (none here)."""

    def run_started(self) -> None: ...
    def run_ended(self, status: str, failure_kind: Any = None) -> None: ...
    def report_started(self, outcome: str, failure_kind: Any = None) -> None: ...
    def report_ended(self, answer: str | None, error: str | None = None) -> None: ...
    def close(self, why: str | None = None) -> None:
        """The attempt is over on this host (ends what is still open; idempotent)."""


NO_SUBMITS, NO_ASSIGN, NO_ATTEMPT = NoSubmits(), NoAssign(), NoAttempt()


class NoTracing:
    """Tracing off: every span is a no-op, and ``opentelemetry`` is never imported."""

    enabled = False

    def submits(self, n: int, pool: str) -> NoSubmits:
        return NO_SUBMITS

    def assign(self, redis: Any, keys: Any, pairs: Sequence[tuple[str, str]]) -> NoAssign:
        return NO_ASSIGN

    def attempt(self, a: Assignment, claim_sent: float) -> NoAttempt:
        return NO_ATTEMPT

    def shutdown(self) -> None:
        pass


_current: Any = NoTracing()
_warned = False  # the environment names an endpoint but the extra is missing: said once


def current() -> Any:
    """This process's tracing (`NoTracing` unless configured)."""
    return _current


def setup(endpoint: str | None, service: str) -> Any:
    """Configure this process's tracing once: with ``endpoint`` (or env
    ``OTEL_EXPORTER_OTLP_ENDPOINT``), spans of service ``service`` go over OTLP/HTTP to its
    ``/v1/traces``; without either, tracing stays off (nothing imported). An ``endpoint``
    given without the ``otel`` extra installed is a ConfigError (one line); one from the
    environment only is a warning, and tracing stays off. Already configured: kept."""
    url = endpoint or os.environ.get(ENV_ENDPOINT) or None
    if not url or _current.enabled:
        return _current
    target = traces_url(url)
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        if endpoint:
            raise ConfigError(f"--otel-endpoint needs the otel extra: {EXTRA_HINT}") from None
        global _warned
        if _warned:
            return _current
        _warned = True
        _LOG.warning("%s is set but the otel extra is not installed (%s): no traces",
                     ENV_ENDPOINT, EXTRA_HINT)  # fmt: skip
        return _current
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=target)))
    tracing = install(provider)
    atexit.register(tracing.shutdown)
    return tracing


def install(provider: Any) -> Any:
    """Trace this process into ``provider`` (an SDK ``TracerProvider``: tests give one with an
    ``InMemorySpanExporter``); returns the tracing now current."""
    global _current
    with _LOCK:
        _current = OtelTracing(provider)
        return _current


def reset() -> None:
    """Tracing off again (flushing and shutting down what was configured)."""
    global _current
    with _LOCK:
        old, _current = _current, NoTracing()
    old.shutdown()


# -- OpenTelemetry (imported only once configured) -----------------------------------------------
def _word(kind: Any) -> str | None:
    """A failure kind (an enum or its text) as its text; None for none."""
    return str(getattr(kind, "value", kind)) if kind else None


def _ns(ms: Any) -> int | None:
    try:
        v = int(ms or 0)
    except (TypeError, ValueError):
        return None
    return v * 1_000_000 if v > 0 else None


class OtelTracing:
    """Spans into an SDK ``TracerProvider`` (see the module's doc for which)."""

    enabled = True

    def __init__(self, provider: Any) -> None:
        from opentelemetry import context, trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.tracer = provider.get_tracer("deviceq")
        self.trace = trace
        self.context = context
        self.propagator = TraceContextTextMapPropagator()

    def parent(self, traceparent: str | None) -> Any:
        """The context of a stored ``traceparent`` (None: not traced)."""
        if not traceparent:
            return None
        ctx = self.propagator.extract({"traceparent": traceparent})
        span = self.trace.get_current_span(ctx)
        return ctx if span.get_span_context().is_valid else None

    def traceparent(self, span: Any) -> str:
        carrier: dict[str, str] = {}
        self.propagator.inject(carrier, context=self.trace.set_span_in_context(span))
        return carrier["traceparent"]

    def span(self, name: str, parent: Any, start_ns: int | None = None, **attrs: Any) -> Any:
        kind = self.trace.SpanKind.PRODUCER if name == "deviceq.submit" else None
        kw: dict[str, Any] = {"kind": kind} if kind is not None else {}
        return self.tracer.start_span(
            name,
            context=parent,
            start_time=start_ns,
            attributes={f"deviceq.{k}": v for k, v in attrs.items() if v is not None},
            **kw,
        )

    def submits(self, n: int, pool: str) -> OtelSubmits:
        return OtelSubmits(self, n, pool)

    def assign(self, redis: Any, keys: Any, pairs: Sequence[tuple[str, str]]) -> Any:
        return OtelAssign(self, redis, keys, pairs)

    def attempt(self, a: Assignment, claim_sent: float) -> Any:
        parent = self.parent(a.task.traceparent)
        if parent is None:
            return NO_ATTEMPT
        return OtelAttempt(self, a, parent, claim_sent)

    def error(self, span: Any, text: str) -> None:
        from opentelemetry.trace import Status, StatusCode

        span.set_status(Status(StatusCode.ERROR, text[:200]))

    def shutdown(self) -> None:
        try:
            self.provider.shutdown()
        except Exception:  # noqa: BLE001 - at exit: an exporter that cannot flush
            _LOG.debug("tracer provider shutdown failed", exc_info=True)


class OtelSubmits(NoSubmits):
    """A ``deviceq.submit`` span per task of one submit call, each the root of a new trace
    (one trace per task); a span active in the caller is linked, not made the parent."""

    def __init__(self, t: OtelTracing, n: int, pool: str) -> None:
        from opentelemetry.context import Context
        from opentelemetry.trace import Link

        self.t = t
        caller = t.trace.get_current_span().get_span_context()
        links = [Link(caller)] if caller.is_valid else None
        self.spans = [
            t.tracer.start_span(
                "deviceq.submit",
                context=Context(),  # a root: a trace of its own
                kind=t.trace.SpanKind.PRODUCER,
                attributes={"deviceq.pool": pool},
                links=links,
            )
            for _ in range(n)
        ]
        self.traceparents: list[str] | None = [t.traceparent(s) for s in self.spans]

    def end(self, flat: Sequence[Any] | None, error: BaseException | None = None) -> None:
        for i, span in enumerate(self.spans):
            if flat is not None and 2 * i + 1 < len(flat):
                span.set_attribute("deviceq.task_id", str(flat[2 * i]))
                span.set_attribute("deviceq.created", str(flat[2 * i + 1]) == "1")
            if error is not None:
                self.t.error(span, f"{type(error).__name__}: {error}")
            span.end()


class OtelAssign:
    """``deviceq.queued`` and ``deviceq.assign`` for each pair a commit assigned. The tasks'
    ``traceparent``, eligibility time and attempt are read before the commit (one pipelined
    HMGET per pair, only while tracing is on)."""

    def __init__(self, t: OtelTracing, redis: Any, keys: Any, pairs: Sequence[tuple[str, str]]):
        self.t, self.pairs = t, list(pairs)
        self.rows: list[Any] = [None] * len(self.pairs)
        try:
            pipe = redis.pipeline(transaction=False)
            for task_id, _ in self.pairs:
                pipe.hmget(keys.task(task_id), "traceparent", "updated_at", "eligible_at",
                           "attempt")  # fmt: skip
            self.rows = list(pipe.execute())
        except Exception:  # noqa: BLE001 - tracing never costs a pass
            _LOG.debug("could not read the tasks' trace context", exc_info=True)
        self.start_ns = time.time_ns()

    def committed(self, answers: Sequence[str]) -> None:
        end_ns = time.time_ns()
        for (task_id, device_id), row, answer in zip(self.pairs, self.rows, answers, strict=False):
            if not row or not str(answer).startswith("ok:"):
                continue
            parent = self.t.parent(row[0])
            if parent is None:
                continue
            since = max(int(row[1] or 0), int(row[2] or 0))
            attrs = {"task_id": task_id, "device_id": device_id, "lease_id": str(answer)[3:],
                     "attempt": int(row[3] or 0) + 1}  # fmt: skip
            start = min(_ns(since) or self.start_ns, self.start_ns)
            self.t.span("deviceq.queued", parent, start, **attrs).end(end_time=self.start_ns)
            self.t.span("deviceq.assign", parent, self.start_ns, **attrs).end(end_time=end_ns)


class OtelAttempt:
    """``deviceq.attempt`` (from the assignment to the report) and its children."""

    def __init__(self, t: OtelTracing, a: Assignment, parent: Any, claim_sent: float) -> None:
        self.t = t
        now_ns = time.time_ns()
        claim_ns = now_ns - int(max(0.0, time.monotonic() - claim_sent) * 1e9)
        attrs = {"task_id": a.task.id, "attempt": a.attempt, "device_id": a.device_id,
                 "host_id": a.host_id, "lease_id": a.lease_id}  # fmt: skip
        start = min(_ns(a.task.assigned_at) or claim_ns, claim_ns)
        self.span = t.span("deviceq.attempt", parent, start, **attrs)
        self.ctx = t.trace.set_span_in_context(self.span)
        t.span("deviceq.claim", self.ctx, claim_ns).end(end_time=now_ns)
        self.run: Any = None
        self.report: Any = None
        self.lock = threading.Lock()
        self.closed = False

    def run_started(self) -> None:
        self.run = self.t.span("deviceq.run", self.ctx)

    def run_ended(self, status: str, failure_kind: Any = None) -> None:
        failure_kind = _word(failure_kind)
        run, self.run = self.run, None
        if run is not None:
            run.set_attribute("deviceq.status", status)
            if failure_kind:
                run.set_attribute("deviceq.failure_kind", failure_kind)
                self.t.error(run, failure_kind)
            run.end()

    def report_started(self, outcome: str, failure_kind: Any = None) -> None:
        failure_kind = _word(failure_kind)
        self.report = self.t.span("deviceq.report", self.ctx, outcome=outcome,
                                  failure_kind=failure_kind or None)  # fmt: skip
        self.span.set_attribute("deviceq.outcome", outcome)
        if failure_kind:
            self.span.set_attribute("deviceq.failure_kind", failure_kind)

    def report_ended(self, answer: str | None, error: str | None = None) -> None:
        report, self.report = self.report, None
        if report is not None:
            if answer is not None:
                report.set_attribute("deviceq.answer", answer)
            if error is not None or answer is None:
                self.t.error(report, error or "not delivered")
            report.end()

    def close(self, why: str | None = None) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
        self.run_ended("stopped")
        self.report_ended(None, why or "ended without a report")
        if why:
            self.span.set_attribute("deviceq.ended", why)
        self.span.end()
