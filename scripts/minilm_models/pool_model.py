"""all-MiniLM-L6-v2 post-processing: TOKEN_EMBEDDINGS [n, seq, 384] and ATTENTION_MASK [n, seq] -> EMBEDDING [n, 384].

Mean pooling over the tokens the mask keeps, then L2 normalisation: sentence-transformers' ``Pooling``
(mean tokens) and ``Normalize`` modules, with their clamps (token count >= 1e-9, norm >= 1e-12). Also
NUM_TOKENS [n, 1]: the tokens each sentence had (special ones included), which the ensemble gives as
``num_input_tokens``, the count the OpenAI-compatible /v1/embeddings reports as ``usage.prompt_tokens``.
"""

import numpy as np
import triton_python_backend_utils as pb_utils


def embed(tokens, mask):
    """Mean of the kept tokens, L2-normalised; float32 [n, 384]."""
    keep = mask.astype(np.float32)[:, :, None]
    mean = (tokens * keep).sum(axis=1) / np.maximum(keep.sum(axis=1), 1e-9)
    norm = np.maximum(np.linalg.norm(mean, axis=1, keepdims=True), 1e-12)
    return (mean / norm).astype(np.float32)


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            tokens = pb_utils.get_input_tensor_by_name(request, "TOKEN_EMBEDDINGS").as_numpy()
            mask = pb_utils.get_input_tensor_by_name(request, "ATTENTION_MASK").as_numpy()
            count = mask.sum(axis=1, keepdims=True).astype(np.int32)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("EMBEDDING", embed(tokens, mask)),
                                                                        pb_utils.Tensor("NUM_TOKENS", count)]))
        return responses
