"""The ensemble graph check (repository/ensemble_graph.py) and the dependency bookkeeping
(repository/dependencies.py): pure functions, Triton's error texts."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

from triton_actor.errors import Code, TritonError
from triton_actor.repository.config import ModelConfig
from triton_actor.repository.dependencies import Dependencies
from triton_actor.repository.ensemble_graph import Composing, check_composing, check_scheduling, find_cycle

STEPS = """
  step [ { model_name: "pre" model_version: -1 input_map { key: "X" value: "IN" } output_map { key: "Y" value: "mid" } },
         { model_name: "left" model_version: -1 input_map { key: "X" value: "mid" } output_map { key: "Y" value: "L" } },
         { model_name: "right" model_version: 1 input_map { key: "X" value: "mid" } output_map { key: "Y" value: "R" } } ]
"""


def _ensemble(steps: str = STEPS, extra: str = "", name: str = "ens") -> ModelConfig:
    text = f"""
name: "{name}"
platform: "ensemble"
max_batch_size: 4
input [ {{ name: "IN", data_type: TYPE_FP32, dims: [ 2 ] }} ]
output [ {{ name: "L", data_type: TYPE_FP32, dims: [ 2 ] }}, {{ name: "R", data_type: TYPE_FP32, dims: [ 2 ] }} ]
ensemble_scheduling {{ {steps} }}
{extra}
"""
    return text_format.Parse(text, ModelConfig())


def _model(name: str, dtype: str = "TYPE_FP32", dims: str = "2", mbs: int = 8) -> ModelConfig:
    return text_format.Parse(f"""
name: "{name}"
backend: "python"
max_batch_size: {mbs}
input [ {{ name: "X", data_type: TYPE_FP32, dims: [ 2 ] }} ]
output [ {{ name: "Y", data_type: {dtype}, dims: [ {dims} ] }} ]
""", ModelConfig())


def _models(**over: ModelConfig) -> dict[str, Composing]:
    out = {n: Composing(_model(n), (1,)) for n in ("pre", "left", "right")}
    out.update({n: Composing(c, (1,)) for n, c in over.items()})
    return out


def _fails(fn: object, *args: object) -> str:
    with pytest.raises(TritonError) as info:
        fn(*args)  # type: ignore[operator]
    assert info.value.code == Code.INVALID_ARG
    return info.value.message


def test_a_valid_graph_knows_who_reads_each_tensor() -> None:
    graph = check_scheduling(_ensemble())
    assert [s.model for s in graph.steps] == ["pre", "left", "right"]
    assert graph.consumers["mid"] == (1, 2)
    assert graph.steps[2].version == 1
    check_composing(_ensemble(), graph, _models())


def test_a_tensor_produced_twice() -> None:
    steps = STEPS.replace('value: "R"', 'value: "L"')
    assert _fails(check_scheduling, _ensemble(steps)) == \
        "ensemble tensor 'L' can appear in an output map only once for ensemble 'ens' step 2"


def test_an_ensemble_input_no_step_reads() -> None:
    cfg = _ensemble()
    cfg.input.add(name="UNUSED", data_type=cfg.input[0].data_type, dims=[1])
    assert _fails(check_scheduling, cfg) == "ensemble input 'UNUSED' for ensemble ens' is not used"


def test_an_ensemble_output_no_step_writes() -> None:
    cfg = _ensemble()
    cfg.output.add(name="NEVER", data_type=cfg.output[0].data_type, dims=[1])
    assert _fails(check_scheduling, cfg) == "ensemble output 'NEVER' for ensemble ens' is not used"


def test_a_cycle_leaves_its_tensors_never_ready() -> None:
    steps = """step [ { model_name: "a" input_map { key: "X" value: "IN" } input_map { key: "Z" value: "loop" }
                        output_map { key: "Y" value: "L" } output_map { key: "W" value: "R" } },
                      { model_name: "b" input_map { key: "X" value: "L" } output_map { key: "Y" value: "loop" } } ]"""
    # Triton's hint walks back from L through 'loop' to L again and then names nothing
    assert _fails(check_scheduling, _ensemble(steps)) == "output 'L' for ensemble 'ens' is not written"


def test_an_output_fed_by_a_tensor_nothing_writes() -> None:
    steps = STEPS.replace('input_map { key: "X" value: "mid" } output_map { key: "Y" value: "R" }',
                          'input_map { key: "X" value: "nowhere" } output_map { key: "Y" value: "R" }')
    assert _fails(check_scheduling, _ensemble(steps)) == (
        "output 'R' for ensemble 'ens' is not written: at least one of its depending tensors, 'nowhere', is not "
        "connected")


def test_an_intermediate_tensor_nobody_reads() -> None:
    steps = STEPS.replace('output_map { key: "Y" value: "L" }',
                          'output_map { key: "Y" value: "L" } output_map { key: "Z" value: "dangling" }')
    assert _fails(check_scheduling, _ensemble(steps)) == "ensemble tensor 'dangling' is unused in ensemble 'ens'"


def test_required_fields_and_forbidden_ones() -> None:
    assert _fails(check_scheduling, _ensemble(steps="")) == "must specify 'step' for ensemble 'ens'"
    no_model = 'step [ { input_map { key: "X" value: "IN" } output_map { key: "Y" value: "L" } } ]'
    assert _fails(check_scheduling, _ensemble(no_model)) == "must specify 'model_name' in step 0 of ensemble 'ens'"
    assert _fails(check_scheduling, _ensemble(extra="instance_group [ { count: 1 } ]")) == \
        "instance group should not be specified for ensemble 'ens'"
    not_ensemble = _ensemble()
    not_ensemble.platform = ""
    not_ensemble.backend = "python"
    assert _fails(check_scheduling, not_ensemble) == \
        "ensemble scheduling cannot be set for model 'ens' whose platform is not ensemble"


def test_unknown_and_unavailable_composing_models() -> None:
    cfg = _ensemble()
    graph = check_scheduling(cfg)
    models = _models()
    del models["left"]
    assert _fails(check_composing, cfg, graph, models) == \
        "ensemble ens contains models that are not available or ambiguous: left"
    models = _models()
    models["left"] = Composing(_model("left"), (), "boom")
    assert _fails(check_composing, cfg, graph, models) == \
        "ensemble 'ens' depends on 'left' which has no loaded version. Model 'left' loading failed with error: boom"
    models = _models()
    models["left"] = Composing(None, (), "bad config")
    assert _fails(check_composing, cfg, graph, models) == \
        "ensemble 'ens' depends on 'left' which is not valid. Model 'left' failed with error: bad config"
    models = _models()
    models["right"] = Composing(_model("right"), (2,))
    assert _fails(check_composing, cfg, graph, models) == \
        "ensemble 'ens' depends on 'right' whose required version 1 is not loaded."


def test_producer_and_consumer_disagree() -> None:
    cfg = _ensemble()
    graph = check_scheduling(cfg)
    assert _fails(check_composing, cfg, graph, _models(pre=_model("pre", dtype="TYPE_INT32"))) == (
        "in ensemble ens, ensemble tensor mid: inconsistent data type: TYPE_INT32 is inferred from model pre "
        "while TYPE_FP32 is inferred from model left")
    assert _fails(check_composing, cfg, graph, _models(pre=_model("pre", dims="3"))) == (
        "in ensemble ens, ensemble tensor mid: inconsistent shape: [-1,3] is inferred from model pre "
        "while [-1,2] is inferred from model left")
    assert _fails(check_composing, cfg, graph, _models(left=_model("left", mbs=2))) == (
        "ensemble ens allows maximum batch size 4, but it contains model left which only allows maximum batch "
        "size to be 2")


def test_variable_dims_agree_with_fixed_ones() -> None:
    cfg = _ensemble()
    check_composing(cfg, check_scheduling(cfg), _models(pre=_model("pre", dims="-1")))


def test_mapping_to_an_input_the_model_does_not_have() -> None:
    cfg = _ensemble(STEPS.replace('input_map { key: "X" value: "mid" } output_map { key: "Y" value: "L" }',
                                  'input_map { key: "Q" value: "mid" } output_map { key: "Y" value: "L" }'))
    assert _fails(check_composing, cfg, check_scheduling(cfg), _models()) == \
        "in ensemble ens, ensemble tensor mid is mapping to non-existing input Q in model left"


def test_ensembles_that_contain_each_other() -> None:
    deps = {"a": ("b", "m"), "b": ("c",), "c": ("a",), "m": ()}
    assert find_cycle("a", lambda n: deps.get(n, ())) == "circular dependency between ensembles: a -> ... -> c -> a"
    assert find_cycle("m", lambda n: deps.get(n, ())) is None


def test_dependencies_load_order_and_unload_dependents() -> None:
    graph = Dependencies()
    on_disk = {"ens": ("pre", "inner"), "inner": ("left",), "pre": (), "left": (), "other": ("left",)}
    assert graph.closure("ens", on_disk.get) == ["pre", "left", "inner", "ens"]
    assert graph.closure("nope", on_disk.get) == ["nope"]  # listed: its load reports it missing
    graph.closure("other", on_disk.get)
    graph.implicit.update({"pre", "left", "inner"})
    # "other" (loaded) still needs "left"
    assert graph.to_unload("ens", ["ens", "pre", "left", "inner", "other"]) == ["pre", "inner"]
    assert graph.to_unload("ens", ["ens", "pre", "left", "inner"]) == ["pre", "inner", "left"]
    graph.implicit.discard("pre")  # loaded explicitly later: stays
    assert graph.to_unload("ens", ["ens", "pre", "left", "inner"]) == ["inner", "left"]


def test_a_step_fed_by_two_different_decoupled_models() -> None:
    cfg = _ensemble()
    graph = check_scheduling(cfg)
    streaming = {n: _model(n) for n in ("left", "right")}
    for c in streaming.values():
        c.model_transaction_policy.decoupled = True
    # Triton pairs the ensemble's outputs too: two streams side by side cannot make one response
    assert _fails(check_composing, cfg, graph, _models(**streaming)) == (
        "in ensemble ens, step of model 'ens' receives inputs originated from different decoupled models")
    assert check_composing(cfg, graph, _models(pre=streaming["left"])) is True  # one stream: a decoupled ensemble
    assert check_composing(cfg, graph, _models()) is False
    joined = STEPS + """ step [ { model_name: "join" model_version: -1 input_map { key: "X" value: "L" } input_map { key: "Z" value: "R" }
                                 output_map { key: "Y" value: "J" } } ]"""
    cfg = _ensemble(joined)
    cfg.output.add(name="J", data_type=cfg.output[0].data_type, dims=[2])
    cfg.output.remove(cfg.output[0])
    cfg.output.remove(cfg.output[0])
    join = _model("join")
    join.input.add(name="Z", data_type=join.input[0].data_type, dims=[2])
    # Triton names the model its tensor map met first with the written tensor: J is an ensemble output
    assert _fails(check_composing, cfg, check_scheduling(cfg), _models(**streaming, join=join)) == (
        "in ensemble ens, step of model 'ens' receives inputs originated from different decoupled models")
