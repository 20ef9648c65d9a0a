"""Background traffic for the fault suite: clients that keep asking a model while a fault happens.

Each client is a greenlet of the (patched) test process with its own official client, HTTP or gRPC,
sending identity requests with a fresh value each time and checking the answer. A client stops after
``limit`` requests or when :meth:`Traffic.stop` is called; every request is counted as an answer or a
failure (with its text), so a test can assert that every request that should have succeeded did.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import gevent
import gevent.event
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from .model_control import wait_for
from .server import ServerProcess

_values = itertools.count(1)


def identity_call(protocol: str, server: ServerProcess, model: str) -> tuple[Callable[[float], float], Callable[[], None]]:
    """``(ask, close)``: ``ask(x)`` sends [x] (FP32, INPUT0) to ``model`` and returns OUTPUT0[0]."""
    if protocol == "grpc":
        g = grpcclient.InferenceServerClient(server.grpc_url)

        def ask_grpc(x: float) -> float:
            i = grpcclient.InferInput("INPUT0", [1], "FP32")
            i.set_data_from_numpy(np.array([x], np.float32))
            return float(g.infer(model, [i], client_timeout=60).as_numpy("OUTPUT0")[0])

        return ask_grpc, g.close
    h = httpclient.InferenceServerClient(server.url, connection_timeout=60, network_timeout=60)

    def ask_http(x: float) -> float:
        i = httpclient.InferInput("INPUT0", [1], "FP32")
        i.set_data_from_numpy(np.array([x], np.float32))
        return float(h.infer(model, [i]).as_numpy("OUTPUT0")[0])

    return ask_http, h.close


def ask_once(protocol: str, server: ServerProcess, model: str, x: float) -> float:
    """One request on a client of its own (closed after)."""
    ask, close = identity_call(protocol, server, model)
    try:
        return ask(x)
    finally:
        close()


class Traffic:
    """``per_protocol`` HTTP clients and as many gRPC clients asking ``model`` (an identity model unless
    ``check`` says otherwise) in greenlets, each at most ``limit`` requests, until :meth:`stop`."""

    def __init__(self, server: ServerProcess, model: str, per_protocol: int = 2, limit: int = 20000,
                 check: Callable[[float, float], bool] = float.__eq__) -> None:
        self.model = model
        self.ok = 0
        self.failures: list[str] = []
        self._check = check  # check(sent, got): the answer is right
        self._stop = gevent.event.Event()
        protocols = ["http", "grpc"] * per_protocol
        self._greenlets = [gevent.spawn(self._run, p, server, limit) for p in protocols]

    def _run(self, protocol: str, server: ServerProcess, limit: int) -> None:
        ask, close = identity_call(protocol, server, self.model)
        try:
            for _ in range(limit):
                if self._stop.is_set():
                    return
                x = float(next(_values) % 1000)
                try:
                    got = ask(x)
                except Exception as e:
                    self.failures.append(f"{protocol} {self.model}: {type(e).__name__}: {e}")
                    gevent.sleep(0.01)  # a failing server answers at once: do not spin
                else:
                    if self._check(x, got):
                        self.ok += 1
                    else:
                        self.failures.append(f"{protocol} {self.model}: sent {x}, got {got}")
        finally:
            close()

    def wait_answers(self, n: int, what: str = "") -> None:
        """Wait until ``n`` more requests were answered (the traffic really overlaps what comes next)."""
        target = self.ok + n
        wait_for(lambda: self.ok >= target or bool(self.failures) or self.done, 60,
                 what or f"{n} answers from {self.model}")

    @property
    def done(self) -> bool:
        return all(g.dead for g in self._greenlets)

    def stop(self) -> Traffic:
        self._stop.set()
        gevent.joinall(self._greenlets, timeout=90)
        assert self.done, f"clients of {self.model} still waiting for an answer"
        return self

    def assert_all_succeeded(self) -> int:
        """Every request sent was answered correctly; the count (printed for the record)."""
        self.stop()
        assert not self.failures, f"{len(self.failures)} of {self.ok + len(self.failures)} failed: {self.failures[:5]}"
        assert self.ok > 0
        print(f"{self.model}: {self.ok} of {self.ok} requests succeeded")
        return self.ok
