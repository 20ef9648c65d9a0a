"""The helpers the RepositoryActor uses to load an ensemble after its composing models and to unload
what it alone needed (``unload_dependents``). They run in helper greenlets the actor spawns and only
tell model actors (a tell is safe from any greenlet); the decisions are the actor's
(:class:`~...repository.dependencies.Dependencies`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from ...errors import TritonError
from ...repository.config import ModelConfig
from ...runtime.kernel import Reply
from ..model.messages import ModelRef

log = logging.getLogger(__name__)

Start = Callable[[ModelRef, Reply[None]], None]  # starts one model's load, completing the reply


def loader(model_dir: Path, config: ModelConfig | None = None, owned: bool = False) -> Start:
    """A :data:`Start` that loads from ``model_dir`` (with the load API's override, if any)."""
    def start(ref: ModelRef, reply: Reply[None]) -> None:
        ref.load(model_dir, config, owned, reply=reply)

    return start


def start_after(waits: list[Reply[None]], start: Start, ref: ModelRef, reply: Reply[None]) -> None:
    """Helper greenlet: wait for the loads of the composing models (failed or not: the ensemble's own
    check then says why), then start the ensemble's."""
    for r in waits:
        try:
            r.get()
        except TritonError:
            pass
    try:
        start(ref, reply)
    except TritonError as e:  # the model actor stopped meanwhile (shutdown)
        reply.fail(e)


def unload_after(done: Reply[None], deps: list[tuple[str, ModelRef]]) -> None:
    """Helper greenlet: once the ensemble is gone, unload what it alone needed (``unload_dependents``)."""
    try:
        done.get()
    except TritonError:
        pass
    for name, ref in deps:
        try:
            ref.unload()
        except TritonError as e:
            log.error("unloading '%s' failed: %s", name, e)
