"""The narrow contract between instance actors and backends (ONNX Runtime, TorchScript, Python)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ..errors import TritonError
from ..inference import InferRequest, InferResponse
from ..repository.config import ModelConfig
from ..repository.public_paths import PublicPaths
from ..runtime.threads import native_rlock


@dataclass(frozen=True, slots=True)
class InstanceContext:
    """Everything a backend instance needs to load, as Triton hands it to ``initialize``."""

    model_name: str
    version: int
    model_dir: Path
    version_dir: Path
    config: ModelConfig
    config_json: str
    instance_name: str  # "<group name>_<index in group>", e.g. "add_sub_0_0"
    kind: str  # "CPU" | "GPU" | "MODEL"
    device_id: int
    index: int  # position among all instances of this model version
    backend_config: dict[str, str] = field(default_factory=dict)
    # what the server that loads it gives its Python models (pb_utils ``serving.ServerHooks``: BLS, model
    # control, custom metrics); None outside a server (unit tests, an isolated model's own process)
    server_hooks: Any = None
    # the server's folders its files may live in (a load request's, an object-store repository's copy)
    # and what its errors name instead (repository/public_paths.py)
    public_paths: PublicPaths = ()


Result = InferResponse | TritonError


class _Reschedule:
    """The result of a request its model released with ``TRITONSERVER_REQUEST_RELEASE_RESCHEDULE``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "RESCHEDULE"


# Returned by a backend in place of a request's result: the scheduler queues the request again and the
# model's ``execute`` gets it in a later batch (Triton's request rescheduling, python backend 23.11+).
RESCHEDULE = _Reschedule()

# Models load on several native threads at once. The bootstrap gives importlib native locks (with
# ``_thread`` patched they would be gevent locks, which native threads cannot share: two first imports of
# one module on two load threads failed or hung). On top of that, backends import runtimes and a Python
# model's top-level code under this one native, re-entrant lock, so heavy first imports happen one at a
# time instead of contending.
IMPORT_LOCK = native_rlock()


class BackendInstance(Protocol):
    """One loaded copy of a model. Every method runs in the instance's native thread, except that
    ``execute`` may run in the calling greenlet when ``inline_ok`` is True (see actors/scheduling/instance.py)."""

    inline_ok: bool

    def execute(self, requests: list[InferRequest]) -> list[Result]:
        """One response or error per request, same order; raising fails the whole batch."""
        ...

    def finalize(self) -> None: ...


class Backend(Protocol):
    """A backend kind. ``auto_complete`` runs in a native helper thread; ``create`` in the instance's."""

    name: str

    def auto_complete(self, config: ModelConfig, model_dir: Path, version_dir: Path | None,
                      explicit: frozenset[str] = frozenset()) -> None:
        """Fill what the model itself tells about inputs, outputs and batching (mutates ``config``).
        ``explicit``: top-level fields the config file sets (they are never overridden)."""
        ...

    def create(self, ctx: InstanceContext) -> BackendInstance: ...


def sequence_io(cfg: ModelConfig) -> tuple[dict[str, int], list[str]]:
    """The inputs the sequence batcher adds to a model's requests (control and implicit-state inputs,
    name → data type enum) and the state outputs it reads back (actors/scheduling/sequence_controls.py); a backend
    that binds tensors by the config's names adds these. None without ``sequence_batching``."""
    if not cfg.HasField("sequence_batching"):
        return {}, []
    sb = cfg.sequence_batching
    types = {"int32_false_true": 8, "fp32_false_true": 11, "bool_false_true": 1}  # TYPE_INT32, _FP32, _BOOL
    added: dict[str, int] = {}
    for entry in sb.control_input:
        for c in entry.control:
            listed = [t for f, t in types.items() if len(getattr(c, f))]
            added[entry.name] = listed[0] if listed else int(c.data_type)
    for st in sb.state:
        added[st.input_name] = int(st.data_type)
    return added, [st.output_name for st in sb.state]
