"""Content codings (protocol/codings.py) and their driver (frontends/compression.py): a compressed body
is inflated a slice at a time, each slice's bytes reserved before they are made, the big ones on a
native thread; answers are compressed the same way; ``Accept-Encoding`` is read as Triton reads it."""

from __future__ import annotations

import gzip
import zlib

import pytest

from triton_actor.frontends import compression
from triton_actor.protocol import codings
from triton_actor.protocol.codings import Inflation

MIB = 1 << 20


def _gzip_zeros(n: int) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    return c.compress(bytes(n)) + c.flush()


class _Budget:
    """A ``hold`` that refuses past ``limit`` and records what was held, as the front ends' do."""

    def __init__(self, limit: int = 1 << 40) -> None:
        self.limit, self.held, self.most = limit, 0, 0

    def __call__(self, n: int) -> None:
        if self.held + n > self.limit:
            raise MemoryError("budget")
        self.held += n
        self.most = max(self.most, self.held)


@pytest.fixture
def thread_calls(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The slices sent to a native thread (they still run there)."""
    calls: list[object] = []
    real = compression.call_in_thread

    def counted(fn, *args):  # type: ignore[no-untyped-def]
        calls.append(fn)
        return real(fn, *args)

    monkeypatch.setattr(compression, "call_in_thread", counted)
    return calls


def test_inflation_round_trips_both_codings() -> None:
    for coding, data in (("gzip", gzip.compress(b"x" * 100)), ("deflate", zlib.compress(b"y" * 100))):
        job = Inflation(coding, data, 1000)
        job.step(1000)
        job.check()
        assert job.done and job.result() == (b"x" if coding == "gzip" else b"y") * 100


def test_inflation_stops_at_its_limit() -> None:
    job = Inflation("gzip", gzip.compress(b"x" * 5000), 1000)
    job.step(1001)  # never more than limit + 1
    with pytest.raises(OverflowError) as e:
        job.check()
    assert e.value.args[0] == 1001


@pytest.mark.parametrize("data", [gzip.compress(b"z" * 1000)[:-12], b"not gzip at all"])
def test_inflation_of_bad_or_truncated_data_fails(data: bytes) -> None:
    job = Inflation("gzip", data, 5000)
    job.step(5000)  # never raises: it may run on a thread
    with pytest.raises(zlib.error):
        job.check()


def test_inflation_in_slices_gives_the_same_bytes() -> None:
    data = bytes(range(256)) * 4000
    job = Inflation("deflate", zlib.compress(data), len(data))
    while not job.done:
        job.step(1000)
        job.check()
    assert job.result() == data


def test_a_small_body_is_inflated_inline_and_holds_its_size(thread_calls: list[object]) -> None:
    budget = _Budget()
    assert compression.inflate("gzip", gzip.compress(b"a" * 1000), 10_000, budget) == b"a" * 1000
    assert thread_calls == [] and budget.held == budget.most == 1000  # its size, not a slice's


def test_a_big_body_is_inflated_on_a_thread_slice_by_slice(thread_calls: list[object]) -> None:
    budget = _Budget()
    out = compression.inflate("gzip", _gzip_zeros(9 * MIB), 64 * MIB, budget)
    assert out == bytes(9 * MIB)
    # the first slice inline, then slices of SLICE bytes each reserved before it is made
    assert len(thread_calls) == -(-(9 * MIB - compression.ON_HUB) // compression.SLICE)
    assert budget.held == 9 * MIB and budget.most <= 9 * MIB + compression.SLICE


def test_a_bomb_stops_at_the_budget_and_gives_back_what_it_held() -> None:
    budget = _Budget(limit=8 * MIB)
    with pytest.raises(MemoryError):
        compression.inflate("gzip", _gzip_zeros(64 * MIB), 2**31 - 1, budget)
    assert budget.most <= 8 * MIB and budget.held == 0


def test_a_bomb_stops_at_the_size_limit() -> None:
    budget = _Budget()
    with pytest.raises(OverflowError):
        compression.inflate("gzip", _gzip_zeros(16 * MIB), 5 * MIB, budget)
    assert budget.most <= 5 * MIB + 1 and budget.held == 0


def test_answers_are_compressed_inline_when_small_and_on_a_thread_when_big(thread_calls: list[object]) -> None:
    small = [b'{"a":', b"1}"]
    assert gzip.decompress(compression.compress("gzip", small)) == b'{"a":1}'
    assert thread_calls == []
    big = [b"head", bytes(range(256)) * 20_000]  # 5 MB
    assert zlib.decompress(compression.compress("deflate", big)) == b"".join(big)
    assert len(thread_calls) == 3 + 1  # three slices and the finish


@pytest.mark.parametrize(("header", "coding"), [
    (None, None), ("", None), ("gzip", "gzip"), ("deflate", "deflate"), ("GZip", "gzip"),
    ("gzip;q=0", None),  # RFC 9110 §12.5.3: q=0 is "not acceptable"
    ("gzip;q=0, deflate;q=0.0", None), ("gzip; q=0", None),
    ("deflate, gzip", "deflate"), ("gzip, deflate", "gzip"),  # Triton: the first of equals
    ("gzip;q=0.5, deflate", "deflate"), ("deflate;q=0.2, gzip;q=0.9", "gzip"),
    ("identity, gzip", None), ("identity;q=0.5, gzip", "gzip"),  # identity competes, as in Triton
    ("br, *", None), ("br;q=1, gzip;q=0.1", "gzip"), ("gzip;q=abc", None), ("gzip;level=1;q=0.3", "gzip"),
])
def test_the_answer_coding_follows_accept_encoding(header: str | None, coding: str | None) -> None:
    assert codings.response_coding(header) == coding


def test_concurrent_big_inflations_take_turns_slice_by_slice(thread_calls: list[object]) -> None:
    """One slice on a thread at a time, and in turn: a body waits at most a slice per other body,
    not for the whole of those before it."""
    import gevent

    bodies = [_gzip_zeros(7 * MIB), _gzip_zeros(7 * MIB)]
    outs = gevent.joinall([gevent.spawn(compression.inflate, "gzip", b, 64 * MIB, _Budget()) for b in bodies])
    assert [len(g.value) for g in outs] == [7 * MIB, 7 * MIB]
    jobs = [id(step.__self__) for step in thread_calls]  # type: ignore[attr-defined]
    assert len(jobs) == 8 and jobs[0::2] == [jobs[0]] * 4 and jobs[1::2] == [jobs[1]] * 4 and jobs[0] != jobs[1]
