"""Decoupled BLS streams of an isolated Python model, server side: ``exec(decoupled=True)`` and
``async_exec(decoupled=True)`` made in the model's process (``isolated_child_bls.py`` is the other side).

The server runs the call with its own hooks (``plane/calls_from_models.py``: the data plane, the BLS wait graph,
the pump that keeps a stream's bound) and a :class:`BlsRelay` forwards the responses over the pipe.
The pump's bound counts what the *model* took, not what the relay forwarded: the model's process
says what its iterator took, ``("call_taken", id, responses, bytes)``, once half the stream's window
was (``protocol/stream_credits.CreditReturn``, the pattern of a decoupled model's own responses, the
other way round), and the relay credits the server's iterator with it (``ResponseIterator.took``).
So the pump, the pipe and the model's queue hold together at most what an in-process model may hold
unread (``STREAM_MAX_RESPONSES`` or ``STREAM_MAX_BYTES``, sent first as ``("call_stream", id,
responses, bytes)``) and the target's ``send()`` waits beyond it; before, the relay read the whole
stream into the model's process (2000 x 1 MiB asked, 3 read: the target sent all 2000, 2 GB held).
The iterator cancelled or dropped in the model's process, ``("call_cancel", id)``, cancels the target
(``ResponseIterator.stop``): it sees ``is_cancelled()`` at its next response; what was in flight is
dropped. Frames: ``("call_stream", ...)``, then ``("call_item", id, response, size)`` (``size``: the
bytes the pump counted, which the process gives back in its credits), then ``("call_end", id)``.

Threads: :meth:`BlsRelay.run` on a native thread of its own (it waits for the server's iterator;
never on the hub, the session's reader thread or the instance's thread, which must go on serving the
model's other calls while the model reads the stream); its frames go to the process's one writer
(``ChildProcess.to_child``), in order, and the pump's bound keeps what waits there bounded; :meth:`took`
and :meth:`cancel` on the session's reader thread (the one writer of the iterator's taken counts);
:meth:`cancel` also from ``on_exit``. Owner: the session (``isolated_session._Session``) holds its relays by
call id, from the call until ``run`` ends. Failure: the process gone (its writer is closed or broken, or it
exited) cancels the target.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ...runtime.response_channel import STREAM_MAX_BYTES, STREAM_MAX_RESPONSES
from . import isolation_wire as wire

log = logging.getLogger(__name__)


class BlsRelay:
    """One decoupled BLS stream from the server's iterator (``server_calls.ResponseIterator``) to the model's process."""

    __slots__ = ("call_id", "_send", "_responses", "_done", "_stopped")

    def __init__(self, send: Callable[[Any], None], call_id: int, responses: Any, done: Callable[[int], None]) -> None:
        self.call_id = call_id
        self._send = send  # a frame to the process (never waits; OSError once it is gone)
        self._responses = responses
        self._done = done  # the session forgets the relay
        self._stopped = False  # set by the reader thread (a plain flag: read here once per response)

    def run(self) -> None:
        """Its own native thread: forward every response until the end, or a cancel."""
        call_id, responses = self.call_id, self._responses
        try:
            self._send(("call_stream", call_id, STREAM_MAX_RESPONSES, STREAM_MAX_BYTES))
            while not self._stopped:
                try:
                    response, size = responses.next_sized()
                except StopIteration:
                    self._send(("call_end", call_id))
                    return
                if not self._stopped:
                    self._send(("call_item", call_id, wire.pb_response_to_wire(response), size))
        except OSError:
            responses.stop()  # the process is gone: nobody reads on
        except Exception as e:
            log.exception("BLS stream %d to the model's process failed", call_id)  # iterator must not wait for ever
            responses.stop()  # (the target is cancelled)
            try:
                self._send(("call_reply", call_id, ("raise", f"the BLS stream failed: {e!r}")))
            except OSError:
                pass
        finally:
            self._done(call_id)

    def took(self, responses: int, size: int) -> None:
        """Reader thread: the model took that many (``size`` bytes as the pump counted them)."""
        self._responses.took(responses, size)

    def cancel(self) -> None:
        """Reader thread (or ``on_exit``): the model cancelled or dropped its iterator, or its process is gone."""
        self._stopped = True
        self._responses.stop()
