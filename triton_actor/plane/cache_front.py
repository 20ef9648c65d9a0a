"""A response-cache hit answered before the scheduler: the fast path of :meth:`.dataplane.DataPlane.infer_start`.

Triton answers a hit in its C++ core without reaching the backend; here a hit through the regular path
still made a reply and a response, and the front end encoded that response again on every hit. So,
for a version whose answers go through a local cache (``response_cache`` with ``--cache-config
local``), the front end's call looks the request up right after its decode: :func:`start` checks the
request as the version's validator does, makes its key and looks it up
(:meth:`~..actors.model.cached.CachedVersion.answer`, which counts the hit in the version's
statistics as Triton does), and hands the hit back in ``Pending.hit``; the front end answers it from
the bytes it encoded for the same entry before (``frontends/cached_answers.py``). A miss is queued
right there, as :meth:`~.dataplane.DataPlane.infer_start` would have queued it.

The slow path, the specification, is ``infer_start`` itself, taken with fast paths off, for a Redis
store (its lookup waits on the network, in a greenlet of its own), for a request traced in OpenTelemetry
mode (its spans are made on the regular path), and whenever the route is not the one to queue with
as it is (a reload swapped the model, on-demand loading, a server that stopped accepting requests).
Runs in the request's greenlet or a connection's reader; never waits.

:func:`again` goes one step earlier for a front end that can name a request by its bytes (HTTP: the
body and its header length; gRPC: the ModelInferRequest's bytes without its id): a request body this version answered from the cache before, with an
answer kept for it, is answered from that entry again without being decoded, checked or keyed
(``CachedVersion.bodies``, per loaded version: its validator checked those bytes, its key was made
from them). The entry is still looked up each time, so an evicted or replaced one is not answered.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from ..actors.model.cached import BODY_MAX, Hit
from ..actors.model.handles import CachedVersionHandle
from ..inference import InferRequest
from ..observability.wire_trace import WireTrace
from ..runtime import fastpath
from ..runtime.kernel import Reply
from .dataplane import DataPlane, Pending
from .route import Route


def start(plane: DataPlane, request: InferRequest, route: Route, traceparent: str | WireTrace | None = None) -> Pending:
    """``plane.infer_start(request, route=route, traceparent=traceparent)``, a cache hit answered at once."""
    target = route.target
    if not fastpath.enabled or target.__class__ is not CachedVersionHandle or plane.tracer.otel is not None:
        return plane.infer_start(request, route=route, traceparent=traceparent)
    current, serving = plane._serving(request, route, False)
    if current is not route or serving is not target or target.cache.store.blocking:
        return plane.infer_start(request, route=current, traceparent=traceparent)
    found = target.cache.answer(request, target.validator.check(request))
    if found.__class__ is Reply:
        return Pending(found, route)
    answered: Reply[None] = Reply()
    answered.set(None)
    return Pending(answered, route, found)  # type: ignore[arg-type]


def again(plane: DataPlane, route: Route, body: Hashable, size: int) -> tuple[Any, str] | None:
    """What a front end kept of the entry a request ``body`` (``size`` bytes) was answered from before,
    and that request's id; None when the body is not known (or its entry or answer is gone): the
    request then goes the regular way. ``route`` must be the one the plane just made for the request."""
    target = route.target
    if target.__class__ is not CachedVersionHandle or size > BODY_MAX or route.closed or plane.tracer.otel is not None:
        return None
    known = target.cache.bodies.get(body)  # always None while fast paths are off
    if known is None:
        return None
    key, kind, rid = known
    found = target.cache.repeat(key, kind)
    return None if found is None else (found.encoded[kind], rid)


def learn(hit: Hit, body: Hashable, size: int, kind: Any, rid: str) -> None:
    """Remember that ``body`` (``size`` bytes) is answered by ``hit`` in ``kind``, for :func:`again`."""
    if size <= BODY_MAX and kind in hit.entry.encoded:
        hit.front.bodies.put(body, (hit.key, kind, rid))
