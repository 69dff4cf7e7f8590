"""A full lifecycle on both backends: the fixtures and the scripts work together."""

from deviceq import TaskStatus


def test_lifecycle_submit_assign_claim_report(fleet):
    h = fleet.add_host("h1", ("d1", "android", ("wifi",)))
    tid = fleet.client.submit("say hi", driver_type="android", tags=["wifi"])
    assert fleet.client.get(tid).status is TaskStatus.queued
    (res,) = fleet.store.commit([(tid, "d1")])
    assert res == f"ok:{tid}-a1"
    (a,) = h.claim(5)
    assert a.task.id == tid and a.task.status is TaskStatus.dispatched
    assert h.report(tid, a.lease_id, "done", payload="hi") == "ok:done"
    t = fleet.client.get(tid)
    assert (t.status, t.result, t.attempt) == (TaskStatus.done, "hi", 1)
    assert [x.outcome for x in t.attempts] == ["done"]
    assert fleet.admin.device("d1").reserved_by is None
