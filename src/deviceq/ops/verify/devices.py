"""Checks of the devices: ``devices`` entries have their hash, the ``caps``/``drivers``/
``qdrivers`` counters count them, ``idle`` holds only assignable devices, and a person's
reservation (``bookings``) never overlaps a lease."""

from __future__ import annotations

from collections import Counter

from ...core import eligibility
from ...core.keys import class_id
from .model import PoolState, to_int
from .results import Findings


def check_devices(st: PoolState, f: Findings) -> None:
    """``devices`` entries have their hash; the counters count the registered devices."""
    counted: dict[str, Counter[str]] = {n: Counter() for n in ("caps", "drivers", "qdrivers")}
    for did in sorted(st.devices):
        d = st.device_rows.get(did)
        if d is None:
            f.add(
                "orphan_index_entry",
                "devices names a device without a hash",
                device=did,
                key="devices",
            )
            continue
        driver = d["driver_type"] or ""
        counted["caps"][f"{driver}|{d['tags'] or ''}"] += 1
        counted["drivers"][driver] += 1
        if d["quarantined"] == "1":
            counted["qdrivers"][driver] += 1
    for did in sorted(set(st.device_rows) - st.devices):
        f.add(
            "device_counts", "the device has a hash but is not in devices (not counted)", device=did
        )
    for name, count in counted.items():
        stored = st.counters[name]
        for key in sorted(set(stored) | set(count)):
            have, want = stored.get(key), count.get(key, 0)
            if to_int(have) != want and not (have is None and want == 0):
                f.add(
                    "device_counts",
                    f"{name}[{key}] is {have if have is not None else '(missing)'}, the "
                    f"registered devices count {want}",
                    key=name,
                )


def check_idle(st: PoolState, f: Findings) -> None:
    """Every ``idle`` entry is a registered device that the one rule
    (`deviceq.core.eligibility.device_blocker`) makes an idle candidate."""
    for did, _ in st.idle:
        d = st.device_rows.get(did)
        if d is None or did not in st.devices:
            f.add(
                "idle_not_assignable",
                "idle names a device that is not registered",
                device=did,
                key="idle",
            )
            continue
        why = eligibility.device_blockers(d)
        if why:
            f.add(
                "idle_not_assignable",
                f"the device is an idle candidate but {', '.join(why)}",
                device=did,
                key="idle",
            )


def check_idle_classes(st: PoolState, f: Findings) -> None:
    """The class idle sets (``idle:c:CLASS``) hold exactly the ``idle`` entries, each in the
    set of its device's class (`deviceq.core.keys.class_id` of ``DRIVER|TAGS``), same score."""
    idle = dict(st.idle)
    placed: dict[str, tuple[str, float]] = {}
    for cid, members in sorted(st.idle_classes.items()):
        key = f"idle:c:{cid}"
        for did, score in members:
            d = st.device_rows.get(did)
            want = class_id(f"{d['driver_type'] or ''}|{d['tags'] or ''}") if d else cid
            if did not in idle or want != cid or idle[did] != score:
                why = (
                    "is not in idle" if did not in idle
                    else "is of another class" if want != cid
                    else f"is scored {score:.0f}, idle says {idle[did]:.0f}"
                )  # fmt: skip
                f.add("idle_classes", f"{key} names the device, which {why}", device=did, key=key)
            placed[did] = (cid, score)
    for did in sorted(set(idle) - set(placed) - (set(idle) - set(st.device_rows))):
        f.add("idle_classes", "an idle device is in no class idle set (the scheduler never "
              "sees it)", device=did, key="idle")  # fmt: skip


def check_bookings(st: PoolState, f: Findings) -> None:
    """A device is held by a lease or a person's reservation, not both; ``bookings`` indexes
    exactly the reserved devices, by their reservation's end."""
    indexed = dict(st.bookings)
    for did, end in st.bookings:
        d = st.device_rows.get(did)
        if d is None or did not in st.devices:
            f.add("booking_index", "bookings names a device that is not registered", device=did,
                  key="bookings")  # fmt: skip
        elif not d["booked_until"]:
            f.add("booking_index", "bookings names a device that is not reserved", device=did,
                  key="bookings")  # fmt: skip
        elif to_int(d["booked_until"]) != int(end):
            f.add(
                "booking_index",
                f"the reservation ends at {d['booked_until']}, bookings says {int(end)}",
                device=did,
                key="bookings",
            )
    for did, d in sorted(st.device_rows.items()):
        if not d["booked_until"]:
            continue
        if did not in indexed:
            f.add("booking_index", "a reserved device is not in bookings (it never expires)",
                  device=did, key="bookings")  # fmt: skip
        if d["reserved_by"]:
            f.add(
                "lease_and_booking",
                f"reserved for a person and held by task {d['reserved_by']}'s lease",
                device=did,
                task=d["reserved_by"],
            )
