"""Stand-in, in Python, for the ``identity`` backend (C++; in neither Triton's PyPI build nor ours) that
Triton's ``qa/L0_client_memory_growth`` serves as ``custom_identity_int32``: OUTPUT0 is INPUT0."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(
            request, "INPUT0").as_numpy())]) for request in requests]
