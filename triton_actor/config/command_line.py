"""tritonserver's command line → :class:`~.settings.Settings`: the parser, the checks, and the log handler
the settings ask for. The entry point (``cli.py``) and the gunicorn workers both start here; nothing here
imports either."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from .. import __version__
from .. import cache as response_cache
from ..observability import log_format
from ..repository import remote
from ..runtime import fastpath
from . import compat_flags
from .flags import (
    GRPC_KEEPALIVE,
    bool_flag,
    boolean,
    grpc_tls,
    grpc_transport_flags,
    int_or_bool,
    metrics_flags,
    metrics_settings,
    openai_flags,
    openai_settings,
    trace_flags,
    trace_settings,
    triton_flags,
    triton_settings,
)
from .settings import Settings


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


def cache_config(values: list[str], byte_size: int = 0) -> dict[str, dict[str, str]]:
    """``--cache-config <cache>,<key>=<value>[,<key>=<value>...]`` (repeated) and the deprecated
    ``--response-cache-byte-size`` → cache name → keys, checked (cache/settings.py); Triton's texts."""
    if byte_size and values:
        raise SystemExit("error: Incompatible flags --response-cache-byte-size and --cache-config both provided. "
                         "Please provide one or the other.")
    out: dict[str, dict[str, str]] = {"local": {"size": str(byte_size)}} if byte_size else {}
    for item in values:
        name, sep, rest = item.partition(",")
        if not sep or not name:
            raise SystemExit(f"error: No cache specified. --cache-config option format is "
                             f"<cache name>,<setting>=<value>. Got {item}")
        keys = out.setdefault(name, {})
        last = ""
        for piece in rest.split(","):
            key, eq, value = piece.partition("=")
            if eq and key and value:
                keys[key] = value
                last = key
            elif last and not eq:  # a comma inside a value (a password): it belongs to the key before
                keys[last] += "," + piece
            else:
                raise SystemExit(f"error: --cache-config option format is '<cache name>,<setting>=<value>'. Got {item}")
    reason = response_cache.check(out)
    if reason is not None:
        raise SystemExit(f"error: {reason}")
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="triton-actor", description="A Triton-compatible inference server in Python.")
    p.add_argument("--version", action="version", version=f"triton-actor {__version__}")
    p.add_argument("--model-repository", "--model-store", action="append", default=[], dest="repos",
                   metavar="DIR",
                   help="model repository folder, or s3://bucket/prefix (other fsspec schemes too) (repeatable)")
    p.add_argument("--id", default="triton", help="server name in server metadata")
    p.add_argument("--http-address", default="0.0.0.0")
    p.add_argument("--http-port", type=int, default=8000, help="0 picks a free port (logged at start)")
    bool_flag(p, "--allow-http", True, "serve HTTP/REST")
    p.add_argument("--grpc-address", default="0.0.0.0")
    p.add_argument("--grpc-port", type=int, default=8001, help="0 picks a free port (logged at start)")
    bool_flag(p, "--allow-grpc", True, "serve gRPC")
    bool_flag(p, "--reuse-grpc-port", False, "let other processes bind the gRPC port too (SO_REUSEPORT)")
    grpc_transport_flags(p)
    p.add_argument("--grpc-infer-allocation-pool-size", type=int, default=8, help="accepted for compatibility; unused")
    for flag, (_arg, default) in GRPC_KEEPALIVE.items():
        p.add_argument(flag, type=int_or_bool, default=default, help=f"gRPC keepalive (default {default})")
    metrics_flags(p)
    p.add_argument("--http-max-input-size", type=int, default=64 * 1024 * 1024, help="bytes, also after decompression (HTTP bodies and compressed gRPC messages)")
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
    bool_flag(p, "--strict-readiness", True, "ready only when every model is ready")
    bool_flag(p, "--exit-on-error", True, "exit when a model fails to load at startup")
    p.add_argument("--exit-timeout-secs", type=float, default=30.0, help="time in-flight requests get at shutdown")
    p.add_argument("--disable-auto-complete-config", action="store_true")
    bool_flag(p, "--strict-model-config", False, "deprecated: true disables auto-complete")
    p.add_argument("--model-control-mode", choices=["none", "poll", "explicit"], default="none")
    p.add_argument("--load-model", action="append", default=[], dest="load_models", metavar="NAME",
                   help="explicit mode: model to load at startup (repeatable; '*' = all)")
    bool_flag(p, "--model-load-on-demand", False,
              "explicit or poll mode: a request for a repository model that is not loaded loads it first")
    p.add_argument("--model-memory-budget", default="", metavar="BYTES|PERCENT%",
                   help="with --model-load-on-demand: host memory the loaded models may hold (bytes, or a percentage "
                        "of MemTotal); the least recently used idle models are unloaded to make room; with --workers, the "
                        "host's: every worker's copy of a model counts")
    p.add_argument("--repository-poll-secs", type=float, default=15.0,
                   help="poll mode: seconds between repository rescans (0 = no periodic rescan)")
    p.add_argument("--model-load-thread-count", type=int, default=4, help="models loaded in parallel")
    p.add_argument("--model-config-name", default="")
    p.add_argument("--backend-config", action="append", default=[], metavar="BACKEND,KEY=VALUE")
    bool_flag(p, "--allow-client-shm", False, "let clients register shared-memory regions for tensors")
    p.add_argument("--fast-paths", type=boolean, nargs="?", const=True, default=None, metavar="BOOL",
                   help="every fast path (caches, inline execution, ...) on or off; default: on, or the "
                        "TRITON_ACTOR_FAST_PATHS environment variable")
    p.add_argument("--http-restricted-api", action="append", default=[], metavar="<API>[,<API>...]:<key>=<value>",
                   help="restrict API categories to requests carrying the header <key> with <value> (Triton's)")
    p.add_argument("--grpc-restricted-protocol", action="append", default=[],
                   metavar="<API>[,<API>...]:<key>=<value>", help="the same for gRPC (metadata key)")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="worker processes serving the same ports under gunicorn's arbiter (default 1: "
                        "one process, no arbiter); see conf/gunicorn.conf.py")
    trace_flags(p)
    triton_flags(p)
    openai_flags(p)
    compat_flags.add_flags(p, bool_flag, boolean)
    return p


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
    if args.model_load_on_demand and args.model_control_mode not in ("explicit", "poll"):
        raise SystemExit("error: --model-load-on-demand needs --model-control-mode=explicit or poll (in NONE mode "
                         "the repository decides what is loaded)")
    budget = memory_budget(args.model_memory_budget)
    if budget and not args.model_load_on_demand:
        raise SystemExit("error: --model-memory-budget needs --model-load-on-demand (an evicted model must load again "
                         "when a request names it)")
    from ..protocol.restricted import Restrictions

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
        **grpc_tls(args),
        **metrics_settings(args),
        http_max_input_size=args.http_max_input_size,
        http_max_connections=args.http_max_connections,
        http_header_timeout_secs=args.http_header_timeout_secs,
        http_body_timeout_secs=args.http_body_timeout_secs,
        request_memory_budget=args.request_memory_budget,
        request_body_min_rate=args.request_body_min_rate,
        request_body_grace_secs=args.request_body_grace_secs,
        http_keepalive_timeout_secs=args.http_keepalive_timeout_secs,
        http_send_timeout_secs=args.http_send_timeout_secs,
        **triton_settings(args),
        **openai_settings(args),
        strict_readiness=args.strict_readiness,
        exit_on_error=args.exit_on_error,
        exit_timeout_secs=args.exit_timeout_secs,
        auto_complete=not (args.disable_auto_complete_config or args.strict_model_config),
        model_control_mode=args.model_control_mode,
        load_models=tuple(args.load_models),
        model_load_on_demand=args.model_load_on_demand,
        model_memory_budget=budget,
        repository_poll_secs=args.repository_poll_secs,
        model_load_thread_count=args.model_load_thread_count,
        model_config_name=args.model_config_name,
        backend_config=_backend_config(args.backend_config),
        cache_config=cache_config(args.cache_config, args.response_cache_byte_size),
        allow_client_shm=args.allow_client_shm,
        fast_paths=fastpath.enabled if args.fast_paths is None else args.fast_paths,
        workers=args.workers,
        http_restricted_api=tuple(args.http_restricted_api),
        grpc_restricted_protocol=tuple(args.grpc_restricted_protocol),
        trace_config=trace_settings(args),
    )


def configure_logging(settings: Settings) -> None:
    """The process's log handler: stderr or ``--log-file``, in ``--log-format`` (observability/log_format.py)."""
    try:
        log_format.install(settings.log_file, log_format.start_settings(settings))
    except OSError as e:
        raise SystemExit(f"error: --log-file: cannot open '{settings.log_file}': {e.strerror or e}") from None


def log_ignored_flags(settings: Settings) -> None:
    """One INFO line per tritonserver flag that was given and has no effect here."""
    for flag, why in settings.ignored_flags:
        logging.getLogger("triton_actor.cli").info("%s accepted for compatibility, no effect: %s", flag, why)


def memory_budget(text: str) -> int:
    """``--model-memory-budget``: bytes (``2000000000``, ``2G``), or ``N%`` of this host's MemTotal; 0 = none."""
    text = text.strip()
    if not text:
        return 0
    try:
        if text.endswith("%"):
            percent = float(text[:-1])
            if not 0 < percent <= 100:
                raise ValueError
            total = next(int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                         if line.startswith("MemTotal:"))
            return int(total * percent / 100)
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1].upper(), 1)
        value = int(float(text[:-1] if scale > 1 else text) * scale)
        if value <= 0:
            raise ValueError
        return value
    except (ValueError, StopIteration):
        raise SystemExit(f"error: --model-memory-budget={text!r}: give bytes (e.g. 2G) or a percentage of "
                         "host memory (e.g. 25%)") from None
