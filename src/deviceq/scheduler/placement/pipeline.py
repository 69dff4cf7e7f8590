"""Running a profile over a view: one pass's ``(task_id, device_id)`` pairs, the same proposal
type as an `AssignmentStrategy`'s (and, for a built-in profile, the same pairs as the old
strategy after ``plan``'s correction).

A pass, per task in the `QueueSort`'s order, until ``limit`` pairs:

1. the device classes the `Filter`s accept for the task's bucket (asked once per distinct
   bucket constraint and class, not per device);
2. the best unused device of those classes by the `Score`s (then ``device_id``): each class is
   ranked once by its device scores, and a task none of whose task scores applies takes the
   first unused device of its classes' ranked lists (a pointer per class skips the used
   ones, so the pass costs devices log devices + tasks x classes); a task with an applying
   task score (a retry with anti-affinity) scans its classes' unused devices, each class up
   to its first device that no task score penalises (when the task scores come first);
3. the `Permit`s: all must allow the pair, else the task gets nothing this pass (the devices a
   permit names ``closed``, e.g. of a host at its cap, count as taken for every later task);
4. the pair is taken and the order and permits are told (`TaskOrder.placed`).

Then ``refine`` (see `Profile`): pairs whose device is not ideal by the refine scores move to
a strictly better unused feasible device the permits allow, in pair order (a scan stops at
the first ideal device, in device_id order).

With a `Recorder` (``place(..., recorder=...)``) the same pass runs with a record of what it
did per task (`deviceq.scheduler.placement.recorder`): the same calls in the same order, plus the
filter stage judged once per requirement with reasons, the chosen device's score keys and
the denying permit. Without one nothing is recorded and nothing is asked beyond the pass's
own calls."""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from .plugins import DeviceScore, PassPermit, Requirement, Score, TaskClosingPermit, TaskScore
from .profiles import Profile
from .recorder import FilterRecord, Recorder, TaskRecord, judge
from .rows import IdleDevice, Pair, QueuedTask
from .view import DeviceClass, View


class MissingInputs(ValueError):
    """The view lacks optional inputs the profile's plugins need."""


def place(profile: Profile, view: View, recorder: Recorder | None = None) -> list[Pair]:
    """The profile's pairs for ``view`` (at most ``view.limit``; each task and device once,
    every device feasible for its task by the profile's filters). With ``recorder``, the same
    pairs, and the recorder holds a `TaskRecord` per task offered (of those it watches)."""
    missing = profile.needs - view.inputs
    if missing:
        raise MissingInputs(
            f"profile {profile.name!r} needs view inputs it lacks: {', '.join(sorted(missing))}"
        )
    if recorder is not None:
        if not view.buckets:
            return []
        return _RecordingPass(profile, view, recorder).run()
    if not view.buckets or not view.devices:
        return []
    return _Pass(profile, view).run()


@dataclass(frozen=True)
class _Shape:
    """What a profile's scores are (protocol isinstance checks are slow: done once per
    profile, not per pass)."""

    is_task: tuple[bool, ...]
    static: tuple[DeviceScore, ...]
    task_scores: tuple[tuple[int, TaskScore], ...]
    task_first: bool  # the task scores come before every device score: see scan
    refine_kinds: tuple[TaskScore | None, ...]


_SHAPES: dict[int, tuple[Profile, _Shape]] = {}


def _shape(profile: Profile) -> _Shape:
    """The profile's shape, computed once per profile object (looked up by identity: hashing
    a profile's plugins costs more than the lookup saves)."""
    got = _SHAPES.get(id(profile))
    if got is not None and got[0] is profile:
        return got[1]
    shape = _make_shape(profile)
    if len(_SHAPES) > 256:  # (profiles made on the fly, as tests do: bounded)
        _SHAPES.clear()
    _SHAPES[id(profile)] = (profile, shape)
    return shape


def _make_shape(profile: Profile) -> _Shape:
    is_task = tuple(isinstance(s, TaskScore) for s in profile.scores)
    task_scores = tuple((i, cast(TaskScore, s)) for i, s in enumerate(profile.scores) if is_task[i])
    return _Shape(
        is_task,
        tuple(cast(DeviceScore, s) for s, t in zip(profile.scores, is_task, strict=True) if not t),
        task_scores,
        not any(is_task[len(task_scores) :]),
        tuple(s if isinstance(s, TaskScore) else None for s in profile.refine),
    )


def _active(score: Score, view: View) -> bool:
    """False when every optional input the score needs is empty in this view: its keys are 0
    for every pair then (the plugin contract), so the pass need not compute them."""
    needs = score.needs
    return not needs or any(getattr(view, n) for n in needs)


class _Pass:
    def __init__(self, profile: Profile, view: View) -> None:
        self.profile = profile
        self.view = view
        shape = _shape(profile)
        self.is_task = shape.is_task
        static = shape.static
        self.task_scores = [(i, s) for i, s in shape.task_scores if _active(s, view)]
        self.task_first = shape.task_first
        self.refine_kinds = shape.refine_kinds
        by_class: Mapping[DeviceClass, Sequence[IdleDevice]]
        if view.classes is not None:  # (grouped by the reader already)
            by_class = view.classes
        else:
            grouped: dict[DeviceClass, list[IdleDevice]] = {}
            for d in view.devices:  # (in device_id order)
                c = (d.driver_type, d.tags)  # (d.device_class, without the property call)
                got = grouped.get(c)
                if got is None:
                    grouped[c] = [d]
                else:
                    got.append(d)
            by_class = grouped
        self.by_class = by_class
        # each device's device score keys (None: the profile has no device score)
        self.key: dict[str, tuple[int, ...]] | None = None
        if len(static) == 1:  # (the common case, without a generator per device)
            one = static[0]
            self.key = {d.device_id: (one.device_key(view, d),) for d in view.devices}
        elif static:
            self.key = {
                d.device_id: tuple(s.device_key(view, d) for s in static) for d in view.devices
            }
        limit = view.limit
        ranked: dict[DeviceClass, Sequence[IdleDevice]] = {}
        for c, devs in by_class.items():
            if self.key is not None:
                key = self.key
                # (key, device_id, index): compared as tuples, no key function per device
                dec = [(key[d.device_id], d.device_id, i) for i, d in enumerate(devs)]
                if profile.window and len(devs) > 4 * limit:
                    dec = heapq.nsmallest(limit, dec)
                else:
                    dec.sort()
                ranked[c] = [devs[i] for _, _, i in dec]
            elif profile.window and len(devs) > 4 * limit:
                ranked[c] = devs[:limit]  # (in device_id order already)
            else:
                ranked[c] = devs
        self.ranked = ranked
        self.pos = dict.fromkeys(ranked, 0)
        self._by_need: dict[tuple[str | None, frozenset[str]], list[DeviceClass]] = {}
        self._by_sig: dict[str, list[DeviceClass]] = {}
        self._feasible: dict[tuple[str | None, frozenset[str]], Sequence[IdleDevice]] = {}

    def classes(self, sig: str) -> list[DeviceClass]:
        """The device classes the filters accept for bucket ``sig``."""
        got = self._by_sig.get(sig)
        if got is None:
            b = self.view.by_sig.get(sig)
            got = [] if b is None else self.classes_for(b)
            self._by_sig[sig] = got
        return got

    def classes_for(self, need: Requirement) -> list[DeviceClass]:
        """The device classes the filters accept for a requirement (a bucket; later a gang's
        role), asked once per distinct (driver type, tags)."""
        k = (need.driver_type, need.tags)
        got = self._by_need.get(k)
        if got is None:
            filters = self.profile.filters
            got = [c for c in self.ranked if all(f.feasible(need, c) for f in filters)]
            self._by_need[k] = got
        return got

    def feasible(self, sig: str) -> Sequence[IdleDevice]:
        """Every device of ``sig``'s feasible classes, in device_id order (of a pinned bucket:
        its device alone, when it is among them)."""
        b = self.view.by_sig[sig]
        need = (b.driver_type, b.tags)
        got = self._feasible.get(need)
        if got is None:
            lists = [self.by_class[c] for c in self.classes(sig)]
            got = lists[0] if len(lists) == 1 else sorted((d for x in lists for d in x), key=_id)
            self._feasible[need] = got
        if b.pin is not None:
            return [d for d in got if d.device_id == b.pin]
        return got

    recording = False  # (`_RecordingPass`: the hooks below record what the loop decides)

    def run(self) -> list[Pair]:
        view, limit = self.view, self.view.limit
        order = self.profile.sort.order(view)
        started = [(p.name, p.start(view)) for p in self.profile.permits]
        permits = [s for _, s in started if s is not None]  # (None: allows every pair)
        names = [n for n, s in started if s is not None]
        task_scores = self.task_scores
        recording = self.recording
        used: set[str] = set()
        for p in permits:
            used.update(p.closed())
        closers = [p for p in permits if isinstance(p, TaskClosingPermit)]
        pins = {b.sig for b in view.buckets if b.pin is not None}
        chosen: list[tuple[QueuedTask, IdleDevice]] = []
        for task in order:
            if len(chosen) >= limit:
                break
            cands = self.classes(task.sig)
            live = {i: s for i, s in task_scores if s.applies(view, task)} if task_scores else None
            skip = used
            for p in closers:
                closed = p.closed_for(task)
                if closed:
                    skip = (skip if skip is not used else set(used)) | set(closed)
            if task.sig in pins:  # its own device, or nothing: it waits for it
                best = next((d for d in self.feasible(task.sig) if d.device_id not in skip), None)
            elif live:
                best = self.scan(task, cands, skip, live)
            else:
                best = self.first(cands, skip, skip is used)
            denied: str | None = None
            if best is not None:
                for name, p in zip(names, permits, strict=True):
                    if not p.allows(task, best):
                        denied = name
                        break
            if recording:
                self.offered(task, cands, best, denied)
            if best is None or denied is not None:
                continue
            used.add(best.device_id)
            chosen.append((task, best))
            order.placed(task, best)
            for p in permits:
                p.placed(task, best)
                used.update(p.closed())
        if self.profile.refine and any(_active(s, view) for s in self.profile.refine):
            before = list(chosen)
            chosen = self.refine(chosen, used, permits)
            if recording:
                self.refined(before, chosen)
        return [(t.task_id, d.device_id) for t, d in chosen]

    def offered(
        self,
        task: QueuedTask,
        cands: list[DeviceClass],
        best: IdleDevice | None,
        denied: str | None,
    ) -> None:
        """A task was offered: its best device (None: none left) and the permit that denied
        it (recording only)."""

    def refined(
        self,
        before: list[tuple[QueuedTask, IdleDevice]],
        after: list[tuple[QueuedTask, IdleDevice]],
    ) -> None:
        """The refine stage moved some pairs (recording only)."""

    def first(
        self, cands: list[DeviceClass], used: set[str], keep: bool = True
    ) -> IdleDevice | None:
        """The best unused device by the device scores: the smallest of the classes' first
        unused ranked devices. ``keep``: ``used`` only grows in this pass, so each class's
        position past its used devices is kept (False: ``used`` holds devices closed to this
        task alone, the positions stay)."""
        best: IdleDevice | None = None
        best_rank: Any = None
        ranked, pos, key = self.ranked, self.pos, self.key
        for c in cands:
            devs = ranked[c]
            i, n = pos[c], len(devs)
            while i < n and devs[i].device_id in used:
                i += 1
            if keep:
                pos[c] = i
            if i < n:
                d = devs[i]
                r = d.device_id if key is None else (key[d.device_id], d.device_id)
                if best_rank is None or r < best_rank:
                    best, best_rank = d, r
        return best

    def scan(
        self,
        task: QueuedTask,
        cands: list[DeviceClass],
        used: set[str],
        live: dict[int, TaskScore],
    ) -> IdleDevice | None:
        """The best unused device by every score (the applying task scores computed per
        device; the others are 0 for every device, so they are left out of the keys). When
        the task scores precede the device scores (the built-in profiles), a class is walked
        in its ranked order only up to its first unused device whose task keys are all 0:
        nothing after it in that class can be better."""
        view, is_task, keys = self.view, self.is_task, self.key
        lives = list(live.values())
        best: IdleDevice | None = None
        best_key: tuple[object, ...] | None = None
        for c in cands:
            devs = self.ranked[c]
            for j in range(self.pos[c], len(devs)):
                d = devs[j]
                did = d.device_id
                if did in used:
                    continue
                static = () if keys is None else keys[did]
                if self.task_first:
                    tk = tuple(s.task_key(view, task, d) for s in lives)
                    key: tuple[object, ...] = (tk, static, did)
                    if best_key is None or key < best_key:
                        best, best_key = d, key
                    if not any(tk):
                        break
                    continue
                parts: list[object] = []
                k = 0
                for i, t in enumerate(is_task):
                    if t:
                        s = live.get(i)
                        parts.append(s.task_key(view, task, d) if s is not None else 0)
                    else:
                        parts.append(static[k])
                        k += 1
                parts.append(did)
                key = tuple(parts)
                if best_key is None or key < best_key:
                    best, best_key = d, key
        return best

    def refine(
        self,
        chosen: list[tuple[QueuedTask, IdleDevice]],
        used: set[str],
        permits: Sequence[PassPermit],
    ) -> list[tuple[QueuedTask, IdleDevice]]:
        """Each pair in turn: when its device is not ideal by the refine scores, the unused
        feasible device with the smallest refine keys (then device_id) that every permit
        allows instead, if better (the permits are told of the move)."""
        view, scores, kinds = self.view, self.profile.refine, self.refine_kinds
        out = []
        for task, dev in chosen:
            # per score: None for a device score, else whether the task score applies
            live = [None if k is None else k.applies(view, task) for k in kinds]
            now = _keys(view, scores, kinds, live, task, dev)
            if any(now):
                for p in permits:
                    p.unplaced(task, dev)
                best: IdleDevice | None = None
                best_key: tuple[int, ...] | None = None
                for d in self.feasible(task.sig):
                    if d.device_id in used:
                        continue
                    if permits and not all(p.allows(task, d) for p in permits):
                        continue
                    k = _keys(view, scores, kinds, live, task, d)
                    if best_key is None or k < best_key:
                        best, best_key = d, k
                        if not any(k):  # nothing beats all zeros (then device_id order)
                            break
                if best is not None and best_key is not None and best_key < now:
                    used.discard(dev.device_id)
                    used.add(best.device_id)
                    dev = best
                for p in permits:
                    p.placed(task, dev)
                    used.update(p.closed())
            out.append((task, dev))
        return out


def refine(profile: Profile, view: View, pairs: Sequence[Pair]) -> list[Pair]:
    """Only ``profile``'s refine stage, over pairs chosen elsewhere (a registered whole-pass
    strategy's, already checked: known tasks and devices, each once, feasible)."""
    if not profile.refine or not pairs:
        return list(pairs)
    run = _Pass(profile, view)
    tasks = {t.task_id: t for t in view.tasks()}
    devices = {d.device_id: d for d in view.devices}
    chosen = [(tasks[t], devices[d]) for t, d in pairs]
    used = {d for _, d in pairs}
    return [(t.task_id, d.device_id) for t, d in run.refine(chosen, used, ())]


class _RecordingPass(_Pass):
    """`_Pass` with a recorder: the same loop (`_Pass.run`), its hooks recording what it
    decides (tests/placement/test_recorder.py holds the pairs equal on the golden corpus)."""

    recording = True

    def __init__(self, profile: Profile, view: View, recorder: Recorder) -> None:
        super().__init__(profile, view)
        self.recorder = recorder
        self._records: dict[tuple[str | None, frozenset[str]], FilterRecord] = {}

    def filter_record(self, sig: str) -> FilterRecord:
        """The filter stage of bucket ``sig`` over the view's devices (once per requirement)."""
        b = self.view.by_sig.get(sig)
        if b is None:
            return FilterRecord()
        k = (b.driver_type, b.tags)
        got = self._records.get(k)
        if got is None:
            got = self._records[k] = judge(self.profile.filters, b, self.view.devices)
        return got

    def offered(
        self,
        task: QueuedTask,
        cands: list[DeviceClass],
        best: IdleDevice | None,
        denied: str | None,
    ) -> None:
        rec = self.recorder
        rec.offered += 1
        if rec.wants(task.task_id):
            rec.tasks[task.task_id] = self.record(task, cands, best, denied)

    def refined(
        self,
        before: list[tuple[QueuedTask, IdleDevice]],
        after: list[tuple[QueuedTask, IdleDevice]],
    ) -> None:
        rec = self.recorder
        was = {t.task_id: d for t, d in before}
        for t, d in after:
            got = rec.tasks.get(t.task_id)
            if got is None:
                continue
            if d.device_id != was[t.task_id].device_id:
                got.refined_from = was[t.task_id].device_id
                got.device_id = d.device_id
                got.scores = self.score_keys(t, d)
            got.refine = self.refine_keys(t, d)

    def record(
        self,
        task: QueuedTask,
        cands: list[DeviceClass],
        best: IdleDevice | None,
        denied: str | None,
    ) -> TaskRecord:
        out = TaskRecord(task.task_id, self.filter_record(task.sig))
        if best is None:
            out.outcome = "exhausted" if cands else "no_feasible_class"
            return out
        out.device_id = best.device_id
        out.scores = self.score_keys(task, best)
        if denied is not None:
            out.outcome, out.denied_by = "denied", denied
        return out

    def score_keys(self, task: QueuedTask, d: IdleDevice) -> dict[str, int]:
        """The device's key by each score of the profile (a task score that does not apply
        to the task: 0)."""
        scores, is_task = self.profile.scores, self.is_task
        kinds = [cast(TaskScore, s) if t else None for s, t in zip(scores, is_task, strict=True)]
        live = [None if k is None else k.applies(self.view, task) for k in kinds]
        keys = _keys(self.view, self.profile.scores, kinds, live, task, d)
        return {s.name: k for s, k in zip(self.profile.scores, keys, strict=True)}

    def refine_keys(self, task: QueuedTask, d: IdleDevice) -> dict[str, int]:
        kinds = self.refine_kinds
        live = [None if k is None else k.applies(self.view, task) for k in kinds]
        keys = _keys(self.view, self.profile.refine, kinds, live, task, d)
        return {s.name: k for s, k in zip(self.profile.refine, keys, strict=True)}


def _keys(
    view: View,
    scores: Sequence[Score],
    kinds: Sequence[TaskScore | None],
    live: Sequence[bool | None],
    task: QueuedTask,
    d: IdleDevice,
) -> tuple[int, ...]:
    out = []
    for s, k, on in zip(scores, kinds, live, strict=True):
        if k is None:
            out.append(cast(DeviceScore, s).device_key(view, d))
        else:
            out.append(k.task_key(view, task, d) if on else 0)
    return tuple(out)


def _id(d: IdleDevice) -> str:
    return d.device_id
