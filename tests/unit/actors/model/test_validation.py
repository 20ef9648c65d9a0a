"""Request checks against the model config (``triton_actor/actors/model/validation.py``): Triton's exact messages.

Expected texts are Triton 2.51's (``infer_request.cc`` ``InferenceRequest::Normalize``), as captured from a
real server in ``tests/integration/test_bad_input.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from triton_actor.actors.model.validation import RequestValidator
from triton_actor.errors import Code, TritonError
from triton_actor.inference import InferInput, InferRequest, RequestedOutput
from triton_actor.protocol.dtypes import BY_WIRE, DType
from triton_actor.repository.config import parse_text

FP32, FP64 = BY_WIRE["FP32"], BY_WIRE["FP64"]
NO_ID = "[request id: <id_unknown>] "
BATCH_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be prepended to "
    "each input shape. If you want to specify the full shape including the batch dim in your input dims config, "
    "try setting max_batch_size to zero. See the model configuration docs for more info on max_batch_size."
)

ADD_SUB = RequestValidator(parse_text("""
name: "add_sub"
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
""", "add_sub", "config.pbtxt"))

IDENTITY_BATCH = RequestValidator(parse_text("""
name: "identity_batch"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
""", "identity_batch", "config.pbtxt"))

THREE = RequestValidator(parse_text("""
name: "three"
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 1 ] },
        { name: "INPUT2" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
""", "three", "config.pbtxt"))

OPTIONAL = RequestValidator(parse_text("""
name: "opt"
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ -1 ] },
        { name: "INPUT2" data_type: TYPE_FP32 dims: [ -1 ] optional: true } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
""", "opt", "config.pbtxt"))


def _t(name: str, shape: tuple[int, ...], dtype: DType = FP32) -> InferInput:
    return InferInput(name, dtype, shape, np.zeros(shape, dtype=dtype.numpy))


def _req(model: str, *inputs: InferInput, outputs: tuple[str, ...] | None = None, rid: str = "") -> InferRequest:
    outs = None if outputs is None else tuple(RequestedOutput(o) for o in outputs)
    return InferRequest(model, -1, rid, {t.name: t for t in inputs}, outs)


def _message(validator: RequestValidator, request: InferRequest) -> str:
    with pytest.raises(TritonError) as info:
        validator.check(request)
    assert info.value.code == Code.INVALID_ARG
    return info.value.message


def test_valid_requests_return_batch_size() -> None:
    assert ADD_SUB.check(_req("add_sub", _t("INPUT0", (4,)), _t("INPUT1", (4,)))) == 1
    assert IDENTITY_BATCH.check(_req("identity_batch", _t("INPUT0", (3, 4)))) == 3
    assert IDENTITY_BATCH.check(_req("identity_batch", _t("INPUT0", (8, 4)), outputs=("OUTPUT0",))) == 8
    assert OPTIONAL.check(_req("opt", _t("INPUT0", (2,)), _t("INPUT1", (5,)))) == 1
    assert OPTIONAL.check(_req("opt", _t("INPUT0", (2,)), _t("INPUT1", (5,)), _t("INPUT2", (1,)))) == 1


def test_wrong_datatype() -> None:
    msg = _message(ADD_SUB, _req("add_sub", _t("INPUT0", (4,), FP64), _t("INPUT1", (4,))))
    assert msg == NO_ID + "inference input 'INPUT0' data-type is 'FP64', but model 'add_sub' expects 'FP32'"


def test_request_id_in_prefix() -> None:
    msg = _message(ADD_SUB, _req("add_sub", _t("INPUT0", (4,), FP64), _t("INPUT1", (4,)), rid="r7"))
    assert msg.startswith("[request id: r7] inference input 'INPUT0'")


def test_wrong_shape_exact_text_with_trailing_space() -> None:
    # Triton builds "... got " + shape + ". " + note, and the note is empty without batching: the text
    # ends with ". " (a trailing space).
    msg = _message(ADD_SUB, _req("add_sub", _t("INPUT0", (5,)), _t("INPUT1", (4,))))
    assert msg == NO_ID + "unexpected shape for input 'INPUT0' for model 'add_sub'. Expected [4], got [5]. "


def test_wrong_shape_of_batching_model_shows_wildcard_and_note() -> None:
    msg = _message(IDENTITY_BATCH, _req("identity_batch", _t("INPUT0", (2, 5))))
    assert msg == (NO_ID + "unexpected shape for input 'INPUT0' for model 'identity_batch'. "
                   "Expected [-1,4], got [2,5]. " + BATCH_NOTE)


def test_batching_model_without_batch_dim_gets_the_note() -> None:
    msg = _message(IDENTITY_BATCH, _req("identity_batch", _t("INPUT0", (4,))))
    assert msg == (NO_ID + "unexpected shape for input 'INPUT0' for model 'identity_batch'. "
                   "Expected [-1,4], got [4]. " + BATCH_NOTE)


def test_missing_required_input() -> None:
    msg = _message(ADD_SUB, _req("add_sub", _t("INPUT0", (4,))))
    assert msg == (NO_ID + "expected 2 inputs but got 1 inputs for model 'add_sub'. Got input(s) ['INPUT0'], "
                   "but missing required input(s) ['INPUT1']. Please provide all required input(s).")


def test_missing_inputs_lists_are_comma_separated_without_spaces() -> None:
    # Triton joins the names with "," (no space): ['INPUT0','INPUT1','INPUT2'] (server qa L0_input_validation)
    msg = _message(THREE, _req("three", _t("INPUT1", (1,))))
    assert msg == (NO_ID + "expected 3 inputs but got 1 inputs for model 'three'. Got input(s) ['INPUT1'], "
                   "but missing required input(s) ['INPUT0','INPUT2']. Please provide all required input(s).")


def test_missing_inputs_are_listed_in_config_order() -> None:
    # Triton walks model_config.input() in order to build the missing list
    zeta_alpha = RequestValidator(parse_text("""
    name: "za"
    backend: "python"
    input [ { name: "ZETA" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "ALPHA" data_type: TYPE_FP32 dims: [ 1 ] } ]
    output [ { name: "O" data_type: TYPE_FP32 dims: [ 1 ] } ]
    """, "za", "config.pbtxt"))
    msg = _message(zeta_alpha, _req("za"))
    assert msg == (NO_ID + "expected 2 inputs but got 0 inputs for model 'za'. Got input(s) [], "
                   "but missing required input(s) ['ZETA','ALPHA']. Please provide all required input(s).")


def test_no_inputs_at_all() -> None:
    msg = _message(ADD_SUB, _req("add_sub"))
    assert msg == (NO_ID + "expected 2 inputs but got 0 inputs for model 'add_sub'. Got input(s) [], "
                   "but missing required input(s) ['INPUT0','INPUT1']. Please provide all required input(s).")


def test_missing_required_input_with_optional_inputs() -> None:
    # with optional inputs Triton reports the allowed range (server qa L0_input_validation)
    msg = _message(OPTIONAL, _req("opt", _t("INPUT0", (1,))))
    assert msg == (NO_ID + "expected number of inputs between 2 and 3 but got 1 inputs for model 'opt'. "
                   "Got input(s) ['INPUT0'], but missing required input(s) ['INPUT1']. "
                   "Please provide all required input(s).")


def test_batch_size_too_large() -> None:
    msg = _message(IDENTITY_BATCH, _req("identity_batch", _t("INPUT0", (9, 4))))
    assert msg == NO_ID + "inference request batch-size must be <= 8 for 'identity_batch'"


def test_unknown_input() -> None:
    msg = _message(ADD_SUB, _req("add_sub", _t("INPUT0", (4,)), _t("INPUT1", (4,)), _t("INPUT9", (4,))))
    assert msg == NO_ID + "unexpected inference input 'INPUT9' for model 'add_sub'"


def test_unknown_output_has_no_request_prefix() -> None:
    msg = _message(ADD_SUB, _req("add_sub", _t("INPUT0", (4,)), _t("INPUT1", (4,)), outputs=("OUTPUT9",)))
    assert msg == "unexpected inference output 'OUTPUT9' for model 'add_sub'"


@pytest.mark.parametrize("fast", [True, False])
def test_an_output_asked_for_twice_is_refused_every_time(fast: bool, monkeypatch) -> None:
    """Triton core refuses a requested output named twice (core PR #493, its L0_grpc python_unit_test):
    ``[request id: ...] output 'X' already exists in request``; never remembered as accepted."""
    from triton_actor.runtime import fastpath

    monkeypatch.setattr(fastpath, "enabled", fast)
    twice = _req("add_sub", _t("INPUT0", (4,)), _t("INPUT1", (4,)), outputs=("OUTPUT1", "OUTPUT0", "OUTPUT1"))
    for _ in range(2):
        assert _message(ADD_SUB, twice) == NO_ID + "output 'OUTPUT1' already exists in request"
    assert ADD_SUB.check(_req("add_sub", _t("INPUT0", (4,)), _t("INPUT1", (4,)), outputs=("OUTPUT1", "OUTPUT0"))) == 1


def test_scalar_input_to_batching_model() -> None:
    # Triton: LogRequest() + "input '" + name + "' has no shape but model requires batch dimension for '" + model + "'"
    msg = _message(IDENTITY_BATCH, _req("identity_batch", _t("INPUT0", ())))
    assert msg == NO_ID + "input 'INPUT0' has no shape but model requires batch dimension for 'identity_batch'"


def test_batch_sizes_of_inputs_must_agree() -> None:
    two = RequestValidator(parse_text("""
    name: "two"
    backend: "python"
    max_batch_size: 4
    input [ { name: "A" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 1 ] } ]
    output [ { name: "O" data_type: TYPE_FP32 dims: [ 1 ] } ]
    """, "two", "config.pbtxt"))
    assert two.check(_req("two", _t("A", (2, 1)), _t("B", (2, 1)))) == 2
    msg = _message(two, _req("two", _t("A", (2, 1)), _t("B", (3, 1))))
    assert msg == NO_ID + "input 'B' batch size does not match other inputs for 'two'"


def test_variable_dims_accept_any_size() -> None:
    assert OPTIONAL.check(_req("opt", _t("INPUT0", (1000,)), _t("INPUT1", (0,)))) == 1
    msg = _message(OPTIONAL, _req("opt", _t("INPUT0", (2, 2)), _t("INPUT1", (1,))))
    assert "Expected [-1], got [2,2]" in msg


@pytest.mark.usefixtures("fast_paths")
def test_an_accepted_signature_is_remembered_and_a_refused_one_refused_each_time() -> None:
    """Fast path: a signature the check accepted gets the same batch size again (from the validator's memo);
    one it refused is refused every time, each error naming its own request; a new shape, type or set of
    outputs is checked in full (so an accepted signature never lets a different request through)."""
    validator = IDENTITY_BATCH
    for _ in range(3):
        assert validator.check(_req("identity_batch", _t("INPUT0", (3, 4)))) == 3
        assert validator.check(_req("identity_batch", _t("INPUT0", (3, 4)), outputs=("OUTPUT0",))) == 3
    for rid in ("a", "b"):
        assert _message(validator, _req("identity_batch", _t("INPUT0", (3, 5)), rid=rid)).startswith(f"[request id: {rid}] unexpected shape")
        assert "data-type is 'FP64'" in _message(validator, _req("identity_batch", _t("INPUT0", (3, 4), FP64), rid=rid))
        assert _message(validator, _req("identity_batch", _t("INPUT0", (3, 4)), outputs=("NOPE",))).startswith("unexpected inference output")
        assert "must be <= 8" in _message(validator, _req("identity_batch", _t("INPUT0", (9, 4)), rid=rid))
    assert validator.check(_req("identity_batch", _t("INPUT0", (3, 4)))) == 3


def test_batch_reshaped_puts_a_batch_of_one_in_front_or_takes_it_off() -> None:
    """Triton's ReshapeTensorDims, for an ensemble step: a batching model (IDENTITY_BATCH, dims [4]) gets a
    tensor of its dims as a batch of 1; one that does not batch (ADD_SUB, dims [4]) gets [1, 4] as [4];
    a tensor already right, or neither, is left alone, and nothing changed hands back the same dict."""
    plain = {"INPUT0": _t("INPUT0", (4,))}
    shaped = IDENTITY_BATCH.batch_reshaped(plain)
    assert shaped["INPUT0"].shape == (1, 4) and shaped["INPUT0"].data.shape == (1, 4)
    assert IDENTITY_BATCH.check(_req("identity_batch", *shaped.values())) == 1
    batched = {"INPUT0": _t("INPUT0", (1, 4)), "INPUT1": _t("INPUT1", (4,))}
    stripped = ADD_SUB.batch_reshaped(batched)
    assert stripped["INPUT0"].shape == (4,) and stripped["INPUT1"] is batched["INPUT1"]
    for same in ({"INPUT0": _t("INPUT0", (2, 4))}, {"INPUT0": _t("INPUT0", (3,))}):
        assert IDENTITY_BATCH.batch_reshaped(same) is same
    assert ADD_SUB.batch_reshaped(plain) is plain
