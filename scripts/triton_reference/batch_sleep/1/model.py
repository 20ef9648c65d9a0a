"""A model whose cost is per batch, not per request (issue 26's comparison with Model Analyzer).

Each ``execute`` call sleeps a fixed 10 ms (a stand-in for a kernel launch or an accelerator round trip
whose cost barely grows with the batch), then answers every request: OUTPUT0 = 2 * INPUT0. Batching
many requests into one call is what makes it fast, so a tuner must find dynamic batching and a
``max_batch_size`` that fits the latency budget. The same files run on Triton's python backend and on
triton_actor. The shipped config has ``max_batch_size: 8`` and no dynamic batching: a naive deployment.
"""
import time

import triton_python_backend_utils as pb_utils

EXECUTE_S = 0.010


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(EXECUTE_S)
        responses = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUTPUT0", in0 * 2)]))
        return responses
