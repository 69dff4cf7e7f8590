"""The operator's side: `admin.PoolAdmin` (hosts, devices, settings, manual dispatch), the
read-only views behind ``deviceq status`` (`status`), the Prometheus endpoint (`metrics`) and
the self-contained demo (`demo`)."""

from .admin import PoolAdmin

__all__ = ["PoolAdmin"]
