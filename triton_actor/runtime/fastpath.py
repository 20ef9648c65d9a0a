"""The one seam for fast paths: a switch that turns every one of them off, and the bounded caches.

Every fast path in the server (caches keyed by request bytes, a model promoted to run in the calling
greenlet, the scheduler running a batch on the sender's stack, gRPC answered in the HTTP/2 reader,
direct socket calls, NamedTuples built with ``tuple.__new__``) has a slow path beside it that is the
specification. ``enabled`` picks between them; the test suite runs both ways (docs/testing.md's command,
``TRITON_ACTOR_FAST_PATHS=0``) and must give the same answers.

The switch is process-wide: read once from the environment at import (so a server subprocess
inherits it), overridden by ``--fast-paths`` through :func:`set_enabled` before anything is served.
Code on the hot path reads ``fastpath.enabled`` (a module attribute: one lookup).

Caches are :class:`BoundedCache` objects, created here through :func:`cache` (process-wide, listed
by :func:`caches`) or per connection. A full cache is cleared rather than evicted entry by entry:
the keys are what a repeating client repeats (a perf_analyzer or tritonclient loop sends the same
bytes every time), so a working set refills in a few requests, and a client cycling through many
keys costs one dict clear per ``maxsize`` misses, never unbounded memory.
"""

from __future__ import annotations

import os
from collections.abc import Hashable
from typing import Any, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

_OFF = ("0", "false", "no", "off")
enabled: bool = os.environ.get("TRITON_ACTOR_FAST_PATHS", "1").strip().lower() not in _OFF


def _miss(_key: Any, _default: Any = None) -> Any:
    return None


class BoundedCache(Generic[K, V]):
    """A dict of at most ``maxsize`` entries. ``get(key)`` is the dict's own ``get`` while fast paths
    are on (no Python frame on a hit) and always misses while they are off; ``put`` then stores
    nothing. Owned by whoever created it; process-wide caches are only touched from the hub thread."""

    __slots__ = ("name", "maxsize", "get", "_data")

    def __init__(self, name: str, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError("maxsize must be at least 1")
        self.name = name
        self.maxsize = maxsize
        self._data: dict[K, V] = {}
        self.get = self._data.get if enabled else _miss

    def put(self, key: K, value: V) -> None:
        if not enabled:
            return
        if self.get is _miss:  # built while fast paths were off (and not registered): look up from now on
            self.get = self._data.get
        data = self._data
        if len(data) >= self.maxsize:
            data.clear()
        data[key] = value

    def clear(self) -> None:
        self._data.clear()

    def _switched(self) -> None:
        self._data.clear()
        self.get = self._data.get if enabled else _miss

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data


_CACHES: dict[str, BoundedCache[Any, Any]] = {}


def cache(name: str, maxsize: int) -> BoundedCache[Any, Any]:
    """The process-wide cache called ``name`` (created on first use)."""
    found = _CACHES.get(name)
    if found is None:
        found = _CACHES[name] = BoundedCache(name, maxsize)
    return found


def caches() -> dict[str, BoundedCache[Any, Any]]:
    """Every process-wide cache by name (for tests and debugging)."""
    return dict(_CACHES)


def _make_tuple(cls: Any, fields: Any) -> Any:
    """The slow path of :data:`new_tuple`: the class's own constructor, which checks the arity."""
    return cls._make(fields)


# ``new_tuple(SomeNamedTuple, full_field_tuple)``: ``tuple.__new__`` builds the same object as the
# generated ``__new__`` in half the time, without checking the field count (the callers' import-time
# asserts pin the field order); read as ``fastpath.new_tuple`` at the call so the switch applies.
new_tuple: Any = tuple.__new__ if enabled else _make_tuple


def set_enabled(value: bool) -> None:
    """Turn every fast path on or off (start-up, or a test); process-wide caches are emptied."""
    global enabled, new_tuple
    enabled = bool(value)
    new_tuple = tuple.__new__ if enabled else _make_tuple
    for c in _CACHES.values():
        c._switched()
