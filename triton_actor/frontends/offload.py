"""One rule for both front ends on when converting a request or response is too much work for the hub.

Decoding typed values (JSON numbers on HTTP, ``contents`` on gRPC) and writing a big JSON response are
pure Python over every element: 14 M FP32 values took 1.2 s, a MiB of JSON ~20 ms. On the hub that is
time no other client is served. So each conversion states its work in elements (:func:`json_work` for
JSON text, ``v2_grpc.decode_work`` for a gRPC message, ``v2_http_response.json_output_elements`` for a
JSON response); up to :data:`WORK_ON_HUB` it runs on the hub (a few ms, no thread hop), above it on a
native thread, one such conversion at a time for the whole server (HTTP and gRPC share the one
:class:`Offload` the ``Server`` builds), so the hub serves the other clients between its steps and
big conversions do not pile up threads and memory. The garbage collector is paused during one (see
:func:`_without_collections`). The converters must not touch the data plane on the thread: what they
need of the model (its route) is looked up before.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import TypeVar

import gevent.lock

from ..errors import TritonError
from ..runtime.bridge import call_in_thread

T = TypeVar("T")

WORK_ON_HUB = 1 << 18  # elements converted on the hub; ~10 ms of the slowest conversion
JSON_BYTES_PER_ELEMENT = 4  # a JSON number with its separator: 1 MiB of JSON text is about WORK_ON_HUB elements


def json_work(text_bytes: int) -> int:
    """The work, in elements, of converting ``text_bytes`` of JSON into tensors."""
    return text_bytes // JSON_BYTES_PER_ELEMENT


class Offload:
    """Runs conversions by the one rule; owned by the ``Server``, shared by its front ends (hub greenlets)."""

    __slots__ = ("_one",)

    def __init__(self) -> None:
        self._one = gevent.lock.Semaphore()  # the one big conversion running off the hub

    def run(self, work: int, convert: Callable[..., T], *args: object) -> T:
        """``convert(*args)``: here if ``work`` elements are few enough, else on a native thread in turn."""
        if work <= WORK_ON_HUB:
            return convert(*args)
        with self._one:
            return call_in_thread(_without_collections, convert, *args)


def _without_collections(convert: Callable[..., T], *args: object) -> T:
    """``convert(*args)`` with the cyclic garbage collector paused. A JSON body of many small objects
    (24 MB of one-element inputs: 2.4 million dicts and lists) triggers collection after collection
    while orjson builds it, each a pass over the whole heap that no other thread can interrupt: the
    parse took 1.0 s with them, 0.23 s without. What a conversion builds holds no cycles, and
    conversions come here one at a time; a collector someone else turned off stays off.

    A refusal leaves without its traceback: the converter's frames hold the parsed body, which would
    otherwise live on with the error into the hub, where a collection then walks all of it (2 s
    held up the other clients in ``scripts/bench_hostile.py --many-inputs``); here it is freed before
    the collector is back."""
    paused = gc.isenabled()
    gc.disable()
    try:
        return convert(*args)
    except TritonError as e:
        raise e.with_traceback(None) from None
    finally:
        if paused:
            gc.enable()
