"""The built-in placement plugins (one module per plugin of substance)."""

from .anti_affinity import AntiAffinity, RetryElsewhere
from .fair_share import FairShareSort
from .faults import FaultCount
from .gang_hold import ReserveThenHold
from .host_cap import HostCap
from .lru import LeastRecentlyUsed
from .matching import Match
from .ordering import AgingSort, FifoSort, PrioritySort
from .tenant_cap import TenantCap

__all__ = [
    "AgingSort",
    "AntiAffinity",
    "FairShareSort",
    "FaultCount",
    "FifoSort",
    "HostCap",
    "LeastRecentlyUsed",
    "Match",
    "PrioritySort",
    "ReserveThenHold",
    "RetryElsewhere",
    "TenantCap",
]
