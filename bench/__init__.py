"""Benchmarks of deviceq. ``python -m bench`` (see ``__main__.py``) drains the same no-op jobs
through deviceq's real daemons and through peer queues (RQ, arq, SAQ, Celery, Dramatiq, Huey,
BullMQ), each on its own private redis-server, and writes ``bench/peers/RESULTS.md``.

The other benchmarks live in folders by subject (``bench/SUBJECT/``, shared helpers in
``bench/support/``); ``bench/README.md`` lists each one with its command and results file.

Keep this module free of imports: worker processes of every peer (one in its own virtualenv)
import ``bench.*`` modules and must not pay for, or need, anything else."""

COUNTER_KEY = "bench:counter"
"""Every benchmark job does one ``INCR`` of this key on the measured redis-server."""

URL_ENV = "BENCH_REDIS_URL"
"""Environment variable holding the measured redis-server's URL in worker processes."""
