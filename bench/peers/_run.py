"""Child-process entry point of the peers: ``python -m bench.peers._run NAME enqueue N`` or
``python -m bench.peers._run NAME work``."""

from __future__ import annotations

import sys

from bench.peers import load


def main(argv: list[str]) -> None:
    name, action, *rest = argv
    peer = load(name)
    if action == "enqueue":
        peer.enqueue(int(rest[0]))
    elif action == "work":
        peer.work()
    else:
        raise SystemExit(f"unknown action {action!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
