"""One descriptor count for every port (frontends/descriptors.py): slots, the drain of the connections
waiting longest across ports, and an accept that pauses quietly on EMFILE."""

from __future__ import annotations

import errno
import logging
import resource
import socket

import gevent
import gevent.event
import pytest
from gevent.server import StreamServer

from triton_actor.frontends import descriptors
from triton_actor.frontends.descriptors import ConnectionSlots, Listener


@pytest.mark.parametrize(("soft", "total"), [(1024, 768), (256, 192), (100, 36), (65536, 49152)])
def test_total_leaves_a_quarter_of_the_limit(monkeypatch: pytest.MonkeyPatch, soft: int, total: int) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda which: (soft, resource.RLIM_INFINITY))
    assert descriptors.descriptor_total() == total
    assert descriptors.descriptor_cap(100_000) == total and descriptors.descriptor_cap(10) == 10


@pytest.mark.parametrize(("soft", "regions"), [(1024, 128), (256, 32), (100, 32), (65536, 8192)])
def test_shared_memory_regions_take_half_of_the_rest(monkeypatch: pytest.MonkeyPatch, soft: int, regions: int) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda which: (soft, resource.RLIM_INFINITY))
    assert descriptors.region_total() == regions
    assert soft - descriptors.descriptor_total() - descriptors.region_total() >= 32  # for models and pipes


def test_slots_run_out_then_the_longest_waiting_on_any_port_are_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    slots = ConnectionSlots(total=40)
    clock = [1000.0]
    monkeypatch.setattr(descriptors.time, "monotonic", lambda: clock[0])
    closed: list[tuple[str, int]] = []

    def port(name: str, waiting_since: list[int]):  # a port's lister: its reusable connections
        def close(i: int) -> None:
            closed.append((name, i))
            slots.give()

        return lambda: [(since, lambda i=i: close(i)) for i, since in enumerate(waiting_since)
                        if (name, i) not in closed]

    assert all(slots.take("HTTP") for _ in range(40))
    assert not slots.take("HTTP")  # nobody waits: the new connection is refused
    clock[0] += 1  # past the pause after a drain that found nothing
    slots.register(port("gRPC", [5, 1, 9] + [100] * 30))
    slots.register(port("HTTP", [3, 7]))
    assert slots.take("HTTP") and slots.used == 40 - 32 + 1
    # the 32 waiting longest, across both ports, went first: gRPC 1, HTTP 3, gRPC 5, HTTP 7, gRPC 9, ...
    assert closed[:5] == [("gRPC", 1), ("HTTP", 0), ("gRPC", 0), ("HTTP", 1), ("gRPC", 2)] and len(closed) == 32


def test_accept_out_of_descriptors_pauses_and_resumes_without_a_traceback(monkeypatch: pytest.MonkeyPatch,
                                                                            caplog: pytest.LogCaptureFixture) -> None:
    real_do_read = StreamServer.do_read
    failures = [OSError(errno.EMFILE, "Too many open files")] * 3

    def flaky(self: StreamServer):  # type: ignore[no-untyped-def]
        if failures:
            raise failures.pop()
        return real_do_read(self)

    monkeypatch.setattr(StreamServer, "do_read", flaky)
    handled = gevent.event.Event()
    errors: list[object] = []
    hub = gevent.get_hub()
    monkeypatch.setattr(hub, "handle_error", lambda *args: errors.append(args))
    server = Listener(("127.0.0.1", 0), lambda sock, addr: handled.set())
    server.start()
    port = server.server_port
    try:
        with caplog.at_level(logging.WARNING, logger=descriptors.__name__):
            client = socket.create_connection(("127.0.0.1", port))
            assert handled.wait(10)  # accepted once the pauses (10, 20, 40 ms) were over
            client.close()
    finally:
        server.stop()
    assert not failures and not errors  # three failed accepts, none reported as an error
    assert [r.getMessage() for r in caplog.records].count(
        f"accept on 127.0.0.1:{port} failed (Too many open files): pausing new connections for 0.01 s") == 1


def test_a_drain_that_found_nothing_is_not_repeated_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(descriptors.time, "monotonic", lambda: clock[0])
    slots = ConnectionSlots(total=1)
    listed = []
    slots.register(lambda: listed.append(1) or [])
    assert slots.take("HTTP") and not slots.take("HTTP") and not slots.take("HTTP")
    assert listed == [1]  # the second refusal did not walk the connections again
    clock[0] += 0.09
    assert not slots.take("HTTP") and listed == [1]  # still within the pause
    clock[0] += 0.02
    assert not slots.take("HTTP") and listed == [1, 1]
