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
"""

from __future__ import annotations

from ..actors.model.handles import CachedVersionHandle
from ..inference import InferRequest
from ..runtime import fastpath
from ..runtime.kernel import Reply
from .dataplane import DataPlane, Pending
from .route import Route


def start(plane: DataPlane, request: InferRequest, route: Route, traceparent: str | None = None) -> Pending:
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
