"""A load's plan: the config a model directory gives (or the load API's override), completed and checked,
and the versions its policy selects, for a :class:`~.actor.ModelActor` to load. A refusal is a
:class:`~.messages.LoadRefused` that names the stage of Triton's load it fails at. Runs in the model
actor's greenlet (a backend's auto-complete on a helper thread).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...backends.base import Backend
from ...errors import TritonError
from ...repository import config as config_mod
from ...repository import ensemble_graph, layout, snapshot
from ...repository.config import ModelConfig
from ...runtime.bridge import call_in_thread
from ..scheduling.ensemble import Routes
from .messages import LoadRefused, LoadSettings


@dataclass(frozen=True, slots=True)
class Plan:
    model_dir: Path
    stamp: snapshot.Stamp
    config: ModelConfig
    backend: Backend | None  # None for an ensemble
    selected: dict[int, Path]
    graph: ensemble_graph.Graph | None = None


def prepare(model: str, model_dir: Path, override: ModelConfig | None, stamp: snapshot.Stamp,
            settings: LoadSettings, backends: dict[str, Backend], routes: Routes) -> Plan:
    """The config and versions to load; a refusal says which of Triton's load stages it is (``LoadRefused``)."""
    try:
        return _prepare_stages(model, model_dir, override, stamp, settings, backends, routes)
    except LoadRefused:
        raise
    except TritonError as e:
        raise LoadRefused(e, "poll") from None


def _prepare_stages(model: str, model_dir: Path, override: ModelConfig | None, stamp: snapshot.Stamp,
                    s: LoadSettings, backends: dict[str, Backend], routes: Routes) -> Plan:
    if override is None:
        cfg, explicit = config_mod.read(model_dir, model, auto_complete=s.auto_complete, config_name=s.config_name)
    else:  # the load's own message (LoadModel's parse): completed in place, a copy cost its size again
        cfg = override
        explicit = frozenset(f.name for f, _ in cfg.ListFields())
    available = layout.list_versions(model_dir)
    first = available[min(available, key=str)] if available else None
    config_mod.fill_backend_fields(cfg, model, first)
    if ensemble_graph.is_ensemble(cfg) or cfg.HasField("ensemble_scheduling"):
        return _prepare_ensemble(model, model_dir, cfg, stamp, available, s, routes)
    config_mod.validate_platform(cfg)
    config_mod.check_name(cfg, model)
    try:  # Triton's backend model and its auto-complete run per version: each selected version fails
        backend = backends.get(cfg.backend)
        if backend is None:  # Triton's text (core backend_model.cc); the built-in backends are listed in the docs
            raise TritonError.invalid_arg(f"unable to find backend library for backend '{cfg.backend}', try "
                                          "specifying runtime on the model configuration.")
        if s.auto_complete:
            call_in_thread(backend.auto_complete, cfg, model_dir, first, explicit)
        config_mod.normalize(cfg, model, s.gpu_count, s.gpu_support)
        config_mod.validate(cfg, model, s.gpu_count, s.gpu_support)
    except TritonError as e:
        versions = tuple(layout.select_versions(*config_mod.version_policy(cfg, unset_latest=1), available))
        # the file's own mistakes are the poll's; with auto-complete Triton checks the completed
        # config when the version loads (model.cc), which is where the backend's errors come from
        stage = "version" if versions and (s.auto_complete or backend is None) else "poll"
        raise LoadRefused(e, stage, versions) from None
    return Plan(model_dir, stamp, cfg, backend, _select(model, cfg, available))


def _prepare_ensemble(model: str, model_dir: Path, cfg: ModelConfig, stamp: snapshot.Stamp,
                      available: dict[int, Path], s: LoadSettings, routes: Routes) -> Plan:
    """An ensemble: no backend; its graph is checked (the poll's checks), then against the composing
    models as the routing table shows them now (the repository loads them first; Triton's model stage)."""
    config_mod.normalize(cfg, model, s.gpu_count, s.gpu_support)
    config_mod.validate(cfg, model, s.gpu_count, s.gpu_support)
    graph = ensemble_graph.check_scheduling(cfg)
    config_mod.check_name(cfg, model)
    table = routes()
    models = {}
    for name in ensemble_graph.dependencies(cfg):
        handle = table.get(name)
        if handle is not None and (handle.config is not None or handle.versions):
            reasons = [vh.reason for vh in handle.versions.values() if vh.reason]
            models[name] = ensemble_graph.Composing(handle.config, handle.ready_versions,
                                                    reasons[0] if reasons else "")
    try:
        # Triton sets an ensemble's policy from its steps, whatever the file says (ensemble_utils.cc)
        cfg.model_transaction_policy.decoupled = ensemble_graph.check_composing(cfg, graph, models)
    except TritonError as e:
        raise LoadRefused(e, "model") from None
    return Plan(model_dir, stamp, cfg, None, _select(model, cfg, available), graph)


def _select(model: str, cfg: ModelConfig, available: dict[int, Path]) -> dict[int, Path]:
    selected = layout.select_versions(*config_mod.version_policy(cfg), available)
    if not selected:  # Triton's model lifecycle picks the versions: a refusal of its model stage
        raise LoadRefused(TritonError.invalid_arg(
            f"at least one version must be available under the version policy of model '{model}'"), "model")
    return {v: available[v] for v in selected}
