"""What each record a task lifecycle keeps costs redis-server, in instructions: ``python
bench/lifecycle/record_costs.py [--tasks 200] [--out FILE]`` (needs valgrind).

``bench/lifecycle/instructions.py`` counts a lifecycle's instructions (callgrind, inside
``processCommand``; 5 items a call). This runs it on copies of this tree's ``src/`` and
``lua/`` with one record left out at a time, so the difference is what that record costs:

- ``events``: no ``XADD`` to the event stream (``lib/events.lua``'s ``emit`` does nothing);
- ``device history``: a device's recent attempts are not kept (``lib/history.lua``);
- ``attempt records``: the end of an attempt is not written into its record, nor into the
  device's history (``lib/attempts.lua``'s ``close_attempt`` does nothing; the record made at
  assignment stays);
- ``status indexes``: no ``status:assigned``, ``status:dispatched`` or finished-status index
  (``status:queued`` stays: the scheduler reads it);
- ``all four``.

A copy without a record is not deviceq (its guarantees, its views and ``deviceq verify`` need
the record): it only measures what the record costs. callgrind counts vary by about 1% from
run to run (hash seeds, the Lua collector's steps), so differences under ~2% are noise.

Prints a markdown table (``--out`` writes it too)."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # (run by path: the repository root)

from bench.lifecycle.instructions import require_callgrind  # noqa: E402
from bench.support.common import table  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PHASES = ("submit", "pass", "claim", "report", "lifecycle")

Patch = tuple[str, str, str]  # (file under lua/, text, its replacement)
EVENTS: list[Patch] = [
    ("lib/events.lua",
     "  redis.call('XADD', k('events'), 'MAXLEN', '~', _maxlen, '*', 'type', kind, ...)",
     "  local _ = kind"),
]  # fmt: skip
HISTORY: list[Patch] = [
    ("lib/history.lua", "local function device_history(did, id, rec)\n",
     "local function device_history(did, id, rec)\n  do return end\n"),
]  # fmt: skip
ATTEMPTS: list[Patch] = [
    ("lib/attempts.lua", "local function close_attempt(id, attempt, outcome, extra, whole_gang)\n",
     "local function close_attempt(id, attempt, outcome, extra, whole_gang)\n  do return end\n"),
]  # fmt: skip
STATUS: list[Patch] = [
    ("lib/status.lua", "if old and not part then redis.call('ZREM', k('status', old), id) end",
     "if old == 'queued' and not part then redis.call('ZREM', k('status', old), id) end"),
    ("lib/status.lua",
     "    if not part then redis.call('ZADD', k('status', new), now_str(), id) end\n", ""),
    ("lib/status.lua", "    redis.call('ZADD', k('status', new), seq, id)",
     "    if new == 'queued' then redis.call('ZADD', k('status', new), seq, id) end"),
]  # fmt: skip
VARIANTS: dict[str, list[Patch]] = {
    "deviceq as it is": [],
    "without events": EVENTS,
    "without device history": HISTORY,
    "without attempt ends (and history)": ATTEMPTS,
    "without status indexes": STATUS,
    "without all four": EVENTS + ATTEMPTS + STATUS,
}

MEASURE = """
import json, sys, tempfile
from pathlib import Path
sys.path.insert(0, {root!r})
import bench.lifecycle.instructions as ri
from deviceq.producer import Client
# (a copy without status indexes cannot count its tasks by status)
Client.counts = lambda self, *a, **k: {{"done": {tasks}}}
with tempfile.TemporaryDirectory() as tmp:
    ins, cmds, _ = ri.measure({tasks}, 5, Path(tmp))
print(json.dumps({{"ins": ins, "cmds": cmds}}))
"""


def tree_without(patches: list[Patch], where: Path) -> Path:
    """A copy of this tree's ``src/`` and ``lua/`` at ``where`` with ``patches`` applied."""
    shutil.copytree(REPO / "src", where / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "lua", where / "lua")
    for name, old, new in patches:
        path = where / "lua" / name
        text = path.read_text()
        if old not in text:
            raise SystemExit(f"lua/{name} has changed: update this benchmark's patch ({old!r})")
        path.write_text(text.replace(old, new, 1))
    return where


def measure(patches: list[Patch], tasks: int) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="deviceq-records-") as tmp:
        tree = tree_without(patches, Path(tmp))
        env = {**os.environ, "PYTHONPATH": str(tree / "src")}
        code = MEASURE.format(root=str(REPO), tasks=tasks)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True)  # fmt: skip
        if out.returncode != 0:
            raise SystemExit(f"the count on a copy failed:\n{out.stderr[-2000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=200, help="lifecycles per variant (default 200)")
    ap.add_argument("--out", type=Path, help="write the table here too")
    args = ap.parse_args()
    if args.tasks < 5:
        ap.error("--tasks must be at least 5")
    require_callgrind()
    got: dict[str, dict[str, dict[str, float]]] = {}
    for name, patches in VARIANTS.items():
        print(f"  {name} ...", file=sys.stderr, flush=True)
        got[name] = measure(patches, args.tasks)
    base = got["deviceq as it is"]["ins"]
    rows = []
    for name, m in got.items():
        ins, cmds = m["ins"], m["cmds"]
        saved = base["lifecycle"] - ins["lifecycle"]
        share = f"{saved:,.0f} ({saved / base['lifecycle']:.1%})" if saved else "-"
        rows.append([name, *(f"{ins[p]:,.0f}" for p in PHASES), f"{cmds['lifecycle']:.1f}", share])
    text = table(["copy of deviceq", *(f"{p} instructions per task" for p in PHASES),
                  "commands per task", "instructions saved per lifecycle"], rows)  # fmt: skip
    print(text)
    print(f"\n{args.tasks} lifecycles per copy, 5 items a call; callgrind, inside processCommand")
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
