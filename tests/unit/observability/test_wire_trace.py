"""A request's wire stamps (observability/wire_trace.py) without a server: a stream request's send pair per
response, and a trace-file entry handed over after the front end's last send (a decoupled model's batch can
complete after its final response went out) written then, not lost."""

from __future__ import annotations

from typing import Any

from triton_actor.observability.wire_trace import WireTrace


class Emitted:
    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []

    def emit(self, _sampler: Any, entries: list[dict[str, Any]]) -> None:
        self.entries += entries


def _names(entries: list[dict[str, Any]]) -> list[str]:
    return [stamp["name"] for e in entries for stamp in e.get("timestamps", ())]


def test_a_trace_held_after_the_last_send_is_written_with_every_send_pair() -> None:
    wire = WireTrace("GRPC", None, 1)
    for _ in range(2):  # two responses of a decoupled model's request
        wire.sending()
        wire.written()
    wire.sent()
    tracer = Emitted()
    wire.hold(tracer, None, [{"id": 7, "model_name": "m"}])
    assert _names(tracer.entries) == ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END",
                                      "GRPC_SEND_START", "GRPC_SEND_END", "GRPC_SEND_START", "GRPC_SEND_END"]
    written = list(tracer.entries)
    wire.sent()  # once: nothing more
    assert tracer.entries == written


def test_a_unary_answer_has_one_send_pair_ended_by_sent() -> None:
    wire = WireTrace("HTTP", None, 1)
    tracer = Emitted()
    wire.hold(tracer, None, [{"id": 1}])
    wire.sending()
    assert tracer.entries == []  # written once the answer is out
    wire.sent()
    assert _names(tracer.entries) == ["HTTP_RECV_START", "HTTP_RECV_END", "HTTP_SEND_START", "HTTP_SEND_END"]
