"""``configs/tuned.pbtxt`` (``triton_actor/tune/config_writer.py``): it parses, passes the server's config
checks, and differs from the original only in the tuned fields."""

from __future__ import annotations

from pathlib import Path

from triton_actor.repository import config as cm
from triton_actor.tune import config_writer as cw
from triton_actor.tune.points import Candidate

ORIGINAL = """
# a comment the user wrote
name: "m"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ -1 ] } ]
dynamic_batching { priority_levels: 2, default_priority_level: 1 }
instance_group [ { count: 2, kind: KIND_CPU }, { count: 1, kind: KIND_CPU } ]
parameters { key: "k" value: { string_value: "v" } }
"""


def _model(tmp_path: Path, text: str = ORIGINAL) -> Path:
    model_dir = tmp_path / "m"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.py").write_text("")
    (model_dir / "config.pbtxt").write_text(text)
    return model_dir


def _without_tuned(cfg: cm.ModelConfig) -> cm.ModelConfig:
    out = cm.ModelConfig()
    out.CopyFrom(cfg)
    for name in cw.TUNED_FIELDS:
        out.ClearField(name)
    return out


def test_tuned_file_parses_passes_checks_and_differs_only_in_tuned_fields(tmp_path: Path) -> None:
    model_dir = _model(tmp_path)
    original = cw.read_original(model_dir, "m")
    pick = Candidate(instances=3, max_batch_size=16, dynamic_batching=True, preferred=(8, 16), queue_delay_us=250)
    path = cw.write(model_dir, cw.apply(original, pick), "pick: three instances")
    assert path == model_dir / "configs" / "tuned.pbtxt"
    assert path.read_text().startswith("# pick: three instances\n")
    tuned, _ = cm.read(model_dir, "m", auto_complete=False, config_name="tuned")
    assert _without_tuned(tuned) == _without_tuned(original)
    assert cw.candidate_of(tuned) == pick
    assert tuned.dynamic_batching.priority_levels == 2  # the batcher's other fields stay
    assert len(tuned.instance_group) == 1 and tuned.instance_group[0].kind == tuned.instance_group[0].KIND_CPU
    cm.normalize(tuned, "m", gpu_count=0)
    cm.validate(tuned, "m", gpu_count=0)
    assert (model_dir / "config.pbtxt").read_text() == ORIGINAL  # the original is never rewritten


def test_turning_dynamic_batching_off_removes_it(tmp_path: Path) -> None:
    original = cw.read_original(_model(tmp_path), "m")
    tuned = cw.apply(original, Candidate(instances=1, max_batch_size=8, dynamic_batching=False))
    assert not tuned.HasField("dynamic_batching") and tuned.max_batch_size == 8


def test_the_servers_default_preferred_size_is_not_written(tmp_path: Path) -> None:
    """Normalization fills ``preferred_batch_size: [max_batch_size]``; writing it back would be noise."""
    original = cw.read_original(_model(tmp_path), "m")
    tuned = cw.apply(original, Candidate(instances=1, max_batch_size=4, dynamic_batching=True, preferred=(4,)))
    assert list(tuned.dynamic_batching.preferred_batch_size) == []


def test_a_model_without_a_batch_dimension_keeps_max_batch_size_0(tmp_path: Path) -> None:
    text = ORIGINAL.replace("max_batch_size: 8", "max_batch_size: 0").replace(
        "dynamic_batching { priority_levels: 2, default_priority_level: 1 }", "")
    original = cw.read_original(_model(tmp_path, text), "m")
    tuned = cw.apply(original, Candidate(instances=4, max_batch_size=0, dynamic_batching=False))
    assert tuned.max_batch_size == 0 and tuned.instance_group[0].count == 4


def test_override_json_round_trips_through_the_load_api_parser(tmp_path: Path) -> None:
    original = cw.read_original(_model(tmp_path), "m")
    served = cw.apply(original, Candidate(instances=2, max_batch_size=8, dynamic_batching=True, queue_delay_us=100))
    assert cw.from_json(cw.override_json(served), "m") == served


def test_a_config_without_groups_gets_one(tmp_path: Path) -> None:
    text = ORIGINAL.replace("instance_group [ { count: 2, kind: KIND_CPU }, { count: 1, kind: KIND_CPU } ]", "")
    original = cw.read_original(_model(tmp_path, text), "m")
    assert cw.candidate_of(original).instances == 1
    tuned = cw.apply(original, Candidate(instances=2, max_batch_size=8, dynamic_batching=True))
    assert [g.count for g in tuned.instance_group] == [2]


def test_isolation_is_a_parameter_written_only_when_the_candidate_sets_it(tmp_path: Path) -> None:
    original = cw.read_original(_model(tmp_path), "m")
    kept = cw.apply(original, Candidate(instances=2, max_batch_size=8, dynamic_batching=True))
    assert dict(kept.parameters) == dict(original.parameters) and cw.candidate_of(kept).isolation == ""
    isolated = cw.apply(original, Candidate(instances=2, max_batch_size=8, dynamic_batching=True, isolation="process"))
    assert isolated.parameters[cw.ISOLATION].string_value == "process" and isolated.parameters["k"].string_value == "v"
    assert cw.candidate_of(isolated).isolation == "process"
