"""What the :class:`~.actor.RepositoryActor` is told, and how: its public messages (:class:`LoadAll`,
:class:`LoadModel`, :class:`UnloadModel`, :class:`Rescan`, :class:`ModelChanged`,
:class:`MarkVersionDown`, :class:`Index`, :class:`UnloadAll`, :class:`Settled`; their meaning is on the actor) and
:class:`RepositoryRef`, the actor's typed facade (what the server and the data plane call). The
messages the actor tells itself (their names start with ``_``) are here too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...errors import TritonError
from ...repository.overrides import ConfigText
from ...runtime.kernel import ActorRef, Reply
from ..model.handles import ModelHandle


@dataclass(frozen=True, slots=True)
class LoadAll:
    reply: Reply[dict[str, str]]


@dataclass(frozen=True, slots=True)
class LoadModel:
    name: str
    reply: Reply[None]
    config: str | ConfigText | None = None  # a holder: its one parse takes the text (issue 23)
    files: dict[str, bytes] = field(default_factory=dict)
    demand: bool = False  # started by a request (--model-load-on-demand), not the load API


@dataclass(frozen=True, slots=True)
class UnloadModel:
    name: str
    reply: Reply[None]
    unload_dependents: bool = False
    finished: bool = False  # answer once the model is gone (the memory budget's evictions), not once it stops
    demand: bool = False  # an eviction of --model-load-on-demand, not the unload API


@dataclass(frozen=True, slots=True)
class Rescan:
    pass


@dataclass(frozen=True, slots=True)
class ModelChanged:
    handle: ModelHandle
    applied: Reply[None] | None = None


@dataclass(frozen=True, slots=True)
class MarkVersionDown:
    """See :class:`~..model.messages.MarkDown`; the files check applies in POLL only (elsewhere loads are host-wide
    changes, ordered by the host's control lock)."""

    name: str
    version: int
    reason: str
    files: str
    here: bool
    reply: Reply[bool]


@dataclass(frozen=True, slots=True)
class Index:
    ready_only: bool = False


@dataclass(frozen=True, slots=True)
class UnloadAll:
    reply: Reply[None]


@dataclass(frozen=True, slots=True)
class Settled:
    name: str
    reply: Reply[None]


class RepositoryRef(ActorRef):
    """Typed facade of the :class:`RepositoryActor` (what the server and the data plane call)."""

    __slots__ = ()

    def load_all(self) -> Reply[dict[str, str]]:
        """Load what the control mode loads at startup; completes with model → error when all finished."""
        done: Reply[dict[str, str]] = Reply()
        self.tell(LoadAll(done))
        return done

    def load(self, name: str, config: str | ConfigText | None = None, files: dict[str, bytes] | None = None,
             demand: bool = False) -> Reply[None]:
        """The load API (EXPLICIT), or with ``demand`` a load a request started (EXPLICIT or POLL with
        --model-load-on-demand): completes when the model loaded, or fails with the reason."""
        done: Reply[None] = Reply()
        self.tell(LoadModel(name, done, config, files or {}, demand))
        return done

    def unload(self, name: str, unload_dependents: bool = False, finished: bool = False,
               demand: bool = False) -> Reply[None]:
        """The unload API (EXPLICIT), or with ``demand`` an eviction of --model-load-on-demand: completes once
        the unload started (Triton: asynchronous), or with ``finished`` once the model is gone (its
        requests answered, its memory freed)."""
        done: Reply[None] = Reply()
        self.tell(UnloadModel(name, done, unload_dependents, finished, demand))
        return done

    def index(self, ready_only: bool = False, timeout: float | None = 60.0) -> list[dict[str, Any]]:
        """The repository index entries (Triton's ``RepositoryIndex``); raises UNAVAILABLE on timeout."""
        return self.ask(Index(ready_only), timeout)

    def unload_all(self) -> Reply[None]:
        """Shutdown: unload every model and stop the model actors; completes when done."""
        done: Reply[None] = Reply()
        self.tell(UnloadAll(done))
        return done

    def rescan(self) -> None:
        """POLL: reconcile with what is on disk now."""
        self.tell(Rescan())

    def settled(self, name: str) -> Reply[None]:
        """Completes once model ``name``'s actor has done everything it was told so far: after a reload
        (answered at the swap), once the versions it replaced have drained and unloaded (the memory
        budget counts them until then). At once when the model has no actor."""
        done: Reply[None] = Reply()
        self.tell(Settled(name, done))
        return done

    def mark_down(self, name: str, version: int, reason: str, files: str, here: bool) -> Reply[bool]:
        """The host's word that a version lost its instances (:class:`MarkVersionDown`)."""
        done: Reply[bool] = Reply()
        self.tell(MarkVersionDown(name, version, reason, files, here, done))
        return done


# -- what the actor tells itself --------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class _Refreshed:
    """EXPLICIT with object-store repositories: the mirrors were re-synced for ``load`` (or failed)."""

    load: LoadModel
    reply: Reply[None]  # the load's reply: an error raised while handling this message fails it
    error: TritonError | None = None


@dataclass(frozen=True, slots=True)
class _ModelGone:
    name: str


@dataclass(frozen=True, slots=True)
class _LoadsFinished:
    reply: Reply[dict[str, str]]
    failures: dict[str, str]


@dataclass(frozen=True, slots=True)
class _UnloadsFinished:
    reply: Reply[None]
