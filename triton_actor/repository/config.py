"""``config.pbtxt`` → ``inference.ModelConfig``: parse, fill, normalize, validate, and print as Triton's JSON.

Mirrors Triton core's order: read (or start empty when auto-complete is on) → fill backend/platform/
default file name from the folder's contents (always) → backend auto-complete (the backend's job) →
normalize → validate. Every error names the model, and the file with line and column or the rule.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from google.protobuf import json_format, text_format
from google.protobuf.descriptor import FieldDescriptor

from ..errors import TritonError
from ..protocol._generated import model_config_pb2 as mc
from .layout import is_plain_file_name

ModelConfig = mc.ModelConfig

# platform / model file → backend, platform, default file name (core ``AutoCompleteBackendFields``, first match wins)
_FILE_RULES: tuple[tuple[str, str, str, str], ...] = (
    ("tensorrt_plan", "model.plan", "tensorrt", "tensorrt_plan"),
    ("onnxruntime_onnx", "model.onnx", "onnxruntime", "onnxruntime_onnx"),
    ("", "model.xml", "openvino", ""),
    ("pytorch_libtorch", "model.pt", "pytorch", "pytorch_libtorch"),
    ("torch_aoti", "model.pt2", "pytorch", "torch_aoti"),
    ("", "model.py", "python", ""),
    ("tensorflow_savedmodel", "model.savedmodel", "tensorflow", "tensorflow_savedmodel"),
    ("tensorflow_graphdef", "model.graphdef", "tensorflow", "tensorflow_graphdef"),
)
_PLATFORM_BACKEND = {
    "tensorrt_plan": "tensorrt",
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "libtorch": "pytorch",
    "torch_aoti": "pytorch",
    "tensorflow_savedmodel": "tensorflow",
    "tensorflow_graphdef": "tensorflow",
}


def _err(model: str, message: str) -> TritonError:
    return TritonError.invalid_arg(f"model '{model}': {message}")


def parse_text(text: str, model: str, path: Path | str) -> ModelConfig:
    """Parse protobuf text format; a syntax error names the file, line and column."""
    cfg = ModelConfig()
    try:
        text_format.Parse(text, cfg)
    except text_format.ParseError as e:
        detail = _cpp_words(str(e).split(": ", 1)[-1] if e.GetLine() else str(e))
        where = f"{path}:{e.GetLine()}:{e.GetColumn()}" if e.GetLine() else str(path)
        raise _err(model, f"invalid config at {where}: {detail}") from None
    return cfg


def _cpp_words(detail: str) -> str:
    """Python protobuf's words for a number that does not fit its field, as C++ protobuf's TextFormat (which
    Triton parses with) says them, after them: Triton's L0_simple_ensemble looks for these in its log."""
    m = re.search(r"(?:Couldn't parse (?:unsigned )?integer|Value out of range): (\S+)$", detail)
    if m is None:
        return detail
    value = m.group(1)
    if not re.fullmatch(r"-?\d+", value):
        return f"{detail} (Expected integer, got: {value})"
    if value.startswith("-") and int(value) >= -(2**31):  # a negative number for an unsigned field
        return f"{detail} (Expected integer, got: -)"
    return f"{detail} (Integer out of range ({value}))"


def parse_json(text: str | Callable[[], str], model: str) -> ModelConfig:
    """A config given as JSON (load API override): proto field names, unknown fields are errors.
    ``text`` may be a call that hands the text over (a load's one-shot holder, repository/overrides.py):
    then nothing holds the text once ``json.loads`` has read it, where ``json_format.Parse`` kept it
    beside the JSON objects and the message it makes (issue 23: three times a 4 MiB override at once)."""
    cfg = ModelConfig()
    try:
        data = json.loads(text if isinstance(text, str) else text(), object_pairs_hook=_unique_keys)
    except ValueError as e:  # json_format.Parse's words
        raise _err(model, f"Invalid config override: Failed to load JSON: {e}.") from None
    try:
        json_format.ParseDict(data, cfg, ignore_unknown_fields=False)
    except json_format.ParseError as e:
        raise _err(model, f"Invalid config override: {e}") from None
    except Exception as e:  # noqa: BLE001 - json_format.Parse's words for what ParseDict raises otherwise
        raise _err(model, f"Invalid config override: Failed to parse JSON: {type(e).__name__}: {e}.") from None
    return cfg


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are unique (json_format.Parse refuses a repeated key as well)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key}")
        out[key] = value
    return out


def read(model_dir: Path, model: str, *, auto_complete: bool, config_name: str = "") -> tuple[ModelConfig, frozenset[str]]:
    """Read ``configs/<config_name>.pbtxt`` or ``config.pbtxt``; none at all is allowed only with auto-complete.

    Also returns the top-level fields the file sets: proto3 cannot tell ``max_batch_size: 0`` from an
    unset field, and auto-complete must not override what the user wrote.
    """
    candidates = [model_dir / "configs" / f"{config_name}.pbtxt"] if config_name else []
    candidates.append(model_dir / "config.pbtxt")
    for path in candidates:
        if path.is_file():
            try:
                text = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise _err(model, f"failed to read {path}: {e}") from None
            return parse_text(text, model, path), top_level_fields(text)
    if not auto_complete:
        raise _err(model, f"failed to read model configuration: {model_dir / 'config.pbtxt'} does not exist "
                          "(auto-complete is disabled)")
    return ModelConfig(), frozenset()


# strings and comments (skipped), brackets, and identifiers that start a field (followed by ':' or '{')
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|#[^\n]*|[{}\[\]<>]|[A-Za-z_][A-Za-z0-9_]*(?=\s*[:{<\[])')


def top_level_fields(text: str) -> frozenset[str]:
    """Names of the fields a protobuf text-format document sets at its top level."""
    depth, names = 0, set()
    for tok in _TOKEN.findall(text):
        first = tok[0]
        if first in "{[<":
            depth += 1
        elif first in "}]>":
            depth -= 1
        elif depth == 0 and first not in "\"'#":
            names.add(tok)
    return frozenset(names)


def fill_backend_fields(cfg: ModelConfig, model: str, first_version_dir: Path | None) -> None:
    """Name, backend, platform and default file name from the folder (runs even without auto-complete)."""
    if not cfg.name:
        cfg.name = model
    if cfg.platform == "ensemble":
        return
    files = set()
    if first_version_dir is not None and first_version_dir.is_dir():
        files = {p.name for p in first_version_dir.iterdir()}
    if cfg.default_model_filename:
        files.add(cfg.default_model_filename)
    for platform, filename, backend, default_platform in _FILE_RULES:
        by_platform = bool(platform) and cfg.platform in (platform, "libtorch" if backend == "pytorch" else platform)
        by_file = filename in files and cfg.backend in ("", backend) and cfg.platform in ("", default_platform)
        if by_platform or by_file:
            cfg.backend = cfg.backend or backend
            cfg.platform = cfg.platform or default_platform
            cfg.default_model_filename = cfg.default_model_filename or filename
            return
    if not (cfg.backend or cfg.platform or cfg.default_model_filename):
        # a custom backend named by the model: "m.identity" runs backend "identity" (core AutoCompleteBackendFields)
        if "." not in model:
            raise TritonError.invalid_arg(
                f"Invalid model name: Could not determine backend for model '{model}' with no backend in model "
                "configuration. Expected model name of the form 'model.<backend_name>'.")
        cfg.backend = model.split(".", 1)[1]
        cfg.default_model_filename = f"model.{cfg.backend}"


def any_runtime(backend: str) -> str | None:
    """The GPU support of a caller that names none: every backend's runtime is taken to use a GPU (model
    actors pass the real probe, ``LoadSettings.gpu_support``)."""
    return None


def normalize(cfg: ModelConfig, model: str, gpu_count: int,
              gpu_support: Callable[[str], str | None] = any_runtime) -> None:
    """Triton's ``NormalizeModelConfig`` / ``NormalizeInstanceGroup``: what /config shows after load.

    A kind left to the server (KIND_AUTO) is KIND_GPU only when the host has a GPU and the backend's
    runtime can use it (``gpu_support(backend)`` is None: a model actor passes
    ``LoadSettings.gpu_support``, :func:`triton_actor.backends.devices.runtime_gpu_support`), else KIND_CPU:
    the CPU wheel of onnxruntime on a GPU host serves on the CPU instead of failing to load."""
    if not cfg.HasField("version_policy"):
        cfg.version_policy.latest.num_versions = 1
    if cfg.HasField("dynamic_batching") and cfg.max_batch_size > 0 and not cfg.dynamic_batching.preferred_batch_size:
        cfg.dynamic_batching.preferred_batch_size.append(cfg.max_batch_size)
    if cfg.HasField("sequence_batching") and cfg.sequence_batching.max_sequence_idle_microseconds == 0:
        cfg.sequence_batching.max_sequence_idle_microseconds = 1_000_000
    if cfg.platform != "ensemble":
        cfg.optimization.input_pinned_memory.enable = True
        cfg.optimization.output_pinned_memory.enable = True
        if not cfg.instance_group:
            # Triton's NormalizeInstanceGroup names the group it adds after the model ("m"), and
            # its instance is then "m_0" (Triton 2.51: /config and the execute error of exec_raise,
            # scripts/triton_reference/NOTES.md); unnamed groups of the file are "<model>_<position>"
            cfg.instance_group.add(name=model, kind=mc.ModelInstanceGroup.KIND_AUTO)
        for idx, group in enumerate(cfg.instance_group):
            if not group.name:
                group.name = f"{model}_{idx}"
            if group.kind == mc.ModelInstanceGroup.KIND_AUTO:
                on_gpu = gpu_count > 0 and gpu_support(cfg.backend) is None
                group.kind = mc.ModelInstanceGroup.KIND_GPU if on_gpu else mc.ModelInstanceGroup.KIND_CPU
            if group.count < 1:
                cpu = group.kind == mc.ModelInstanceGroup.KIND_CPU
                group.count = 2 if cfg.backend in ("onnxruntime", "tensorflow") and cpu else 1
            if group.kind == mc.ModelInstanceGroup.KIND_GPU and not group.gpus:
                group.gpus.extend(range(gpu_count))


def validate_platform(cfg: ModelConfig) -> None:
    """A backend, except for an ensemble, which must have none (core ``ValidateModelConfig``, its first checks)."""
    ensemble = cfg.platform == "ensemble"
    if not cfg.backend and not ensemble:
        raise TritonError.invalid_arg(f"unexpected platform type '{cfg.platform}' for {cfg.name}")
    if cfg.backend and ensemble:
        raise TritonError.invalid_arg(f"Ensemble model '{cfg.name}' must have platform type 'ensemble' and empty "
                                      "backend type")


def validate(cfg: ModelConfig, model: str, gpu_count: int,
             gpu_support: Callable[[str], str | None] = any_runtime) -> None:
    """The invalid combinations (https://github.com/triton-inference-server/server/blob/main/docs/user_guide/model_configuration.md) that apply to any model; raise on the first.
    An explicit KIND_GPU needs a GPU on the host and a runtime that can use it (``gpu_support``).
    The name is checked apart (:func:`check_name`): Triton checks it after the whole config, an
    ensemble's graph included."""
    validate_platform(cfg)
    expected = _PLATFORM_BACKEND.get(cfg.platform)
    if expected and cfg.backend and cfg.backend != expected:
        raise _err(model, f"platform '{cfg.platform}' does not match backend '{cfg.backend}' (expected '{expected}')")
    if cfg.max_batch_size < 0:
        raise _err(model, f"max_batch_size must be non-negative, got {cfg.max_batch_size}")
    for kind, tensors in (("input", cfg.input), ("output", cfg.output)):
        seen = set()
        for t in tensors:
            if not t.name:
                raise _err(model, f"model {kind} must specify 'name'")
            if t.name in seen:
                raise _err(model, f"{kind} '{t.name}' is specified more than once")
            seen.add(t.name)
            if t.data_type == mc.TYPE_INVALID:
                raise _err(model, f"model {kind} '{t.name}' must specify 'data_type'")
            if not t.dims and not (t.HasField("reshape") and cfg.max_batch_size > 0):
                raise _err(model, f"model {kind} '{t.name}' must specify 'dims'")
            for d in t.dims:
                if d < 1 and d != -1:
                    raise _err(model, f"model {kind} '{t.name}' dimension must be integer >= 1, or -1 to indicate a variable-size dimension")
    name = cfg.default_model_filename
    if name and not is_plain_file_name(name):
        raise _err(model, f"default_model_filename '{name}' must be a file name inside the version folder")
    if cfg.HasField("dynamic_batching"):
        _validate_dynamic_batching(cfg, model)
    if cfg.response_cache.enable:
        _validate_response_cache(cfg)
    for group in () if cfg.HasField("ensemble_scheduling") else cfg.instance_group:  # the graph check refuses them
        if group.kind in (mc.ModelInstanceGroup.KIND_CPU, mc.ModelInstanceGroup.KIND_MODEL) and group.gpus:
            raise _err(model, f"instance group {group.name} of kind {mc.ModelInstanceGroup.Kind.Name(group.kind)} must not specify GPUs")
        if group.kind == mc.ModelInstanceGroup.KIND_GPU:
            if not gpu_count:
                raise _err(model, f"instance group {group.name} of kind KIND_GPU but no GPUs are available")
            reason = gpu_support(cfg.backend)
            if reason is not None:
                raise _err(model, f"instance group {group.name} of kind KIND_GPU but {reason}")
            for g in group.gpus:
                if g < 0 or g >= gpu_count:
                    raise _err(model, f"instance group {group.name} of kind KIND_GPU specifies invalid or unsupported gpu id {g}")
    # an ensemble's own checks (its graph, its composing models) are in ensemble_graph.py


def _validate_response_cache(cfg: ModelConfig) -> None:
    """What Triton core refuses with the cache on (model_config_utils.cc), whether the server has a cache or not."""
    if cfg.HasField("sequence_batching"):
        raise TritonError.invalid_arg(f"Response Cache does not currently support model {cfg.name} with sequence "
                                      "batching scheduler. Please disable the response cache.")
    if cfg.model_transaction_policy.decoupled:
        raise TritonError.invalid_arg(f"Response Cache does not currently support model {cfg.name} with 'decoupled' "
                                      "transaction policy. Please disable the response cache.")


def check_name(cfg: ModelConfig, model: str) -> None:
    """The config's name must be its folder's (core ``ModelRepositoryManager::InitializeModelInfo``)."""
    if cfg.name != model:
        raise TritonError.invalid_arg(f"unexpected directory name '{model}' for model '{cfg.name}', directory name "
                                      "must equal model name")


def _validate_dynamic_batching(cfg: ModelConfig, model: str) -> None:
    db = cfg.dynamic_batching
    for size in db.preferred_batch_size:
        if size < 1 or (cfg.max_batch_size > 0 and size > cfg.max_batch_size):
            raise _err(model, f"dynamic batching preferred size must be positive and <= max_batch_size {cfg.max_batch_size}, got {size}")
    levels = db.priority_levels
    if levels and not 1 <= db.default_priority_level <= levels:
        raise _err(model, f"default priority level must be in range [1, {levels}], got {db.default_priority_level}")
    for level in db.priority_queue_policy:
        if not 1 <= level <= levels:
            raise _err(model, f"priority queue policy must have priority level in range [1, {levels}], got {level}")
    if db.preserve_ordering:
        policies = [db.default_queue_policy, *db.priority_queue_policy.values()]
        if levels > 1 or any(p.timeout_action == mc.ModelQueuePolicy.DELAY for p in policies):
            raise _err(model, "dynamic batching preserve_ordering cannot be combined with more than one priority level "
                              "or a DELAY queue policy")


# ---- JSON as /v2/models/<m>/config prints it ----------------------------------------------------

_INT64_TYPES = frozenset({FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
                          FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64})
_FLOAT_TYPES = frozenset({FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE})


def without_version_policy(cfg: ModelConfig | None) -> ModelConfig | None:
    """A copy of ``cfg`` with no ``version_policy``: whether a reload must load the other versions again."""
    if cfg is None:
        return None
    out = ModelConfig()
    out.CopyFrom(cfg)
    out.ClearField("version_policy")
    return out


def to_json_dict(cfg: ModelConfig) -> dict[str, Any]:
    """Proto field names, default fields printed, enums by name, and 64-bit integers as JSON numbers."""
    data = json_format.MessageToDict(cfg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    _numbers(cfg.DESCRIPTOR, data)
    return _ordered(cfg.DESCRIPTOR, data)


def to_json_text(cfg: ModelConfig) -> str:
    """:func:`to_json_dict` as JSON text, the ``model_config`` a backend gets (a Python model's
    ``args["model_config"]``), compact as Triton's TritonJson writes it. Made with orjson and the dict
    dropped before the text is decoded: a config of one big field is held at most twice over meanwhile
    (json.dumps held the dict, its escaped chunks and their join: three times, issue 23's overrides)."""
    data = to_json_dict(cfg)
    raw = orjson.dumps(data)
    del data
    return raw.decode()


def _ordered(desc: Any, data: dict[str, Any]) -> dict[str, Any]:
    """Re-key ``data`` in field declaration order (protobuf prints set fields first, defaults after)."""
    out: dict[str, Any] = {}
    for field in desc.fields:
        if field.name not in data:
            continue
        value = data[field.name]
        msg = field.message_type
        if msg is not None and not msg.GetOptions().map_entry:
            value = [_ordered(msg, v) for v in value] if isinstance(value, list) else _ordered(msg, value)
        out[field.name] = value
    return out


def _numbers(desc: Any, data: dict[str, Any]) -> None:
    for key, value in data.items():
        field = desc.fields_by_name.get(key)
        if field is None:
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            vfield = field.message_type.fields_by_name["value"]
            for k, v in value.items():
                if vfield.message_type is not None:
                    _numbers(vfield.message_type, v)
                elif vfield.type in _INT64_TYPES:
                    value[k] = int(v)
        elif field.message_type is not None:
            for item in value if isinstance(value, list) else [value]:
                _numbers(field.message_type, item)
        elif field.type in _INT64_TYPES:
            data[key] = [int(v) for v in value] if isinstance(value, list) else int(value)
        elif field.type in _FLOAT_TYPES:  # Triton prints a whole float as an integer (fp32_false_true: [0, 1])
            data[key] = [_whole(v) for v in value] if isinstance(value, list) else _whole(value)


def _whole(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


def data_type_name(value: int) -> str:
    return mc.DataType.Name(value)


def version_policy(cfg: ModelConfig, unset_latest: int = 0) -> tuple[str, Any]:
    """``cfg``'s version policy as ``layout.select_versions`` takes it; ``unset_latest``: the number of
    latest versions where none is set (normalize makes it 1)."""
    policy = cfg.version_policy.WhichOneof("policy_choice")
    if policy == "latest":
        return policy, cfg.version_policy.latest.num_versions
    if policy == "specific":
        return policy, list(cfg.version_policy.specific.versions)
    return policy or "latest", unset_latest if policy is None else 0
