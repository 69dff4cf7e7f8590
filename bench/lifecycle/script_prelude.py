"""What every call of each script pays before its first line of work: ``python
bench/lifecycle/script_prelude.py [--calls 200] [--out FILE]`` (needs valgrind).

Redis runs a script's whole text at every ``EVALSHA``: the generated settings functions and
every helper function the script carries (`deviceq.core.lua_prune` keeps those it can reach)
are made again, closure by closure, at each call, before the script's own work begins. This
counts that part alone, in machine instructions (callgrind, inside ``processCommand``, on a
private redis-server): for each script, a probe made of the same includes as the script and
``return 1`` in place of its body, assembled and pruned as the script is (the helpers its
includes' top-level statements reach are kept, as they are in the script), beside
``return 1`` alone, the least any script call costs. ``--calls`` calls each, averaged (Redis
runs a Lua garbage-collection step every 50 script calls: a multiple of 50 counts them
alike). A Redis Function (``FUNCTION LOAD``, ``FCALL``) makes its library's functions once,
at load; this is what it would save per call.

Prints a markdown table (``--out`` writes it too)."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # (run by path: the repository root)

from bench.lifecycle.instructions import counted_server, require_callgrind  # noqa: E402
from bench.support.common import table  # noqa: E402
from deviceq.core.scripts import assemble, includes, lua_dir, names, source  # noqa: E402

PREFIX = "dq:{prelude}:"


def probe(name: str) -> str:
    """Script ``name``'s includes with ``return 1`` for a body, assembled as the script is."""
    body = (lua_dir() / f"{name}.lua").read_text()
    head = "".join(f'--- @include "{inc}"\n' for inc in includes(body, name))
    return assemble(head + "return 1", name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=200, help="calls per script (default 200)")
    ap.add_argument("--out", type=Path, help="write the table here too (bench.ab)")
    args = ap.parse_args()
    if args.calls < 1:
        ap.error("--calls must be at least 1")
    require_callgrind()
    rows = []
    with tempfile.TemporaryDirectory(prefix="deviceq-prelude-") as tmp:
        server, counter = counted_server(Path(tmp))
        try:
            r = redis.Redis.from_url(server.url, decode_responses=True)

            def per_call(text: str) -> float:
                sha = r.script_load(text)
                r.evalsha(sha, 1, PREFIX)
                counter.zero()
                for _ in range(args.calls):
                    r.evalsha(sha, 1, PREFIX)
                return counter.read() / args.calls

            floor = per_call("return 1")
            rows.append(["`return 1`", "-", f"{floor:,.0f}", "-"])
            for name in names():
                cost = per_call(probe(name))
                rows.append([name, f"{len(source(name)):,}", f"{cost:,.0f}",
                             f"{cost - floor:,.0f}"])  # fmt: skip
            r.close()
        finally:
            server.stop()
    text = table(["script", "bytes sent", "instructions per call before its work",
                  "of which its helpers and settings"], rows)  # fmt: skip
    print(text)
    print(f"\n{args.calls} calls each; callgrind, inside processCommand")
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
