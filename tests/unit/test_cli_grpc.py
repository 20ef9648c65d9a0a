"""tritonserver's gRPC flags → Settings (spec §2.4 keepalive defaults)."""

from __future__ import annotations

from triton_actor.cli import parse


def test_grpc_defaults_are_tritons() -> None:
    s = parse(["--model-repository", "m"], environ={})
    assert (s.grpc_address, s.grpc_port, s.allow_grpc) == ("0.0.0.0", 8001, True)
    assert dict(s.grpc_options) == {
        "grpc.so_reuseport": 0, "grpc.keepalive_time_ms": 7_200_000, "grpc.keepalive_timeout_ms": 20_000,
        "grpc.keepalive_permit_without_calls": 0, "grpc.http2.max_pings_without_data": 2,
        "grpc.http2.min_recv_ping_interval_without_data_ms": 300_000, "grpc.http2.max_ping_strikes": 2,
    }


def test_grpc_flags() -> None:
    s = parse(["--model-repository", "m", "--grpc-port", "0", "--allow-grpc=false", "--reuse-grpc-port",
               "--grpc-keepalive-time=1000", "--grpc-keepalive-permit-without-calls=true",
               "--grpc-infer-allocation-pool-size", "16"], environ={})
    options = dict(s.grpc_options)
    assert (s.grpc_port, s.allow_grpc) == (0, False)
    assert (options["grpc.so_reuseport"], options["grpc.keepalive_time_ms"]) == (1, 1000)
    assert options["grpc.keepalive_permit_without_calls"] == 1


def test_grpc_server_choice() -> None:
    assert parse(["--model-repository", "m"], environ={}).grpc_server == "builtin"
    assert parse(["--model-repository", "m", "--grpc-server", "grpcio"], environ={}).grpc_server == "grpcio"
