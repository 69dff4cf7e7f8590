"""The scheduler's cache of buckets' head tasks between passes: a bucket's heads are used
again while its head score in ``queues`` (the head task's ``seq``) is unchanged, for at most
``HEAD_CACHE_SECONDS`` (see `deviceq.scheduler.snapshot` for when it is dropped)."""

from __future__ import annotations

from dataclasses import dataclass

from .placement.rows import QueuedTask

HEAD_CACHE_SECONDS = 10.0  # longest a bucket's cached heads are used without a read


@dataclass(frozen=True)
class CachedHeads:
    """A bucket's heads as read: valid while the bucket's head score is still ``head_seq``."""

    head_seq: int
    heads: tuple[QueuedTask, ...]
    complete: bool  # the read returned fewer than asked: the bucket held only these
    read_at: float  # time.monotonic()


class HeadCache:
    """Bucket -> its cached heads (``entries``), and bucket -> its head score as read with the
    last base (``head_seq``, set by the reader each pass)."""

    def __init__(self) -> None:
        self.entries: dict[str, CachedHeads] = {}
        self.head_seq: dict[str, int] = {}

    def based_on(self, head_seq: dict[str, int]) -> None:
        """A new base's head scores; entries of buckets that emptied are dropped once they
        are many (bounded to the live buckets)."""
        self.head_seq = head_seq
        if len(self.entries) > 2 * len(head_seq) + 1000:
            self.entries = {s: v for s, v in self.entries.items() if s in head_seq}

    def remember(
        self, sig: str, heads: tuple[QueuedTask, ...], complete: bool, mono: float
    ) -> None:
        seq = self.head_seq.get(sig)
        if seq is not None and heads and heads[0].seq == seq:
            self.entries[sig] = CachedHeads(seq, heads, complete, mono)
        else:  # the bucket changed since the base was read: read it again next time
            self.entries.pop(sig, None)

    def get(self, sig: str, mono: float) -> CachedHeads | None:
        """The bucket's heads from an earlier pass, while still valid (same head score as
        this pass's base, younger than ``HEAD_CACHE_SECONDS``)."""
        c = self.entries.get(sig)
        if c is None or c.head_seq != self.head_seq.get(sig):
            return None
        return c if mono - c.read_at < HEAD_CACHE_SECONDS else None

    def drop(self, sigs: set[str]) -> None:
        for sig in sigs:
            self.entries.pop(sig, None)

    def clear(self) -> None:
        self.entries.clear()
