"""tritonserver's flag groups for ``triton-actor`` (:mod:`..cli` builds the parser and the Settings): how
each group is added to the parser, and the Settings fields its values become, checked (docs/command-line.md)."""

from __future__ import annotations

import argparse

from ..metrics.config import parse_metrics_config
from ..observability import log_format
from ..observability import log_trace_settings as runtime_settings
from ..protocol import header_forward, restricted
from ..protocol.codings import GRPC_LEVELS
from . import compat_flags
from .settings import default_grpc_max_connections

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def boolean(text: str) -> bool:
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got '{text}'")


def int_or_bool(text: str) -> int:
    low = text.strip().lower()
    return 1 if low in _TRUE else 0 if low in _FALSE else int(text)


def bool_flag(parser: argparse.ArgumentParser, name: str, default: bool, help_: str) -> None:
    """Triton booleans: ``--flag``, ``--flag=true`` and ``--flag=false`` all parse."""
    parser.add_argument(name, type=boolean, nargs="?", const=True, default=default, metavar="BOOL", help=help_)


# tritonserver's gRPC keepalive flags → grpc channel arguments, with Triton's defaults (server's ``src/command_line_parser.cc``)
GRPC_KEEPALIVE = {
    "--grpc-keepalive-time": ("grpc.keepalive_time_ms", 7_200_000),
    "--grpc-keepalive-timeout": ("grpc.keepalive_timeout_ms", 20_000),
    "--grpc-keepalive-permit-without-calls": ("grpc.keepalive_permit_without_calls", 0),
    "--grpc-http2-max-pings-without-data": ("grpc.http2.max_pings_without_data", 2),
    "--grpc-http2-min-recv-ping-interval-without-data": ("grpc.http2.min_recv_ping_interval_without_data_ms", 300_000),
    "--grpc-http2-max-ping-strikes": ("grpc.http2.max_ping_strikes", 2),
}


def grpc_transport_flags(p: argparse.ArgumentParser) -> None:
    """TLS (Triton's flags) and the limits of our HTTP/2 transport."""
    bool_flag(p, "--grpc-use-ssl", False, "serve gRPC over TLS (needs --grpc-server-cert and --grpc-server-key)")
    p.add_argument("--grpc-server-cert", default="", help="PEM certificate (chain) of the gRPC server")
    p.add_argument("--grpc-server-key", default="", help="PEM private key of the gRPC server")
    p.add_argument("--grpc-root-cert", default="", help="PEM CA certificates that client certificates must chain to")
    bool_flag(p, "--grpc-use-ssl-mutual", False, "require a client certificate (mutual TLS; implies --grpc-use-ssl)")
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


def grpc_tls(args: argparse.Namespace) -> dict[str, object]:
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


def metrics_flags(p: argparse.ArgumentParser) -> None:
    """Prometheus /metrics (Triton's flags) and the StatsD push."""
    bool_flag(p, "--allow-metrics", True, "serve Prometheus metrics at /metrics on the metrics port")
    p.add_argument("--metrics-port", type=int, default=8002, help="0 picks a free port (logged at start)")
    p.add_argument("--metrics-address", default="0.0.0.0")
    p.add_argument("--metrics-interval-ms", type=int, default=2000, help="CPU/GPU gauge sampling period")
    p.add_argument("--metrics-config", action="append", default=[], metavar="SETTING=VALUE",
                   help="counter_latencies, summary_latencies, histogram_latencies, summary_quantiles (repeatable)")
    p.add_argument("--statsd-host", default="", help="push metrics to this StatsD daemon (default: no push)")
    p.add_argument("--statsd-port", type=int, default=8125)
    p.add_argument("--statsd-prefix", default="triton", help="prefix of every StatsD metric name")
    p.add_argument("--statsd-interval-ms", type=int, default=1000, help="StatsD push period")
    bool_flag(p, "--statsd-tags", False, "send model, version and reason as Graphite tags (name;model=...)")


def metrics_settings(args: argparse.Namespace) -> dict[str, object]:
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


def triton_flags(p: argparse.ArgumentParser) -> None:
    """More of tritonserver's flags, grouped as its --help groups them."""
    logs = p.add_argument_group("logging (GET/POST /v2/logging shows and changes them at run time)")
    logs.add_argument("--log-verbose", type=int, default=0, help="verbose level; > 0 logs debug messages")
    bool_flag(logs, "--log-info", True, "log informational messages")
    bool_flag(logs, "--log-warning", True, "log warnings")
    bool_flag(logs, "--log-error", True, "log errors")
    logs.add_argument("--log-format", choices=log_format.FORMATS, default="default",
                      help="default: 'I0520 20:03:25.829575 3355 name] msg'; ISO8601: '2024-05-20T20:03:25Z I 3355 "
                           "name] msg'")
    logs.add_argument("--log-file", default="", metavar="PATH", help="append the log to this file, not stderr")
    net = p.add_argument_group("HTTP and gRPC")
    bool_flag(net, "--reuse-http-port", False, "let other processes bind the HTTP port too (SO_REUSEPORT)")
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
    bool_flag(metrics, "--allow-cpu-metrics", True, "nv_cpu_* families on /metrics")
    bool_flag(metrics, "--allow-gpu-metrics", True, "nv_gpu_* and nv_energy_consumption families (NVML)")
    models = p.add_argument_group("model loading")
    models.add_argument("--model-load-retry-count", type=int, default=0, metavar="N",
                        help="a model version whose load fails is tried N more times before it is UNAVAILABLE")
    limits = p.add_argument_group("rate limiter (instance groups' rate_limiter resources and priority)")
    limits.add_argument("--rate-limit", type=str.lower, choices=["off", "execution_count"], default="off",
                        help="execution_count: an instance runs only while it holds its group's resources")
    limits.add_argument("--rate-limit-resource", action="append", default=[], metavar="NAME:COUNT[:DEVICE]",
                        help="copies of a resource (on DEVICE, else on every device and as a global resource)")


def rate_limit_resource(text: str) -> tuple[str, int, int]:
    """``--rate-limit-resource=NAME:COUNT[:DEVICE]`` → (name, device or -2 for every device, count), as
    tritonserver reads it (its error text when it cannot)."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0] or not all(p.isdigit() for p in parts[1:]):
        raise SystemExit(f"error: --rate-limit-resource option format is '<resource_name>:<count>:<device>' or "
                         f"'<resource_name>:<count>'. Got {text}")
    return parts[0], int(parts[2]) if len(parts) == 3 else -2, int(parts[1])


def triton_settings(args: argparse.Namespace) -> dict[str, object]:
    """Settings of :func:`triton_flags` (checked), and the compatibility flags' notes."""
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
                rate_limit=args.rate_limit,
                rate_limit_resources=tuple(rate_limit_resource(r) for r in args.rate_limit_resource),
                ignored_flags=compat_flags.check(args))


def trace_flags(p: argparse.ArgumentParser) -> None:
    """Triton's ``--trace-config`` and its deprecated single flags (observability/tracing.py records the traces)."""
    p.add_argument("--trace-config", action="append", default=[], metavar="[MODE,]KEY=VALUE",
                   help="trace settings: level=TIMESTAMPS|TENSORS|OFF, rate=N, count=N, triton,file=PATH, "
                        "triton,log-frequency=N, mode=triton|opentelemetry, opentelemetry,url=URL, "
                        "opentelemetry,resource=KEY=VALUE, opentelemetry,bsp_max_queue_size=N (bsp_schedule_delay, "
                        "bsp_max_export_batch_size)")
    for flag, dest in (("--trace-file", "trace_file"), ("--trace-level", "trace_level"),
                       ("--trace-rate", "trace_rate"), ("--trace-count", "trace_count"),
                       ("--trace-log-frequency", "log_frequency")):
        p.add_argument(flag, action="append", default=[], dest=f"deprecated_{dest}", help="deprecated: --trace-config")


def trace_settings(args: argparse.Namespace) -> dict[str, list[str]]:
    old = {k[len("deprecated_"):]: v for k, v in vars(args).items() if k.startswith("deprecated_trace") or
           k == "deprecated_log_frequency"}
    try:
        return runtime_settings.trace_config(args.trace_config, old)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None


def openai_flags(p: argparse.ArgumentParser) -> None:
    """The OpenAI-compatible API (docs/openai.md): Triton's OpenAI frontend's flags that apply here."""
    g = p.add_argument_group("OpenAI-compatible API (/v1/... on the HTTP port, and on --openai-port when given)")
    g.add_argument("--openai-port", type=int, default=None,
                   help="also serve the /v1 routes alone on this port (Triton's frontend: 9000; 0 picks a free one)")
    g.add_argument("--tokenizer", default="", metavar="FOLDER|ID",
                   help="the tokenizer whose chat template every model's chat requests use (default: each "
                        "model's own tokenizer folder, else a simple fallback template)")
    g.add_argument("--default-max-tokens", type=int, default=16, metavar="N",
                   help="tokens generated when a request does not say (Triton's default: 16)")
    g.add_argument("--openai-restricted-api", nargs=3, action="append", default=[],
                   metavar=("APIs", "KEY", "VALUE"),
                   help="'<API>[,<API>...] <header> <value>': the APIs (inference, model-repository) need "
                        "that header (Triton's OpenAI frontend's syntax); 401 otherwise")


def openai_settings(args: argparse.Namespace) -> dict[str, object]:
    try:
        restricted.openai_rules(args.openai_restricted_api)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    if args.default_max_tokens < 1:
        raise SystemExit("error: --default-max-tokens must be >= 1")
    return dict(openai_port=args.openai_port, tokenizer=args.tokenizer, default_max_tokens=args.default_max_tokens,
                openai_restricted_api=tuple(tuple(spec) for spec in args.openai_restricted_api))
