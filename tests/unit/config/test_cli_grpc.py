"""tritonserver's gRPC flags → Settings (Triton's keepalive defaults)."""

from __future__ import annotations

import pytest

from triton_actor.config.command_line import parse
from triton_actor.config.settings import default_grpc_max_connections


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


def test_grpc_tls_flags_are_tritons() -> None:
    s = parse(["--model-repository", "m"], environ={})
    assert (s.grpc_use_ssl, s.grpc_use_ssl_mutual, s.grpc_server_cert) == (False, False, "")
    s = parse(["--model-repository", "m", "--grpc-use-ssl-mutual=true", "--grpc-server-cert", "c.pem",
               "--grpc-server-key", "k.pem", "--grpc-root-cert", "ca.pem"], environ={})
    assert (s.grpc_use_ssl, s.grpc_use_ssl_mutual) == (True, True)  # mutual implies TLS
    assert (s.grpc_server_cert, s.grpc_server_key, s.grpc_root_cert) == ("c.pem", "k.pem", "ca.pem")
    with pytest.raises(SystemExit, match="--grpc-server-cert"):
        parse(["--model-repository", "m", "--grpc-use-ssl"], environ={})
    with pytest.raises(SystemExit, match="--grpc-root-cert"):
        parse(["--model-repository", "m", "--grpc-use-ssl-mutual", "--grpc-server-cert", "c", "--grpc-server-key",
               "k"], environ={})


def test_grpc_transport_limits() -> None:
    s = parse(["--model-repository", "m"], environ={})
    assert (s.grpc_max_connections, s.grpc_max_concurrent_streams) == (default_grpc_max_connections(), 128)
    assert (s.grpc_header_timeout_secs, s.grpc_idle_timeout_secs) == (60.0, 180.0)
    s = parse(["--model-repository", "m", "--grpc-max-connections", "10", "--grpc-max-concurrent-streams", "4",
               "--grpc-header-timeout-secs", "2.5", "--grpc-idle-timeout-secs", "0"], environ={})
    assert (s.grpc_max_connections, s.grpc_max_concurrent_streams) == (10, 4)
    assert (s.grpc_header_timeout_secs, s.grpc_idle_timeout_secs) == (2.5, 0.0)
