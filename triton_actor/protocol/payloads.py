"""JSON bodies of the non-inference endpoints: server/model metadata (https://github.com/kserve/kserve/blob/master/docs/predict-api/v2/required_api.md) and statistics (https://github.com/triton-inference-server/server/blob/main/docs/protocol/extension_statistics.md)."""

from __future__ import annotations

from typing import Any

import orjson

from ..errors import TritonError
from .dtypes import BY_ENUM_VALUE

EXTENSIONS = (
    "classification", "sequence", "model_repository", "model_repository(unload_dependents)", "schedule_policy",
    "model_configuration", "system_shared_memory", "cuda_shared_memory", "binary_tensor_data", "parameters",
    "statistics", "trace", "logging",
)


def server_metadata(name: str, version: str, extensions: tuple[str, ...] = EXTENSIONS) -> dict[str, Any]:
    return {"name": name, "version": version, "extensions": list(extensions)}


def model_metadata(name: str, versions: list[int], config: Any) -> dict[str, Any]:
    """``platform`` is config.platform, else config.backend; shapes get a leading -1 when batching."""
    batch = [-1] if config.max_batch_size > 0 else []

    def tensors(items: Any) -> list[dict[str, Any]]:
        return [{"name": t.name, "datatype": BY_ENUM_VALUE[t.data_type].wire, "shape": batch + list(t.dims)}
                for t in items]

    return {
        "name": name,
        "versions": [str(v) for v in versions],
        "platform": config.platform or config.backend,
        "inputs": tensors(config.input),
        "outputs": tensors(config.output),
    }


def _dur(count_ns: tuple[int, int]) -> dict[str, int]:
    return {"count": count_ns[0], "ns": count_ns[1]}


def model_statistics(snap: dict[str, Any]) -> dict[str, Any]:
    """One entry of ``model_stats`` from a :meth:`VersionStats.snapshot`."""
    d = snap["durations"]
    return {
        "name": snap["name"],
        "version": str(snap["version"]),
        "last_inference": snap["last_inference"],
        "inference_count": snap["inference_count"],
        "execution_count": snap["execution_count"],
        "inference_stats": {k: _dur(v) for k, v in d.items()},
        "response_stats": {},  # per-response stats exist for decoupled models only (Triton 2.51)
        "batch_stats": [
            {"batch_size": size, "compute_input": {"count": c, "ns": ci},
             "compute_infer": {"count": c, "ns": inf}, "compute_output": {"count": c, "ns": co}}
            for size, (c, ci, inf, co) in snap["batches"].items()
        ],
        "memory_usage": [],
    }


def json_object(body: bytes, what: str = "the request body") -> dict[str, Any]:
    """A JSON object body (empty body: ``{}``), with Triton's parse error text."""
    try:
        data = orjson.loads(body) if body.strip() else {}
    except orjson.JSONDecodeError as e:
        raise TritonError.invalid_arg(f"failed to parse the request JSON buffer: {e}") from None
    if not isinstance(data, dict):
        raise TritonError.invalid_arg(f"{what} must be a JSON object")
    return data
