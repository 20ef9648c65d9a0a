"""Filesystem watching for POLL mode: watchdog's inotify emitter on native threads, nudging the hub.

watchdog's own Observer breaks under our patching (its ``SkipRepeatsQueue`` subclasses the patched
``queue.Queue``, so no events arrive; docs/architecture.md#threads), so the observer is not used: one native thread per
repository runs an ``InotifyEmitter`` loop directly (its helper "threads" become greenlets of that
thread's own hub, never the server's), and every event only sends a :class:`~...runtime.bridge.HubSignal`.
The repository actor's periodic rescan stays the ground truth; a lost or coalesced event costs at
most one poll period. Without inotify (or watchdog) the watcher logs once and does nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...runtime.bridge import HubSignal
from ...runtime.threads import start_native_thread

log = logging.getLogger(__name__)
_WAIT_S = 0.5  # how often a watcher thread checks whether it should stop


class _Sink:
    """Stands in for watchdog's event queue: every event becomes a (coalescing) nudge."""

    __slots__ = ("_signal",)

    def __init__(self, signal: HubSignal) -> None:
        self._signal = signal

    def put(self, _item: Any, block: bool = True, timeout: float | None = None) -> None:
        self._signal.send()


class Watcher:
    """Watches the repositories recursively; ``nudge()`` runs in the hub after changes."""

    def __init__(self, repositories: list[Path], nudge: Callable[[], None]) -> None:
        self._signal = HubSignal(nudge)
        self._stopping = False
        for repo in repositories:
            start_native_thread(self._run, str(repo))

    def _run(self, path: str) -> None:
        """Native thread: the emitter loop until :meth:`stop`."""
        try:
            from watchdog.observers.api import ObservedWatch
            from watchdog.observers.inotify import InotifyEmitter

            emitter = InotifyEmitter(_Sink(self._signal), ObservedWatch(path, recursive=True), timeout=_WAIT_S)
            emitter.on_thread_start()
            self._signal.send()  # a rescan now catches what changed before the watch existed
        except Exception as e:  # noqa: BLE001 - no inotify here: the periodic rescan still works
            log.warning("not watching %s for changes (%r); relying on --repository-poll-secs", path, e)
            return
        try:
            # the emitter stops itself when the watched folder goes away (then every further call
            # only logs a warning, in a busy loop): from there the periodic rescan alone keeps watch
            while not self._stopping and emitter.should_keep_running():
                emitter.queue_events(_WAIT_S)
            if not self._stopping:
                log.warning("stopped watching %s (it is gone); relying on --repository-poll-secs", path)
        except Exception as e:  # noqa: BLE001
            log.warning("watching %s stopped: %r; relying on --repository-poll-secs", path, e)
        finally:
            emitter.on_thread_stop()

    def stop(self) -> None:
        """Hub thread: the watcher threads end within ``_WAIT_S``."""
        self._stopping = True
