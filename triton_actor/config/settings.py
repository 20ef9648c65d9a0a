"""Server settings, read once (defaults < environment < command line) and passed down."""

from __future__ import annotations

import resource
from dataclasses import dataclass, field
from pathlib import Path

from ..metrics.config import MetricsConfig


def default_grpc_max_connections() -> int:
    """min(1000, half the soft RLIMIT_NOFILE): each connection is a descriptor, and models, files and
    the HTTP port need theirs (1000 against the common soft limit of 1024 ended in EMFILE)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return 1000 if soft == resource.RLIM_INFINITY else max(1, min(1000, soft // 2))


@dataclass(frozen=True, slots=True)
class Settings:
    """Every knob, named as tritonserver's flags (docs/command-line.md)."""

    model_repositories: tuple[Path, ...] = ()
    # object-store repositories (s3://bucket/prefix, other fsspec schemes), mirrored to a local cache
    # folder under remote_cache_dir (Triton's TRITON_AWS_MOUNT_DIRECTORY; empty = the system temp folder)
    remote_repositories: tuple[str, ...] = ()
    remote_cache_dir: str = ""
    server_id: str = "triton"
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    allow_http: bool = True
    reuse_http_port: bool = False  # SO_REUSEPORT on the HTTP port (Triton's --reuse-http-port)
    # request headers (HTTP) / metadata (gRPC) whose name matches are forwarded to the model as string
    # parameters (Triton's --http/grpc-header-forward-pattern; protocol/header_forward.py); "" = none
    http_header_forward_pattern: str = ""
    grpc_header_forward_pattern: str = ""
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    allow_grpc: bool = True
    grpc_options: tuple[tuple[str, int], ...] = ()  # grpc channel arguments (keepalive flags)
    grpc_use_ssl: bool = False  # TLS on the gRPC port (Triton's --grpc-use-ssl*)
    grpc_server_cert: str = ""
    grpc_server_key: str = ""
    grpc_root_cert: str = ""  # CA that client certificates must chain to (mutual TLS)
    grpc_use_ssl_mutual: bool = False
    # served at once; more wait in the listen backlog
    grpc_max_connections: int = field(default_factory=default_grpc_max_connections)
    grpc_max_concurrent_streams: int = 128  # HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS (nginx's default)
    grpc_header_timeout_secs: float = 60.0  # TLS handshake, preface, SETTINGS or a header block (nginx's)
    grpc_idle_timeout_secs: float = 180.0
    # grpc.max_connection_age_ms / _grace_ms: GOAWAY once a connection is this old, closed after the grace
    # (seconds; 0 = never / no limit to the grace, as grpc-core's defaults)
    grpc_max_connection_age_secs: float = 0.0
    grpc_max_connection_age_grace_secs: float = 0.0  # a connection without open streams is closed (GOAWAY); 0 = never
    # Triton's --grpc-infer-response-compression-level: none, low, medium, high (codings.grpc_response_coding)
    grpc_infer_response_compression_level: str = "none"
    metrics_port: int = 8002
    allow_metrics: bool = True  # GET /metrics on metrics_address:metrics_port (triton_actor.metrics)
    metrics_address: str = "0.0.0.0"
    metrics_interval_ms: int = 2000  # CPU/GPU gauges are sampled this often
    allow_cpu_metrics: bool = True  # nv_cpu_* families on /metrics (Triton's --allow-cpu-metrics)
    allow_gpu_metrics: bool = True  # nv_gpu_* / nv_energy_* families (NVML)
    metrics_config: MetricsConfig = field(default_factory=MetricsConfig)
    statsd_host: str = ""  # empty: no StatsD push
    statsd_port: int = 8125
    statsd_prefix: str = "triton"
    statsd_interval_ms: int = 1000
    statsd_tags: bool = False  # model/version/reason as Graphite tags instead of path components
    http_max_input_size: int = 64 * 1024 * 1024
    # HTTP connection bounds, nginx's defaults (worker_connections is 512-1024; client_header_timeout,
    # client_body_timeout, keepalive_timeout); the metrics port has them too, each port its own cap
    http_max_connections: int = 1024
    http_header_timeout_secs: float = 60.0
    http_body_timeout_secs: float = 60.0
    http_keepalive_timeout_secs: float = 75.0
    http_send_timeout_secs: float = 60.0
    # bytes of request bodies / gRPC messages all connections may hold at once (frontends/budget.py); 0 = no bound
    request_memory_budget: int = 1024 * 1024 * 1024
    # a request body (HTTP/1, gRPC) must average this many bytes/s after the grace (mod_reqtimeout's MinRate): a
    # slow client cannot hold what it reserved of the budget for ever (docs/security.md#slow-request-bodies); 0 = no minimum
    request_body_min_rate: float = 1024 * 1024
    request_body_grace_secs: float = 10.0
    log_verbose: int = 0
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    log_format: str = "default"  # Triton's "default" or "ISO8601" line format (observability/log_format.py)
    log_file: str = ""  # log to this file instead of stderr
    strict_readiness: bool = True
    exit_on_error: bool = True
    exit_timeout_secs: float = 30.0
    auto_complete: bool = True
    model_control_mode: str = "none"
    load_models: tuple[str, ...] = ()  # --load-model (explicit mode); ("*",) = every model
    model_load_on_demand: bool = False  # explicit or poll mode: a request loads a repository model (plane/on_demand.py)
    model_memory_budget: int = 0  # bytes the loaded models may hold, 0 = no budget (plane/memory_budget.py)
    repository_poll_secs: float = 15.0  # poll mode; 0 disables the periodic rescan
    model_load_thread_count: int = 4  # models that load at the same time
    model_load_retry_count: int = 0  # a version whose load fails is tried this many more times
    model_config_name: str = ""
    backend_config: dict[str, dict[str, str]] = field(default_factory=dict)
    # --cache-config: cache name ("local" or "redis") → its keys, checked (cache/settings.py); empty = no cache
    cache_config: dict[str, dict[str, str]] = field(default_factory=dict)
    allow_client_shm: bool = False
    trace_config: dict[str, list[str]] = field(default_factory=dict)  # --trace-config (observability/log_trace_settings.py)
    fast_paths: bool = True  # triton_actor.runtime.fastpath: applied process-wide at start-up
    http_restricted_api: tuple[str, ...] = ()  # --http-restricted-api specs (protocol/restricted.py)
    grpc_restricted_protocol: tuple[str, ...] = ()  # --grpc-restricted-protocol specs
    # the OpenAI-compatible API (frontends/openai_routes.py): its own port besides the HTTP port's /v1 routes
    # (None: none), one tokenizer for every chat template ("" = each model's own), --openai-restricted-api
    openai_port: int | None = None
    tokenizer: str = ""
    default_max_tokens: int = 16
    openai_restricted_api: tuple[tuple[str, str, str], ...] = ()
    workers: int = 1  # --workers: processes under gunicorn's arbiter (triton_actor/workers/)
    rate_limit: str = "off"  # --rate-limit: "execution_count" turns the rate limiter on
    # --rate-limit-resource: (name, device or -2 for every device, count)
    rate_limit_resources: tuple[tuple[str, int, int], ...] = ()
    # tritonserver flags given that have no effect here: (flag, why), logged once at start (config/compat_flags.py)
    ignored_flags: tuple[tuple[str, str], ...] = ()
