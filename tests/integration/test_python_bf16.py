"""BF16 through a Python model as in Triton's python backend: no numpy conversion, DLPack
to torch.bfloat16 and back, and a BF16 output on the wire (binary only)."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from .clients import PROTOCOLS, Client
from .server import add_model

pytest.importorskip("torch")

# the shape of Triton's own BF16 identity model (python_backend examples): as_numpy() must raise,
# the tensor goes to torch by DLPack and the output comes back from torch by DLPack
BF16_PY = """
import torch
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            try:
                tensor.as_numpy()
            except pb_utils.TritonModelException as e:
                assert "tensor dtype is bf16 and cannot be converted to numpy" in str(e).lower()
            else:
                raise Exception("Expected BF16 conversion to numpy to fail")
            doubled = torch.utils.dlpack.from_dlpack(tensor.to_dlpack()) * 2
            assert doubled.dtype == torch.bfloat16
            out = pb_utils.Tensor.from_dlpack("OUTPUT0", torch.utils.dlpack.to_dlpack(doubled))
            responses.append(pb_utils.InferenceResponse([out, tensor]))  # the input itself too
        return responses
"""
BF16_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_BF16, dims: [ -1 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_BF16, dims: [ -1 ] }, { name: "INPUT0", data_type: TYPE_BF16, dims: [ -1 ] } ]
"""


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_bf16_round_trip_through_dlpack(tmp_path: Path, start_server, protocol: str) -> None:
    add_model(tmp_path, "bf16", BF16_CONFIG, BF16_PY)
    server = start_server(tmp_path)
    client = Client(protocol, server)
    try:
        data = np.array([1.5, -2.0, 3.25, 0.0], dtype=ml_dtypes.bfloat16)
        x = client.mod.InferInput("INPUT0", [4], "BF16")
        x.set_data_from_numpy(data)
        outputs = [client.mod.InferRequestedOutput(n, **({} if client.grpc else {"binary_data": True}))
                   for n in ("OUTPUT0", "INPUT0")]
        result = client.infer("bf16", [x], outputs=outputs)
        out = result.get_output("OUTPUT0")
        assert (out["datatype"] if not client.grpc else out.datatype) == "BF16"
        assert result.as_numpy("OUTPUT0").astype(np.float32).tolist() == [3.0, -4.0, 6.5, 0.0]
        assert result.as_numpy("INPUT0").astype(np.float32).tolist() == [1.5, -2.0, 3.25, 0.0]
        if not client.grpc:  # like FP16, BF16 cannot come back as JSON (Triton's text)
            with pytest.raises(InferenceServerException, match="sending BF16 data via JSON is not supported"):
                client.infer("bf16", [x], outputs=[client.mod.InferRequestedOutput("OUTPUT0", binary_data=False)])
    finally:
        client.close()
