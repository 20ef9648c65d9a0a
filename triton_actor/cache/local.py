"""``local``: the in-process response cache, least recently used out first, bounded by bytes.

Triton's local cache (https://github.com/triton-inference-server/local_cache) keeps entries in one
buffer of ``size`` bytes and evicts the least recently used until a new entry fits; an entry larger
than the whole cache is not kept. Here the bytes are the outputs' buffers plus a small overhead per
entry (:mod:`.entry`). Owned by the server that made it and used only on its hub thread (lookups and
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
            self.used -= old.nbytes + len(key)
        while self.used + cost > self.size:
            gone_key, gone = self._entries.popitem(last=False)
            self.used -= gone.nbytes + len(gone_key)
            self.evictions += 1
        self._entries[key] = entry
        self.used += cost
        return True

    def metrics(self) -> dict[str, int]:
        return self.counters.snapshot(len(self._entries), self.used, self.size, self.evictions)

    def open(self) -> None:
        pass  # nothing to reach

    def close(self) -> None:
        self._entries.clear()
        self.used = 0
