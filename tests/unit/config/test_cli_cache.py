"""``--cache-config`` and ``--response-cache-byte-size`` → ``Settings.cache_config``, with Triton's checks."""

from __future__ import annotations

import pytest

from triton_actor.config.command_line import parse


def _cache(*flags: str) -> dict[str, dict[str, str]]:
    return parse(["--model-repository", "m", *flags], environ={}).cache_config


def test_no_flag_no_cache() -> None:
    assert _cache() == {}


def test_local_size_and_the_deprecated_byte_size() -> None:
    assert _cache("--cache-config", "local,size=1048576") == {"local": {"size": "1048576"}}
    assert _cache("--response-cache-byte-size=4096") == {"local": {"size": "4096"}}
    assert _cache("--response-cache-byte-size=0") == {}


def test_redis_one_key_per_flag_or_several_in_one() -> None:
    one = _cache("--cache-config", "redis,host=h", "--cache-config", "redis,port=6379", "--cache-config=redis,db=2")
    assert one == {"redis": {"host": "h", "port": "6379", "db": "2"}}
    assert _cache("--cache-config", "redis,host=h,port=1,pool_size=4") == {
        "redis": {"host": "h", "port": "1", "pool_size": "4"}}


def test_a_comma_inside_a_value_stays_in_it() -> None:
    assert _cache("--cache-config", "redis,host=h,port=1,password=p,q") == {
        "redis": {"host": "h", "port": "1", "password": "p,q"}}


@pytest.mark.parametrize(("flags", "says"), [
    (["--cache-config", "local,size=1", "--response-cache-byte-size=100"], "Incompatible flags"),
    (["--cache-config", "size=100"], "No cache specified"),
    (["--cache-config", "local,size"], "<cache name>,<setting>=<value>"),
    (["--cache-config", "local,size=abc"], "integer size"),
    (["--cache-config", "local,size=10"], "too small"),
    (["--cache-config", "local,size=4096", "--cache-config", "redis,host=h"], "only a single cache"),
    (["--cache-config", "redis,host=h"], "Must at a minimum specify 'host' and 'port'"),
    (["--cache-config", "redis,host=h,port=x"], "port must be an integer"),
    (["--cache-config", "redis,host=h,port=1,colour=red"], "unknown redis cache setting"),
    (["--cache-config", "memcached,size=1"], "unknown cache 'memcached'"),
])
def test_refusals_name_the_problem(flags: list[str], says: str) -> None:
    with pytest.raises(SystemExit) as e:
        _cache(*flags)
    assert says in str(e.value.code)
