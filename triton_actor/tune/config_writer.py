"""A candidate applied to a ``ModelConfig``: the load API's override and ``configs/tuned.pbtxt``.

Only the tuned fields change: the first instance group's ``count`` (other groups are dropped: the count
is tuned for one kind of device) and its ``kind`` when the candidate sets one (a host with a GPU), ``max_batch_size`` when the model takes a batch dimension, and
``dynamic_batching`` (present or not; its ``preferred_batch_size`` and ``max_queue_delay_microseconds``,
its other fields kept), and for a Python model the ``TRITON_ACTOR_ISOLATION`` parameter (in-process or a
process per instance, docs/isolation.md) when the candidate sets it. ``configs/<name>.pbtxt`` beside ``config.pbtxt`` is what Triton's
``--model-config-name=<name>`` reads instead, so an unchanged Triton serves the pick too.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf import json_format, text_format

from ..repository import config as model_config
from .points import Candidate

ModelConfig = model_config.ModelConfig
TUNED_FIELDS = ("instance_group", "max_batch_size", "dynamic_batching")
ISOLATION = "TRITON_ACTOR_ISOLATION"  # backends/python/isolated.py's parameter (a string here: tune is above it)


def candidate_of(cfg: ModelConfig, model: str = "") -> Candidate:
    """The tuned fields as a config sets them (one instance when it names no group, as Triton's default);
    ``model`` names an ensemble's composing model the candidate is for."""
    instances = cfg.instance_group[0].count if cfg.instance_group and cfg.instance_group[0].count else 1
    dynamic = cfg.HasField("dynamic_batching")
    db = cfg.dynamic_batching
    return Candidate(instances=instances, max_batch_size=cfg.max_batch_size, dynamic_batching=dynamic,
                     preferred=tuple(db.preferred_batch_size) if dynamic else (),
                     queue_delay_us=db.max_queue_delay_microseconds if dynamic else 0,
                     isolation=cfg.parameters[ISOLATION].string_value if ISOLATION in cfg.parameters else "",
                     model=model)


def apply(cfg: ModelConfig, candidate: Candidate) -> ModelConfig:
    """A copy of ``cfg`` with the candidate's fields."""
    out = ModelConfig()
    out.CopyFrom(cfg)
    if out.instance_group:
        del out.instance_group[1:]
        out.instance_group[0].count = candidate.instances
    else:
        out.instance_group.add(count=candidate.instances)
    if candidate.kind:
        group = out.instance_group[0]
        group.kind = model_config.mc.ModelInstanceGroup.Kind.Value(candidate.kind)
        if candidate.kind != "KIND_GPU":
            del group.gpus[:]  # a CPU group must name no GPU (Triton refuses it)
    if cfg.max_batch_size > 0:
        out.max_batch_size = candidate.max_batch_size
    if candidate.dynamic_batching:
        db = out.dynamic_batching
        db.SetInParent()
        was = tuple(db.preferred_batch_size)
        del db.preferred_batch_size[:]
        # the server's default (the maximum, core's normalization) is left unwritten where it was unwritten
        if was or candidate.preferred != (candidate.max_batch_size,):
            db.preferred_batch_size.extend(candidate.preferred)
        db.max_queue_delay_microseconds = candidate.queue_delay_us
    else:
        out.ClearField("dynamic_batching")
    if candidate.isolation:
        out.parameters[ISOLATION].string_value = candidate.isolation
    return out


def override_json(cfg: ModelConfig) -> str:
    """The load API's ``config`` parameter (proto field names, as Triton's JSON)."""
    return json_format.MessageToJson(cfg, preserving_proto_field_name=True, indent=None)


def from_json(text: str, model: str) -> ModelConfig:
    return model_config.parse_json(text, model)


def read_original(model_dir: Path, model: str) -> ModelConfig:
    """``config.pbtxt`` as written (not normalized): the base ``tuned.pbtxt`` differs from."""
    path = model_dir / "config.pbtxt"
    return model_config.parse_text(path.read_text(encoding="utf-8"), model, path)


def render(cfg: ModelConfig, header: str) -> str:
    lines = "".join(f"# {line}\n" for line in header.splitlines())
    return lines + text_format.MessageToString(cfg)


def write(model_dir: Path, cfg: ModelConfig, header: str, name: str = "tuned") -> Path:
    """Write ``<model_dir>/configs/<name>.pbtxt``; it is parsed back before it replaces anything."""
    text = render(cfg, header)
    model_config.parse_text(text, cfg.name or model_dir.name, f"configs/{name}.pbtxt")
    path = model_dir / "configs" / f"{name}.pbtxt"
    path.parent.mkdir(exist_ok=True)
    tmp = path.with_suffix(".pbtxt.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path
