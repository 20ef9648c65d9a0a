"""The child process of ``check``: one real ``Server`` (EXPLICIT mode, no ports) loads one model and
serves it one request, and the outcome is written as JSON to the report file the parent named.

Runs on the hub of its own process (``python -m triton_actor check --one NAME --report FILE REPO...``).
The load goes through the server's load API (``DataPlane.load_model``), so its errors are the server's own
text; the request goes through the in-process data plane. A model that has a ``model_warmup`` ran it
during the load; any other gets one request synthesised from its config (zeros; empty strings for
BYTES; every non-optional input, variable dims as 1, batch 1; a whole sequence for a sequence batcher),
built by the warmup code. A model that calls ``os._exit`` leaves a report naming the call's file and line
first; a crash (a signal) leaves none and the parent reports it, with faulthandler's traceback in the log.
"""

from __future__ import annotations

import faulthandler
import json
import os
import time
import traceback
from dataclasses import asdict
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from ..actors.model.warmup import sample_request
from ..config.command_line import configure_logging, parse
from ..errors import TritonError
from ..protocol._generated import model_config_pb2 as mc
from ..protocol.v2_http import SEQUENCE_END, SEQUENCE_START
from ..repository import config as config_mod
from ..repository import layout
from ..runtime.process_memory import tree_bytes
from ..server import Server
from . import static
from .report import Failure, ModelResult

_EXIT_TIMEOUT_S = 5.0


def run(name: str, repositories: list[str], report: Path, on_cpu: bool) -> int:
    """Load ``name``, serve it one request, write the report; the process's exit status."""
    faulthandler.enable()  # a segfault in model code prints the Python frames it happened in
    result = ModelResult(name)
    real_exit = _report_exit_calls(result, report)
    settings = parse([f"--model-repository={r}" for r in repositories] + [
        "--model-control-mode=explicit", "--allow-http=false", "--allow-grpc=false", "--allow-metrics=false",
        # a model that calls others (BLS) finds them: they load on its first call, as a server serving the
        # whole repository would have them (the example repository's minilm_bls failed its check without)
        "--model-load-on-demand=true", f"--exit-timeout-secs={_EXIT_TIMEOUT_S:g}"])
    configure_logging(settings)
    server = Server(settings)
    server.start()
    try:
        _load_and_serve(server, name, repositories, on_cpu, result)
    except TritonError as e:
        result.error = Failure.from_text(e.message, repositories)
    _write(report, result)
    server.stop()
    os._exit = real_exit  # type: ignore[assignment]
    return 0


def _load_and_serve(server: Server, name: str, repositories: list[str], on_cpu: bool, result: ModelResult) -> None:
    parameters: dict[str, Any] = {}
    if on_cpu:  # KIND_GPU on a host without one: the rest of the model is still worth checking
        folders = layout.list_models([Path(r) for r in repositories]).get(name, [])
        cfg, _ = config_mod.read(folders[0], name, auto_complete=True)
        parameters["config"] = json_format.MessageToJson(static.cpu_only(cfg), preserving_proto_field_name=True)
    before = footprint()
    start = time.monotonic()
    server.plane.load_model(name, parameters)
    result.load_s = time.monotonic() - start
    handle = server.repository.routes[name]
    cfg = handle.config
    if cfg.model_warmup:
        result.exercised = f"model_warmup ran ({len(cfg.model_warmup)} sample(s))"
    else:
        start = time.monotonic()
        _one_request(server, name, cfg)
        result.infer_ms = (time.monotonic() - start) * 1000
        result.exercised = "one synthesised request"
    result.footprint_bytes = footprint() - before


def _one_request(server: Server, name: str, cfg: Any) -> None:
    """One request made from the config's inputs through the data plane; raises the model's error."""
    sample = mc.ModelWarmup(name="check", batch_size=1)
    for spec in cfg.input:
        if not spec.optional:
            sample.inputs[spec.name].CopyFrom(mc.ModelWarmup.Input(
                data_type=spec.data_type, dims=[d if d > 0 else 1 for d in spec.dims], zero_data=True))
    request = sample_request(sample, cfg, Path(), name, -1)._replace(id="check")
    if cfg.HasField("sequence_batching"):
        request = request._replace(correlation_id=1, flags=SEQUENCE_START | SEQUENCE_END)
    streamed = server.plane.infer_stream(request)
    try:
        for item, final in streamed.responses:
            if isinstance(item, TritonError):
                raise item
            if final:
                break
    finally:
        close = getattr(streamed.responses, "close", None)
        if close is not None:
            close()


def footprint() -> int:
    """Resident bytes of this process and every process below it (isolated Python models)."""
    return tree_bytes()


def _report_exit_calls(result: ModelResult, report: Path) -> Any:
    """Make ``os._exit`` (which skips every handler) leave a report that says where it was called;
    returns the real one. Processes forked from this one (isolated models) exit as they would."""
    real_exit, me = os._exit, os.getpid()

    def exit_here(status: int) -> None:
        if os.getpid() == me:
            caller = traceback.extract_stack(limit=2)[0]
            result.error = Failure(f"model '{result.name}': model code called os._exit({status}) while the model "
                                   "was loading or serving, which ends the server's process",
                                   caller.filename, caller.lineno)
            _write(report, result)
        real_exit(status)

    os._exit = exit_here  # type: ignore[assignment]
    return real_exit


def _write(report: Path, result: ModelResult) -> None:
    report.write_text(json.dumps(asdict(result)))
