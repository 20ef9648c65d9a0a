"""Wire compatibility of our generated protos with the official tritonclient modules.

tritonclient ships generated ``service_pb2`` / ``model_config_pb2`` modules built
from Triton's own .proto files; they are the ground truth here. Every message,
enum, field and RPC they define must exist in ours with identical wire
properties (ours may add things, never lack or change them).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from gevent import subprocess  # the test process is gevent-patched (tests/conftest.py)
from google.protobuf import descriptor_pb2, text_format
from google.protobuf.descriptor import (
    Descriptor,
    EnumDescriptor,
    FieldDescriptor,
    FileDescriptor,
)
from google.protobuf.message import Message

from triton_actor.protocol._generated import (
    grpc_service_pb2,
    grpc_service_pb2_grpc,
    health_pb2,
    health_pb2_grpc,
    model_config_pb2,
)
from triton_actor.protocol._generated._pool import POOL

pytest.importorskip("tritonclient.grpc")
ref_service = pytest.importorskip("tritonclient.grpc.service_pb2")
ref_model_config = pytest.importorskip("tritonclient.grpc.model_config_pb2")

REPO_ROOT = Path(__file__).resolve().parents[3]

# (reference module, our module)
FILE_PAIRS: list[tuple[ModuleType, ModuleType]] = [
    (ref_model_config, model_config_pb2),
    (ref_service, grpc_service_pb2),
]


def _walk_messages(messages: list[Descriptor]) -> Iterator[Descriptor]:
    """Yield every message, nested ones (map entries included) too."""
    for message in messages:
        yield message
        yield from _walk_messages(list(message.nested_types))


def _all_messages(file: FileDescriptor) -> list[Descriptor]:
    """All messages declared in *file*, depth first."""
    return list(_walk_messages(list(file.message_types_by_name.values())))


def _all_enums(file: FileDescriptor) -> list[EnumDescriptor]:
    """All enums declared in *file*, top-level and nested."""
    enums = list(file.enum_types_by_name.values())
    for message in _all_messages(file):
        enums.extend(message.enum_types)
    return enums


def _label(field: FieldDescriptor) -> str:
    """Field cardinality as a word."""
    if field.is_repeated:
        return "repeated"
    return "required" if field.is_required else "optional"


def _type_name(field: FieldDescriptor) -> str | None:
    """Full name of the field's message or enum type, if any."""
    if field.message_type is not None:
        return field.message_type.full_name
    if field.enum_type is not None:
        return field.enum_type.full_name
    return None


def _field_signature(field: FieldDescriptor) -> dict[str, object]:
    """Every property of a field that affects the wire or JSON/text formats."""
    oneof = field.containing_oneof
    return {
        "name": field.name,
        "number": field.number,
        "type": field.type,
        "label": _label(field),
        "type_name": _type_name(field),
        "oneof": oneof.name if oneof is not None else None,
        "is_map": field.message_type is not None
        and field.message_type.GetOptions().map_entry,
        "packed": field.is_packed,
        "has_presence": field.has_presence,
        "json_name": field.json_name,
    }


@pytest.mark.parametrize(("ref", "ours"), FILE_PAIRS, ids=lambda m: m.__name__)
def test_file_level(ref: ModuleType, ours: ModuleType) -> None:
    """Same proto file name, package, syntax and imports."""
    ref_proto = descriptor_pb2.FileDescriptorProto()
    ours_proto = descriptor_pb2.FileDescriptorProto()
    ref.DESCRIPTOR.CopyToProto(ref_proto)
    ours.DESCRIPTOR.CopyToProto(ours_proto)
    assert ours_proto.name == ref_proto.name
    assert ours_proto.package == ref_proto.package == "inference"
    assert ours_proto.syntax == ref_proto.syntax
    assert list(ours_proto.dependency) == list(ref_proto.dependency)


@pytest.mark.parametrize(("ref", "ours"), FILE_PAIRS, ids=lambda m: m.__name__)
def test_messages_and_fields(ref: ModuleType, ours: ModuleType) -> None:
    """Every reference message and field exists in ours with identical properties."""
    problems: list[str] = []
    for ref_msg in _all_messages(ref.DESCRIPTOR):
        try:
            our_msg = POOL.FindMessageTypeByName(ref_msg.full_name)
        except KeyError:
            problems.append(f"missing message {ref_msg.full_name}")
            continue
        if our_msg.file.name != ref_msg.file.name:
            problems.append(
                f"{ref_msg.full_name}: in {our_msg.file.name}, not {ref_msg.file.name}"
            )
        if our_msg.GetOptions().map_entry != ref_msg.GetOptions().map_entry:
            problems.append(f"{ref_msg.full_name}: map_entry differs")
        for ref_field in ref_msg.fields:
            our_field = our_msg.fields_by_name.get(ref_field.name)
            if our_field is None:
                problems.append(f"missing field {ref_field.full_name}")
                continue
            want, got = _field_signature(ref_field), _field_signature(our_field)
            if want != got:
                diff = {k: (want[k], got[k]) for k in want if want[k] != got[k]}
                problems.append(f"{ref_field.full_name}: (reference, ours) {diff}")
        for ref_oneof in ref_msg.oneofs:
            our_oneof = our_msg.oneofs_by_name.get(ref_oneof.name)
            if our_oneof is None:
                problems.append(f"missing oneof {ref_msg.full_name}.{ref_oneof.name}")
                continue
            ref_members = {f.name for f in ref_oneof.fields}
            if not ref_members <= {f.name for f in our_oneof.fields}:
                problems.append(
                    f"oneof {ref_msg.full_name}.{ref_oneof.name} lacks members"
                )
        # Declaration order drives the JSON/text printers: keep the reference order.
        ref_order = [f.name for f in ref_msg.fields]
        our_order = [f.name for f in our_msg.fields if f.name in set(ref_order)]
        if our_order != ref_order:
            problems.append(
                f"{ref_msg.full_name}: field order {our_order} != {ref_order}"
            )
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(("ref", "ours"), FILE_PAIRS, ids=lambda m: m.__name__)
def test_enums(ref: ModuleType, ours: ModuleType) -> None:
    """Every reference enum exists in ours with the same value names and numbers."""
    problems: list[str] = []
    for ref_enum in _all_enums(ref.DESCRIPTOR):
        try:
            our_enum = POOL.FindEnumTypeByName(ref_enum.full_name)
        except KeyError:
            problems.append(f"missing enum {ref_enum.full_name}")
            continue
        for value in ref_enum.values:
            our_value = our_enum.values_by_name.get(value.name)
            if our_value is None or our_value.number != value.number:
                problems.append(f"{ref_enum.full_name}.{value.name} = {value.number}")
    assert not problems, "\n".join(problems)


def test_inference_service_methods() -> None:
    """GRPCInferenceService has every reference RPC with the same types and streaming."""
    ref_svc = ref_service.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    our_svc = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert our_svc.full_name == ref_svc.full_name == "inference.GRPCInferenceService"
    assert len(ref_svc.methods) == 20
    for ref_method in ref_svc.methods:
        our_method = our_svc.methods_by_name.get(ref_method.name)
        assert our_method is not None, f"missing rpc {ref_method.name}"
        assert our_method.input_type.full_name == ref_method.input_type.full_name
        assert our_method.output_type.full_name == ref_method.output_type.full_name
        assert our_method.client_streaming == ref_method.client_streaming, (
            ref_method.name
        )
        assert our_method.server_streaming == ref_method.server_streaming, (
            ref_method.name
        )
    stream = our_svc.methods_by_name["ModelStreamInfer"]
    assert stream.client_streaming and stream.server_streaming
    assert hasattr(grpc_service_pb2_grpc, "GRPCInferenceServiceServicer")
    assert hasattr(grpc_service_pb2_grpc, "add_GRPCInferenceServiceServicer_to_server")


def test_health_service() -> None:
    """grpc.health.v1.Health/Check with the standard request, response and statuses."""
    assert health_pb2.DESCRIPTOR.package == "grpc.health.v1"
    svc = health_pb2.DESCRIPTOR.services_by_name["Health"]
    check = svc.methods_by_name["Check"]
    assert check.input_type.full_name == "grpc.health.v1.HealthCheckRequest"
    assert check.output_type.full_name == "grpc.health.v1.HealthCheckResponse"
    assert not check.client_streaming and not check.server_streaming
    request_field = health_pb2.HealthCheckRequest.DESCRIPTOR.fields_by_name["service"]
    assert (request_field.number, request_field.type) == (
        1,
        FieldDescriptor.TYPE_STRING,
    )
    status_field = health_pb2.HealthCheckResponse.DESCRIPTOR.fields_by_name["status"]
    assert status_field.number == 1
    assert (
        status_field.enum_type.full_name
        == "grpc.health.v1.HealthCheckResponse.ServingStatus"
    )
    assert {v.name: v.number for v in status_field.enum_type.values} == {
        "UNKNOWN": 0,
        "SERVING": 1,
        "NOT_SERVING": 2,
        "SERVICE_UNKNOWN": 3,
    }
    assert hasattr(health_pb2_grpc, "add_HealthServicer_to_server")


def _reference_infer_request() -> Message:
    """A ModelInferRequest built with tritonclient's classes, touching every field kind."""
    req = ref_service.ModelInferRequest(
        model_name="simple", model_version="3", id="req-1"
    )
    req.parameters["sequence_id"].int64_param = -42
    req.parameters["sequence_start"].bool_param = True
    req.parameters["priority"].uint64_param = 2**63 + 5
    req.parameters["tag"].string_param = "héllo"
    req.parameters["scale"].double_param = 0.125
    tensor = req.inputs.add(name="INPUT0", datatype="INT32", shape=[1, 4])
    tensor.parameters["shared_memory_region"].string_param = "region0"
    tensor.parameters["shared_memory_byte_size"].int64_param = 16
    typed = req.inputs.add(name="INPUT1", datatype="FP32", shape=[2])
    contents = typed.contents
    contents.bool_contents.extend([True, False])
    contents.int_contents.extend([-1, 2**31 - 1])
    contents.int64_contents.extend([-(2**63), 7])
    contents.uint_contents.extend([0, 2**32 - 1])
    contents.uint64_contents.extend([2**64 - 1])
    contents.fp32_contents.extend([1.5, -0.0])
    contents.fp64_contents.extend([3.25])
    contents.bytes_contents.extend([b"", b"\x00\xff"])
    out = req.outputs.add(name="OUTPUT0")
    out.parameters["classification"].int64_param = 3
    out.parameters["binary_data"].bool_param = True
    req.raw_input_contents.extend([b"\x01\x00\x00\x00" * 4, b""])
    return req


def _reference_config() -> Message:
    """A ModelConfig using maps, oneofs, nested enums and repeated scalars."""
    config = ref_model_config.ModelConfig(name="m", backend="python", max_batch_size=8)
    config.version_policy.specific.versions.extend([1, 3])
    config.input.add(
        name="IN",
        data_type=ref_model_config.TYPE_FP32,
        dims=[-1, 3],
        allow_ragged_batch=True,
    ).reshape.shape.extend([3])
    config.output.add(name="OUT", data_type=ref_model_config.TYPE_STRING, dims=[1])
    config.instance_group.add(
        count=2, kind=ref_model_config.ModelInstanceGroup.KIND_CPU
    )
    batching = config.dynamic_batching
    batching.preferred_batch_size.extend([4, 8])
    batching.max_queue_delay_microseconds = 100
    batching.priority_queue_policy[1].max_queue_size = 5
    config.parameters[
        "EXECUTION_ENV_PATH"
    ].string_value = "$$TRITON_MODEL_DIRECTORY/env.tar.gz"
    config.model_transaction_policy.decoupled = True
    warmup = config.model_warmup.add(name="w", batch_size=1)
    warmup.inputs["IN"].random_data = True
    config.model_metrics.metric_control.add().histogram_options.buckets.extend(
        [0.5, 1.0]
    )
    return config


def _round_trip(ref_message: Message, our_class: type[Message]) -> None:
    """Reference bytes parse with ours, re-serialize identically and back again."""
    wire = ref_message.SerializeToString(deterministic=True)
    ours = our_class.FromString(wire)
    assert ours.SerializeToString(deterministic=True) == wire
    # Text output ignores unknown fields: equality proves ours understood every field.
    assert text_format.MessageToString(ours) == text_format.MessageToString(ref_message)
    back = type(ref_message).FromString(ours.SerializeToString())
    assert back == ref_message


def test_round_trip_model_infer_request() -> None:
    """A tritonclient ModelInferRequest survives a trip through our classes byte for byte."""
    _round_trip(_reference_infer_request(), grpc_service_pb2.ModelInferRequest)


def test_round_trip_stream_response_and_config() -> None:
    """Responses and configs also survive the trip byte for byte."""
    stream = ref_service.ModelStreamInferResponse(error_message="")
    response = stream.infer_response
    response.model_name, response.model_version, response.id = "m", "1", "r"
    response.parameters["triton_final_response"].bool_param = True
    response.outputs.add(name="OUT", datatype="BYTES", shape=[1])
    response.raw_output_contents.append(b"\x03\x00\x00\x00abc")
    _round_trip(stream, grpc_service_pb2.ModelStreamInferResponse)

    config_response = ref_service.ModelConfigResponse()
    config_response.config.CopyFrom(_reference_config())
    _round_trip(config_response, grpc_service_pb2.ModelConfigResponse)


def test_generated_modules_up_to_date() -> None:
    """The committed generated modules match what scripts/gen_protos.py produces now."""
    pytest.importorskip("grpc_tools")
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "gen_protos.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
