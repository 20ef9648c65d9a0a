"""Stand-in, in Python, for Triton's ``dyna_sequence`` test backend (server ``src/test/dyna_sequence``), which
Triton's ``qa/L0_http`` serves as ``simple_string_dyna_sequence``: that backend is C++ and ships with
neither Triton's PyPI build nor ours. The config is the one the suite makes (``client_examples.py``
writes it from ``simple_dyna_sequence``'s, as the suite's ``sed`` lines do), with ``backend: "python"``.

What the C++ backend computes, per sequence: READY=1 with START=1 sets the accumulator to the sum of
INPUT, READY=1 with START=0 adds that sum, END=1 adds the correlation ID (a string ID must read as an
integer), and every element of OUTPUT is the accumulator. ``execute_delay_ms`` delays each batch."""

import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.delay = int(params.get("execute_delay_ms", {}).get("string_value", "0")) / 1000
        self.sums = {}

    def execute(self, requests):
        if self.delay:
            time.sleep(self.delay)
        responses = []
        for request in requests:
            def control(name, request=request):
                return pb_utils.get_input_tensor_by_name(request, name).as_numpy().flat[0]

            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            corrid = control("CORRID")
            key = int(corrid.decode() if isinstance(corrid, bytes) else corrid)
            total = self.sums.get(key, 0)
            if control("READY"):
                total = (0 if control("START") else total) + int(value.sum())
                if control("END"):
                    total += key
            if control("END"):
                self.sums.pop(key, None)
            else:
                self.sums[key] = total
            out = np.full(value.shape, total, dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", out)]))
        return responses
