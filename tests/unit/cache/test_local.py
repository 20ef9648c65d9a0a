"""The local cache's LRU by bytes, the entry copies and their Redis encoding, and the request key."""

from __future__ import annotations

import numpy as np

from triton_actor.cache import entry as cache_entry
from triton_actor.cache.keys import request_key
from triton_actor.cache.local import LocalCache
from triton_actor.inference import InferInput, InferRequest, InferResponse, RequestedOutput
from triton_actor.protocol.dtypes import BY_WIRE


def _entry(n: int, value: float = 0.0) -> cache_entry.Entry:
    kept = cache_entry.from_response(InferResponse([("OUT", np.full(n, value, np.float32))]))
    assert kept is not None
    return kept


def test_least_recently_used_goes_first_when_the_bytes_are_spent() -> None:
    one = _entry(100).nbytes + 1  # the entry and its one-byte key
    cache = LocalCache(3 * one)
    for key in (b"a", b"b", b"c"):
        assert cache.insert(key, _entry(100))
    assert cache.lookup(b"a") is not None  # a is now the most recent
    cache.insert(b"d", _entry(100))
    assert cache.lookup(b"b") is None and cache.evictions == 1
    assert {k for k in (b"a", b"c", b"d") if cache.lookup(k) is not None} == {b"a", b"c", b"d"}
    assert cache.used == 3 * one


def test_an_entry_larger_than_the_cache_is_not_kept() -> None:
    cache = LocalCache(1024)
    assert not cache.insert(b"big", _entry(1000))
    assert len(cache) == 0 and cache.used == 0


def test_replacing_a_key_frees_its_old_bytes() -> None:
    cache = LocalCache(4096)
    cache.insert(b"k", _entry(100))
    cache.insert(b"k", _entry(200))
    assert len(cache) == 1 and cache.used == _entry(200).nbytes + 1


def test_hits_are_fresh_responses_over_read_only_copies() -> None:
    produced = np.arange(4, dtype=np.float32)
    kept = cache_entry.from_response(InferResponse([("OUT", produced)], {"p": 1}))
    assert kept is not None
    produced[:] = -1  # the model reuses its buffer: the entry does not change
    first, second = kept.response(), kept.response()
    assert first is not second and first.outputs is not second.outputs
    np.testing.assert_array_equal(first.outputs[0][1], np.arange(4, dtype=np.float32))
    assert not first.outputs[0][1].flags.writeable and first.parameters == {"p": 1}


def test_redis_bytes_round_trip_numbers_and_bytes() -> None:
    strings = np.array([b"a", b"", b"xyz"], dtype=object).reshape(3, 1)
    kept = cache_entry.from_response(InferResponse([("N", np.eye(2, dtype=np.int64)), ("S", strings)], {"q": "v"}))
    assert kept is not None
    back = cache_entry.decode(cache_entry.encode(kept))
    np.testing.assert_array_equal(back.outputs[0][1], np.eye(2, dtype=np.int64))
    assert back.outputs[1][1].shape == (3, 1) and list(back.outputs[1][1].reshape(-1)) == [b"a", b"", b"xyz"]
    assert back.parameters == {"q": "v"}


def _request(data: np.ndarray, wire: str = "FP32", **kw: object) -> InferRequest:
    return InferRequest("m", -1, "id", {"IN": InferInput("IN", BY_WIRE[wire], data.shape, data)}, **kw)  # type: ignore[arg-type]


def test_the_key_covers_model_version_bytes_shape_type_outputs_and_parameters() -> None:
    a = np.arange(4, dtype=np.float32)
    base = request_key("m", 1, _request(a))
    assert request_key("m", 1, _request(a.copy())) == base  # same question, same key (the id does not count)
    others = [
        request_key("n", 1, _request(a)), request_key("m", 2, _request(a)), request_key("m", 1, _request(a + 1)),
        request_key("m", 1, _request(a.reshape(2, 2))), request_key("m", 1, _request(a.view(np.int32), "INT32")),
        request_key("m", 1, _request(a, outputs=(RequestedOutput("OUT"),))),
        request_key("m", 1, _request(a, parameters={"temperature": 0.5})),
    ]
    assert len({base, *others}) == len(others) + 1


def test_bytes_elements_are_length_prefixed() -> None:
    one = np.array([b"ab", b"c"], dtype=object)
    two = np.array([b"a", b"bc"], dtype=object)
    assert request_key("m", 1, _request(one, "BYTES")) != request_key("m", 1, _request(two, "BYTES"))


def test_encoded_answers_kept_beside_an_entry_count_in_its_bytes() -> None:
    one = _entry(100).nbytes + 1
    cache = LocalCache(3 * one)
    entries = {key: _entry(100) for key in (b"a", b"b", b"c")}
    for key, kept in entries.items():
        cache.insert(key, kept)
    assert cache.grow(b"a", entries[b"a"], one)  # room made: b, the least recently used, goes
    assert cache.lookup(b"b") is None and cache.evictions == 1
    assert cache.used == 3 * one and entries[b"a"].extra == one
    cache.insert(b"d", _entry(100))  # c goes
    assert cache.lookup(b"c") is None and cache.evictions == 2
    cache.insert(b"e", _entry(100))  # then a (just looked up by no one): its bytes and what was kept beside it
    assert cache.lookup(b"a") is None and cache.used == 2 * one and cache.evictions == 3


def test_growing_is_refused_for_a_replaced_entry_or_past_the_size() -> None:
    cache = LocalCache(4096)
    old = _entry(100)
    cache.insert(b"k", old)
    cache.insert(b"k", _entry(100))  # replaced meanwhile: what the old one's hit encoded is not kept
    assert not cache.grow(b"k", old, 10)
    assert not cache.grow(b"gone", old, 10)
    kept = cache.lookup(b"k")
    assert kept is not None and not cache.grow(b"k", kept, 4096)
    assert cache.used == kept.nbytes + 1 and kept.extra == 0
