"""A process-isolated model's stdout/stderr reach the server log line by line (child_process._LineLogger),
and what a model writes without a newline is bounded (review finding: a progress bar's ``\\r`` lines were
held whole, 26 MB and 4.9 s of CPU for 26 MB of them)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from triton_actor.backends.python import child_process
from triton_actor.backends.python.child_process import MAX_LINE, _LineLogger


@pytest.fixture
def emitted(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    lines: list[bytes] = []
    monkeypatch.setattr(_LineLogger, "emit", lambda self, line: lines.append(line))
    return lines


def _logger() -> _LineLogger:
    return _LineLogger(logging.INFO, SimpleNamespace(name="m_0", pid=1))  # type: ignore[arg-type]


def test_lines_split_on_newlines_and_carriage_returns(emitted: list[bytes]) -> None:
    sink = _logger()
    for chunk in (b"one\ntw", b"o\r\nthr", b"ee\r", b"\n 10%\r 20%\r", b"last"):
        sink.feed(chunk)
    assert emitted == [b"one", b"two", b"three", b" 10%", b" 20%"] and sink.partial == b"last"


def test_output_without_line_ends_is_emitted_in_bounded_pieces(emitted: list[bytes]) -> None:
    sink = _logger()
    chunk = b"x" * 65536
    for _ in range(400):  # 26 MB with no line end
        sink.feed(chunk)
        assert len(sink.partial) <= MAX_LINE
    assert sum(map(len, emitted)) + len(sink.partial) == 400 * 65536
    assert all(len(line) == MAX_LINE for line in emitted)


def test_the_real_emit_logs_with_the_instance(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=child_process._model_log.name):
        _logger().feed(b"hello\n")
    assert "[m_0 pid 1] hello" in caplog.text
