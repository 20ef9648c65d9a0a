"""Which GPUs this host has, without importing a CUDA runtime (torch alone costs ~2.5 s and 300 MB).

The NVIDIA driver lists one folder per GPU under /proc/driver/nvidia/gpus; ``CUDA_VISIBLE_DEVICES``
narrows what processes may use. No driver → no GPU, so KIND_AUTO resolves to CPU (spec §3.4).
"""

from __future__ import annotations

import os
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
