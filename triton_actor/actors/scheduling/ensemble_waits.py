"""What the BLS wait graph reads of an ensemble version (``plane/bls_waits.Composite``): the composing versions
its requests call (a mixin of :class:`~.ensemble.EnsembleScheduler`, read on the hub thread between its
messages; split from it so the scheduler module keeps to the data flow)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...errors import TritonError
from ...repository.ensemble_graph import Graph
from .ensemble_run import _Run


class WaitGraphReads:
    """The versions an ensemble's requests still need."""

    # the ensemble scheduler's state (ensemble.py)
    _graph: Graph
    _runs: set[_Run]
    _routes: Any

    def needs(self) -> set[tuple[str, int]]:
        """The composing versions a new request calls: every step's."""
        return self._versions(range(len(self._graph.steps)))

    def runs_need(self) -> list[set[tuple[str, int]]]:
        """For each request in flight, the composing versions it still calls: the steps running or not
        started in any of its open tables (a step after a decoupled one runs in the forks)."""
        out = []
        every = range(len(self._graph.steps))
        for run in self._runs:
            if run.failed:
                continue
            left: set[int] = set()
            for table in run.tables:
                if table.at >= 0:  # a chain's: the step in flight and those after it
                    left.update(range(table.at, len(every)))
                elif not table.settled:
                    left.update(i for i in every if i not in table.started)
                    left.update(table.running)
            out.append(self._versions(left))
        return out

    def _versions(self, indices: Iterable[int]) -> set[tuple[str, int]]:
        """The versions that serve these steps now (steps that cannot be routed are left out)."""
        routes = self._routes()
        out = set()
        for i in indices:
            step = self._graph.steps[i]
            handle = routes.get(step.model)
            try:
                if handle is not None:
                    out.add((step.model, handle.resolve(step.version).version))
            except TritonError:
                pass  # not ready: the step fails when it starts, nobody waits on it
        return out
