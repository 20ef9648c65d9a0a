"""What a store did, for Triton's server-wide ``nv_cache_*`` gauges (core ``metrics.cc``, 2.51).

One per store, counted by the version fronts that use it (``actors/model/cached.py``) on the hub
thread; read by the metrics snapshot. Triton 2.51 exports these families for any cache and, with its
local cache, leaves every one but ``nv_cache_util`` at 0; here they count (docs/cache.md).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class StoreCounters:
    lookups: int = 0
    hits: int = 0
    misses: int = 0
    lookup_ns: int = 0
    insertion_ns: int = 0

    def snapshot(self, entries: int, used: int, size: int, evictions: int) -> dict[str, int]:
        """Plain data for ``host.gather("metrics")``, summed over workers (util = used / size of the sums)."""
        return {"entries": entries, "used": used, "size": size, "evictions": evictions, "lookups": self.lookups,
                "hits": self.hits, "misses": self.misses, "lookup_us": self.lookup_ns // 1000,
                "insertion_us": self.insertion_ns // 1000}
