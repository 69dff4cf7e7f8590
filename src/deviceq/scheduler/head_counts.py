"""How many head tasks a pass reads per servable bucket: first a fair share of the batch
(`initial_want`), then deeper where the plan used a bucket's heads up (`grow`). Pure functions
of the base's bucket -> matching devices index, the batch and the strategy's lookahead."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from .placement.rows import Bucket, IdleDevice, Pair

MIN_HEADS = 8  # heads first read per servable bucket (at least)

Matching = Mapping[str, Sequence[IdleDevice]]


def initial_want(
    shells: Sequence[Bucket], matching: Matching, batch: int, lookahead: int
) -> dict[str, int]:
    """Heads to read per servable bucket: a fair share of twice the batch (at least
    ``MIN_HEADS`` while that reads at most 4 x batch heads in all: with hundreds of buckets,
    e.g. tenants x priorities, one each), never more than its matching idle devices; plus
    ``lookahead``. A bucket the plan uses up is read deeper (`grow`)."""
    servable = [b for b in shells if matching[b.sig]]
    if not servable:
        return {}
    most = share(len(servable), batch)
    return {b.sig: min(len(matching[b.sig]), batch, most) + lookahead for b in servable}


def share(servable: int, batch: int) -> int:
    """The heads first read per bucket when ``servable`` buckets are (see `initial_want`)."""
    return max(min(MIN_HEADS, -(-4 * batch // servable)), -(-2 * batch // servable))


def cap(matching: Matching, sig: str, batch: int, lookahead: int) -> int:
    """The most heads worth reading for bucket ``sig``."""
    return min(len(matching[sig]), batch) + lookahead


def grow(
    matching: Matching,
    buckets: Sequence[Bucket],
    pairs: list[Pair],
    want: dict[str, int],
    batch: int,
    lookahead: int,
) -> dict[str, int]:
    """Buckets the plan used up: every head read was paired and the bucket may hold more,
    while a device that could serve it is unused or went to another bucket's task (which a
    deeper, maybe older, task of this bucket might deserve). Returns their new (larger) head
    counts; empty when the plan is final. For any policy that keeps submission order within a
    bucket, the final plan equals the plan on unbounded heads. With interleaved buckets a plan
    rarely uses up a bucket, so this seldom reads more (a bucket whose heads are not all
    paired never grows)."""
    task_sig = {t.task_id: b.sig for b in buckets for t in b.heads}
    dev_sig = {d: task_sig.get(t) for t, d in pairs}
    taken = Counter(task_sig.get(t) for t, _ in pairs)
    out: dict[str, int] = {}
    for b in buckets:
        n = want.get(b.sig, 0)
        most = cap(matching, b.sig, batch, lookahead)
        if len(b.heads) < n or n >= most:
            continue  # bucket exhausted, or already read as deep as useful
        if taken[b.sig] < len(b.heads):
            continue  # some head left unpaired: deeper tasks would not be chosen either
        if any(dev_sig.get(d.device_id, "") != b.sig for d in matching[b.sig]):
            out[b.sig] = min(most, n * 4)
    return out
