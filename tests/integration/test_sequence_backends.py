"""Implicit state and controls on ONNX and TorchScript models (backends Triton implements implicit state
for): each sequence's running sum lives in the server, fed back as the model's ``ACC_IN`` input."""

from __future__ import annotations

from pathlib import Path

import gevent
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from scripts import modelgen


@pytest.mark.parametrize("kind,strategy", [("onnx", "direct { }"), ("onnx", "oldest { max_candidate_sequences: 4 }"),
                                           ("torchscript", "direct { }")])
def test_running_sums_per_sequence(tmp_path: Path, start_server, kind: str, strategy: str) -> None:
    if kind == "onnx":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnx")
        modelgen.onnx_accumulator(tmp_path, "acc", strategy=strategy)
    else:
        pytest.importorskip("torch")
        modelgen.torchscript_accumulator(tmp_path, "acc", strategy=strategy)
    server = start_server(tmp_path)
    client = grpcclient.InferenceServerClient(server.grpc_url)

    def run(seq: int, values: list[float]) -> list[float]:
        sums = []
        for i, v in enumerate(values):
            x = grpcclient.InferInput("INPUT", [1, 1], "FP32")
            x.set_data_from_numpy(np.array([[v]], np.float32))
            result = client.infer("acc", [x], sequence_id=seq, sequence_start=i == 0, sequence_end=i == len(values) - 1)
            assert result.as_numpy("ACC_OUT") is None  # a state output is not an answer
            sums.append(float(result.as_numpy("OUTPUT")[0, 0]))
        return sums

    try:
        runs = [gevent.spawn(run, seq, [float(seq)] * 4) for seq in (1, 2, 3)]
        gevent.joinall(runs, timeout=60, raise_error=True)
        assert [g.value for g in runs] == [[s * k for k in (1.0, 2.0, 3.0, 4.0)] for s in (1, 2, 3)]
    finally:
        client.close()
