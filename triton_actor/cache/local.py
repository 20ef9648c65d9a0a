"""``local``: the in-process response cache, least recently used out first, bounded by bytes.

Triton's local cache (https://github.com/triton-inference-server/local_cache) keeps entries in one
buffer of ``size`` bytes and evicts the least recently used until a new entry fits; an entry larger
than the whole cache is not kept. Here the bytes are the outputs' buffers plus a small overhead per
entry (:mod:`.entry`), its key, and the answers front ends encoded from it and keep beside it (:meth:`LocalCache.grow`). Owned by the server that made it and used only on its hub thread (lookups and
inserts come from request greenlets and reply callbacks, never from an instance thread), so no lock.
With ``--workers`` each worker has its own, as each Triton process has its own.
"""

from __future__ import annotations

from collections import OrderedDict

from .counters import StoreCounters
from .entry import Entry

MIN_SIZE = 1024  # Triton's local cache may refuse sizes under about 1 KB; we refuse them outright


class LocalCache:
    """An LRU map key → :class:`~.entry.Entry` holding at most ``size`` bytes."""

    name = "local"
    blocking = False  # lookups and inserts return at once: the front calls them inline

    def __init__(self, size: int) -> None:
        self.size = size
        self.used = 0
        self.evictions = 0
        self.counters = StoreCounters()  # counted by the version fronts (nv_cache_* gauges)
        self._entries: OrderedDict[bytes, Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, key: bytes) -> Entry | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def insert(self, key: bytes, entry: Entry) -> bool:
        """Keep ``entry`` (replacing one under the same key); False when it is larger than the cache.
        The key's bytes count too (a small request's key is its inputs, keys.py)."""
        cost = entry.nbytes + len(key)
        if cost > self.size:
            return False
        old = self._entries.pop(key, None)
        if old is not None:
            self.used -= old.nbytes + old.extra + len(key)
        self._make_room(cost)
        self._entries[key] = entry
        self.used += cost
        return True

    def grow(self, key: bytes, entry: Entry, n: int) -> bool:
        """Count ``n`` more bytes for ``entry`` (an encoded answer kept beside it) when it is still the
        one under ``key`` and all of it still fits; others go first, least recently used first."""
        if self._entries.get(key) is not entry or entry.nbytes + entry.extra + n + len(key) > self.size:
            return False
        del self._entries[key]  # out while room is made, so it is not the one that goes; back as the newest
        cost = entry.nbytes + entry.extra + len(key)
        self.used -= cost
        self._make_room(cost + n)
        entry.extra += n
        self._entries[key] = entry
        self.used += cost + n
        return True

    def _make_room(self, cost: int) -> None:
        while self.used + cost > self.size:
            gone_key, gone = self._entries.popitem(last=False)
            self.used -= gone.nbytes + gone.extra + len(gone_key)
            self.evictions += 1

    def metrics(self) -> dict[str, int]:
        return self.counters.snapshot(len(self._entries), self.used, self.size, self.evictions)

    def open(self) -> None:
        pass  # nothing to reach

    def close(self) -> None:
        self._entries.clear()
        self.used = 0
