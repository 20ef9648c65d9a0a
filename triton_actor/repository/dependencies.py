"""Which models an ensemble needs, and which models were loaded only because an ensemble needed them.

A single-owner object of the RepositoryActor (its greenlet only; no I/O but reading configs through
``read_deps``). Mirrors Triton's dependency graph (``model_repository_manager.cc``): an ensemble loads
after its composing models (all control modes), in EXPLICIT mode loading an ensemble loads them too and
marks those that were not loaded as "not explicitly loaded", and ``unload_dependents`` unloads those
again once no loaded ensemble needs them (https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_model_repository.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from ..errors import TritonError
from . import config as config_mod
from .ensemble_graph import dependencies, find_cycle


def read_deps(name: str, model_dir: Path, config_name: str = "") -> tuple[str, ...]:
    """The composing models the model's config on disk names (empty for a non-ensemble or an unreadable
    config: its own load reports that)."""
    try:
        cfg, _ = config_mod.read(model_dir, name, auto_complete=True, config_name=config_name)
    except TritonError:
        return ()
    return dependencies(cfg)


class Dependencies:
    """The dependency graph as the last loads saw it, and the models loaded only as dependencies."""

    def __init__(self) -> None:
        self._deps: dict[str, tuple[str, ...]] = {}
        self.implicit: set[str] = set()

    def set(self, name: str, deps: tuple[str, ...]) -> None:
        if deps:
            self._deps[name] = deps
        else:
            self._deps.pop(name, None)

    def of(self, name: str) -> tuple[str, ...]:
        return self._deps.get(name, ())

    def cycle(self, name: str) -> str | None:
        """Triton's text when ``name`` contains itself through other ensembles."""
        return find_cycle(name, self.of) if self.of(name) else None

    def closure(self, name: str, lookup: Callable[[str], tuple[str, ...] | None]) -> list[str]:
        """``name`` and everything it needs, dependencies first. ``lookup(n)`` reads ``n``'s
        dependencies (None: ``n`` is not in any repository; it is listed, its load reports that) and is
        recorded here."""
        order: list[str] = []
        seen: set[str] = set()

        def visit(n: str) -> None:
            if n in seen:
                return
            seen.add(n)
            deps = lookup(n)
            if deps is None:
                order.append(n)
                return
            self.set(n, deps)
            for d in deps:
                visit(d)
            order.append(n)

        visit(name)
        return order

    def to_unload(self, name: str, loaded: Iterable[str]) -> list[str]:
        """With ``unload_dependents``: the models ``name`` needed that were loaded only as dependencies
        and that no other loaded model needs once ``name`` (and they) are gone, nearest first."""
        gone = {name}
        out: list[str] = []
        still = set(loaded) - gone
        queue = list(self.of(name))
        while queue:
            dep = queue.pop(0)
            if dep in gone or dep not in self.implicit:
                continue
            if any(dep in self.of(other) for other in still - gone - {dep}):
                continue
            gone.add(dep)
            out.append(dep)
            queue.extend(self.of(dep))
        return out
