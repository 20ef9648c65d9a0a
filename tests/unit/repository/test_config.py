"""``config.pbtxt`` handling (``triton_actor/repository/config.py``): parse, fill, normalize, validate, JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from triton_actor.backends.devices import runtime_gpu_support
from triton_actor.errors import Code, TritonError
from triton_actor.protocol._generated import model_config_pb2 as mc
from triton_actor.repository import config as cm

ADD_SUB_PBTXT = """
backend: "python"
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
instance_group [{count: 1, kind: KIND_CPU}]
"""

# /v2/models/add_sub/config of a real Triton for the python add_sub model above.
_IN = ('"data_type":"TYPE_FP32","format":"FORMAT_NONE","dims":[4],"is_shape_tensor":false,'
       '"allow_ragged_batch":false,"optional":false,"is_non_linear_format_io":false}')
_OUT = '"data_type":"TYPE_FP32","dims":[4],"label_filename":"","is_shape_tensor":false,"is_non_linear_format_io":false}'
TRITON_ADD_SUB_JSON = (
    '{"name":"add_sub","platform":"","backend":"python","runtime":"","version_policy":{"latest":{"num_versions":1}},'
    '"max_batch_size":0,'
    '"input":[{"name":"INPUT0",' + _IN + ',{"name":"INPUT1",' + _IN + '],'
    '"output":[{"name":"OUTPUT0",' + _OUT + ',{"name":"OUTPUT1",' + _OUT + '],'
    '"batch_input":[],"batch_output":[],'
    '"optimization":{"priority":"PRIORITY_DEFAULT","input_pinned_memory":{"enable":true},'
    '"output_pinned_memory":{"enable":true},"gather_kernel_buffer_threshold":0,"eager_batching":false},'
    '"instance_group":[{"name":"add_sub_0","kind":"KIND_CPU","count":1,"gpus":[],"secondary_devices":[],'
    '"profile":[],"passive":false,"host_policy":""}],'
    '"default_model_filename":"model.py","cc_model_filenames":{},"metric_tags":{},"parameters":{},'
    '"model_warmup":[]}'
)


def _version_dir(tmp_path: Path, *files: str) -> Path:
    d = tmp_path / "1"
    d.mkdir(parents=True, exist_ok=True)
    for f in files:
        (d / f).write_text("")
    return d


def _invalid(excinfo: pytest.ExceptionInfo[TritonError], *parts: str) -> None:
    err = excinfo.value
    assert err.code == Code.INVALID_ARG, repr(err)
    for part in parts:
        assert part in err.message, (part, err.message)


# -- parsing ---------------------------------------------------------------------------------------


def test_parse_text_ok() -> None:
    cfg = cm.parse_text(ADD_SUB_PBTXT, "add_sub", "/repo/add_sub/config.pbtxt")
    assert cfg.backend == "python"
    assert [i.name for i in cfg.input] == ["INPUT0", "INPUT1"]
    assert list(cfg.output[1].dims) == [4]


def test_parse_error_names_file_line_and_column() -> None:
    text = 'name: "m"\nmax_batch_size: "eight"\n'
    with pytest.raises(TritonError) as info:
        cm.parse_text(text, "m", "/repo/m/config.pbtxt")
    _invalid(info, "model 'm'", "/repo/m/config.pbtxt:2:17", "integer")



@pytest.mark.parametrize(("value", "words"), [
    ("-5", "Expected integer, got: -"),  # a negative number for a uint32
    ('"invalid_value"', 'Expected integer, got: "invalid_value"'),
    ("12345678901", "Integer out of range (12345678901)"),
])
def test_a_number_that_does_not_fit_is_said_in_cpp_protobuf_s_words_too(value: str, words: str) -> None:
    """Triton parses configs with C++ protobuf; its L0_simple_ensemble greps the log for its words."""
    text = f'name: "e"\nplatform: "ensemble"\nensemble_scheduling {{ max_inflight_requests: {value} }}\n'
    with pytest.raises(TritonError) as info:
        cm.parse_text(text, "e", "/r/e/config.pbtxt")
    assert words in info.value.message and "/r/e/config.pbtxt:3:" in info.value.message


def test_parse_error_at_end_of_input_names_line_and_column() -> None:
    with pytest.raises(TritonError) as info:
        cm.parse_text('name: "m"\ninput [ { name: "a" ', "m", "cfg.pbtxt")
    _invalid(info, "cfg.pbtxt:2:", 'Expected "}"')


def test_unknown_field_is_an_error() -> None:
    with pytest.raises(TritonError) as info:
        cm.parse_text('name: "m"\n  bogus_field: 1\n', "m", "/r/m/config.pbtxt")
    _invalid(info, "/r/m/config.pbtxt:2:3", 'no field named "bogus_field"')


def test_parse_json_rejects_unknown_fields() -> None:
    cfg = cm.parse_json('{"name": "m", "max_batch_size": 4}', "m")
    assert cfg.max_batch_size == 4
    with pytest.raises(TritonError) as info:
        cm.parse_json('{"name": "m", "bogus": 1}', "m")
    _invalid(info, "model 'm'", "bogus")


def test_parse_json_takes_its_text_from_a_holder_and_refuses_what_json_format_refuses() -> None:
    """A load's override is handed over by a call (issue 23: the text goes once read, not after the
    message is made); bad JSON, a repeated key and a wrong type are refused as json_format.Parse does."""
    calls = []

    def text() -> str:
        calls.append(1)
        return '{"name": "m", "max_batch_size": 4}'

    assert cm.parse_json(text, "m").max_batch_size == 4 and calls == [1]
    for bad, words in (('{"name": ', "Failed to load JSON"), ('{"name": "m", "name": "n"}', "duplicate key name"),
                       ('{"max_batch_size": "four"}', "max_batch_size")):
        with pytest.raises(TritonError) as info:
            cm.parse_json(lambda bad=bad: bad, "m")
        _invalid(info, "model 'm'", words)


def test_read_prefers_named_config_and_requires_a_file_without_auto_complete(tmp_path: Path) -> None:
    model = tmp_path / "m"
    (model / "configs").mkdir(parents=True)
    (model / "config.pbtxt").write_text("max_batch_size: 1")
    (model / "configs" / "big.pbtxt").write_text("max_batch_size: 16")
    assert cm.read(model, "m", auto_complete=False)[0].max_batch_size == 1
    assert cm.read(model, "m", auto_complete=False, config_name="big")[0].max_batch_size == 16
    assert cm.read(model, "m", auto_complete=False, config_name="absent")[0].max_batch_size == 1
    empty = tmp_path / "e"
    empty.mkdir()
    assert cm.read(empty, "e", auto_complete=True) == (mc.ModelConfig(), frozenset())
    with pytest.raises(TritonError) as info:
        cm.read(empty, "e", auto_complete=False)
    _invalid(info, "model 'e'", "config.pbtxt")


# -- backend / platform / default file name --------------------------------------------------------


@pytest.mark.parametrize(
    ("filename", "backend", "platform"),
    [
        ("model.py", "python", ""),
        ("model.onnx", "onnxruntime", "onnxruntime_onnx"),
        ("model.pt", "pytorch", "pytorch_libtorch"),
        ("model.plan", "tensorrt", "tensorrt_plan"),
        ("model.pt2", "pytorch", "torch_aoti"),
    ],
)
def test_fill_backend_fields_from_file(tmp_path: Path, filename: str, backend: str, platform: str) -> None:
    cfg = mc.ModelConfig()
    cm.fill_backend_fields(cfg, "m", _version_dir(tmp_path, filename))
    assert (cfg.name, cfg.backend, cfg.platform, cfg.default_model_filename) == ("m", backend, platform, filename)


def test_fill_backend_fields_explicit_platform_wins(tmp_path: Path) -> None:
    cfg = mc.ModelConfig(platform="pytorch_libtorch")
    cm.fill_backend_fields(cfg, "m", _version_dir(tmp_path, "model.onnx", "model.py"))
    assert (cfg.backend, cfg.platform, cfg.default_model_filename) == ("pytorch", "pytorch_libtorch", "model.pt")


def test_fill_backend_fields_explicit_backend_is_kept(tmp_path: Path) -> None:
    cfg = mc.ModelConfig(backend="onnxruntime")
    cm.fill_backend_fields(cfg, "m", _version_dir(tmp_path, "model.py", "model.onnx"))
    assert (cfg.backend, cfg.platform, cfg.default_model_filename) == ("onnxruntime", "onnxruntime_onnx", "model.onnx")


def test_fill_backend_fields_default_filename_model_py(tmp_path: Path) -> None:
    cfg = mc.ModelConfig(default_model_filename="model.py")
    cm.fill_backend_fields(cfg, "m", None)
    assert (cfg.backend, cfg.platform) == ("python", "")


def test_fill_backend_fields_keeps_name_and_uses_backend_suffix(tmp_path: Path) -> None:
    cfg = mc.ModelConfig(name="given")
    cm.fill_backend_fields(cfg, "m", _version_dir(tmp_path, "model.onnx"))
    assert cfg.name == "given"
    cfg = mc.ModelConfig()
    cm.fill_backend_fields(cfg, "detector.my.backend", _version_dir(tmp_path / "empty"))
    assert (cfg.backend, cfg.platform, cfg.default_model_filename) == ("my.backend", "", "model.my.backend")
    with pytest.raises(TritonError) as info:  # no file, no backend, no ".<backend>" in the name
        cm.fill_backend_fields(mc.ModelConfig(), "detector", _version_dir(tmp_path / "empty"))
    assert info.value.message == ("Invalid model name: Could not determine backend for model 'detector' with no "
                                  "backend in model configuration. Expected model name of the form "
                                  "'model.<backend_name>'.")
    ens = mc.ModelConfig(platform="ensemble")
    cm.fill_backend_fields(ens, "pipe", _version_dir(tmp_path, "model.py"))
    assert (ens.backend, ens.default_model_filename) == ("", "")


# -- normalize -------------------------------------------------------------------------------------


def test_normalize_defaults() -> None:
    cfg = mc.ModelConfig(name="m", backend="python", max_batch_size=8)
    cfg.dynamic_batching.SetInParent()
    cm.normalize(cfg, "m", gpu_count=0)
    assert cfg.version_policy.WhichOneof("policy_choice") == "latest"
    assert cfg.version_policy.latest.num_versions == 1
    assert list(cfg.dynamic_batching.preferred_batch_size) == [8]
    assert cfg.optimization.input_pinned_memory.enable is True
    assert cfg.optimization.output_pinned_memory.enable is True
    # no instance_group at all: one group named after the model (Triton 2.51 shows "name": "m" in
    # /config and names its instance "m_0"), KIND_AUTO → CPU without GPUs
    assert len(cfg.instance_group) == 1
    group = cfg.instance_group[0]
    assert (group.name, group.kind, group.count) == ("m", mc.ModelInstanceGroup.KIND_CPU, 1)


def test_normalize_keeps_explicit_values() -> None:
    cfg = mc.ModelConfig(name="m", backend="python", max_batch_size=8)
    cfg.version_policy.all.SetInParent()
    cfg.dynamic_batching.preferred_batch_size.extend([2, 4])
    cm.normalize(cfg, "m", gpu_count=0)
    assert cfg.version_policy.WhichOneof("policy_choice") == "all"
    assert list(cfg.dynamic_batching.preferred_batch_size) == [2, 4]


def test_normalize_no_preferred_size_without_batching() -> None:
    cfg = mc.ModelConfig(name="m", backend="python", max_batch_size=0)
    cfg.dynamic_batching.SetInParent()
    cm.normalize(cfg, "m", gpu_count=0)
    assert list(cfg.dynamic_batching.preferred_batch_size) == []


def test_normalize_instance_groups() -> None:
    cfg = mc.ModelConfig(name="m", backend="python")
    cfg.instance_group.add(kind=mc.ModelInstanceGroup.KIND_CPU, count=3)
    cfg.instance_group.add(kind=mc.ModelInstanceGroup.KIND_AUTO)
    cfg.instance_group.add(name="named", kind=mc.ModelInstanceGroup.KIND_CPU)
    cm.normalize(cfg, "m", gpu_count=0)
    got = [(g.name, g.kind, g.count) for g in cfg.instance_group]
    assert got == [
        ("m_0", mc.ModelInstanceGroup.KIND_CPU, 3),
        ("m_1", mc.ModelInstanceGroup.KIND_CPU, 1),
        ("named", mc.ModelInstanceGroup.KIND_CPU, 1),
    ]


def test_normalize_onnx_cpu_count_default_and_gpu_fill() -> None:
    cpu = mc.ModelConfig(name="m", backend="onnxruntime")
    cpu.instance_group.add(kind=mc.ModelInstanceGroup.KIND_CPU)
    cm.normalize(cpu, "m", gpu_count=0)
    assert cpu.instance_group[0].count == 2  # Triton: two CPU instances for onnxruntime/tensorflow
    gpu = mc.ModelConfig(name="m", backend="onnxruntime")
    gpu.instance_group.add(kind=mc.ModelInstanceGroup.KIND_AUTO)
    cm.normalize(gpu, "m", gpu_count=2, gpu_support=_can_use_gpu)
    g = gpu.instance_group[0]
    assert (g.kind, g.count, list(g.gpus)) == (mc.ModelInstanceGroup.KIND_GPU, 1, [0, 1])


# -- a kind left to the server on a GPU host: the runtime decides -----------------------

CPU_WHEEL = "ONNX Runtime 1.0 has no CUDAExecutionProvider (available providers: CPUExecutionProvider)"


def _can_use_gpu(backend: str) -> str | None:
    return None


def _cpu_wheel(backend: str) -> str | None:
    return CPU_WHEEL if backend == "onnxruntime" else None


def _never_asked(backend: str) -> str | None:
    raise AssertionError(f"the runtime of {backend} was probed on a host without GPUs")


@pytest.mark.parametrize("groups", [0, 1])  # no instance_group at all, or one KIND_AUTO group
def test_kind_left_to_us_follows_the_runtime_on_a_gpu_host(groups: int) -> None:
    def normalized(backend: str, gpu_support) -> tuple:
        cfg = mc.ModelConfig(name="m", backend=backend)
        for _ in range(groups):
            cfg.instance_group.add(kind=mc.ModelInstanceGroup.KIND_AUTO)
        cm.normalize(cfg, "m", gpu_count=2, gpu_support=gpu_support)
        cm.validate(cfg, "m", gpu_count=2, gpu_support=gpu_support)
        g = cfg.instance_group[0]
        return mc.ModelInstanceGroup.Kind.Name(g.kind), g.count, list(g.gpus)

    # the CPU wheel of onnxruntime: the CPU, with Triton's CPU count for onnxruntime; it loads
    assert normalized("onnxruntime", _cpu_wheel) == ("KIND_CPU", 2, [])
    assert normalized("onnxruntime", _can_use_gpu) == ("KIND_GPU", 1, [0, 1])
    assert normalized("pytorch", lambda b: "torch 2.0 has no usable CUDA device") == ("KIND_CPU", 1, [])
    # python models take a GPU group as Triton gives them one: the device id only (no runtime to ask)
    assert normalized("python", runtime_gpu_support) == ("KIND_GPU", 1, [0, 1])


def test_no_runtime_is_probed_without_gpus() -> None:
    for backend in ("onnxruntime", "pytorch", "python"):
        cfg = mc.ModelConfig(name="m", backend=backend)
        cm.normalize(cfg, "m", gpu_count=0, gpu_support=_never_asked)
        cm.validate(cfg, "m", gpu_count=0, gpu_support=_never_asked)
        assert cfg.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU


def test_validate_explicit_kind_gpu_names_the_missing_provider() -> None:
    cfg = mc.ModelConfig(name="m", backend="onnxruntime")
    cfg.instance_group.add(kind=mc.ModelInstanceGroup.KIND_GPU)
    cm.normalize(cfg, "m", gpu_count=1, gpu_support=_cpu_wheel)
    assert list(cfg.instance_group[0].gpus) == [0]  # an explicit kind is never changed
    with pytest.raises(TritonError) as info:
        cm.validate(cfg, "m", gpu_count=1, gpu_support=_cpu_wheel)
    assert info.value.code == Code.INVALID_ARG
    assert info.value.message == f"model 'm': instance group m_0 of kind KIND_GPU but {CPU_WHEEL}"


def test_normalize_ensemble_gets_no_instances_or_optimization() -> None:
    cfg = mc.ModelConfig(name="e", platform="ensemble")
    cm.normalize(cfg, "e", gpu_count=0)
    assert len(cfg.instance_group) == 0
    assert not cfg.HasField("optimization")


# -- validate --------------------------------------------------------------------------------------


def _valid_config(**kw: object) -> mc.ModelConfig:
    cfg = cm.parse_text(ADD_SUB_PBTXT, "add_sub", "config.pbtxt")
    cfg.name = "add_sub"
    for k, v in kw.items():
        setattr(cfg, k, v)
    cm.normalize(cfg, "add_sub", gpu_count=0)
    return cfg


def test_validate_accepts_add_sub() -> None:
    cm.validate(_valid_config(), "add_sub", gpu_count=0)


def test_check_name_mismatch() -> None:
    cfg = _valid_config()
    cfg.name = "other"
    cm.validate(cfg, "add_sub", gpu_count=0)  # Triton checks the name after the rest of the config
    with pytest.raises(TritonError) as info:
        cm.check_name(cfg, "add_sub")
    assert info.value.message == ("unexpected directory name 'add_sub' for model 'other', directory name must equal "
                                  "model name")


def test_validate_platform_texts() -> None:
    with pytest.raises(TritonError) as info:
        cm.validate_platform(mc.ModelConfig(name="m", platform="mystery"))
    assert info.value.message == "unexpected platform type 'mystery' for m"
    with pytest.raises(TritonError) as info:
        cm.validate_platform(mc.ModelConfig(name="e", platform="ensemble", backend="onnxruntime"))
    assert info.value.message == "Ensemble model 'e' must have platform type 'ensemble' and empty backend type"


def test_validate_negative_max_batch_size() -> None:
    cfg = _valid_config(max_batch_size=-1)
    with pytest.raises(TritonError) as info:
        cm.validate(cfg, "add_sub", gpu_count=0)
    _invalid(info, "max_batch_size", "-1")


def test_validate_zero_dim() -> None:
    cfg = _valid_config()
    cfg.input[1].dims[0] = 0
    with pytest.raises(TritonError) as info:
        cm.validate(cfg, "add_sub", gpu_count=0)
    _invalid(info, "INPUT1", "dimension must be integer >= 1, or -1")


def test_validate_missing_dims_and_data_type() -> None:
    cfg = _valid_config()
    del cfg.output[0].dims[:]
    with pytest.raises(TritonError) as info:
        cm.validate(cfg, "add_sub", gpu_count=0)
    _invalid(info, "OUTPUT0", "must specify 'dims'")
    cfg = _valid_config()
    cfg.input[0].data_type = mc.TYPE_INVALID
    with pytest.raises(TritonError) as info:
        cm.validate(cfg, "add_sub", gpu_count=0)
    _invalid(info, "INPUT0", "data_type")


def test_validate_preferred_batch_size_above_max() -> None:
    cfg = _valid_config(max_batch_size=4)
    cfg.dynamic_batching.preferred_batch_size.extend([2, 8])
    with pytest.raises(TritonError) as info:
        cm.validate(cfg, "add_sub", gpu_count=0)
    _invalid(info, "preferred", "8")


@pytest.mark.parametrize(("setup", "words"), [
    (lambda db: (setattr(db, "priority_levels", 2), setattr(db, "default_priority_level", 3)), ["default priority", "[1, 2]"]),
    (lambda db: (setattr(db, "priority_levels", 2), setattr(db, "default_priority_level", 1),
                 db.priority_queue_policy[5].CopyFrom(mc.ModelQueuePolicy())), ["priority queue policy", "5"]),
    (lambda db: (setattr(db, "priority_levels", 2), setattr(db, "default_priority_level", 1),
                 setattr(db, "preserve_ordering", True)), ["preserve_ordering"]),
    (lambda db: (setattr(db, "preserve_ordering", True),
                 setattr(db.default_queue_policy, "timeout_action", mc.ModelQueuePolicy.DELAY)), ["preserve_ordering", "DELAY"]),
])
def test_validate_dynamic_batching_priorities_and_ordering(setup, words) -> None:
    cfg = _valid_config(max_batch_size=4)
    setup(cfg.dynamic_batching)
    with pytest.raises(TritonError) as info:
        cm.validate(cfg, "add_sub", gpu_count=0)
    _invalid(info, *words)


@pytest.mark.parametrize("name", ["../../x/model.py", "a/b.py", "..", "a\\b"])
def test_validate_default_model_filename_is_a_plain_name(name: str) -> None:
    cfg = _valid_config()
    cfg.default_model_filename = name
    with pytest.raises(TritonError) as info:
        cm.validate(cfg, "add_sub", gpu_count=0)
    _invalid(info, "default_model_filename")


def test_validate_kind_gpu_without_gpus() -> None:
    cfg = _valid_config()
    cfg.instance_group[0].kind = mc.ModelInstanceGroup.KIND_GPU
    with pytest.raises(TritonError) as info:
        cm.validate(cfg, "add_sub", gpu_count=0)
    _invalid(info, "KIND_GPU")


def test_validate_kind_gpu_with_unknown_gpu_id() -> None:
    cfg = _valid_config()
    cfg.instance_group[0].kind = mc.ModelInstanceGroup.KIND_GPU
    cfg.instance_group[0].gpus.append(3)
    with pytest.raises(TritonError) as info:
        cm.validate(cfg, "add_sub", gpu_count=1)
    _invalid(info, "gpu id 3")


def test_validate_kind_cpu_with_gpus() -> None:
    cfg = _valid_config()
    cfg.instance_group[0].gpus.append(0)
    with pytest.raises(TritonError) as info:
        cm.validate(cfg, "add_sub", gpu_count=1)
    _invalid(info, "KIND_CPU", "must not specify GPUs")


def test_validate_platform_backend_mismatch() -> None:
    cfg = _valid_config()
    cfg.platform = "onnxruntime_onnx"
    cfg.backend = "pytorch"
    with pytest.raises(TritonError) as info:
        cm.validate(cfg, "add_sub", gpu_count=0)
    _invalid(info, "onnxruntime_onnx", "pytorch")


def test_validate_no_backend_or_platform() -> None:
    cfg = _valid_config()
    cfg.backend = ""
    with pytest.raises(TritonError) as info:
        cm.validate(cfg, "add_sub", gpu_count=0)
    _invalid(info, "platform")


def test_validate_duplicate_input_name() -> None:
    cfg = _valid_config()
    cfg.input[1].name = "INPUT0"
    with pytest.raises(TritonError) as info:
        cm.validate(cfg, "add_sub", gpu_count=0)
    _invalid(info, "INPUT0")


def test_validate_accepts_an_ensemble() -> None:
    """An ensemble's own checks live in ensemble_graph.py (tests/unit/repository/test_ensemble_graph.py)."""
    cfg = _valid_config()
    cfg.backend = ""
    cfg.platform = "ensemble"
    cm.validate(cfg, "add_sub", gpu_count=0)


# -- JSON as /config prints it ---------------------------------------------------------------------


def test_to_json_matches_real_triton_for_add_sub(tmp_path: Path) -> None:
    cfg = cm.parse_text(ADD_SUB_PBTXT, "add_sub", tmp_path / "config.pbtxt")
    cm.fill_backend_fields(cfg, "add_sub", _version_dir(tmp_path, "model.py"))
    cm.normalize(cfg, "add_sub", gpu_count=0)
    cm.validate(cfg, "add_sub", gpu_count=0)
    assert json.dumps(cm.to_json_dict(cfg), separators=(",", ":")) == TRITON_ADD_SUB_JSON


def test_to_json_key_order_follows_declaration_order() -> None:
    cfg = mc.ModelConfig(name="m", backend="python", max_batch_size=2)
    cfg.instance_group.add(count=1)  # set before input: protobuf would print it first
    cfg.input.add(name="I", data_type=mc.TYPE_FP32, dims=[1])
    cfg.version_policy.latest.num_versions = 1  # set last, printed fifth
    data = cm.to_json_dict(cfg)
    assert list(data)[:8] == ["name", "platform", "backend", "runtime", "version_policy", "max_batch_size",
                              "input", "output"]
    assert list(data["input"][0])[:4] == ["name", "data_type", "format", "dims"]
    assert list(data["instance_group"][0])[:3] == ["name", "kind", "count"]


def test_to_json_int64_fields_are_numbers_and_enums_are_names() -> None:
    cfg = mc.ModelConfig(name="m", backend="python", max_batch_size=8)
    cfg.version_policy.specific.versions.extend([1, 3])
    cfg.input.add(name="I", data_type=mc.TYPE_STRING, dims=[-1, 16])
    cfg.output.add(name="O", data_type=mc.TYPE_BF16, dims=[2])
    cfg.dynamic_batching.max_queue_delay_microseconds = 100
    cfg.dynamic_batching.preferred_batch_size.extend([4, 8])
    cfg.parameters["k"].string_value = "v"
    data = cm.to_json_dict(cfg)
    assert data["version_policy"] == {"specific": {"versions": [1, 3]}}
    assert data["input"][0]["dims"] == [-1, 16]
    assert data["input"][0]["data_type"] == "TYPE_STRING"
    assert data["input"][0]["format"] == "FORMAT_NONE"
    assert data["output"][0]["dims"] == [2]
    assert data["output"][0]["data_type"] == "TYPE_BF16"
    assert data["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    assert data["dynamic_batching"]["preferred_batch_size"] == [4, 8]
    assert data["parameters"] == {"k": {"string_value": "v"}}
    text = json.dumps(data)
    assert '"versions": [1, 3]' in text
    assert '"max_queue_delay_microseconds": 100' in text
    assert '"dims": [-1, 16]' in text
    # defaults are printed
    assert data["platform"] == "" and data["runtime"] == "" and data["model_warmup"] == []
