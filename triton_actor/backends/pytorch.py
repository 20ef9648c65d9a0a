"""The PyTorch backend for TorchScript files (``backend: "pytorch"`` / ``platform: "pytorch_libtorch"``).

``torch`` is imported only when such a model loads, so a server without one does not pay its
memory. Each instance loads its own ``torch.jit`` module onto its device on its native thread and runs
it under ``torch.inference_mode()``. Tensor naming follows Triton (https://github.com/triton-inference-server/pytorch_backend): names ``<name>__<i>``
bind inputs by position ``i`` and pick outputs by index ``i`` in the returned tuple; other input names
bind to the ``forward()`` arguments of the same name; other output names follow config order.
"""

from __future__ import annotations

import importlib.util
import os
import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import TritonError
from ..inference import InferRequest, InferResponse
from ..protocol._generated import model_config_pb2 as mc
from ..repository.config import ModelConfig
from ..repository.layout import model_file
from .base import IMPORT_LOCK, InstanceContext, Result, sequence_io

_INDEXED = re.compile(r"^(.*)__(\d+)$")
_threads_configured = False


def _import_torch() -> Any:
    try:
        with IMPORT_LOCK, warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            import torch
    except ImportError as e:
        if importlib.util.find_spec("torch") is not None:  # installed, but its import failed
            raise TritonError.internal(f"importing torch failed: {e!r}") from None
        raise TritonError.unavailable(
            "the pytorch backend needs torch: pip install 'triton-actor[torch]' (torch==2.13.0 is the CPU build)"
        ) from None
    return torch


def gpu_support() -> str | None:
    """None when torch sees a CUDA device, else why not (``devices.runtime_gpu_support``: a CPU build of torch
    on a GPU host puts a kind left to the server on the CPU and refuses KIND_GPU)."""
    try:
        torch = _import_torch()
    except TritonError as e:
        return e.message
    if torch.cuda.is_available():
        return None
    return (f"torch {torch.__version__} has no usable CUDA device (torch.cuda.is_available() is false); "
            "install a CUDA build of torch, or use KIND_CPU")


def _indices(names: list[str]) -> list[int] | None:
    """Positions from ``<name>__<i>`` names, or None when not every name has that form."""
    found = [_INDEXED.match(n) for n in names]
    if not all(found):
        return None
    return [int(m.group(2)) for m in found if m is not None]


class PyTorchBackend:
    """Backend factory for TorchScript models."""

    name = "pytorch"

    def __init__(self, backend_config: dict[str, dict[str, str]] | None = None) -> None:
        self._own = (backend_config or {}).get("pytorch", {})

    def auto_complete(self, config: ModelConfig, model_dir: Path, version_dir: Path | None,
                      explicit: frozenset[str] = frozenset()) -> None:
        """A TorchScript file carries no input/output metadata: like Triton, the config must list them."""
        if not config.input or not config.output:
            raise TritonError.invalid_arg(
                f"model '{config.name}': the PyTorch backend cannot read inputs and outputs from a TorchScript "
                "file; list every input and output in config.pbtxt"
            )

    def create(self, ctx: InstanceContext) -> TorchScriptInstance:
        return TorchScriptInstance(ctx, self._threads(ctx))

    def _threads(self, ctx: InstanceContext) -> int:
        value = self._own.get("intra_op_thread_count") or self._own.get("num-threads")
        if value:
            return max(1, int(value))
        instances = sum(g.count for g in ctx.config.instance_group) or 1
        return max(1, (os.cpu_count() or 1) // max(2, instances))


class TorchScriptInstance:
    """One loaded TorchScript module. Every method runs in the instance's native thread."""

    inline_ok = False  # torch releases the GIL in its kernels: a thread gives real parallelism

    def __init__(self, ctx: InstanceContext, threads: int) -> None:
        global _threads_configured
        torch = self.torch = _import_torch()
        cfg = ctx.config
        self.ctx = ctx
        if not _threads_configured:  # process-wide in torch: sized once, at the first PyTorch model
            torch.set_num_threads(threads)
            _threads_configured = True
        if ctx.kind == "GPU":
            if not torch.cuda.is_available():
                raise TritonError.invalid_arg(
                    f"model '{cfg.name}' instance '{ctx.instance_name}': KIND_GPU but torch has no CUDA device "
                    f"(torch {torch.__version__}); use KIND_CPU or a CUDA build of torch"
                )
            self.device = torch.device("cuda", ctx.device_id)
        else:
            self.device = torch.device("cpu")
        for t in (*cfg.input, *cfg.output):
            if t.data_type in (mc.TYPE_STRING, mc.TYPE_BF16):
                raise TritonError.invalid_arg(
                    f"model '{cfg.name}': {mc.DataType.Name(t.data_type)} tensor '{t.name}' is not supported by "
                    "the PyTorch backend"
                )
        path = model_file(cfg.name, ctx.version_dir, cfg.default_model_filename or "model.pt", "TorchScript file")
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.module = torch.jit.load(str(path), map_location=self.device)
        except Exception as e:  # noqa: BLE001 - torch's own errors fail this load with its message
            raise TritonError.invalid_arg(f"failed to load TorchScript model {path}: {e}") from None
        self.module.eval()
        self.batching = cfg.max_batch_size > 0
        added, state_outputs = sequence_io(cfg)  # the sequence batcher's control and state tensors
        self.input_names = [i.name for i in cfg.input] + [n for n in added if n not in {i.name for i in cfg.input}]
        self.input_order = self._bind_inputs(cfg)
        self.output_names = [o.name for o in cfg.output] + [n for n in state_outputs if n not in {o.name for o in cfg.output}]
        self.output_index = _indices(self.output_names) or list(range(len(self.output_names)))

    def _bind_inputs(self, cfg: ModelConfig) -> list[str]:
        """Config input names in the order ``forward()`` takes them."""
        positions = _indices(self.input_names)
        if positions is not None:
            by_pos = dict(zip(positions, self.input_names, strict=True))
            if sorted(by_pos) != list(range(len(by_pos))):
                raise TritonError.invalid_arg(
                    f"model '{cfg.name}': input indices {sorted(by_pos)} must be 0..{len(by_pos) - 1} "
                    "(names '<name>__<index>')"
                )
            return [by_pos[i] for i in range(len(by_pos))]
        try:
            args = [a.name for a in self.module.forward.schema.arguments[1:]]  # [0] is self
        except AttributeError:
            return self.input_names
        unknown = [n for n in self.input_names if n not in args]
        if unknown:
            raise TritonError.invalid_arg(
                f"unable to load model '{cfg.name}': configuration input(s) {unknown} match no argument of "
                f"forward({', '.join(args)}); name inputs after forward()'s arguments or '<name>__<index>'"
            )
        return [a for a in args if a in self.input_names]

    def execute(self, requests: list[InferRequest]) -> list[Result]:
        try:
            with self.torch.inference_mode():
                if self.batching and len(requests) > 1:
                    return self._run_batched(requests)
                return [InferResponse(self._run({n: t.data for n, t in r.inputs.items()})) for r in requests]
        except TritonError as e:
            return [e] * len(requests)
        except Exception as e:  # noqa: BLE001 - torch errors fail this batch with torch's message
            err = TritonError.internal(f"PyTorch execution failed for model '{self.ctx.model_name}': {e}")
            return [err] * len(requests)

    def _run(self, inputs: dict[str, np.ndarray]) -> list[tuple[str, np.ndarray]]:
        torch = self.torch
        args = []
        for name in self.input_order:
            array = inputs[name]
            if not array.flags.writeable:  # torch.from_numpy needs a writable buffer
                array = array.copy()
            args.append(torch.from_numpy(array).to(self.device))
        result = self.module(*args)
        outs = list(result) if isinstance(result, tuple | list) else [result]
        produced = []
        for name, index in zip(self.output_names, self.output_index, strict=True):
            if index >= len(outs):
                raise TritonError.internal(
                    f"model '{self.ctx.model_name}' returned {len(outs)} output(s); output '{name}' asks for index {index}"
                )
            produced.append((name, outs[index].detach().cpu().numpy()))
        return produced

    def _run_batched(self, requests: list[InferRequest]) -> list[Result]:
        sizes = [next(iter(r.inputs.values())).shape[0] for r in requests]
        joined = {n: np.concatenate([r.inputs[n].data for r in requests]) for n in self.input_order}
        outs = self._run(joined)
        bounds = np.cumsum(sizes)[:-1]
        parts = [(name, np.split(array, bounds)) for name, array in outs]
        return [InferResponse([(name, split[i]) for name, split in parts]) for i in range(len(requests))]

    def finalize(self) -> None:
        self.module = None
