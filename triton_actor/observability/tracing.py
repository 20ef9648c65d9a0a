"""Request traces in Triton's trace-file format, driven by the trace settings (https://github.com/triton-inference-server/server/blob/main/docs/user_guide/trace.md).

Who owns what: one :class:`Tracer` per server (the ``Server`` makes it, its
:class:`~.log_trace_settings.RuntimeSettings` pushes every settings change into it with :meth:`Tracer.configure`,
and ``LoadSettings.tracer`` carries it down the actor tree to the schedulers it builds); two servers in one
process trace apart. Each scheduler holds the
:class:`VersionTrace` of its model version and reads ``trace.on`` once per finished batch: that one
attribute check is all the hot path pays while tracing is off.

Settings in force are :class:`Sampler` objects, as Triton core's ``TraceSetting``: one global, one per model
with an override; a change replaces them (sample counter and remaining count start again, as a new
``TraceSetting`` does in Triton). ``trace_rate`` N traces requests N, 2N, 3N, ... of those a sampler
sees; ``trace_count`` stops it after that many traces (-1: never); ``log_frequency`` 0 appends every trace
to ``trace_file`` (kept a valid JSON array after every write, where Triton closes the array at exit),
N > 0 writes each N traces to ``<trace_file>.<index>`` and what is left at shutdown to the next index.

Sampling happens when a request's batch completes, so requests that never executed (rejected, timed out
in the queue, cancelled before running) are neither counted nor traced.

Threads: everything here runs on the hub, except the file writes, which run in gevent's thread pool (``bridge.call_in_thread``),
one at a time, from the writer greenlet (the hot path never touches a file). A write that fails is logged
and dropped.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import gevent
import gevent.event
import orjson

from ..errors import TritonError
from ..protocol import trace_json
from ..runtime.bridge import call_in_thread

if TYPE_CHECKING:
    from .otel import OtelExport, SpanTrace
    from .wire_trace import WireTrace

log = logging.getLogger(__name__)
_LEVELS = ("TIMESTAMPS", "TENSORS")


class Sampler:
    """One trace setting in force: which requests to trace and where their entries go."""

    __slots__ = ("levels", "rate", "remaining", "log_frequency", "file", "seen", "collected", "stream", "otel")

    def __init__(self, settings: dict[str, list[str]], otel: bool = False) -> None:
        """``otel``: the server exports OpenTelemetry spans (observability/otel.py) instead of writing a file."""
        self.levels = frozenset(v for v in settings.get("trace_level", ["OFF"]) if v in _LEVELS)
        self.otel = otel
        self.rate = max(0, _int(settings, "trace_rate", 1000))
        self.remaining = _int(settings, "trace_count", -1)
        self.log_frequency = max(0, _int(settings, "log_frequency", 0))
        self.file = (settings.get("trace_file") or [""])[0]
        self.seen = 0
        self.collected = 0
        self.stream: list[dict[str, Any]] = []  # entries waiting for log_frequency traces

    @property
    def active(self) -> bool:
        if self.otel:  # a propagated context is traced after the count ran out too (Triton's force_sample)
            return bool(self.levels)
        return bool(self.levels) and self.remaining != 0 and bool(self.file)

    def take(self, force: bool = False) -> bool:
        """Count one request; True when it is to be traced. ``force``: it came with an OpenTelemetry
        context, traced whatever the rate and count say but counted by them (Triton's ``SampleTrace``;
        rate 0 traces only those)."""
        if self.rate == 0 or (self.remaining == 0 and not force):
            return force
        self.seen += 1
        if self.seen % self.rate:  # Triton core: ``(++sample_) % rate_ == 0``
            return force
        if self.remaining > 0:
            self.remaining -= 1
            return True
        return force or self.remaining < 0


def _int(settings: dict[str, list[str]], key: str, default: int) -> int:
    try:
        return int((settings.get(key) or [str(default)])[0])
    except ValueError:
        return default


class VersionTrace:
    """What one version's scheduler holds: ``on`` (read once per batch) and how to record a batch."""

    __slots__ = ("tracer", "model", "version", "on", "sampler")

    def __init__(self, tracer: Tracer, model: str, version: int) -> None:
        self.tracer, self.model, self.version = tracer, model, version
        self.on = False
        self.sampler: Sampler | None = None

    def batch(self, items: list[Any], results: list[Any] | None, dispatch_ns: int, end_ns: int,
              timings: tuple[int, int, int]) -> None:
        """A finished batch (scheduler's greenlet): trace the sampled requests. ``items`` are the
        scheduler's ``Enqueue`` messages, ``results`` their responses (None when the batch failed)."""
        sampler = self.sampler
        if sampler is None:
            return
        respond_ns = time.perf_counter_ns()
        if sampler.otel:  # sampled where the request came in (Tracer.begin): the ones that carry a trace
            for item in items:
                span_trace = item.request.trace
                if span_trace is not None:
                    span_trace.record(self.model, self.version, item.request.id,
                                      trace_json.stage_times(item.start_ns, dispatch_ns, end_ns, timings, respond_ns))
            return
        wires = self.tracer.wires
        for i, item in enumerate(items):
            if not sampler.take():
                continue
            result = results[i] if results is not None else None
            entries = self._entries(sampler, item, result, dispatch_ns, end_ns, timings, respond_ns)
            wire = wires.pop(id(item.request), None) if wires else None
            if wire is None:
                self.tracer.emit(sampler, entries)
            else:  # the front end writes it once its answer is sent, with its receive and send stamps
                wire.hold(self.tracer, sampler, entries)
        if not sampler.active:
            self.tracer.refresh()

    def _entries(self, sampler: Sampler, item: Any, result: Any, dispatch_ns: int, end_ns: int,
                 timings: tuple[int, int, int], respond_ns: int) -> list[dict[str, Any]]:
        tid = self.tracer.next_id()
        request = item.request
        entries = [trace_json.header(tid, self.model, self.version, request.id)]
        entries += trace_json.timestamps(tid, trace_json.stage_times(item.start_ns, dispatch_ns, end_ns, timings,
                                                                     respond_ns))
        if "TENSORS" in sampler.levels:
            entries += [trace_json.tensor(tid, "TENSOR_QUEUE_INPUT", name, t.data) for name, t in request.inputs.items()]
            for name, array in getattr(result, "outputs", None) or ():
                entries.append(trace_json.tensor(tid, "TENSOR_BACKEND_OUTPUT", name, array))
        return entries


class Tracer:
    """One server's samplers, version traces and trace-file writer (hub only; see the module doc)."""

    def __init__(self) -> None:
        self._global = Sampler({})
        self._models: dict[str, Sampler] = {}
        self._settings: tuple[dict[str, list[str]], dict[str, dict[str, list[str]]]] = ({}, {})
        self._traces: dict[tuple[str, int], VersionTrace] = {}
        self._last_id = 0
        self._pending: list[tuple[str, bool, list[dict[str, Any]]]] = []  # (file, indexed, entries)
        self._files: dict[str, int] = {}  # path → next index (indexed writes); present once written
        self._wake = gevent.event.Event()
        self._idle = gevent.event.Event()
        self._idle.set()
        self._writer: gevent.Greenlet | None = None
        self._suffix = ""  # ".worker<N>" for worker N > 0: one writer per file (see for_worker)
        self.otel: OtelExport | None = None  # mode=opentelemetry (start_otel); read once per request by the plane
        # the front ends stamp requests on the wire (a WireTrace each): in OpenTelemetry mode, or while a
        # trace-file sampler is active; read once per request by the front ends
        self.wired = False
        # trace files: each front end's WireTrace of a request on its way through a scheduler, by the id of
        # its InferRequest (the one the scheduler's Enqueue holds), dropped when its reply completes
        self.wires: dict[int, WireTrace] = {}

    def start_otel(self, settings: dict[str, Any]) -> None:
        """Export OpenTelemetry spans from now on (start-up, mode=opentelemetry): the SDK is imported here."""
        from .otel import OtelExport

        try:
            self.otel = OtelExport(settings, self.next_id)
        except ImportError as e:
            raise TritonError.unsupported(f"--trace-config mode=opentelemetry needs the OpenTelemetry SDK "
                                          f"(pip install 'triton-actor[opentelemetry]'): {e}") from None
        self.configure(*self._settings)

    def families(self) -> list[dict[str, Any]]:
        """Our own metric families (server.py's ``_own_families``): the spans lost in OpenTelemetry mode."""
        return [] if self.otel is None else self.otel.families()

    def begin(self, model: str, traceparent: str | None, start_ns: int) -> tuple[Any, SpanTrace] | None:
        """A request for ``model`` comes in (its greenlet): sample it; when traced, its ``InferRequest``
        span and the :class:`~.otel.SpanTrace` the request carries. Only while :attr:`otel` is set."""
        assert self.otel is not None
        sampler = self._models.get(model, self._global)
        if not sampler.levels:
            return None
        parent = self.otel.extract(traceparent)
        if not sampler.take(force=parent is not None):
            return None
        return self.otel.begin(parent, start_ns)

    def for_worker(self, worker_id: int) -> None:
        """Several worker processes (host/base.py): trace ids stay unique host-wide (worker N counts from
        N * 10**12) and worker N > 0 writes ``<trace_file>.worker<N>``, so no two processes write one file."""
        self._last_id = max(self._last_id, worker_id * 10**12)
        self._suffix = f".worker{worker_id}" if worker_id else ""

    # -- settings ---------------------------------------------------------------------------------
    def configure(self, global_settings: dict[str, list[str]], models: dict[str, dict[str, list[str]]]) -> None:
        """Replace every sampler (a settings change); traces held for log_frequency are written first."""
        for old in (self._global, *self._models.values()):
            self._spill(old)
        self._settings = (global_settings, models)
        otel = self.otel is not None
        self._global = Sampler(global_settings, otel)
        self._models = {m: Sampler({**global_settings, **o}, otel) for m, o in models.items() if o}
        self.refresh()
        if self.otel is not None:  # the spans recorded under the old settings go out now
            self.otel.flush_soon()

    def refresh(self) -> None:
        for trace in self._traces.values():
            sampler = self._models.get(trace.model, self._global)
            trace.sampler, trace.on = sampler, sampler.active
        self.wired = self.otel is not None or any(s.active for s in (self._global, *self._models.values()))

    def wired_infer(self, infer: Callable[[Any], Any], request: Any, wire: WireTrace) -> Any:
        """Trace files: queue ``request`` with ``infer`` while its front end's ``wire`` waits for the
        scheduler that may sample it (VersionTrace.batch hands it the trace to write after the send)."""
        key = id(request)  # the request stays alive (and its id unique) until its reply completes
        self.wires[key] = wire
        reply = infer(request)
        reply.link(lambda _r: self.wires.pop(key, None))
        return reply

    def version(self, model: str, version: int) -> VersionTrace:
        """The trace a scheduler of ``model`` ``version`` holds (created once, kept up to date)."""
        trace = self._traces.get((model, version))
        if trace is None:
            trace = self._traces[(model, version)] = VersionTrace(self, model, version)
            sampler = self._models.get(model, self._global)
            trace.sampler, trace.on = sampler, sampler.active
        return trace

    def remaining(self, model: str = "") -> int:
        """The trace count left to the setting in force for ``model`` (global with ``""``)."""
        return self._models.get(model, self._global).remaining if model else self._global.remaining

    def next_id(self) -> int:
        self._last_id += 1
        return self._last_id

    # -- writing ----------------------------------------------------------------------------------
    def emit(self, sampler: Sampler, entries: list[dict[str, Any]]) -> None:
        sampler.collected += 1
        if not sampler.log_frequency:
            self._queue(sampler.file, False, entries)
            return
        sampler.stream += entries
        # a trace held until its send (WireTrace) may come after a settings change replaced its sampler,
        # whose leftovers were written then: this one is written at once, or it would never be
        replaced = sampler is not self._global and sampler not in self._models.values()
        if replaced or sampler.collected % sampler.log_frequency == 0:
            self._spill(sampler)

    def _spill(self, sampler: Sampler) -> None:
        if sampler.stream:
            self._queue(sampler.file, True, sampler.stream)
            sampler.stream = []

    def _queue(self, path: str, indexed: bool, entries: list[dict[str, Any]]) -> None:
        self._pending.append((path + self._suffix, indexed, entries))
        self._idle.clear()
        if self._writer is None:
            self._writer = gevent.spawn(self._write_loop)
        self._wake.set()

    def _write_loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            pending, self._pending = self._pending, []
            for path, indexed, entries in pending:
                if indexed:
                    index = self._files.get(path, 0)
                    self._files[path] = index + 1
                    target, append = f"{path}.{index}", False
                else:
                    target, append = path, path in self._files
                    self._files.setdefault(path, 0)
                try:
                    call_in_thread(_write, target, entries, append)
                except Exception as e:  # noqa: BLE001 - a trace file that cannot be written must not stop serving
                    log.error("writing traces to %s: %s", target, e)
            if not self._pending:
                self._idle.set()

    def flush(self, timeout: float | None = 30) -> bool:
        """Write every collected trace, log_frequency leftovers included (shutdown, tests)."""
        for sampler in (self._global, *self._models.values()):
            self._spill(sampler)
        return self._idle.wait(timeout)

    def close(self, timeout: float | None = 30) -> bool:
        """Shutdown: :meth:`flush`, then export the spans the SDK still holds and stop its thread."""
        written = self.flush(timeout)
        otel, self.otel = self.otel, None
        if otel is not None:
            try:
                call_in_thread(otel.shutdown)
            except Exception as e:  # noqa: BLE001 - an exporter that fails at exit must not stop the shutdown
                log.error("exporting OpenTelemetry spans: %s", e)
        return written


def _write(path: str, entries: list[dict[str, Any]], append: bool) -> None:
    """Thread pool: write ``entries`` as a JSON array, or splice them into the array already there."""
    body = b",".join(orjson.dumps(e) for e in entries)
    if append and os.path.exists(path):
        with open(path, "r+b") as f:
            f.seek(-1, os.SEEK_END)  # over the closing ']'
            f.write(b"," + body + b"]")
        return
    partial = f"{path}.writing"  # a new file appears whole: a reader never sees it empty or half written
    with open(partial, "wb") as f:
        f.write(b"[" + body + b"]")
    os.replace(partial, path)

