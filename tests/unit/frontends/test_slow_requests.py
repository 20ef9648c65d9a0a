"""The log of requests closed for a too-slow body: one line at info, a flood summarised."""

from __future__ import annotations

import logging

import pytest

from triton_actor.frontends.slow_requests import SlowRequestLog


def test_one_line_then_a_count_per_quiet_period(caplog: pytest.LogCaptureFixture) -> None:
    slow = SlowRequestLog("HTTP", quiet=10.0)
    with caplog.at_level(logging.INFO, logger="triton_actor.frontends.slow_requests"):
        assert slow.report(("10.0.0.1", 5000), "request body too slow: ...", now=100.0)
        assert not slow.report(("10.0.0.2", 5001), "x", now=101.0)
        assert not slow.report(("10.0.0.3", 5002), "x", now=109.9)
        assert slow.report(("10.0.0.4", 5003), "request body too slow: 7", now=110.0)
    assert [r.levelno for r in caplog.records] == [logging.INFO, logging.INFO]
    assert [r.getMessage() for r in caplog.records] == [
        "HTTP request from 10.0.0.1:5000 closed: request body too slow: ...",
        "HTTP request from 10.0.0.4:5003 closed: request body too slow: 7 (and 2 more since the last report)"]
    assert all(r.exc_info is None for r in caplog.records)
