#!/usr/bin/env python3
"""The gRPC designs that lost the measurement, kept runnable so ``bench_grpc.py --variants`` can re-check.

    python scripts/grpc_candidates.py VARIANT [triton-actor flags...]

VARIANT ``grpcio`` (alias ``native``) is ``--grpc-server grpcio`` as shipped (``frontends/grpc_server.py``:
grpcio's sync server on native threads, calls handed to the hub); the default transport,
``frontends/grpc_h2.py``, needs no launcher. The others replace ``GrpcServer`` before the CLI runs:

- ``gevent``: the documented integration, ``grpc.experimental.gevent.init_gevent()``; grpcio's
  threads are greenlets and its completion queue is polled cooperatively on the hub; the servicer
  runs directly in grpcio's (greenlet) handler pool.
- ``aio``: ``grpc.aio`` on its own asyncio loop in a native thread (cygrpc's poller thread made
  native too); each coroutine hands its call to the hub through the same HubPort and awaits an
  asyncio future completed with ``call_soon_threadsafe``. Unary RPCs only (no ModelStreamInfer).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton_actor.bootstrap  # noqa: F401 - patch first, as the CLI does
from triton_actor import server as server_module
from triton_actor.frontends import grpc_server


class GeventGrpcServer(grpc_server.GrpcServer):
    def _runtime(self) -> tuple[Any, Callable[..., Any]]:
        from grpc.experimental import gevent as grpc_gevent

        grpc_gevent.init_gevent()
        return concurrent.futures.ThreadPoolExecutor(16), lambda fn, *args: fn(*args)


class HubHandlerGrpcServer(grpc_server.GrpcServer):
    """grpcio's handlers themselves run in hub greenlets (grpcio's waits on its native conditions
    then block the hub for a polling-thread round trip): fewer thread hops, a blocked hub."""

    def _runtime(self) -> tuple[Any, Callable[..., Any]]:
        from triton_actor.actors.native_threads import NativeFuture, native_threading

        grpc_server.grpc_server_module.threading = native_threading()
        port = self._port

        class HubExecutor:
            def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> NativeFuture:
                future = NativeFuture()

                def run() -> None:
                    try:
                        fn(*args, **kwargs)
                    finally:
                        future._finish()

                port.post(run)
                return future

            def shutdown(self, wait: bool = False) -> None:
                pass

        return HubExecutor(), lambda fn, *args: fn(*args)


class AioGrpcServer(grpc_server.GrpcServer):
    def start(self) -> int:
        import grpc
        from gevent import monkey
        from grpc._cython import cygrpc

        from triton_actor.actors.bridge import call_in_thread
        from triton_actor.actors.native_threads import native_threading
        from triton_actor.errors import TritonError
        from triton_actor.protocol._generated import grpc_service_pb2 as pb

        native = native_threading()
        cygrpc.threading = native  # cygrpc's aio poller thread: native
        started = native.Event()
        box: dict[str, Any] = {}

        def run() -> None:
            loop = asyncio.SelectorEventLoop(monkey.get_original("selectors", "EpollSelector")())
            asyncio.set_event_loop(loop)

            def bridge(method: Callable[[Any], Any]) -> Callable[..., Any]:
                async def handle(request: Any, context: Any) -> Any:
                    fut = loop.create_future()

                    def on_hub() -> None:
                        try:
                            loop.call_soon_threadsafe(fut.set_result, self._guarded(method, request))
                        except BaseException as e:  # noqa: BLE001
                            loop.call_soon_threadsafe(fut.set_exception, e)

                    self._port.post(on_hub)
                    try:
                        return await fut
                    except TritonError as e:
                        await context.abort(grpc_server.GRPC_STATUS[e.code], e.message)

                return handle

            async def main() -> None:
                server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
                handlers = {}
                for m in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods:
                    if m.name != "ModelStreamInfer":
                        handlers[m.name] = grpc.unary_unary_rpc_method_handler(
                            bridge(getattr(self.servicer, m.name)),
                            request_deserializer=getattr(pb, m.input_type.name).FromString,
                            response_serializer=getattr(pb, m.output_type.name).SerializeToString)
                server.add_generic_rpc_handlers(
                    (grpc.method_handlers_generic_handler("inference.GRPCInferenceService", handlers),))
                box["port"] = server.add_insecure_port(f"{self.address}:{self.port}")
                await server.start()
                started.set()
                await server.wait_for_termination()

            loop.run_until_complete(main())

        native.Thread(target=run, daemon=True).start()
        call_in_thread(started.wait, 30)
        self.server_port = box["port"]
        return self.server_port

    def stop(self, grace: float) -> None:
        pass  # measurement only: the process exits


CANDIDATES = {"grpcio": grpc_server.GrpcServer, "native": grpc_server.GrpcServer, "gevent": GeventGrpcServer, "aio": AioGrpcServer,
              "hub": HubHandlerGrpcServer}

if __name__ == "__main__":
    server_module.GrpcServer = CANDIDATES[sys.argv[1]]  # type: ignore[misc]
    from triton_actor.cli import main

    main([*sys.argv[2:], "--grpc-server", "grpcio"])
