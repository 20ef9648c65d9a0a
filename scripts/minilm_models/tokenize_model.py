"""all-MiniLM-L6-v2 pre-processing: sentences (BYTES [n, 1]) -> INPUT_IDS and ATTENTION_MASK (INT64 [n, seq]).

Tokenises with the model's own ``tokenizer.json`` (copied beside this file by ``scripts/minilm.py``) through
``tokenizers``: truncation at ``max_tokens`` (256, sentence-transformers' ``max_seq_length``), padding to the
longest sentence of the request rounded up to ``pad_to_multiple_of`` (16), so requests of similar length have
the same shape and the encoder's dynamic batcher can join them (a batch needs one shape per input).
"""

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer


def _text(element):
    return element.decode("utf-8") if isinstance(element, bytes) else str(element)


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {})
        max_tokens = int(params.get("max_tokens", {}).get("string_value", "256"))
        multiple = int(params.get("pad_to_multiple_of", {}).get("string_value", "16"))
        path = Path(args["model_repository"]) / args["model_version"] / "tokenizer.json"
        self.tokenizer = Tokenizer.from_file(str(path))
        self.tokenizer.enable_truncation(max_length=max_tokens)
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]", pad_to_multiple_of=multiple)

    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            encodings = self.tokenizer.encode_batch([_text(t) for t in text.reshape(-1)])
            ids = np.array([e.ids for e in encodings], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
            responses.append(pb_utils.InferenceResponse(
                output_tensors=[pb_utils.Tensor("INPUT_IDS", ids), pb_utils.Tensor("ATTENTION_MASK", mask)]))
        return responses
