"""`deviceq.core.heap.settle`: what the process holds is frozen out of the collector's reach,
the young generation is collected less often, and cyclic garbage made afterwards is still
collected. Run in a child process: settling is for a daemon's process, not the test runner's."""

from __future__ import annotations

import json
import subprocess
import sys

from deviceq.core.heap import YOUNG_THRESHOLD

CHILD = r"""
import gc, json, weakref
from deviceq.core import heap

class Node:
    pass

before = Node()
before.me = before  # a cycle made before settling: frozen with the rest, never collected
gc.disable()  # (only the explicit collections below run)
heap.settle()
frozen = gc.get_freeze_count()
after = Node()
after.me = after  # garbage made afterwards: collected as before
gone = weakref.ref(after)
del after
gc.collect()
print(json.dumps({"frozen": frozen, "threshold": gc.get_threshold(),
                  "after_collected": gone() is None,
                  "before_tracked_young": any(o is before for o in gc.get_objects(0))}))
"""


def test_settle_freezes_the_heap_and_still_collects_new_garbage() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, check=True, timeout=60
    )
    got = json.loads(out.stdout)
    assert got["frozen"] > 1000  # the modules' objects, the classes, the functions
    assert got["threshold"][0] == YOUNG_THRESHOLD
    assert got["after_collected"] is True
    assert got["before_tracked_young"] is False
