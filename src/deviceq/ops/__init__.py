"""The operator's side: `admin.PoolAdmin` (hosts, devices, settings, manual dispatch), the
read-only views behind ``deviceq status`` (`status`) and ``explain`` (`explain`), the
Prometheus endpoint (`metrics`) and the self-contained demo (`demo`). `PoolAdmin` is imported
on first use (so that importing a light module of this package, ``ops.verify.model``, stays
light)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .admin import PoolAdmin


def __getattr__(name: str) -> Any:
    if name == "PoolAdmin":
        from .admin import PoolAdmin

        return PoolAdmin
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["PoolAdmin"]
