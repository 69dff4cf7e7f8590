"""Placement as plugins: a pass's task order, device feasibility, device preference and
admission as small plugins (`plugins`), combined into named profiles (`profiles`), run over
an immutable view of a snapshot (`view`) by `pipeline.place`, which can record what it did
and why (`recorder`). Pure Python, no Redis access.

The built-in strategies (`deviceq.scheduler.strategies`) are these profiles: the scheduler
runs them over the view its snapshot reader gives (`SnapshotReader.make_view`). The rows of a
snapshot are in `rows`. Multi-device tasks are placed with the same profiles
(`gang.place_gangs`). See README.md in this folder."""

from .pipeline import MissingInputs, place
from .plugins import (
    DeviceScore,
    ExplainingFilter,
    Filter,
    GangDecision,
    GangPassPermit,
    GangPermit,
    PassPermit,
    Permit,
    QueueSort,
    Requirement,
    Score,
    TaskOrder,
    TaskScore,
)
from .profiles import PROFILES, Profile, get_profile
from .recorder import FilterRecord, Need, Recorder, Rejection, TaskRecord, judge
from .view import INPUTS, Avoid, View

__all__ = [
    "INPUTS",
    "PROFILES",
    "Avoid",
    "DeviceScore",
    "ExplainingFilter",
    "Filter",
    "FilterRecord",
    "GangDecision",
    "GangPassPermit",
    "GangPermit",
    "MissingInputs",
    "Need",
    "PassPermit",
    "Permit",
    "Profile",
    "QueueSort",
    "Recorder",
    "Rejection",
    "Requirement",
    "Score",
    "TaskOrder",
    "TaskRecord",
    "TaskScore",
    "View",
    "get_profile",
    "judge",
    "place",
]
