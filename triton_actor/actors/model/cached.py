"""The response cache in front of one version's scheduler (``response_cache { enable: true }``).

Built by the model actor when the version loads and the server has a cache (``--cache-config``); the
routing table then shows a :class:`~.handles.CachedVersionHandle`, so versions without a cache keep
the plain handle and pay nothing. Runs in the request's greenlet and in reply callbacks, all on the
hub thread. A hit answers at once and never reaches the scheduler; a miss is queued as any request and
its successful answer is stored before the client gets it.

Statistics follow Triton core (``InferenceStatsAggregator::UpdateSuccessCacheHit`` / ``...CacheMiss``):
a hit counts as a success with its duration, a queue entry of no time and a ``cache_hit`` (the
lookup); it adds no inference or execution. A miss counts ``cache_miss`` with the lookup plus the
insertion time, which is added to the request's duration. The counters are the version's
:class:`~...metrics.statistics.VersionStats`, written here on the hub thread beside its scheduler,
which never yields between reading and writing them. A store that fails (a Redis gone away) only
turns lookups into misses: the request still runs its model.
"""

from __future__ import annotations

import logging
import time
from typing import Any, NamedTuple

import gevent

from ...cache import entry as cache_entry
from ...cache.keys import request_key
from ...errors import TritonError
from ...inference import InferRequest, InferResponse
from ...metrics.statistics import VersionStats
from ...runtime.fastpath import BoundedCache
from ...runtime.kernel import Reply
from ..scheduling.messages import Enqueue

log = logging.getLogger(__name__)
_clock = time.perf_counter_ns


# encoded answers kept per entry: the variants one client uses (HTTP binary or JSON outputs, gRPC) are
# a few; a client cycling through output selections on one input gets the rest encoded on each hit
MAX_VARIANTS = 4
# request bodies remembered per version (frontends/cached_answers.py): a repeating client's working
# set is a few bodies; at most BODIES of BODY_MAX bytes (1 MiB a version) besides the cache's size
BODIES = 64
BODY_MAX = 16 * 1024


class Hit(NamedTuple):
    """An answer found in the cache by :meth:`CachedVersion.answer`: the entry, its key, and the front
    that remembers what front ends encode from it."""

    entry: cache_entry.Entry
    key: bytes
    front: CachedVersion


class CachedVersion:
    """One version's cache front: ``store`` is the server's (local or redis), shared by its models."""

    __slots__ = ("store", "stats", "model", "version", "scheduler", "bodies")

    def __init__(self, store: Any, stats: VersionStats, model: str, version: int, scheduler: Any) -> None:
        self.store, self.stats, self.model, self.version, self.scheduler = store, stats, model, version, scheduler
        stats.cache_enabled = True
        # request bodies answered from the cache before → (key, variant, id): frontends/cached_answers.py.
        # This version's own: the same bytes were checked by its validator and keyed for its entries.
        self.bodies: BoundedCache[Any, tuple[bytes, Any, str]] = BoundedCache("cache.bodies", BODIES)

    def infer(self, request: InferRequest, batch: int, reply: Reply[InferResponse] | None = None) -> Reply[InferResponse]:
        """Answer ``request`` (checked: ``batch`` is its batch size) in ``reply``, a new one if None."""
        start = _clock()
        key = request_key(self.model, self.version, request)
        if reply is None:
            reply = Reply()
        if self.store.blocking:  # a network lookup: not in the caller, which may be a connection's reader
            gevent.spawn(self._lookup_then_run, request, batch, key, reply, start)
            return reply
        found = self._lookup(key)
        if found is not None:
            self._hit(found, reply, start)
        else:
            self._run(request, batch, key, reply, start, _clock() - start)
        return reply

    def answer(self, request: InferRequest, batch: int) -> Hit | Reply[InferResponse]:
        """:meth:`infer` for the plane's fast path (``plane/cache_front.py``, local stores only): a hit
        is counted as :meth:`infer` counts it and handed back as it is, with no response made, for the
        front end to answer from what it encoded before; a miss is queued and its reply returned."""
        start = _clock()
        key = request_key(self.model, self.version, request)
        found = self._lookup(key)
        if found is None:
            reply: Reply[InferResponse] = Reply()
            self._run(request, batch, key, reply, start, _clock() - start)
            return reply
        end = _clock()
        self.stats.record_cache_hit(end - start, end - start)
        return Hit(found, key, self)

    def repeat(self, key: bytes, variant: Any) -> cache_entry.Entry | None:
        """A hit on ``key`` whose answer in ``variant`` is kept (the front end sends it), counted as
        :meth:`answer` counts one; None, and nothing counted, when either is gone: the request then
        takes the way of any other and is looked up (and counted) there."""
        start = _clock()
        found = self.store.lookup(key)
        if found is None or variant not in found.encoded:
            return None
        ns = _clock() - start
        counters = self.store.counters  # _count's for a hit, without its call (once per hit by bytes)
        counters.lookup_ns += ns
        counters.lookups += 1
        counters.hits += 1
        self.stats.record_cache_hit(ns, ns)
        return found

    def remember(self, hit: Hit, variant: Any, encoded: Any, nbytes: int) -> None:
        """Keep a front end's ``encoded`` answer of ``hit`` (its ``variant``) beside its entry, counted in
        the store's bytes; nothing is kept when that does not fit or the entry is gone meanwhile."""
        entry = hit.entry
        if len(entry.encoded) < MAX_VARIANTS and self.store.grow(hit.key, entry, nbytes):
            entry.encoded[variant] = encoded

    def _lookup(self, key: bytes) -> cache_entry.Entry | None:
        """The store's answer, counted in its server-wide counters (nv_cache_* gauges)."""
        start = _clock()
        found = self.store.lookup(key)
        self._count(found is not None, _clock() - start)
        return found

    def _count(self, hit: bool, ns: int) -> None:
        counters = self.store.counters
        counters.lookup_ns += ns
        counters.lookups += 1
        if hit:
            counters.hits += 1
        else:
            counters.misses += 1

    def _lookup_then_run(self, request: InferRequest, batch: int, key: bytes, reply: Reply[InferResponse],
                         start: int) -> None:
        """A greenlet of its own: whatever goes wrong fails this request's reply, nobody waits for ever."""
        try:
            found = self._lookup(key)
            if reply.ready():  # cancelled by its client while the lookup waited
                return
            if found is not None:
                self._hit(found, reply, start)
            else:
                self._run(request, batch, key, reply, start, _clock() - start)
        except TritonError as e:  # the scheduler stopped meanwhile (an unload): its refusal is the answer
            reply.fail(e)
        except Exception as e:  # a bug of ours must still answer the request
            log.exception("response cache of '%s' version %d failed", self.model, self.version)
            reply.fail(TritonError.internal(f"response cache: {e!r}"))

    def _hit(self, found: cache_entry.Entry, reply: Reply[InferResponse], start: int) -> None:
        response = found.response()
        end = _clock()
        self.stats.record_cache_hit(end - start, end - start)
        response.timings = (0, 0, 0, 0)  # nothing queued or computed (an ensemble adds these up)
        reply.set(response)

    def _run(self, request: InferRequest, batch: int, key: bytes, reply: Reply[InferResponse], start: int,
             lookup_ns: int) -> None:
        """Queue the request as any other; its successful answer is kept before the client gets it, as
        Triton inserts before it responds (a client that has its answer finds it in the cache next time).
        A local insert is done in the reply's callback, ahead of the waiting client; a network insert
        waits in a greenlet, so the scheduler answers an inner reply that this one follows (a client's
        cancel is passed on to it, so a request still queued is not run)."""
        if not self.store.blocking:
            reply.link(lambda done: self._store(done, key, lookup_ns))
            self.scheduler.ref.tell(Enqueue(request, batch, reply, start))
            return
        inner: Reply[InferResponse] = Reply()
        reply.link(lambda outer: inner.fail(outer.exception()) if outer.exception() is not None else None)
        inner.link(lambda done: gevent.spawn(self._store_then_answer, done, reply, key, lookup_ns))
        self.scheduler.ref.tell(Enqueue(request, batch, inner, start))

    def _store_then_answer(self, done: Reply[InferResponse], reply: Reply[InferResponse], key: bytes,
                           lookup_ns: int) -> None:
        """A greenlet of its own: insert (network), then answer; the answer goes out whatever happens."""
        error = done.exception()
        try:
            if error is None:
                self._store(done, key, lookup_ns)
        finally:
            if error is not None:
                reply.fail(error)
            else:
                reply.set(done.value())

    def _store(self, done: Reply[InferResponse], key: bytes, lookup_ns: int) -> None:
        """Once the model answered: only successful answers are kept (as Triton)."""
        if done.exception() is not None:
            return
        response = done.value()
        if type(response) is not InferResponse:
            return
        kept = cache_entry.from_response(response)
        if kept is None:  # outputs that are not arrays: answered, counted as a miss, not kept
            self.stats.record_cache_miss(lookup_ns)
            return
        start = _clock()
        self.store.insert(key, kept)
        insert_ns = _clock() - start
        self.store.counters.insertion_ns += insert_ns
        self.stats.record_cache_miss(lookup_ns + insert_ns)
