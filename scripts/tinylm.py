"""Write ``tiny_lm``, the generation example of the OpenAI-compatible API (docs/openai.md), into a repository.

The model is ``scripts/tinylm_model.py`` (a Python-backend, decoupled, character-level trigram model) with
the trigram counts of :data:`CORPUS` beside it and, in the model's folder, a ``tokenizer_config.json``
that holds a chat template, so ``/v1/chat/completions`` shows where templates come from. Deterministic and
offline: the same files on every machine.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

NAME = "tiny_lm"
SOURCE = Path(__file__).resolve().with_name("tinylm_model.py")
ALPHABET = "\n" + "".join(chr(c) for c in range(32, 127))  # as tinylm_model.py

CORPUS = """\
The server loads every model in the repository and serves it over HTTP and gRPC.
A client sends a request, the scheduler forms a batch, and the model answers each request in turn.
Dynamic batching waits a little for more requests, so the model runs fewer and larger batches.
A decoupled model may send many responses for one request, one token at a time, and then a final flag.
The ensemble runs its steps in order: the tokenizer, the encoder, and the pooling step.
When a client goes away in the middle of a stream, the server cancels the request and the model stops.
Metrics count the requests, the batches and the time each of them spent in the queue and in the model.
The repository can be polled, so a new version of a model is loaded and then swapped in while serving.
This is a tiny language model. It knows a few sentences about serving models and nothing else.
Ask it anything and it will answer with words about servers, models, requests and batches.
"""

CONFIG = """\
# tiny_lm: a character-level trigram model behind the OpenAI-compatible API (scripts/tinylm.py writes it).
# Triton's OpenAI-frontend contract: text_input, stream, sampling_parameters, exclude_input_in_output in;
# text_output (and the token counts, and logprobs as the vLLM backend gives them) out; decoupled, so a
# stream is one response per character.
name: "tiny_lm"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [
  { name: "text_input", data_type: TYPE_STRING, dims: [ 1 ] },
  { name: "stream", data_type: TYPE_BOOL, dims: [ 1 ], optional: true },
  { name: "sampling_parameters", data_type: TYPE_STRING, dims: [ 1 ], optional: true },
  { name: "exclude_input_in_output", data_type: TYPE_BOOL, dims: [ 1 ], optional: true },
  { name: "return_num_input_tokens", data_type: TYPE_BOOL, dims: [ 1 ], optional: true },
  { name: "return_num_output_tokens", data_type: TYPE_BOOL, dims: [ 1 ], optional: true },
  { name: "return_logprobs", data_type: TYPE_BOOL, dims: [ 1 ], optional: true }
]
output [
  { name: "text_output", data_type: TYPE_STRING, dims: [ -1 ] },
  { name: "num_input_tokens", data_type: TYPE_INT32, dims: [ 1 ] },
  { name: "num_output_tokens", data_type: TYPE_INT32, dims: [ 1 ] },
  { name: "logprobs", data_type: TYPE_STRING, dims: [ -1 ] }
]
instance_group [ { count: 2, kind: KIND_CPU } ]
parameters { key: "token_delay_ms" value: { string_value: "%(delay)s" } }
"""

# the chat template (Jinja, as a Hugging Face tokenizer keeps it): one line per message, then the answer's cue,
# its space included: a character model's first token would be that space, an answer of no word at one token
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant: {% endif %}"
)


def trigram_counts(text: str = CORPUS) -> np.ndarray:
    index = {ch: i for i, ch in enumerate(ALPHABET)}
    ids = [index[ch] for ch in "  " + text]
    counts = np.zeros((len(ALPHABET),) * 3, dtype=np.uint16)
    np.add.at(counts, (ids[:-2], ids[1:-1], ids[2:]), 1)
    return counts


def write_model(repo: Path, name: str = NAME, token_delay_ms: int = 5) -> Path:
    model_dir = repo / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(CONFIG.replace('"tiny_lm"', f'"{name}"', 1) % {"delay": token_delay_ms})
    shutil.copyfile(SOURCE, model_dir / "1" / "model.py")
    np.savez_compressed(model_dir / "1" / "trigrams.npz", counts=trigram_counts())
    tokenizer = {"chat_template": CHAT_TEMPLATE, "bos_token": "", "eos_token": "\n",
                 "model_max_length": 4096, "tokenizer_class": "PreTrainedTokenizerFast"}
    (model_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer, indent=2) + "\n")
    return model_dir
