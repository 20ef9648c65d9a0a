"""``triton-actor`` / ``python -m triton_actor``: tritonserver's flags and defaults (spec §5.2)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from . import __version__, compat_flags, fastpath, log_format, runtime_settings
from .metrics.config import parse_metrics_config
from .protocol import header_forward
from .protocol.codings import GRPC_LEVELS
from .repository import remote
from .settings import Settings, default_grpc_max_connections

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")


def _int_or_bool(text: str) -> int:
    low = text.strip().lower()
    return 1 if low in _TRUE else 0 if low in _FALSE else int(text)


def _flag(parser: argparse.ArgumentParser, name: str, default: bool, help_: str) -> None:
    """Triton booleans: ``--flag``, ``--flag=true`` and ``--flag=false`` all parse."""
    parser.add_argument(name, type=_bool, nargs="?", const=True, default=default, metavar="BOOL", help=help_)


def _backend_config(values: list[str]) -> dict[str, dict[str, str]]:
    """``--backend-config=<backend>,<key>=<value>``; no backend = global (``default-max-batch-size``)."""
    out: dict[str, dict[str, str]] = {}
    for item in values:
        backend, _, setting = item.partition(",") if "," in item else ("", "", item)
        key, sep, value = setting.partition("=")
        if not sep or not key:
            raise SystemExit(f"error: --backend-config expects <backend>,<key>=<value>, got '{item}'")
        out.setdefault(backend, {})[key] = value
    return out


# tritonserver's gRPC keepalive flags → grpc channel arguments, with Triton's defaults (spec §2.4)
GRPC_KEEPALIVE = {
    "--grpc-keepalive-time": ("grpc.keepalive_time_ms", 7_200_000),
    "--grpc-keepalive-timeout": ("grpc.keepalive_timeout_ms", 20_000),
    "--grpc-keepalive-permit-without-calls": ("grpc.keepalive_permit_without_calls", 0),
    "--grpc-http2-max-pings-without-data": ("grpc.http2.max_pings_without_data", 2),
    "--grpc-http2-min-recv-ping-interval-without-data": ("grpc.http2.min_recv_ping_interval_without_data_ms", 300_000),
    "--grpc-http2-max-ping-strikes": ("grpc.http2.max_ping_strikes", 2),
}


def _grpc_transport_flags(p: argparse.ArgumentParser) -> None:
    """TLS (Triton's flags) and the limits of our HTTP/2 transport."""
    _flag(p, "--grpc-use-ssl", False, "serve gRPC over TLS (needs --grpc-server-cert and --grpc-server-key)")
    p.add_argument("--grpc-server-cert", default="", help="PEM certificate (chain) of the gRPC server")
    p.add_argument("--grpc-server-key", default="", help="PEM private key of the gRPC server")
    p.add_argument("--grpc-root-cert", default="", help="PEM CA certificates that client certificates must chain to")
    _flag(p, "--grpc-use-ssl-mutual", False, "require a client certificate (mutual TLS; implies --grpc-use-ssl)")
    p.add_argument("--grpc-max-connections", type=int, default=0,
                   help="gRPC connections served at once (default: min(1000, half the open-file limit))")
    p.add_argument("--grpc-max-concurrent-streams", type=int, default=128, help="HTTP/2 streams per connection")
    p.add_argument("--grpc-header-timeout-secs", type=float, default=60.0,
                   help="a TLS handshake, HTTP/2 preface or header block must complete within this")
    p.add_argument("--grpc-infer-response-compression-level", choices=GRPC_LEVELS, default="none",
                   help="compress ModelInfer / ModelStreamInfer answers for clients that accept gzip or deflate "
                        "(grpc-core's choice per level: low gzip, medium and high deflate when both are accepted)")
    p.add_argument("--grpc-idle-timeout-secs", type=float, default=180.0,
                   help="close gRPC connections without open HTTP/2 streams after this (0 = never)")


def _grpc_tls(args: argparse.Namespace) -> dict[str, object]:
    use_ssl = args.grpc_use_ssl or args.grpc_use_ssl_mutual
    if use_ssl and not (args.grpc_server_cert and args.grpc_server_key):
        raise SystemExit("error: --grpc-use-ssl needs --grpc-server-cert and --grpc-server-key")
    if args.grpc_use_ssl_mutual and not args.grpc_root_cert:
        raise SystemExit("error: --grpc-use-ssl-mutual needs --grpc-root-cert")
    return dict(grpc_use_ssl=use_ssl, grpc_server_cert=args.grpc_server_cert, grpc_server_key=args.grpc_server_key,
                grpc_root_cert=args.grpc_root_cert, grpc_use_ssl_mutual=args.grpc_use_ssl_mutual,
                grpc_max_connections=args.grpc_max_connections or default_grpc_max_connections(),
                grpc_max_concurrent_streams=args.grpc_max_concurrent_streams,
                grpc_header_timeout_secs=args.grpc_header_timeout_secs,
                grpc_idle_timeout_secs=args.grpc_idle_timeout_secs,
                grpc_infer_response_compression_level=args.grpc_infer_response_compression_level)


def _metrics_flags(p: argparse.ArgumentParser) -> None:
    """Prometheus /metrics (Triton's flags) and the StatsD push."""
    _flag(p, "--allow-metrics", True, "serve Prometheus metrics at /metrics on the metrics port")
    p.add_argument("--metrics-port", type=int, default=8002, help="0 picks a free port (logged at start)")
    p.add_argument("--metrics-address", default="0.0.0.0")
    p.add_argument("--metrics-interval-ms", type=int, default=2000, help="CPU/GPU gauge sampling period")
    p.add_argument("--metrics-config", action="append", default=[], metavar="SETTING=VALUE",
                   help="counter_latencies, summary_latencies, histogram_latencies, summary_quantiles (repeatable)")
    p.add_argument("--statsd-host", default="", help="push metrics to this StatsD daemon (default: no push)")
    p.add_argument("--statsd-port", type=int, default=8125)
    p.add_argument("--statsd-prefix", default="triton", help="prefix of every StatsD metric name")
    p.add_argument("--statsd-interval-ms", type=int, default=1000, help="StatsD push period")
    _flag(p, "--statsd-tags", False, "send model, version and reason as Graphite tags (name;model=...)")


def _metrics_settings(args: argparse.Namespace) -> dict[str, object]:
    try:
        config = parse_metrics_config(args.metrics_config)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    if args.metrics_interval_ms < 1 or args.statsd_interval_ms < 1:
        raise SystemExit("error: --metrics-interval-ms and --statsd-interval-ms must be >= 1")
    return dict(metrics_port=args.metrics_port, allow_metrics=args.allow_metrics,
                metrics_address=args.metrics_address, metrics_interval_ms=args.metrics_interval_ms,
                metrics_config=config, statsd_host=args.statsd_host, statsd_port=args.statsd_port,
                statsd_prefix=args.statsd_prefix, statsd_interval_ms=args.statsd_interval_ms,
                statsd_tags=args.statsd_tags)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="triton-actor", description="A Triton-compatible inference server in Python.")
    p.add_argument("--version", action="version", version=f"triton-actor {__version__}")
    p.add_argument("--model-repository", "--model-store", action="append", default=[], dest="repos",
                   metavar="DIR",
                   help="model repository folder, or s3://bucket/prefix (other fsspec schemes too) (repeatable)")
    p.add_argument("--id", default="triton", help="server name in server metadata")
    p.add_argument("--http-address", default="0.0.0.0")
    p.add_argument("--http-port", type=int, default=8000, help="0 picks a free port (logged at start)")
    _flag(p, "--allow-http", True, "serve HTTP/REST")
    p.add_argument("--grpc-address", default="0.0.0.0")
    p.add_argument("--grpc-port", type=int, default=8001, help="0 picks a free port (logged at start)")
    _flag(p, "--allow-grpc", True, "serve gRPC")
    _flag(p, "--reuse-grpc-port", False, "let other processes bind the gRPC port too (SO_REUSEPORT)")
    _grpc_transport_flags(p)
    p.add_argument("--grpc-infer-allocation-pool-size", type=int, default=8, help="accepted for compatibility; unused")
    for flag, (_arg, default) in GRPC_KEEPALIVE.items():
        p.add_argument(flag, type=_int_or_bool, default=default, help=f"gRPC keepalive (default {default})")
    _metrics_flags(p)
    p.add_argument("--http-max-input-size", type=int, default=64 * 1024 * 1024, help="bytes, also after decompression")
    p.add_argument("--http-max-connections", type=int, default=1024,
                   help="open connections on the HTTP port (the metrics port has at most 64; every port draws on "
                        "one count that leaves a quarter of the descriptor limit free); the timeouts below apply "
                        "to both ports")
    p.add_argument("--http-header-timeout-secs", type=float, default=60.0, help="time to send a request head")
    p.add_argument("--http-body-timeout-secs", type=float, default=60.0, help="time between two reads of a body")
    p.add_argument("--http-keepalive-timeout-secs", type=float, default=75.0, help="idle time between requests")
    p.add_argument("--http-send-timeout-secs", type=float, default=60.0,
                   help="time between two writes of an answer to a client that stopped reading")
    p.add_argument("--request-memory-budget", type=int, default=1024 * 1024 * 1024,
                   help="bytes of requests (HTTP bodies, gRPC messages) held at once over all connections: past it "
                        "HTTP bodies wait and gRPC calls get RESOURCE_EXHAUSTED; one larger request runs alone; 0 = no bound")
    p.add_argument("--request-body-min-rate", type=float, default=1024 * 1024,
                   help="bytes/s a request body (HTTP, gRPC) must average once the grace is over, or it is answered "
                        "408 / DEADLINE_EXCEEDED and its share of the budget freed; 0 = no minimum")
    p.add_argument("--request-body-grace-secs", type=float, default=10.0,
                   help="seconds a request body may take before --request-body-min-rate applies")
    _flag(p, "--strict-readiness", True, "ready only when every model is ready")
    _flag(p, "--exit-on-error", True, "exit when a model fails to load at startup")
    p.add_argument("--exit-timeout-secs", type=float, default=30.0, help="time in-flight requests get at shutdown")
    p.add_argument("--disable-auto-complete-config", action="store_true")
    _flag(p, "--strict-model-config", False, "deprecated: true disables auto-complete")
    p.add_argument("--model-control-mode", choices=["none", "poll", "explicit"], default="none")
    p.add_argument("--load-model", action="append", default=[], dest="load_models", metavar="NAME",
                   help="explicit mode: model to load at startup (repeatable; '*' = all)")
    p.add_argument("--repository-poll-secs", type=float, default=15.0,
                   help="poll mode: seconds between repository rescans (0 = no periodic rescan)")
    p.add_argument("--model-load-thread-count", type=int, default=4, help="models loaded in parallel")
    p.add_argument("--model-config-name", default="")
    p.add_argument("--backend-config", action="append", default=[], metavar="BACKEND,KEY=VALUE")
    _flag(p, "--allow-client-shm", False, "let clients register shared-memory regions for tensors")
    p.add_argument("--fast-paths", type=_bool, nargs="?", const=True, default=None, metavar="BOOL",
                   help="every fast path (caches, inline execution, ...) on or off; default: on, or the "
                        "TRITON_ACTOR_FAST_PATHS environment variable")
    p.add_argument("--http-restricted-api", action="append", default=[], metavar="<API>[,<API>...]:<key>=<value>",
                   help="restrict API categories to requests carrying the header <key> with <value> (Triton's)")
    p.add_argument("--grpc-restricted-protocol", action="append", default=[],
                   metavar="<API>[,<API>...]:<key>=<value>", help="the same for gRPC (metadata key)")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="worker processes serving the same ports under gunicorn's arbiter (default 1: "
                        "one process, no arbiter); see conf/gunicorn.conf.py")
    _trace_flags(p)
    _triton_flags(p)
    compat_flags.add_flags(p, _flag, _bool)
    return p


def _triton_flags(p: argparse.ArgumentParser) -> None:
    """More of tritonserver's flags, grouped as its --help groups them."""
    logs = p.add_argument_group("logging (GET/POST /v2/logging shows and changes them at run time)")
    logs.add_argument("--log-verbose", type=int, default=0, help="verbose level; > 0 logs debug messages")
    _flag(logs, "--log-info", True, "log informational messages")
    _flag(logs, "--log-warning", True, "log warnings")
    _flag(logs, "--log-error", True, "log errors")
    logs.add_argument("--log-format", choices=log_format.FORMATS, default="default",
                      help="default: 'I0520 20:03:25.829575 3355 name] msg'; ISO8601: '2024-05-20T20:03:25Z I 3355 "
                           "name] msg'")
    logs.add_argument("--log-file", default="", metavar="PATH", help="append the log to this file, not stderr")
    net = p.add_argument_group("HTTP and gRPC")
    _flag(net, "--reuse-http-port", False, "let other processes bind the HTTP port too (SO_REUSEPORT)")
    net.add_argument("--http-header-forward-pattern", default="", metavar="REGEX",
                     help="HTTP request headers whose name matches (case-insensitive unless the pattern starts "
                          "with (?-i)) reach the model as string parameters")
    net.add_argument("--grpc-header-forward-pattern", default="", metavar="REGEX",
                     help="the same for gRPC metadata")
    net.add_argument("--grpc-max-connection-age", type=int, default=0, metavar="MS",
                     help="a gRPC connection this old gets GOAWAY (running calls finish; 0 = no limit)")
    net.add_argument("--grpc-max-connection-age-grace", type=int, default=0, metavar="MS",
                     help="after its GOAWAY an aged connection is closed within this (0 = when its calls end)")
    metrics = p.add_argument_group("metrics")
    _flag(metrics, "--allow-cpu-metrics", True, "nv_cpu_* families on /metrics")
    _flag(metrics, "--allow-gpu-metrics", True, "nv_gpu_* and nv_energy_consumption families (NVML)")
    models = p.add_argument_group("model loading")
    models.add_argument("--model-load-retry-count", type=int, default=0, metavar="N",
                        help="a model version whose load fails is tried N more times before it is UNAVAILABLE")


def _triton_settings(args: argparse.Namespace) -> dict[str, object]:
    """Settings of :func:`_triton_flags` (checked), and the compatibility flags' notes."""
    for flag, pattern in (("--http-header-forward-pattern", args.http_header_forward_pattern),
                          ("--grpc-header-forward-pattern", args.grpc_header_forward_pattern)):
        try:
            header_forward.compile_pattern(pattern)
        except ValueError as e:
            raise SystemExit(f"error: {flag}: {e}") from None
    if min(args.model_load_retry_count, args.grpc_max_connection_age, args.grpc_max_connection_age_grace) < 0:
        raise SystemExit("error: --model-load-retry-count and --grpc-max-connection-age(-grace) must be >= 0")
    if args.log_verbose < 0:
        raise SystemExit("error: --log-verbose must be >= 0")
    return dict(log_verbose=args.log_verbose, log_info=args.log_info, log_warning=args.log_warning,
                log_error=args.log_error, log_format=args.log_format, log_file=args.log_file,
                reuse_http_port=args.reuse_http_port,
                http_header_forward_pattern=args.http_header_forward_pattern,
                grpc_header_forward_pattern=args.grpc_header_forward_pattern,
                grpc_max_connection_age_secs=args.grpc_max_connection_age / 1000,
                grpc_max_connection_age_grace_secs=args.grpc_max_connection_age_grace / 1000,
                allow_cpu_metrics=args.allow_cpu_metrics and args.allow_metrics,
                allow_gpu_metrics=args.allow_gpu_metrics and args.allow_metrics,
                model_load_retry_count=args.model_load_retry_count,
                ignored_flags=compat_flags.check(args))


def _trace_flags(p: argparse.ArgumentParser) -> None:
    """Triton's ``--trace-config`` and its deprecated single flags (tracing.py records the traces)."""
    p.add_argument("--trace-config", action="append", default=[], metavar="[MODE,]KEY=VALUE",
                   help="trace settings: level=TIMESTAMPS|TENSORS|OFF, rate=N, count=N, triton,file=PATH, "
                        "triton,log-frequency=N")
    for flag, dest in (("--trace-file", "trace_file"), ("--trace-level", "trace_level"),
                       ("--trace-rate", "trace_rate"), ("--trace-count", "trace_count"),
                       ("--trace-log-frequency", "log_frequency")):
        p.add_argument(flag, action="append", default=[], dest=f"deprecated_{dest}", help="deprecated: --trace-config")


def _trace_settings(args: argparse.Namespace) -> dict[str, list[str]]:
    old = {k[len("deprecated_"):]: v for k, v in vars(args).items() if k.startswith("deprecated_trace") or
           k == "deprecated_log_frequency"}
    try:
        return runtime_settings.trace_config(args.trace_config, old)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None


def parse(argv: Sequence[str] | None = None, environ: dict[str, str] | None = None) -> Settings:
    """Command line (and ``TRITON_ACTOR_MODEL_REPOSITORY`` when no repository is given) → Settings."""
    args = build_parser().parse_args(argv)
    env = os.environ if environ is None else environ
    repos = args.repos or ([env["TRITON_ACTOR_MODEL_REPOSITORY"]] if env.get("TRITON_ACTOR_MODEL_REPOSITORY") else [])
    if not repos:
        raise SystemExit("error: --model-repository is required")
    if "*" in args.load_models and len(args.load_models) > 1:
        # tritonserver: "Wildcard model name '*' must be the ONLY startup model if specified at all."
        raise SystemExit("error: --load-model='*' must be the only --load-model if given at all")
    if args.repository_poll_secs < 0:
        raise SystemExit("error: --repository-poll-secs must be >= 0")
    from .protocol.restricted import Restrictions

    for flag, specs in (("--http-restricted-api", args.http_restricted_api),
                        ("--grpc-restricted-protocol", args.grpc_restricted_protocol)):
        try:
            Restrictions(specs, flag)
        except ValueError as e:
            raise SystemExit(f"error: {e}") from None
    if args.workers < 1:
        raise SystemExit("error: --workers must be >= 1")
    if args.request_body_min_rate < 0 or args.request_body_grace_secs < 0:
        raise SystemExit("error: --request-body-min-rate and --request-body-grace-secs must be >= 0")
    if args.model_load_thread_count < 1:
        raise SystemExit("error: --model-load-thread-count must be >= 1")
    return Settings(
        model_repositories=tuple(Path(r).resolve() for r in repos if not remote.is_remote(r)),
        remote_repositories=tuple(r for r in repos if remote.is_remote(r)),
        remote_cache_dir=env.get("TRITON_AWS_MOUNT_DIRECTORY", ""),
        server_id=args.id,
        http_address=args.http_address,
        http_port=args.http_port,
        allow_http=args.allow_http,
        grpc_address=args.grpc_address,
        grpc_port=args.grpc_port,
        allow_grpc=args.allow_grpc,
        grpc_options=(("grpc.so_reuseport", int(args.reuse_grpc_port)),
                      *((arg, int(getattr(args, flag[2:].replace("-", "_")))) for flag, (arg, _) in GRPC_KEEPALIVE.items())),
        **_grpc_tls(args),
        **_metrics_settings(args),
        http_max_input_size=args.http_max_input_size,
        http_max_connections=args.http_max_connections,
        http_header_timeout_secs=args.http_header_timeout_secs,
        http_body_timeout_secs=args.http_body_timeout_secs,
        request_memory_budget=args.request_memory_budget,
        request_body_min_rate=args.request_body_min_rate,
        request_body_grace_secs=args.request_body_grace_secs,
        http_keepalive_timeout_secs=args.http_keepalive_timeout_secs,
        http_send_timeout_secs=args.http_send_timeout_secs,
        **_triton_settings(args),
        strict_readiness=args.strict_readiness,
        exit_on_error=args.exit_on_error,
        exit_timeout_secs=args.exit_timeout_secs,
        auto_complete=not (args.disable_auto_complete_config or args.strict_model_config),
        model_control_mode=args.model_control_mode,
        load_models=tuple(args.load_models),
        repository_poll_secs=args.repository_poll_secs,
        model_load_thread_count=args.model_load_thread_count,
        model_config_name=args.model_config_name,
        backend_config=_backend_config(args.backend_config),
        allow_client_shm=args.allow_client_shm,
        fast_paths=fastpath.enabled if args.fast_paths is None else args.fast_paths,
        workers=args.workers,
        http_restricted_api=tuple(args.http_restricted_api),
        grpc_restricted_protocol=tuple(args.grpc_restricted_protocol),
        trace_config=_trace_settings(args),
    )


def configure_logging(settings: Settings) -> None:
    """The process's log handler: stderr or ``--log-file``, in ``--log-format`` (log_format.py)."""
    try:
        log_format.install(settings.log_file, log_format.start_settings(settings))
    except OSError as e:
        raise SystemExit(f"error: --log-file: cannot open '{settings.log_file}': {e.strerror or e}") from None


def log_ignored_flags(settings: Settings) -> None:
    """One INFO line per tritonserver flag that was given and has no effect here."""
    for flag, why in settings.ignored_flags:
        logging.getLogger("triton_actor.cli").info("%s accepted for compatibility, no effect: %s", flag, why)


def main(argv: Sequence[str] | None = None) -> NoReturn:
    argv = list(sys.argv[1:] if argv is None else argv)
    settings = parse(argv)
    if settings.workers > 1:  # gunicorn's arbiter, unpatched; each worker patches after the fork
        from .workers import arbiter

        arbiter.run(settings, argv)
        sys.exit(0)
    from . import bootstrap  # noqa: F401 - patch before the server's modules import gevent-sensitive stuff

    fastpath.set_enabled(settings.fast_paths)
    configure_logging(settings)
    log_ignored_flags(settings)
    from .server import Server

    code = Server(settings).run()
    # Models are drained and finalized by now. Leave without the interpreter's exit handlers: they
    # would join threads that model code started (e.g. a ThreadPoolExecutor made in initialize()),
    # which can wait forever once their instance thread is gone. Triton kills its stubs likewise.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
