"""The ONNX Runtime backend (``backend: "onnxruntime"`` / ``platform: "onnxruntime_onnx"``).

One ``InferenceSession`` per instance, created and run on the instance's native thread (ORT releases
the GIL, so instances run in parallel). Batched requests are concatenated along dimension 0 and the
outputs split back. Auto-complete reads inputs, outputs and batching from the model file by Triton's
rules (https://github.com/triton-inference-server/server/blob/main/docs/user_guide/model_configuration.md#auto-generated-model-configuration); a config that disagrees with the file is refused at load naming both sides.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import TritonError
from ..inference import InferRequest, InferResponse
from ..protocol._generated import model_config_pb2 as mc
from ..repository.config import ModelConfig
from ..repository.layout import model_file
from .base import IMPORT_LOCK, InstanceContext, Result, sequence_io

# ONNX tensor type strings (as onnxruntime reports them) → Triton config data types
ORT_TO_TRITON = {
    "tensor(bool)": mc.TYPE_BOOL, "tensor(uint8)": mc.TYPE_UINT8, "tensor(uint16)": mc.TYPE_UINT16,
    "tensor(uint32)": mc.TYPE_UINT32, "tensor(uint64)": mc.TYPE_UINT64, "tensor(int8)": mc.TYPE_INT8,
    "tensor(int16)": mc.TYPE_INT16, "tensor(int32)": mc.TYPE_INT32, "tensor(int64)": mc.TYPE_INT64,
    "tensor(float16)": mc.TYPE_FP16, "tensor(float)": mc.TYPE_FP32, "tensor(double)": mc.TYPE_FP64,
    "tensor(string)": mc.TYPE_STRING, "tensor(bfloat16)": mc.TYPE_BF16,
}
DEFAULT_MAX_BATCH_SIZE = 4  # Triton's --backend-config=default-max-batch-size default


def _dims(shape: list[Any]) -> list[int]:
    """ORT shape entries are ints, symbolic names (str) or None; variable ones become -1."""
    return [d if isinstance(d, int) and d >= 0 else -1 for d in shape]


def _type_name(value: int) -> str:
    return mc.DataType.Name(value)


def _import_ort() -> Any:
    try:
        with IMPORT_LOCK:
            import onnxruntime
    except ImportError as e:
        if importlib.util.find_spec("onnxruntime") is not None:  # installed, but its import failed
            raise TritonError.internal(f"importing onnxruntime failed: {e!r}") from None
        raise TritonError.unavailable(
            "the onnxruntime backend needs ONNX Runtime: pip install 'triton-actor[onnx]' "
            "(or 'triton-actor[onnx-gpu]' on CUDA hosts)"
        ) from None
    return onnxruntime


def gpu_support() -> str | None:
    """None when this ONNX Runtime has its CUDA execution provider, else why not (``devices.runtime_gpu_support``:
    the CPU wheel on a GPU host puts a kind left to the server on the CPU and refuses KIND_GPU)."""
    try:
        ort = _import_ort()
    except TritonError as e:
        return e.message
    providers = ort.get_available_providers()
    if "CUDAExecutionProvider" in providers:
        return None
    return (f"ONNX Runtime {ort.__version__} has no CUDAExecutionProvider (available providers: "
            f"{', '.join(providers)}); install onnxruntime-gpu with CUDA and cuDNN, or use KIND_CPU")


def _session(path: Path, threads: int, providers: list[Any]) -> Any:
    ort = _import_ort()

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    # no spinning: idle ORT threads must not steal the cores the hub and other instances need
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    opts.log_severity_level = 3
    try:
        return ort.InferenceSession(str(path), opts, providers=providers)
    except Exception as e:  # noqa: BLE001 - ORT raises its own exception types; the load fails with its message
        raise TritonError.invalid_arg(f"failed to load ONNX model {path}: {e}") from None


def _model_file(model_dir: Path, version_dir: Path | None, config: ModelConfig) -> Path:
    if version_dir is None:
        raise TritonError.invalid_arg(f"model '{config.name}': no version folder to read the ONNX model from")
    return model_file(config.name, version_dir, config.default_model_filename or "model.onnx", "ONNX model file")


class OnnxRuntimeBackend:
    """Backend factory; ``backend_config`` holds ``--backend-config`` (key "" = global settings)."""

    name = "onnxruntime"

    def __init__(self, backend_config: dict[str, dict[str, str]] | None = None) -> None:
        cfg = backend_config or {}
        self._global = cfg.get("", {})
        self._own = cfg.get("onnxruntime", {})

    # -- auto-complete (Triton's onnxruntime_backend) ------------------------------------------------------------------
    def auto_complete(self, config: ModelConfig, model_dir: Path, version_dir: Path | None,
                      explicit: frozenset[str] = frozenset()) -> None:
        session = _session(_model_file(model_dir, version_dir, config), 1, ["CPUExecutionProvider"])
        inputs, outputs = session.get_inputs(), session.get_outputs()
        if "max_batch_size" not in explicit and config.max_batch_size == 0:
            batchable = all(_dims(t.shape)[:1] == [-1] for t in [*inputs, *outputs])
            if batchable:
                default = self._global.get("default-max-batch-size", str(DEFAULT_MAX_BATCH_SIZE))
                config.max_batch_size = int(default)
        skip = 1 if config.max_batch_size > 0 else 0
        for field, model_tensors in ((config.input, inputs), (config.output, outputs)):
            if not field:
                for t in model_tensors:
                    entry = field.add()
                    entry.name = t.name
            by_name = {t.name: t for t in model_tensors}
            for entry in field:
                t = by_name.get(entry.name)
                if t is None:
                    continue  # reported at load, with both sides named
                if entry.data_type == mc.TYPE_INVALID and t.type in ORT_TO_TRITON:
                    entry.data_type = ORT_TO_TRITON[t.type]
                if not entry.dims and not entry.HasField("reshape"):
                    entry.dims.extend(_dims(t.shape)[skip:] or [1])
        scheduled = config.WhichOneof("scheduling_choice") is not None
        if config.max_batch_size > 1 and not scheduled:
            config.dynamic_batching.SetInParent()

    # -- instances ----------------------------------------------------------------------------------
    def create(self, ctx: InstanceContext) -> OnnxInstance:
        return OnnxInstance(ctx, self._threads(ctx))

    def _threads(self, ctx: InstanceContext) -> int:
        """Threads per session: config parameter, else --backend-config, else the cores shared out
        between this model's instances (at least 2 shares, so the hub keeps a core)."""
        params = ctx.config.parameters
        for key in ("intra_op_thread_count",):
            if key in params and params[key].string_value.strip():
                return max(1, int(params[key].string_value))
            if key in self._own:
                return max(1, int(self._own[key]))
        instances = sum(g.count for g in ctx.config.instance_group) or 1
        return max(1, (os.cpu_count() or 1) // max(2, instances))


class OnnxInstance:
    """One InferenceSession. Every method runs in the instance's native thread."""

    inline_ok = False  # ORT releases the GIL: a thread gives real parallelism

    def __init__(self, ctx: InstanceContext, threads: int) -> None:
        self.ctx = ctx
        cfg = ctx.config
        path = _model_file(ctx.model_dir, ctx.version_dir, cfg)
        if ctx.kind == "GPU":
            providers: list[Any] = [("CUDAExecutionProvider", {"device_id": ctx.device_id}), "CPUExecutionProvider"]
        else:
            providers = ["CPUExecutionProvider"]
        self.session = _session(path, threads, providers)
        if ctx.kind == "GPU" and "CUDAExecutionProvider" not in self.session.get_providers():
            # onnxruntime-gpu falls back to the CPU silently: refuse instead
            raise TritonError.invalid_arg(
                f"model '{cfg.name}' instance '{ctx.instance_name}': KIND_GPU asked for CUDA device "
                f"{ctx.device_id} but ONNX Runtime has no working CUDAExecutionProvider (providers: "
                f"{', '.join(self.session.get_providers())}); install onnxruntime-gpu with CUDA and cuDNN, "
                "or use KIND_CPU"
            )
        self.batching = cfg.max_batch_size > 0
        self._check_against_model(cfg)
        added, state_outputs = sequence_io(cfg)
        self.input_types = {**added, **{i.name: i.data_type for i in cfg.input}}
        self.output_names = [o.name for o in cfg.output] + [n for n in state_outputs if n not in {o.name for o in cfg.output}]

    def _check_against_model(self, cfg: ModelConfig) -> None:
        """Refuse a config that disagrees with the model file, naming both sides."""
        model = cfg.name
        skip = 1 if self.batching else 0
        for kind, config_tensors, model_tensors in (
            ("input", cfg.input, self.session.get_inputs()),
            ("output", cfg.output, self.session.get_outputs()),
        ):
            by_name = {t.name: t for t in model_tensors}
            for entry in config_tensors:
                t = by_name.get(entry.name)
                if t is None:
                    allowed = ", ".join(by_name)
                    raise TritonError.invalid_arg(
                        f"unable to load model '{model}', unexpected inference {kind} '{entry.name}', "
                        f"allowed {kind}s are: {allowed}"
                    )
                model_type = ORT_TO_TRITON.get(t.type, mc.TYPE_INVALID)
                if model_type != entry.data_type:
                    raise TritonError.invalid_arg(
                        f"unable to load model '{model}', configuration expects datatype "
                        f"{_type_name(entry.data_type)} for {kind} '{entry.name}', model provides "
                        f"{_type_name(model_type)} ({t.type})"
                    )
                self._check_dims(model, kind, entry, _dims(t.shape), skip)
            if kind == "input":
                known = {e.name for e in config_tensors} | set(sequence_io(cfg)[0])
                missing = [n for n in by_name if n not in known]
                if missing:
                    raise TritonError.invalid_arg(
                        f"unable to load model '{model}': the model has input(s) {missing} that the configuration "
                        "does not list"
                    )

    @staticmethod
    def _check_dims(model: str, kind: str, entry: Any, model_dims: list[int], skip: int) -> None:
        config_dims = list(entry.reshape.shape) if entry.HasField("reshape") else list(entry.dims)
        if skip and (not model_dims or model_dims[0] != -1):
            raise TritonError.invalid_arg(
                f"unable to load model '{model}', model {kind} '{entry.name}' has shape {model_dims}: its first "
                "dimension is not variable, so the model cannot support batching (max_batch_size > 0); "
                "set max_batch_size: 0"
            )
        rest = model_dims[skip:]
        if len(rest) != len(config_dims) or any(m != -1 and c != m for c, m in zip(config_dims, rest, strict=False)):
            shown = ([-1] if skip else []) + config_dims
            raise TritonError.invalid_arg(
                f"unable to load model '{model}', model {kind} '{entry.name}': the model has shape {model_dims} "
                f"but the configuration specifies {shown}"
                + (" (including the batch dimension of max_batch_size)" if skip else "")
            )

    def execute(self, requests: list[InferRequest]) -> list[Result]:
        try:
            if self.batching and len(requests) > 1:
                return self._run_batched(requests)
            return [self._run_one(r) for r in requests]
        except TritonError as e:
            return [e] * len(requests)
        except Exception as e:  # noqa: BLE001 - ORT errors fail this batch with ORT's message
            err = TritonError.internal(f"onnxruntime execution failed for model '{self.ctx.model_name}': {e}")
            return [err] * len(requests)

    def _feeds(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        feeds = {}
        for name, array in inputs.items():
            if self.input_types.get(name) == mc.TYPE_STRING:
                array = np.vectorize(_as_str, otypes=[object])(array) if array.size else array.astype(object)
            feeds[name] = array
        return feeds

    def _run_one(self, request: InferRequest) -> Result:
        feeds = self._feeds({n: t.data for n, t in request.inputs.items()})
        outs = self.session.run(self.output_names, feeds)
        return InferResponse(list(zip(self.output_names, outs, strict=True)))

    def _run_batched(self, requests: list[InferRequest]) -> list[Result]:
        sizes = [next(iter(r.inputs.values())).shape[0] for r in requests]
        names = list(requests[0].inputs)
        joined = {n: np.concatenate([r.inputs[n].data for r in requests]) for n in names}
        outs = self.session.run(self.output_names, self._feeds(joined))
        bounds = np.cumsum(sizes)[:-1]
        parts = [np.split(o, bounds) for o in outs]
        return [InferResponse([(n, parts[k][i]) for k, n in enumerate(self.output_names)]) for i in range(len(requests))]

    def finalize(self) -> None:
        self.session = None


def _as_str(item: Any) -> str:
    return item.decode("utf-8", "replace") if isinstance(item, bytes | bytearray) else str(item)
