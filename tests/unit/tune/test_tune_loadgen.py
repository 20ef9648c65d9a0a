"""The load generator's inputs (``triton_actor/tune/loadgen.py``) and the command line's parsing
(``tune/command.py``, ``cli.py``'s dispatch); the measuring itself runs in the integration test."""

from __future__ import annotations

import numpy as np
import pytest

from triton_actor import cli
from triton_actor.tune import command, loadgen
from triton_actor.tune.points import Candidate


def test_inputs_from_config_add_the_batch_and_fill_variable_dims() -> None:
    cfg = {"max_batch_size": 8, "input": [
        {"name": "A", "data_type": "TYPE_FP32", "dims": ["-1", "4"]},
        {"name": "T", "data_type": "TYPE_STRING", "dims": [1]},
        {"name": "O", "data_type": "TYPE_INT32", "dims": [2], "optional": True}]}
    assert loadgen.inputs_from_config(cfg) == [{"name": "A", "datatype": "FP32", "shape": [1, 1, 4]},
                                               {"name": "T", "datatype": "BYTES", "shape": [1, 1]}]
    assert loadgen.inputs_from_config({"input": [{"name": "X", "data_type": "TYPE_INT64", "dims": [3]}]}) == [
        {"name": "X", "datatype": "INT64", "shape": [3]}]


@pytest.mark.parametrize("datatype", ["FP32", "FP16", "INT64", "UINT8", "BOOL", "BYTES"])
def test_synthesised_tensors_have_the_type_and_shape(datatype: str) -> None:
    data = loadgen.synthesise(datatype, [2, 3], np.random.default_rng(0))
    assert data.shape == (2, 3)
    assert (data.dtype == np.object_) == (datatype == "BYTES")


def test_the_space_follows_the_flags() -> None:
    args = command.parser().parse_args(["--model", "m", "--model-repository", "r", "--instances", "1,2",
                                        "--max-batch-sizes", "4,8", "--dynamic-batching", "on", "--no-preferred",
                                        "--queue-delays-us", "0"])
    space = command.space_from(args, Candidate(2, 8, True))
    assert (space.instances, space.batch_sizes, space.dynamic, space.queue_delays_us, space.preferred) == (
        (1, 2), (4, 8), (True,), (0,), False)
    no_batch = command.space_from(args, Candidate(1, 0, False))
    assert no_batch.batch_sizes == () and no_batch.isolation == ()
    assert command.space_from(args, Candidate(1, 0, False), "python").isolation == ("thread", "process")


def test_tune_is_a_subcommand_and_bad_usage_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(["tune", "--help"])
    assert e.value.code == 0 and "--latency-budget-ms" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        cli.main(["tune", "--model", "m"])  # neither a repository nor --url
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        cli.main(["tune", "--model", "m", "--url", "x:1", "--concurrency", "a"])
    assert e.value.code == 2
