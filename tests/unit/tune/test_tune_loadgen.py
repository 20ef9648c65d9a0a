"""The load generator's inputs and open-loop schedule (``triton_actor/tune/loadgen.py``), the command line's
parsing (``tune/command.py``, ``cli.py``'s dispatch) and its choice of axes (workers, instance kind); the
measuring itself runs in the integration test."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import numpy as np
import pytest

from triton_actor import cli
from triton_actor.backends import devices
from triton_actor.tune import command, loadgen, search
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


def test_open_loop_arrivals_are_poisson_at_the_rate() -> None:
    """Exponential gaps: mean 1/rate, coefficient of variation 1 (a fixed-interval sender would show 0),
    the same schedule for the same seed."""
    times = list(itertools.islice(loadgen.arrivals(200.0, np.random.default_rng(7), start=10.0), 20000))
    gaps = np.diff([10.0, *times])
    assert times[0] > 10.0 and all(b > a for a, b in itertools.pairwise(times))
    assert abs(gaps.mean() * 200.0 - 1) < 0.03 and abs(gaps.std() / gaps.mean() - 1) < 0.05
    again = list(itertools.islice(loadgen.arrivals(200.0, np.random.default_rng(7), start=10.0), 5))
    assert again == times[:5]


def test_workers_are_tried_only_on_a_server_started_here() -> None:
    args = command.parser().parse_args(["--model", "m", "--model-repository", "r"])
    assert command.space_from(args, Candidate(1, 0, False), workers=False).workers == ()
    assert command.space_from(args, Candidate(1, 0, False), workers=True).workers == tuple(
        n for n in sorted(search.doubling(1, os.cpu_count() or 1)) if n > 1)
    listed = command.parser().parse_args(["--model", "m", "--model-repository", "r", "--workers", "1,2,3"])
    assert command.space_from(listed, Candidate(1, 0, False), workers=True).workers == (2, 3)
    with pytest.raises(SystemExit) as e:
        cli.main(["tune", "--model", "m", "--url", "x:1", "--workers", "2"])  # a restart needs our own server
    assert e.value.code == 2


def test_instance_kind_is_tuned_only_where_a_gpu_is_visible(tmp_path: Path) -> None:
    """The decision from a fake device list (the driver's /proc/driver/nvidia/gpus folders)."""
    proc = tmp_path / "gpus"
    proc.mkdir()
    assert command.instance_kinds("KIND_CPU", devices.gpu_count({}, proc), local=True) == (
        (), "instance kind: not tuned, no GPU on this host (no /proc/driver/nvidia/gpus entry visible)")
    for bus in ("0000:01:00.0", "0000:02:00.0"):
        (proc / bus).mkdir()
    kinds, why = command.instance_kinds("KIND_CPU", devices.gpu_count({}, proc), local=True)
    assert kinds == ("KIND_GPU",) and "2 GPU(s)" in why
    assert command.instance_kinds("KIND_GPU", devices.gpu_count({}, proc), local=True)[0] == ("KIND_CPU",)
    hidden = devices.gpu_count({"CUDA_VISIBLE_DEVICES": "-1"}, proc)
    assert command.instance_kinds("KIND_CPU", hidden, local=True)[0] == ()
    assert command.instance_kinds("KIND_CPU", 2, local=False)[0] == ()  # another host's devices: unknown here


def test_a_point_settles_when_its_confidence_interval_is_tight() -> None:
    """``loadgen.settled``: the 95 % interval of the mean throughput (and mean latency) within the
    percentage, from at least ``min_windows`` windows and ``MIN_REQUESTS`` answers; a warming-up first
    window is left out when that is what settles it; a noisy run needs more windows than a quiet one."""
    def window(rate: float, latency_ms: float = 2.0, n: int = 100) -> loadgen.Window:
        return (rate, [latency_ms / 1000] * n)

    quiet = [window(1000), window(1010), window(990)]
    assert loadgen.settled(quiet, 3, 10.0) == quiet
    assert loadgen.settled(quiet[:2], 3, 10.0) is None  # fewer windows than min_windows
    assert loadgen.settled([window(1000, n=30)] * 3, 3, 10.0) is None  # 90 answers: too few for a p99
    warming = [window(300)] + quiet
    assert loadgen.settled(warming, 3, 10.0) == quiet  # the warm-up window drops out
    noisy = [window(r) for r in (1000, 1150, 900, 1080)]  # cv about 10 %: three windows are not enough
    assert loadgen.settled(noisy[:3], 3, 10.0) is None
    more = noisy + [window(r) for r in (950, 1050, 1000, 1020)]
    assert loadgen.settled(more, 3, 10.0) == more  # eight of them narrow the interval enough
    slower = [window(1000, latency_ms) for latency_ms in (2.0, 3.0, 4.5)]  # an open loop falling behind
    assert loadgen.settled(slower, 3, 10.0) is None
    assert loadgen.half_width_pct([100.0, 100.0]) == 0.0
    assert abs(loadgen.half_width_pct([90.0, 110.0]) - 12.706 * 14.142 / 2 ** 0.5) < 0.01
