"""Hypothesis strategies and settings shared by the codec property tests (tests/unit/test_properties_*.py).

A drawn :class:`Tensor` is the value a client means to send: a name, a Triton datatype, a shape and a
numpy array of that shape (BF16 as its 16-bit patterns in ``V2`` elements, BYTES as an object array of
``bytes``, empty and non-UTF-8 ones included). :func:`same_array` is the equality the round trips
assert: dtype, shape and bytes (so NaN payloads and -0.0 count), element-wise for BYTES.

Settings: the ``default`` profile runs ``MAX_EXAMPLES`` examples per property without a deadline;
``ci`` (loaded when ``CI`` is set, as ``.ci/run`` runs) derandomizes, so a CI run is reproducible;
``HYPOTHESIS_PROFILE=thorough`` runs 20x the examples when hunting.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from triton_actor.protocol.dtypes import BF16_NUMPY, BY_WIRE

MAX_EXAMPLES = 200
_COMMON: dict[str, Any] = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
settings.register_profile("default", max_examples=MAX_EXAMPLES, **_COMMON)
settings.register_profile("ci", max_examples=MAX_EXAMPLES, derandomize=True, database=None, **_COMMON)
settings.register_profile("thorough", max_examples=20 * MAX_EXAMPLES, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "default"))

WIRES = tuple(BY_WIRE)  # every Triton datatype, BF16 and BYTES included
NUMERIC_WIRES = tuple(w for w in WIRES if w not in ("BYTES", "BF16"))
# JSON carries neither FP16 nor BF16 (Triton refuses them as JSON data both ways)
JSON_WIRES = tuple(w for w in WIRES if w not in ("FP16", "BF16"))

# any text a JSON string or a protobuf string can hold (no lone surrogates: they are not UTF-8)
text = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
names = text
shapes = st.lists(st.integers(0, 3), max_size=4)
byte_strings = st.one_of(st.binary(max_size=16), st.sampled_from([b"", b"\xff\xfe", b"\x00", "é".encode()]))
utf8_strings = text.map(lambda s: s.encode("utf-8"))


class Tensor(NamedTuple):
    name: str
    wire: str
    shape: tuple[int, ...]
    array: np.ndarray


def _objects(items: list[bytes], shape: tuple[int, ...]) -> np.ndarray:
    out = np.empty(len(items), dtype=np.object_)
    out[:] = items
    return out.reshape(shape)


@st.composite
def arrays(draw: st.DrawFn, wire: str, shape: tuple[int, ...], finite: bool = False,
           utf8: bool = False) -> np.ndarray:
    """An array of ``wire``'s values: every bit pattern for floats unless ``finite`` (JSON has no NaN
    or infinity); BYTES from ``utf8`` strings only where the transport carries text."""
    count = int(np.prod(shape, dtype=np.int64))
    if wire == "BYTES":
        return _objects(draw(st.lists(utf8_strings if utf8 else byte_strings, min_size=count, max_size=count)), shape)
    if wire == "BF16":
        return draw(hnp.arrays(np.uint16, shape)).view(BF16_NUMPY)
    dtype = BY_WIRE[wire].numpy
    if dtype.kind == "f":
        elements = st.floats(width=dtype.itemsize * 8, allow_nan=not finite, allow_infinity=not finite)
        return draw(hnp.arrays(dtype, shape, elements=elements))
    return draw(hnp.arrays(dtype, shape))


@st.composite
def tensors(draw: st.DrawFn, wires: tuple[str, ...] = WIRES, finite: bool = False, utf8: bool = False,
            name: st.SearchStrategy[str] = names) -> Tensor:
    wire = draw(st.sampled_from(wires))
    shape = tuple(draw(shapes))
    return Tensor(draw(name), wire, shape, draw(arrays(wire, shape, finite, utf8)))


def tensor_lists(wires: tuple[str, ...] = WIRES, finite: bool = False, utf8: bool = False,
                 max_size: int = 4) -> st.SearchStrategy[list[Tensor]]:
    return st.lists(tensors(wires, finite, utf8), max_size=max_size, unique_by=lambda t: t.name)


# request parameters forwarded to the model (the consumed keys are drawn by consumed_parameters)
_RESERVED = ("sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "binary_data_output")
parameter_keys = text.filter(lambda k: not k.startswith("triton_") and k not in _RESERVED)
parameter_values = st.one_of(st.booleans(), st.integers(-(2**63), 2**63 - 1), text)
parameters = st.dictionaries(parameter_keys, parameter_values, max_size=3)


@st.composite
def consumed_parameters(draw: st.DrawFn) -> dict[str, Any]:
    """The parameters Triton takes for itself: sequence id/start/end, priority, timeout."""
    out: dict[str, Any] = {}
    if draw(st.booleans()):
        out["sequence_id"] = draw(st.one_of(st.integers(1, 2**63 - 1), text.filter(bool)))
        out["sequence_start"] = draw(st.booleans())
        out["sequence_end"] = draw(st.booleans())
    if draw(st.booleans()):
        out["priority"] = draw(st.integers(0, 2**63 - 1))
    if draw(st.booleans()):
        out["timeout"] = draw(st.integers(0, 2**63 - 1))
    return out


class Output(NamedTuple):
    name: str
    binary: bool | None
    classification: int


outputs = st.one_of(st.none(), st.lists(
    st.builds(Output, names, st.one_of(st.none(), st.booleans()), st.one_of(st.just(0), st.integers(0, 2**31))),
    max_size=3, unique_by=lambda o: o.name))


def same_array(got: np.ndarray, want: np.ndarray) -> bool:
    """Same dtype, shape and content (bitwise for numbers; element-wise bytes for BYTES)."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    if want.dtype == np.object_:
        return [bytes(x) for x in got.reshape(-1)] == [bytes(x) for x in want.reshape(-1)]
    return np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes()


def mutations(data: bytes) -> st.SearchStrategy[bytes]:
    """``data`` with a few bytes flipped, inserted, deleted, or cut short: near-valid inputs reach far
    deeper into a decoder than random bytes do."""
    def mutate(draw: st.DrawFn) -> bytes:
        buf = bytearray(data)
        for _ in range(draw(st.integers(1, 4))):
            op = draw(st.sampled_from(("flip", "insert", "delete", "truncate")))
            pos = draw(st.integers(0, len(buf)))
            if op == "flip" and pos < len(buf):
                buf[pos] = draw(st.integers(0, 255))
            elif op == "insert":
                buf[pos:pos] = draw(st.binary(min_size=1, max_size=8))
            elif op == "delete":
                del buf[pos:pos + draw(st.integers(1, 8))]
            else:
                del buf[pos:]
        return bytes(buf)

    return st.composite(mutate)()
