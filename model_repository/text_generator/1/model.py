"""A toy text generator over a tiny vocabulary, written as a Triton decoupled Python model.

Each request gets one response per generated token through its response sender, then a response-less
call with TRITONSERVER_RESPONSE_COMPLETE_FINAL. Generation is deterministic: the same prompt always
continues the same way. A client that goes away stops the generation (``is_cancelled``).
"""

import json
import time
import zlib

import numpy as np
import triton_python_backend_utils as pb_utils

VOCABULARY = (
    "the", "a", "model", "server", "streams", "tokens", "to", "every", "client", "quickly",
    "and", "batches", "requests", "on", "one", "GPU",
)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.delay = float(config["parameters"]["token_delay_ms"]["string_value"]) / 1000.0
        self.logger = pb_utils.Logger

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            prompt = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0]
            prompt = prompt.decode("utf-8", "replace") if isinstance(prompt, bytes) else str(prompt)
            limit = pb_utils.get_input_tensor_by_name(request, "max_tokens")
            count = int(limit.as_numpy().reshape(-1)[0]) if limit is not None else 8
            if count < 0:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("max_tokens must be >= 0")),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            state = zlib.crc32(prompt.encode("utf-8"))
            for i in range(count):
                if sender.is_cancelled():
                    self.logger.log_info(f"request {request.request_id()!r} cancelled after {i} tokens")
                    break
                state = (state * 1103515245 + 12345) & 0x7FFFFFFF
                token = VOCABULARY[state % len(VOCABULARY)]
                time.sleep(self.delay)
                sender.send(pb_utils.InferenceResponse([
                    pb_utils.Tensor("text_output", np.array([(" " + token if i else token).encode()], dtype=np.object_)),
                    pb_utils.Tensor("index", np.array([i], dtype=np.int32)),
                ]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
