"""The isolation frames (backends/python/isolation_frames.py): byte for byte, no processes."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from triton_actor.backends.python.isolation_frames import OUT_OF_BAND_MIN, FrameDecoder, encode
from triton_actor.backends.python.isolation_wire import pack, unpack


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


def test_large_buffers_travel_out_of_band_small_ones_in_the_pickle() -> None:
    big = np.ones(OUT_OF_BAND_MIN // 8, np.float64)
    parts = encode(("x", pickle.PickleBuffer(big)))
    assert len(parts) == 3 and memoryview(parts[2]).nbytes == big.nbytes  # head, pickle, the array's own bytes
    assert len(encode(("x", pickle.PickleBuffer(big[:-1])))) == 2


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


@pytest.mark.parametrize("array", [
    np.arange(6, dtype=np.float32).reshape(2, 3), np.arange(OUT_OF_BAND_MIN, dtype=np.int32),
    np.arange(12, dtype=np.int64).reshape(3, 4)[:, ::2], np.zeros((0, 4), np.float16), np.array(True),
    np.array([b"a", "\u00e9", b""], dtype=object), np.zeros(3, np.dtype("V2")),
])
def test_tensors_cross_as_raw_bytes_dtype_and_shape(array: np.ndarray) -> None:
    (message,) = FrameDecoder().feed(_frame_bytes(("x", pack(array))))
    _assert_same(unpack(message[1]), array)


def test_large_tensors_received_are_writable() -> None:
    (message,) = FrameDecoder().feed(_frame_bytes(("x", pack(np.arange(OUT_OF_BAND_MIN, dtype=np.int32)))))
    array = unpack(message[1])
    array[0] = 9  # the model may write into its inputs
    assert array[:3].tolist() == [9, 1, 2]


def test_a_malformed_frame_raises() -> None:
    frame = bytearray(_frame_bytes(("x", 1)))
    frame[10:14] = b"\xff\xff\xff\xff"  # garbage in the pickle
    with pytest.raises(ValueError, match="malformed frame"):
        FrameDecoder().feed(bytes(frame))
