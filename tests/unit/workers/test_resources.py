"""The rate limiter's units across processes (``triton_actor/workers/resources.py``): a unit is held by one
process at a time, a process that dies gives back what it held, and a process that waits for a resource
keeps its turn, so the one that gave the units back cannot take them again before it.

The other worker is a real second process (record locks belong to processes) driven line by line."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from triton_actor.actors.scheduling.rate_limiter import GLOBAL
from triton_actor.workers.resources import HostUnits

R = ((("R", GLOBAL), 1),)
TOTALS = {("R", GLOBAL): 1}

PEER = """
import sys
from triton_actor.actors.scheduling.rate_limiter import GLOBAL
from triton_actor.workers.resources import HostUnits

units, lease = HostUnits(sys.argv[1]), None
for line in sys.stdin:
    if line.strip() == "take":
        lease = units.take(((("R", GLOBAL), 1),), {("R", GLOBAL): 1})
        print("took" if lease is not None else "waits", flush=True)
    elif line.strip() == "give":
        units.give(lease)
        print("gave", flush=True)
"""


class Peer:
    def __init__(self, run_dir: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", PEER, str(run_dir)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def ask(self, command: str) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()


@pytest.fixture
def peer(tmp_path: Path) -> Iterator[Peer]:
    p = Peer(tmp_path)
    yield p
    p.proc.kill()
    p.proc.wait()


def test_a_unit_is_one_process_s_at_a_time_and_a_dead_holder_gives_it_back(tmp_path: Path, peer: Peer) -> None:
    units = HostUnits(tmp_path)
    assert peer.ask("take") == "took"
    assert units.take(R, TOTALS) is None
    peer.proc.kill()  # dies holding R: the kernel drops its locks
    peer.proc.wait()
    assert units.take(R, TOTALS) is not None


def test_the_process_that_waits_has_the_turn(tmp_path: Path, peer: Peer) -> None:
    units = HostUnits(tmp_path)
    lease = units.take(R, TOTALS)
    assert lease is not None
    assert peer.ask("take") == "waits"  # and keeps R's turn
    units.give(lease)
    assert units.take(R, TOTALS) is None  # free, but the peer's turn: not taken back at once
    assert peer.ask("take") == "took"
    assert units.take(R, TOTALS) is None  # now this process waits, with the turn
    assert peer.ask("give") == "gave"
    assert peer.ask("take") == "waits"  # the turn is this process's
    assert units.take(R, TOTALS) is not None


def test_one_process_never_takes_more_units_than_it_is_given(tmp_path: Path) -> None:
    """Record locks are the process's: a second lock of a byte it holds would succeed, so it counts its own."""
    units = HostUnits(tmp_path)
    two = {("R", GLOBAL): 2}
    first, second = units.take(R, two), units.take(R, two)
    assert first is not None and second is not None and first != second
    assert units.take(R, two) is None
    units.give(first)
    assert units.take(R, two) == first
