"""Runner threads are reused across runs (a thread start costs ~0.3 ms of CPU per task), a
runner that never returns keeps its thread without blocking the next run, and idle threads are
bounded."""

from __future__ import annotations

import threading
import time

from deviceq.host.runner_threads import RunnerThreads
from harness import wait_for


def run_and_wait(pool: RunnerThreads, fn: object, name: str) -> None:
    done = threading.Event()

    def job() -> None:
        try:
            fn()  # type: ignore[operator]
        finally:
            done.set()

    pool.run(job, name)
    assert done.wait(5)


def test_one_thread_serves_runs_one_after_another() -> None:
    pool = RunnerThreads(keep=4)
    names: list[str] = []
    idents: set[int] = set()

    def record() -> None:
        names.append(threading.current_thread().name)
        idents.add(threading.get_ident())

    for i in range(50):
        run_and_wait(pool, record, f"runner-t{i}")
        wait_for(lambda: pool.idle == 1, 5, "the thread back among the idle")
    assert pool.started == 1 and len(idents) == 1
    assert names == [f"runner-t{i}" for i in range(50)]


def test_a_runner_that_never_returns_keeps_its_thread_and_the_next_run_gets_another() -> None:
    pool = RunnerThreads(keep=4)
    release = threading.Event()
    stuck_started = threading.Event()

    def stuck() -> None:
        stuck_started.set()
        release.wait(30)

    pool.run(stuck, "runner-stuck")
    assert stuck_started.wait(5)
    run_and_wait(pool, lambda: None, "runner-next")  # not blocked by the stuck one
    assert pool.started == 2
    release.set()
    wait_for(lambda: pool.idle == 2, 5, "both threads idle")


def test_idle_threads_are_bounded_by_keep() -> None:
    pool = RunnerThreads(keep=3)
    gate = threading.Event()
    running = threading.Semaphore(0)
    before = threading.active_count()

    def block() -> None:
        running.release()
        gate.wait(30)

    for i in range(10):
        pool.run(block, f"runner-b{i}")
    for _ in range(10):
        assert running.acquire(timeout=5)
    assert pool.started == 10 and threading.active_count() == before + 10
    gate.set()
    wait_for(lambda: threading.active_count() == before + 3, 5, "surplus threads ended")
    assert pool.idle == 3


def test_a_raising_job_does_not_kill_its_thread() -> None:
    pool = RunnerThreads(keep=2)

    def boom() -> None:
        raise RuntimeError("runner bug")

    run_and_wait(pool, boom, "runner-boom")
    wait_for(lambda: pool.idle == 1, 5, "the thread back among the idle")
    run_and_wait(pool, lambda: time.sleep(0), "runner-after")
    assert pool.started == 1
