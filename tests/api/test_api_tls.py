"""Hosts through the API over TLS: a real ``deviceq api --tls-cert --tls-key`` serving a
self-signed certificate, real ``deviceq host run --api-url https://...`` and ``deviceq
scheduler run`` daemons, a real Redis. With ``--api-ca`` naming the certificate a task runs to
done; without it the daemon refuses the certificate in one clear log line (no token in it)."""

from __future__ import annotations

from test_api_server import make_cert, start_api

from deviceq import TaskStatus
from deviceq.ops.verify import verify
from harness import Deployment, wait_for

NOWHERE = {"DEVICEQ_REDIS_URL": "redis://127.0.0.1:1/0"}  # the hosts can only use the API
RUN = ("--goal-runner", "command", "--command", "sh -c {goal}")


def test_a_host_runs_a_task_over_https_with_api_ca_and_refuses_the_certificate_without(
    deploy: Deployment,
) -> None:
    d = deploy
    cert, key = make_cert(d.tmp)
    url = start_api(d, "api-tls", "--tls-cert", str(cert), "--tls-key", str(key),
                    scheme="https", ca=str(cert))  # fmt: skip
    d.scheduler()
    d.host("h1", "d1:x", extra=("--api-url", url, "--api-ca", str(cert), *RUN), env=NOWHERE)
    t = d.client.wait(d.client.submit("echo over tls", driver_type="x"), timeout=60)
    assert (t.status, t.host_id, t.result) == (TaskStatus.done, "h1", "over tls\n")

    proc = d.host("h2", "d2:y", extra=("--api-url", url, *RUN), env=NOWHERE)
    wait_for(lambda: "certificate" in d.log("h2"), 60, "h2 to log the refused certificate")
    log = d.log("h2")
    refused = [line for line in log.splitlines() if "certificate" in line]
    assert len(refused) == 1, log
    assert "not accepted" in refused[0] and "--api-ca" in refused[0], refused
    assert "Traceback" not in log
    assert not d.tokens_in(log)
    assert not d.admin.host("h2").alive  # it never got through: no heartbeat, no device
    assert d.admin.redis.exists(d.admin.keys.device("d2")) == 0
    assert proc.wait(60) != 0
    assert verify(d.admin).ok
