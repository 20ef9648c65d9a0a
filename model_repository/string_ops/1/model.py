"""UPPER = TEXT.upper(), LENGTH = len(TEXT) in bytes, element-wise over a BYTES tensor."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            upper = np.array([s.decode("utf-8").upper().encode("utf-8") for s in text.reshape(-1)], dtype=np.object_)
            length = np.array([len(s) for s in text.reshape(-1)], dtype=np.int32)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("UPPER", upper.reshape(text.shape)),
                        pb_utils.Tensor("LENGTH", length.reshape(text.shape)),
                    ]
                )
            )
        return responses
