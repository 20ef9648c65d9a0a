"""POLL mode's reconciliation, as a pure state machine: scan results in, loads and unloads out.

Desired state = the model folders on disk and their :class:`~.snapshot.Stamp`; actual state = the
stamp each model was last loaded from. A model whose stamp differs from what was loaded is loaded
again once the stamp has stayed the same for ``settle_s`` (a folder still being copied is not
loaded half-written); a model that failed is tried again only when its files change, so a broken
model is neither retried in a loop nor forgotten (Triton: https://github.com/triton-inference-server/server/issues/6534); a model whose folder is gone
is unloaded. Owned by the repository actor; no I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .snapshot import Stamp


@dataclass(slots=True)
class Actions:
    load: list[str] = field(default_factory=list)
    unload: list[str] = field(default_factory=list)
    settling: bool = False  # something changed and is waiting to settle: rescan after settle_s


@dataclass(slots=True)
class Reconciler:
    settle_s: float
    loaded_only: bool = False  # --model-load-on-demand: a folder alone loads nothing, a request does
    applied: dict[str, Stamp] = field(default_factory=dict)  # model → stamp it was last loaded from
    _changed: dict[str, tuple[Stamp, float]] = field(default_factory=dict)  # model → new stamp, first seen

    def loaded(self, name: str, stamp: Stamp) -> None:
        """A load of ``name`` from ``stamp`` was started (whatever its outcome)."""
        self.applied[name] = stamp
        self._changed.pop(name, None)

    def forget(self, name: str) -> None:
        """``name`` was unloaded on purpose (an eviction): no rescan acts on it until it is loaded again."""
        self.applied.pop(name, None)
        self._changed.pop(name, None)

    def step(self, found: dict[str, Stamp], now: float) -> Actions:
        """One rescan: ``found`` is every (unique) model folder on disk with its stamp."""
        out = Actions()
        for name, stamp in found.items():
            if self.loaded_only and name not in self.applied:
                continue
            if self.applied.get(name) == stamp:
                self._changed.pop(name, None)
                continue
            seen = self._changed.get(name)
            if seen is None or seen[0] != stamp:
                self._changed[name] = (stamp, now)
                out.settling = True
            elif now - seen[1] < self.settle_s:
                out.settling = True
            else:
                self.loaded(name, stamp)
                out.load.append(name)
        for name in [n for n in self.applied if n not in found]:
            del self.applied[name]
            out.unload.append(name)
        for name in [n for n in self._changed if n not in found]:
            del self._changed[name]
        return out
