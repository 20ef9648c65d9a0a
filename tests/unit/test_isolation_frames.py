"""The isolation frames (protocol/isolation_frames.py): byte for byte, no processes."""

from __future__ import annotations

import numpy as np
import pytest

from triton_actor.protocol.isolation_frames import FrameDecoder, encode


def _message() -> tuple[object, ...]:
    return ("execute", [("r1", [("INPUT0", 11, (2, 3), np.arange(6, dtype=np.float32).reshape(2, 3)),
                                ("TEXT", 13, (2,), np.array([b"a", "\u00e9"], dtype=object)),
                                ("BF16", 14, (2,), np.zeros(2, np.dtype("V2"))),
                                ("STRIDED", 9, (3,), np.arange(6, dtype=np.int64)[::2])], None)])


def _frame_bytes(message: object) -> bytes:
    return b"".join(bytes(p) for p in encode(message))


def _assert_same(got: object, want: object) -> None:
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes() if want.dtype.kind != "O" else got.tolist() == want.tolist()
    elif isinstance(want, list | tuple):
        assert type(got) is type(want) and len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            _assert_same(g, w)
    else:
        assert got == want


def test_numeric_arrays_travel_out_of_band() -> None:
    parts = encode(("x", np.ones(1000, np.float64)))
    assert len(parts) == 3 and memoryview(parts[2]).nbytes == 8000  # head, pickle, the array's own bytes


@pytest.mark.parametrize("chunk", [1, 7, 64, 1 << 20])
def test_any_chunking_gives_the_messages_back_in_order(chunk: int) -> None:
    stream = _frame_bytes(_message()) + _frame_bytes(("reply", ("ok", None))) + _frame_bytes(("log", {"a": 1}))
    decoder = FrameDecoder()
    got = []
    for i in range(0, len(stream), chunk):
        got += decoder.feed(stream[i:i + chunk])
    assert decoder.pending == 0
    assert len(got) == 3
    _assert_same(got[0], _message())
    assert got[1:] == [("reply", ("ok", None)), ("log", {"a": 1})]


def test_arrays_received_are_writable_views_of_their_own_buffer() -> None:
    (message,) = FrameDecoder().feed(_frame_bytes(("x", np.arange(4, dtype=np.int32))))
    array = message[1]
    array[0] = 9  # the model may write into its inputs, as in-process
    assert array.tolist() == [9, 1, 2, 3]


def test_a_malformed_frame_raises() -> None:
    frame = bytearray(_frame_bytes(("x", 1)))
    frame[10:14] = b"\xff\xff\xff\xff"  # garbage in the pickle
    with pytest.raises(ValueError, match="malformed frame"):
        FrameDecoder().feed(bytes(frame))
