"""Which GPUs this host has, and whether a backend's runtime can use them.

GPUs are counted without importing a CUDA runtime (torch alone costs ~2.5 s and 300 MB): the NVIDIA
driver lists one folder per GPU under /proc/driver/nvidia/gpus; ``CUDA_VISIBLE_DEVICES`` narrows what
processes may use. No driver → no GPU, so KIND_AUTO resolves to CPU (https://github.com/triton-inference-server/server/blob/main/docs/user_guide/model_configuration.md#instance-groups).

A driver is not enough: the CPU wheel of onnxruntime (what docs/install.md installs) and a CPU build of torch
cannot run on it. Triton's CPU-only backend builds name KIND_CPU as their preferred group; here
:func:`runtime_gpu_support` asks the runtime itself, once per backend per process and only on hosts that
have a GPU, and every kind left to the server (no ``instance_group``, or KIND_AUTO) follows the answer. The Python backend can always take a GPU group: like Triton's, it only
hands the model the device id (``model_instance_kind`` "GPU", ``model_instance_device_id``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

_PROC = Path("/proc/driver/nvidia/gpus")


def gpu_count(environ: dict[str, str] | None = None, proc: Path = _PROC) -> int:
    env = os.environ if environ is None else environ
    try:
        present = len([p for p in proc.iterdir() if p.is_dir()])
    except OSError:
        return 0
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return present
    ids = [v for v in visible.split(",") if v.strip() and v.strip() != "-1"]
    return min(present, len(ids))


def _probe(backend: str) -> Callable[[], str | None] | None:
    """The backend's own ``gpu_support()``, its module imported on first use (only hosts with a GPU ask).
    Backends without one (python) run wherever they are put."""
    if backend == "onnxruntime":
        from . import onnxruntime as module
    elif backend == "pytorch":
        from . import pytorch as module  # type: ignore[no-redef]
    else:
        return None
    return module.gpu_support


_answers: dict[str, str | None] = {}  # backend → its probe's answer; one entry per backend at most


def runtime_gpu_support(backend: str) -> str | None:
    """None when ``backend``'s runtime can run an instance on a GPU, else the reason (naming what is missing).

    Probed once per backend per process; the probe imports the runtime, so it runs on gevent's thread
    pool (``call_in_thread``) and blocks only the calling greenlet (a model's loader), not the hub.
    """
    if backend not in _answers:
        probe = _probe(backend)
        if probe is None:
            return None
        from ..runtime.bridge import call_in_thread  # lazy: only hosts with a GPU get here

        _answers[backend] = call_in_thread(probe)
    return _answers[backend]
