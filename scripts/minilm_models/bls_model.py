"""Sentence embeddings by BLS: TEXT (BYTES [n, 1]) -> EMBEDDING (FP32 [n, 384]), calling the pipeline's models.

The same three steps as ``minilm_ensemble``, written in Python with ``pb_utils.InferenceRequest(...).exec()``:
``minilm_tokenize`` -> the encoder named by the ``encoder`` parameter (``minilm_encoder_onnx`` by default,
``minilm_encoder_torchscript`` also fits) -> ``minilm_pool``. A failing step fails the request with its message.
"""

import json

import triton_python_backend_utils as pb_utils


def _call(model, inputs, outputs):
    response = pb_utils.InferenceRequest(
        model_name=model, inputs=inputs, requested_output_names=outputs).exec()
    if response.has_error():
        raise pb_utils.TritonModelException(f"{model}: {response.error().message()}")
    return [pb_utils.get_output_tensor_by_name(response, name) for name in outputs]


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        self.encoder = params.get("encoder", {}).get("string_value", "minilm_encoder_onnx")

    def embed(self, text):
        ids, mask = _call("minilm_tokenize", [pb_utils.Tensor("TEXT", text)], ["INPUT_IDS", "ATTENTION_MASK"])
        (tokens,) = _call(self.encoder, [pb_utils.Tensor("input_ids", ids.as_numpy()),
                                         pb_utils.Tensor("attention_mask", mask.as_numpy())], ["last_hidden_state"])
        (embedding,) = _call("minilm_pool", [pb_utils.Tensor("TOKEN_EMBEDDINGS", tokens.as_numpy()),
                                             pb_utils.Tensor("ATTENTION_MASK", mask.as_numpy())], ["EMBEDDING"])
        return embedding.as_numpy()

    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            try:
                embedding = self.embed(text)
            except pb_utils.TritonModelException as e:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(str(e))))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("EMBEDDING", embedding)]))
        return responses
