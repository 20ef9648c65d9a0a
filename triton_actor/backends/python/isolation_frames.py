"""Frames between the server and an isolated Python model's process (sans-I/O: bytes in, messages out).

One frame carries one message, a tuple of plain values and ``pickle.PickleBuffer`` objects::

    <I meta length> <H buffer count> <Q length> * count   meta (pickle, protocol 5)   buffers

Large buffers (a tensor's raw bytes, see ``backends/python/isolation_wire.py``) travel out of band:
their bytes follow the pickle unchanged, so the sender copies nothing and the receiver gets each as
one bytearray of its own that numpy can view.

Both ends are this project's code, started by the server: pickle is not a trust boundary here.
Owner: each :class:`FrameDecoder` belongs to one reader; :func:`encode` is a pure function.
Failure: a malformed frame raises ``ValueError`` (the reader then treats the peer as broken).
"""

from __future__ import annotations

import pickle
import struct
from typing import Any

_HEAD = struct.Struct("<IH")
_LEN = struct.Struct("<Q")
MAX_BUFFERS = 65535
OUT_OF_BAND_MIN = 16384


def encode(message: Any) -> list[bytes | memoryview]:
    """The parts of one frame, in order (hand them to ``os.writev``). ``pickle.PickleBuffer`` objects in
    the message of at least :data:`OUT_OF_BAND_MIN` bytes travel out of band, smaller ones in the pickle."""
    buffers: list[pickle.PickleBuffer] = []

    def out_of_band(buffer: pickle.PickleBuffer) -> bool:
        if buffer.raw().nbytes < OUT_OF_BAND_MIN:
            return True  # in band: one part fewer, and no bytearray of its own at the receiver
        buffers.append(buffer)
        return False

    meta = pickle.dumps(message, protocol=5, buffer_callback=out_of_band)
    raws = [b.raw() for b in buffers]
    if len(raws) > MAX_BUFFERS:
        raise ValueError(f"a frame holds at most {MAX_BUFFERS} arrays, got {len(raws)}")
    head = _HEAD.pack(len(meta), len(raws)) + b"".join(_LEN.pack(r.nbytes) for r in raws)
    return [head, meta, *raws]


class FrameDecoder:
    """Reassembles frames from bytes as they arrive (any chunking): :meth:`feed` returns the messages
    completed by that chunk, in order."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes | bytearray | memoryview) -> list[Any]:
        buf = self._buf
        buf += data
        messages = []
        start = 0
        while (end := self._complete_frame(start)) is not None:
            messages.append(self._decode(start, end))
            start = end
        if start:
            del buf[:start]
        return messages

    @property
    def pending(self) -> int:
        """Bytes received that do not yet make a whole frame."""
        return len(self._buf)

    def _complete_frame(self, start: int) -> int | None:
        """The end offset of the frame at ``start`` if all of it has arrived."""
        buf = self._buf
        if len(buf) - start < _HEAD.size:
            return None
        meta_len, count = _HEAD.unpack_from(buf, start)
        lens_end = start + _HEAD.size + count * _LEN.size
        if len(buf) < lens_end:
            return None
        body = sum(_LEN.unpack_from(buf, start + _HEAD.size + i * _LEN.size)[0] for i in range(count))
        end = lens_end + meta_len + body
        return end if len(buf) >= end else None

    def _decode(self, start: int, end: int) -> Any:
        buf = self._buf
        meta_len, count = _HEAD.unpack_from(buf, start)
        offset = start + _HEAD.size + count * _LEN.size
        lens = [_LEN.unpack_from(buf, start + _HEAD.size + i * _LEN.size)[0] for i in range(count)]
        view = memoryview(buf)
        try:
            meta = bytes(view[offset:offset + meta_len])
            offset += meta_len
            buffers = []
            for n in lens:
                buffers.append(bytearray(view[offset:offset + n]))  # owned: numpy arrays view it
                offset += n
        finally:
            view.release()
        if offset != end:
            raise ValueError("frame length mismatch")
        try:
            return pickle.loads(meta, buffers=buffers)
        except Exception as e:  # noqa: BLE001 - any unpickling failure is a malformed frame
            raise ValueError(f"malformed frame: {e!r}") from None
