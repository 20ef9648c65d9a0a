"""Stand-in, in Python, for Triton's ``repeat`` example backend (decoupled; C++, in neither Triton's PyPI
build nor ours), with the ``repeat_int32`` config of Triton's ``src/test/models`` and ``backend: "python"``.

For each element ``IN[i]`` it waits ``DELAY[i]`` ms and sends one response, ``OUT = [IN[i]]`` and
``IDX = [i]``; then it waits ``WAIT`` ms and sends the final flag alone, as the C++ backend does."""

import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()
            wait = int(pb_utils.get_input_tensor_by_name(request, "WAIT").as_numpy().flat[0])
            for i, (value, delay) in enumerate(zip(values, delays, strict=True)):
                time.sleep(int(delay) / 1000)
                sender.send(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUT", np.array([value], dtype=np.int32)),
                    pb_utils.Tensor("IDX", np.array([i], dtype=np.uint32))]))
            time.sleep(wait / 1000)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
