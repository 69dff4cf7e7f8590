"""``deviceq demo``: a whole fleet on one machine, in well under a minute.

The demo starts an embedded Redis (a private ``redis-server`` on a free port in a temporary
directory, or an in-process fakeredis TCP server when no ``redis-server`` binary exists), then
runs the real daemons as subprocesses of the ``deviceq`` command line:

* one scheduler (``deviceq scheduler run``),
* two hosts (``deviceq host run``) with several ``sim`` devices of two driver types and tags,

submits a stream of goal and workflow tasks, SIGKILLs one host mid-way so that lease expiry and
retry happen for real, shows a live view while it runs, and prints a summary at the end (tasks
done / failed / retried, submit-to-dispatch latency percentiles). Everything it started is
stopped and every file it wrote is removed, whatever happens. With ``redis_url`` it runs against
that Redis instead, in a fresh pool whose keys it deletes at the end.
"""

from .backend import Backend, start_backend
from .run import Demo, DemoError, DemoOptions, delete_pool, next_steps, summary_table
from .scenario import EMBEDDED_CHOICES, DemoResult

__all__ = [
    "EMBEDDED_CHOICES",
    "Backend",
    "Demo",
    "DemoError",
    "DemoOptions",
    "DemoResult",
    "delete_pool",
    "next_steps",
    "start_backend",
    "summary_table",
]
