"""``redis``: the response cache in a Redis server, shared by every worker and server pointed at it.

Triton's redis cache (https://github.com/triton-inference-server/redis_cache) is a client with a
connection pool; it pings at start (a server that does not answer stops Triton from starting) and
afterwards turns every Redis error into a miss with an error in the log. Here: the ``redis`` PyPI
client over gevent's patched sockets, so a lookup waits in the calling greenlet and the hub goes on
(the front runs each lookup in a greenlet of its own, never in a reader). Connections come from a
pool of ``pool_size``; a greenlet waits at most ``wait_timeout`` ms for one, then it is a miss. A
Redis that goes away is logged once when it does and once when it answers again; meanwhile every
request is a miss and runs its model. Values are :func:`.entry.encode`'s bytes under
``triton_actor:<digest>`` (SET/GET; expiry is the Redis server's ``maxmemory-policy``).
"""

from __future__ import annotations

import logging
from typing import Any

import gevent.lock

from ..errors import TritonError
from .counters import StoreCounters
from .entry import Entry, decode, encode

log = logging.getLogger(__name__)

PREFIX = b"triton_actor:"
_TLS_KEYS = {"cert": "ssl_certfile", "key": "ssl_keyfile", "cacert": "ssl_ca_certs", "cacert_dir": "ssl_ca_path"}


def _ms(keys: dict[str, str], name: str, default: int) -> float | None:
    """Triton's milliseconds, 0 = wait for ever (None to redis-py)."""
    value = int(keys.get(name, default))
    return value / 1000 if value > 0 else None


def connection_options(keys: dict[str, str]) -> dict[str, Any]:
    """``--cache-config redis,<key>=<value>`` → redis-py ``ConnectionPool`` arguments (keys as Triton names them)."""
    import redis

    options: dict[str, Any] = {
        "host": keys["host"], "port": int(keys["port"]), "db": int(keys.get("db", 0)),
        "username": keys.get("user") or None, "password": keys.get("password") or None,
        "socket_connect_timeout": _ms(keys, "connect_timeout", 0), "socket_timeout": _ms(keys, "socket_timeout", 0),
        "max_connections": max(1, int(keys.get("pool_size", 1))),
    }
    tls = {arg: keys[k] for k, arg in _TLS_KEYS.items() if keys.get(k)}
    if tls:  # Triton turns TLS on when any TLS key is given
        options.update(connection_class=redis.SSLConnection, **tls)
    return options


class RedisCache:
    """A client of one Redis server; methods run in the calling greenlet (they wait on the network)."""

    name = "redis"
    blocking = True  # the front looks up in a greenlet of its own

    def __init__(self, keys: dict[str, str]) -> None:
        import redis

        options = connection_options(keys)
        self.address = f"{options['host']}:{options['port']}"
        self._pool = redis.ConnectionPool(**options)
        self._client = redis.Redis(connection_pool=self._pool)
        self._slots = gevent.lock.BoundedSemaphore(options["max_connections"])
        self._wait = _ms(keys, "wait_timeout", 100)
        self.down = False
        self.errors = 0
        self.counters = StoreCounters()  # counted by the version fronts (nv_cache_* gauges)

    def metrics(self) -> dict[str, int]:
        """Entries, bytes and evictions are the Redis server's own (its INFO): 0 here, as in Triton."""
        return self.counters.snapshot(0, 0, 0, 0)

    def open(self) -> None:
        """Ping once before models load: a Redis that does not answer stops the start, as Triton's ping does."""
        import redis

        try:
            self._client.ping()
        except (redis.RedisError, OSError) as e:
            self._pool.disconnect()
            raise TritonError.internal(f"Failed to initialize RedisCache: {e}") from None

    def lookup(self, key: bytes) -> Entry | None:
        blob = self._call("GET", PREFIX + key)
        if blob is None:
            return None
        try:
            return decode(blob)
        except (ValueError, KeyError, TypeError) as e:  # not ours, or written by another format: a miss
            log.warning("redis cache: entry at %r unreadable, ignored: %s", PREFIX + key, e)
            return None

    def insert(self, key: bytes, entry: Entry) -> bool:
        return self._call("SET", PREFIX + key, encode(entry)) is not None

    def grow(self, key: bytes, entry: Entry, n: int) -> bool:
        """Nothing is kept beside an entry: each lookup decodes a new one from the server's bytes."""
        return False

    def _call(self, command: str, *args: Any) -> Any:
        """One command; any failure is None (a miss, an entry not kept), logged once per outage."""
        import redis

        if not self._slots.acquire(timeout=self._wait):
            return None  # the pool is busy for longer than wait_timeout, as Triton's pool wait
        try:
            result = self._client.execute_command(command, *args)
        except (redis.RedisError, OSError) as e:
            self.errors += 1
            if not self.down:
                self.down = True
                log.error("redis cache at %s failed (%s): requests run their models until it answers again",
                          self.address, e)
            return None
        finally:
            self._slots.release()
        if self.down:
            self.down = False
            log.info("redis cache at %s answers again", self.address)
        return result

    def close(self) -> None:
        self._pool.disconnect()
