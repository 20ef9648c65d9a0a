"""``sys.argv`` as model code sees it: ``['']``, what Triton's python backend stub process has.

The stub embeds Python through pybind11 without arguments, so a model's ``sys.argv`` is ``['']`` at
import, in ``initialize``, ``execute`` and ``finalize`` (checked on Triton 2.51). Triton's own QA models
call ``unittest.main(..., exit=False)`` inside ``execute``, which parses ``sys.argv``: with the
server's flags there argparse ends the request with ``SystemExit: 2``.

In-process, ``sys.argv`` is the server's, and it is one per process: :func:`enter` puts ``['']`` in
place and :func:`leave` gives the server's back, counted across the instances' threads (the last one
out restores it). The Python backend holds it from an instance's load to its ``finalize``, as Triton's
stub has ``['']`` for the model's whole life: between calls too, and in threads the model started.
So while an in-process Python model is loaded the process's ``sys.argv`` is ``['']`` (the server reads
its flags once, at start); process isolation gives the model a process whose argv is ``['']``
throughout (``isolated_child.py``). Owner: this module (the count and the saved argv, under a native
lock). Failure: none; the argv is restored whatever the model raised.

Held per load, not per call: ``enter`` and ``leave`` around each ``execute`` cost 0.9 µs of CPU per
request (two calls, a lock taken twice, a new list; 46 bytecodes), on every request.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from ...runtime.threads import native_lock

STUB_ARGV = [""]
_lock = native_lock()
_inside = 0  # model calls running now, all threads together
_saved: list[str] = []  # the server's argv while they run


def enter() -> None:
    """A model call starts: ``sys.argv`` is ``['']`` until the last call running ends (:func:`leave`)."""
    global _inside, _saved
    with _lock:
        if not _inside:
            _saved = sys.argv
            sys.argv = list(STUB_ARGV)
        _inside += 1


def leave() -> None:
    """A model call ended (whatever it raised): the last one out puts the server's argv back."""
    global _inside
    with _lock:
        _inside -= 1
        if not _inside:
            sys.argv = _saved


@contextlib.contextmanager
def as_stub() -> Iterator[None]:
    """``with as_stub():`` model code runs with ``sys.argv == ['']``."""
    enter()
    try:
        yield
    finally:
        leave()
