"""One client facade over the official ``tritonclient.http`` and ``tritonclient.grpc``.

The shared scenarios run over both protocols: this adapter gives them one API whose answers look
like the HTTP client's (JSON dicts, numbers as numbers), converting gRPC's protobuf messages.
"""

from __future__ import annotations

from typing import Any

import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from triton_actor.repository.config import to_json_dict

from .server import ServerProcess

PROTOCOLS = ("http", "grpc")


class Client:
    """``protocol`` is "http" or "grpc"; ``mod`` is the tritonclient module for InferInput & co."""

    def __init__(self, protocol: str, server: ServerProcess) -> None:
        self.protocol = protocol
        self.grpc = protocol == "grpc"
        self.mod: Any = grpcclient if self.grpc else httpclient
        if self.grpc:
            self.raw: Any = grpcclient.InferenceServerClient(server.grpc_url)
        else:
            self.raw = httpclient.InferenceServerClient(server.url, concurrency=8)

    def close(self) -> None:
        self.raw.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)

    def _json(self, message: Any) -> Any:
        return to_json_dict(message) if self.grpc else message

    # -- calls whose answers differ in type between the clients ------------------------------------
    def get_server_metadata(self) -> dict[str, Any]:
        return self._json(self.raw.get_server_metadata())

    def get_model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        return self._json(self.raw.get_model_metadata(name, version))

    def get_model_config(self, name: str, version: str = "") -> dict[str, Any]:
        if self.grpc:
            return to_json_dict(self.raw.get_model_config(name, version).config)
        return self.raw.get_model_config(name, version)

    def get_inference_statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        return self._json(self.raw.get_inference_statistics(name, version))

    def get_model_repository_index(self) -> list[dict[str, Any]]:
        if self.grpc:
            return [{k: v for k, v in m.items() if v != ""} for m in to_json_dict(self.raw.get_model_repository_index())["models"]]
        return self.raw.get_model_repository_index()

    def shm_status(self, name: str = "") -> list[dict[str, Any]]:
        """System shared memory regions as HTTP lists them (gRPC answers a map of messages)."""
        if self.grpc:
            regions = to_json_dict(self.raw.get_system_shared_memory_status(name)).get("regions", {})
            return [regions[k] for k in sorted(regions)]
        return sorted(self.raw.get_system_shared_memory_status(name), key=lambda r: r["name"])

    def output_parameters(self, result: Any, name: str) -> dict[str, Any]:
        """An output's response parameters as plain values."""
        if self.grpc:
            return {k: v.WhichOneof("parameter_choice") and getattr(v, v.WhichOneof("parameter_choice"))
                    for k, v in result.get_output(name).parameters.items()}
        return result.get_output(name).get("parameters", {})

    def log_settings(self, update: dict[str, Any] | None = None) -> dict[str, Any]:
        """Log settings (after ``update``), as plain values."""
        answer = self.raw.update_log_settings(update) if update else self.raw.get_log_settings()
        if self.grpc:
            return {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in answer.settings.items()}
        return answer

    def trace_settings(self, model: str = "", update: dict[str, Any] | None = None) -> dict[str, list[str]]:
        """Trace settings (after ``update``), every value a list of strings as gRPC has them."""
        if update:
            answer = self.raw.update_trace_settings(model or None, update)
        else:
            answer = self.raw.get_trace_settings(model or None)
        if self.grpc:
            return {k: list(v.value) for k, v in answer.settings.items()}
        return {k: v if isinstance(v, list) else [v] for k, v in answer.items()}

    def response(self, result: Any) -> dict[str, Any]:
        """The infer response's header as a dict (id, model_name, model_version, outputs...)."""
        return to_json_dict(result.get_response()) if self.grpc else result.get_response()

    def input(self, name: str, array: Any, datatype: str, binary: bool = True) -> Any:
        """An InferInput holding ``array`` (gRPC always sends raw contents: ``binary`` is HTTP's)."""
        i = self.mod.InferInput(name, list(array.shape), datatype)
        if self.grpc:
            i.set_data_from_numpy(array)
        else:
            i.set_data_from_numpy(array, binary_data=binary)
        return i

    def output(self, name: str, binary: bool = True, class_count: int = 0) -> Any:
        if self.grpc:
            return grpcclient.InferRequestedOutput(name, class_count=class_count)
        return httpclient.InferRequestedOutput(name, binary_data=binary, class_count=class_count)

    def status(self, error: Any) -> str:
        """An InferenceServerException's status in this protocol's spelling."""
        return str(error.status())

    def expect(self, grpc_code: str, http_status: int) -> str:
        """The status an error has here: ``StatusCode.X`` over gRPC, the HTTP status code over HTTP."""
        return f"StatusCode.{grpc_code}" if self.grpc else str(http_status)


def register_until_refused(client: Any, keys: list[str]) -> tuple[int, Any]:
    """Register system shared-memory regions ``r0``, ``r1``, ... over ``keys`` until the server refuses
    one: how many it took, and the refusal (an ``InferenceServerException``; AssertionError if none)."""
    from tritonclient.utils import InferenceServerException

    for registered, key in enumerate(keys):
        try:
            client.register_system_shared_memory(f"r{registered}", key, 64)
        except InferenceServerException as refused:
            return registered, refused
    raise AssertionError(f"all {len(keys)} regions were registered: none was refused")
