"""The built-in placement plugins (one module per plugin of substance)."""

from .anti_affinity import AntiAffinity, RetryElsewhere
from .fair_share import FairShareSort
from .faults import FaultCount
from .gang_hold import ReserveThenHold
from .limit_caps import LIMIT_CAPS, LimitCap
from .lru import LeastRecentlyUsed
from .matching import Match
from .ordering import AgingSort, FifoSort, PrioritySort

__all__ = [
    "AgingSort",
    "AntiAffinity",
    "FairShareSort",
    "FaultCount",
    "FifoSort",
    "LIMIT_CAPS",
    "LeastRecentlyUsed",
    "LimitCap",
    "Match",
    "PrioritySort",
    "ReserveThenHold",
    "RetryElsewhere",
]
