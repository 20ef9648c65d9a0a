"""``--cache-config <cache>,<key>=<value>`` checked and turned into a store, as Triton's server does.

Triton collects the keys per cache name (the flag repeats, one key each), refuses more than one cache
("found multiple cache configurations, but only a single cache is currently supported", core
``server.cc``) and lets the cache library refuse its own keys. ``--response-cache-byte-size N`` is
``local,size=N`` (deprecated in Triton, still honoured; giving both flags is an error there too).
"""

from __future__ import annotations

from typing import Any

from ..errors import TritonError
from .local import MIN_SIZE, LocalCache

REDIS_KEYS = frozenset({"host", "port", "user", "password", "db", "connect_timeout", "socket_timeout",
                        "pool_size", "wait_timeout", "cert", "key", "cacert", "cacert_dir", "sni"})
_REDIS_INTS = ("port", "db", "connect_timeout", "socket_timeout", "pool_size", "wait_timeout")


def check(config: dict[str, dict[str, str]]) -> str | None:
    """Why ``config`` (cache name → keys) cannot start, or None."""
    if not config:
        return None
    if len(config) > 1:
        return "found multiple cache configurations, but only a single cache is currently supported"
    (name, keys), = config.items()
    if name == "local":
        return _check_local(keys)
    if name == "redis":
        return _check_redis(keys)
    return f"unknown cache '{name}': the caches built in are 'local' and 'redis'"


def _check_local(keys: dict[str, str]) -> str | None:
    unknown = sorted(set(keys) - {"size"})
    if unknown:
        return f"unknown local cache setting(s) {', '.join(unknown)}: the local cache takes 'size'"
    try:
        size = int(keys.get("size", ""))
    except ValueError:
        return "the local cache needs an integer size: --cache-config local,size=<bytes>"
    if size < MIN_SIZE:
        return f"local cache size {size} is too small: give at least {MIN_SIZE} bytes"
    return None


def _check_redis(keys: dict[str, str]) -> str | None:
    if "host" not in keys or "port" not in keys:
        return ("Failed to initialize RedisCache, didn't specify address. Must at a minimum specify 'host' and "
                "'port' in the configuration - e.g. tritonserver --cache-config redis,host=redis --cache-config "
                "redis,port=6379 --model-repository=/models ...")
    unknown = sorted(set(keys) - REDIS_KEYS)
    if unknown:
        return f"unknown redis cache setting(s) {', '.join(unknown)}: known are {', '.join(sorted(REDIS_KEYS))}"
    if "sni" in keys:
        return "redis,sni is not supported here: the TLS server name sent is the host"
    for k in _REDIS_INTS:
        if k in keys and not keys[k].lstrip("-").isdigit():
            return f"redis cache setting {k} must be an integer, got '{keys[k]}'"
    return None


def create(config: dict[str, dict[str, str]]) -> Any:
    """The store for a checked ``config`` (None: no cache), not yet connected (its ``open()`` does that)."""
    if not config:
        return None
    reason = check(config)
    if reason is not None:
        raise TritonError.invalid_arg(reason)
    (name, keys), = config.items()
    if name == "local":
        return LocalCache(int(keys["size"]))
    from .redis_store import RedisCache

    return RedisCache(keys)
