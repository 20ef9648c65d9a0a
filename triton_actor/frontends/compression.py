"""Compressed requests inflated, and compressed answers deflated, in slices: off the hub when big,
and a request's inflated bytes inside the request memory budget (:mod:`.budget`) as they come.

Why: a gzip body inflates to up to ~1000 times its size. A 2 MiB gRPC message inflated to 2 GiB in
one zlib call on the hub: every client waited 18 s, RSS peaked at 4.2 GB, and the budget had counted
the 2 MiB on the wire; forty 65 KB HTTP bodies of 64 MiB each held health checks 12 s. Compressing
four 60 MiB answers for ``Accept-Encoding: gzip`` on the hub held other clients 8 s.

How: each slice's bytes are reserved before zlib produces them (``hold``, which raises the front end's
budget refusal: 503 / RESOURCE_EXHAUSTED), so the budget bounds what a request inflates, beside the
size limit of its transport (``--http-max-input-size``, gRPC's max receive length). The first slice,
at most :data:`ON_HUB` bytes, is inflated inline and then reserved (a small body holds its size, not
a slice's; at most ON_HUB bytes are unreserved for that moment, as ``budget.with_room`` runs ahead of a
body): almost every compressed request is that small, and a thread hop costs more than it saves. Later slices, and answers over :data:`ON_HUB`, run on gevent's native
thread pool (``call_in_thread``; zlib releases the GIL), one slice at a time in the process
(``_turn``): concurrent big ones take turns slice by slice, and a small one waits at most a slice.
Runs in the calling greenlet (the hub thread); the slices run on the pool's threads, handed over and
back so that one thread at a time touches an :class:`~..protocol.codings.Inflation`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import gevent
import gevent.lock

from ..config.settings import Settings
from ..protocol.codings import Deflation, Inflation
from ..runtime.bridge import call_in_thread

ON_HUB = 256 * 1024  # bytes inflated (or an answer compressed) inline: ~1 ms of zlib at worst
SLICE = 2 * 1024 * 1024  # bytes per slice on a thread (a few ms), reserved before each
Hold = Callable[[int], None]  # reserve n more bytes of the budget (n < 0: give them back); raises if refused

T = TypeVar("T")
_turn = gevent.lock.Semaphore()  # the one slice running on a thread (hub-owned, like the budget)


def inflation_limit(s: Settings) -> int:
    """The most bytes one compressed request inflates to, HTTP body or gRPC message: ``--http-max-input-size``
    (Triton's limit "also after decompression"). gRPC's own message limit is INT32_MAX, as Triton's, which
    let a 1 MiB gzip message inflate to the 1 GiB budget (4.3 s of zlib, 1 GB peak) where a gzip body
    stopped at 64 MiB; an uncompressed message costs its sender every byte, an inflated one a thousandth.
    Past it, each transport answers as it does for a request over its size limit (400 / RESOURCE_EXHAUSTED)."""
    return s.http_max_input_size


def inflate(coding: str, data: bytes, limit: int, hold: Hold) -> bytes:
    """``data`` inflated (``coding`` one of :data:`~..protocol.codings.CODINGS`); OverflowError past
    ``limit`` bytes, ``zlib.error`` for bad data; what ``hold`` raises when the budget is spent. The
    request keeps holding the inflated bytes (the caller gives them back with the request's)."""
    job = Inflation(coding, data, limit)
    reserved = 0
    try:
        job.step(min(ON_HUB, limit + 1))
        job.check()
        hold(job.size)
        reserved = job.size
        while not job.done:
            n = min(SLICE, limit + 1 - job.size)
            hold(n)
            reserved += n
            _on_thread(job.step, n)
            job.check()
    except BaseException:
        hold(-reserved)  # a refused request keeps nothing of it (a stream goes on without it)
        # and its bytes go now: the traceback keeps this frame, and a caller's exception that refers
        # to its own frame (a cycle) would keep them until the cyclic collector ran (1 GB held after)
        job = None
        raise
    if reserved != job.size:
        hold(job.size - reserved)  # the last slice's unused room
    return job.result()


def compress(coding: str, chunks: list[bytes]) -> bytes:
    """The answer ``chunks`` joined and compressed; over :data:`ON_HUB` bytes, slice by slice on a
    thread (an answer is not in the request budget: its model made it, within its own bounds)."""
    job = Deflation(coding)
    if sum(map(len, chunks)) <= ON_HUB:
        for chunk in chunks:
            job.step(chunk)
        return job.finish()
    for pieces in _slices(chunks):
        _on_thread(_deflate, job, pieces)
    return _on_thread(job.finish)


def _on_thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on a native thread when it is our turn; then the next in line has its turn (a
    gevent semaphore lets a greenlet that releases and takes it again at once pass its waiters: the
    first of forty 64 MiB bodies kept the thread until it was whole, and the others waited behind it)."""
    with _turn:
        result = call_in_thread(fn, *args)
    if _turn.linkcount():
        gevent.sleep(0)  # the waiter woken by the release takes the turn before we ask again
    return result


def _deflate(job: Deflation, pieces: list[memoryview]) -> None:
    """One slice of an answer (on a native thread)."""
    for piece in pieces:
        job.step(piece)


def _slices(chunks: list[bytes]) -> Iterator[list[memoryview]]:
    """``chunks`` cut into slices of at most :data:`SLICE` bytes (small chunks share one)."""
    pieces: list[memoryview] = []
    room = SLICE
    for chunk in chunks:
        view = memoryview(chunk)
        while view:
            pieces.append(view[:room])
            room -= len(pieces[-1])
            view = view[len(pieces[-1]):]
            if not room:
                yield pieces
                pieces, room = [], SLICE
    if pieces:
        yield pieces
