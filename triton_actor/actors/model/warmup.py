"""``model_warmup`` (https://github.com/triton-inference-server/server/blob/main/docs/user_guide/model_configuration.md#model-warmup): sample requests run on every instance before a version is READY.

Runs in the greenlet that loads the version. Each warmup entry builds one request (``zero_data``,
``random_data`` — zeros for BYTES, as Triton does — or ``input_data_file`` under ``<model>/warmup/``)
and runs it ``count`` times on each instance; any error fails the version's load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ...errors import TritonError
from ...inference import InferInput, InferRequest
from ...protocol import bytes_codec
from ...protocol.dtypes import BY_ENUM_VALUE, BYTES
from ...repository import layout
from ...repository.config import ModelConfig
from ...runtime.kernel import Reply
from ...runtime.response_channel import ResponseChannel
from ..scheduling.instance import ModelInstance

WARMUP_TIMEOUT_S = 600.0


def warm_up(config: ModelConfig, model_dir: Path, model: str, version: int, instances: list[ModelInstance]) -> None:
    """Run every warmup sample on every instance; raise INVALID_ARG naming the sample on failure."""
    for sample in config.model_warmup:
        request = sample_request(sample, config, model_dir, model, version)
        for inst in instances:
            for _ in range(max(sample.count, 1)):
                reply: Reply[Any] = Reply()
                # a decoupled model answers through a response sender: give it a sink and drain it
                channel = ResponseChannel() if config.model_transaction_policy.decoupled else None
                run = request if channel is None else request._replace(responses=channel)
                inst.execute([run], lambda ok, value, r=reply: r.set(value) if ok else r.fail(value))
                try:
                    results, _timings = reply.get(WARMUP_TIMEOUT_S)
                    if isinstance(results[0], BaseException):
                        raise results[0]
                    final = channel is None
                    while not final:
                        item, final = channel.receive(WARMUP_TIMEOUT_S)
                        if isinstance(item, BaseException):
                            raise item
                except Exception as e:  # noqa: BLE001 - reported with the sample's name
                    raise TritonError.invalid_arg(
                        f"model '{model}' version {version}: warmup sample '{sample.name}' failed: {e}") from None
                finally:
                    if channel is not None:
                        channel.close()


def sample_request(sample: Any, config: ModelConfig, model_dir: Path, model: str, version: int) -> InferRequest:
    """One ``ModelWarmup`` entry as a request (``triton-actor check`` builds one from the config, too)."""
    batch = max(sample.batch_size, 1)
    inputs: dict[str, InferInput] = {}
    for name, spec in sample.inputs.items():
        dtype = BY_ENUM_VALUE.get(spec.data_type)
        if dtype is None or dtype.numpy is None:
            raise TritonError.invalid_arg(f"model '{model}': warmup input '{name}' has an unsupported data type")
        shape = ((batch,) if config.max_batch_size > 0 else ()) + tuple(int(d) for d in spec.dims)
        count = int(np.prod(shape)) if shape else 1
        source = spec.WhichOneof("input_data_type")
        if source == "input_data_file":
            path = model_dir / "warmup" / spec.input_data_file
            if not layout.contained(model_dir / "warmup", path) or not path.is_file():
                raise TritonError.invalid_arg(f"model '{model}': warmup file '{spec.input_data_file}' not found")
            raw = path.read_bytes()
            per_item = count // batch if config.max_batch_size > 0 else count
            if dtype is BYTES:
                data = bytes_codec.deserialize(raw, per_item, f"warmup input '{name}'")
            else:
                data = np.frombuffer(raw, dtype.numpy, per_item)
            data = np.concatenate([data] * batch) if config.max_batch_size > 0 else data
            data = data.reshape(shape)
        elif source == "random_data" and dtype is not BYTES:
            data = np.random.default_rng().random(shape).astype(dtype.numpy) if dtype.numpy.kind == "f" else \
                np.random.default_rng().integers(0, 2 if dtype.numpy.kind == "b" else 100, shape).astype(dtype.numpy)
        elif dtype is BYTES:
            data = np.full(shape, b"", dtype=np.object_)
        else:
            data = np.zeros(shape, dtype.numpy)
        inputs[name] = InferInput(name, dtype, shape, data)
    return InferRequest(model, version, f"warmup:{sample.name}", inputs)
