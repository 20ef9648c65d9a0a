"""tiny_lm: a character-level trigram language model, served through Triton's OpenAI-frontend model contract.

A demonstration of the API, not of language: ``scripts/tinylm.py`` counts the character trigrams of a few
paragraphs written into it (no download, no randomness) and saves them next to this file
(``trigrams.npz``). Decoupled: with ``stream`` true each generated character is one response, then a
response-less final flag; otherwise one response holds the whole text. Sampling follows the request's
``sampling_parameters`` JSON: ``max_tokens`` (16), ``temperature`` (1.0; 0 is greedy), ``top_p`` (1.0),
``seed`` (none: fresh entropy); a pair of characters the text never had backs off to bigrams, then to single
characters, ``stop`` (strings that end the text, left out of it; a stream leaves them to the server, which cuts
the text and cancels the rest). Every response
carries ``num_input_tokens`` (the prompt's characters) and ``num_output_tokens`` (its own characters).
A client that goes away stops the generation (``is_cancelled``).
"""

import json
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

ALPHABET = "\n" + "".join(chr(c) for c in range(32, 127))  # the tokens: newline and printable ASCII
INDEX = {ch: i for i, ch in enumerate(ALPHABET)}


def _input(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else tensor.as_numpy().reshape(-1)[0]


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.delay = float(config["parameters"]["token_delay_ms"]["string_value"]) / 1000.0
        counts = np.load(Path(__file__).with_name("trigrams.npz"))["counts"].astype(np.float64)
        # an unseen pair of characters backs off to the last character's bigrams, then to the unigrams
        bigrams = counts.sum(axis=0)
        bigrams = np.where(bigrams.sum(axis=-1, keepdims=True) > 0, bigrams, bigrams.sum(axis=0))
        counts = np.where(counts.sum(axis=-1, keepdims=True) > 0, counts, bigrams[None])
        smoothed = counts + 1e-4  # unseen trigrams stay possible, rarely
        self.probs = smoothed / smoothed.sum(axis=-1, keepdims=True)

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                self._generate(request, sender)
            except (ValueError, TypeError) as e:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(f"tiny_lm: {e}")),
                            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None

    def _generate(self, request, sender):
        prompt = _input(request, "text_input", b"")
        prompt = prompt.decode("utf-8", "replace") if isinstance(prompt, bytes) else str(prompt)
        params = json.loads(_input(request, "sampling_parameters", b"{}") or b"{}")
        stream = bool(_input(request, "stream", False))
        echo = not bool(_input(request, "exclude_input_in_output", True))
        stops = params.get("stop") or []
        stops = [stops] if isinstance(stops, str) else stops
        rng = np.random.default_rng(params.get("seed"))
        context = [INDEX.get(ch, INDEX[" "]) for ch in (" " + " " + prompt)[-2:]]
        text, tokens = prompt if echo else "", 0
        if stream and echo:
            sender.send(self._response(prompt, prompt, 0))
            text = ""
        for _ in range(int(params.get("max_tokens", 16))):
            if sender.is_cancelled():
                pb_utils.Logger.log_info(f"tiny_lm: request cancelled after {tokens} tokens")
                break
            ch = ALPHABET[self._sample(context, rng, float(params.get("temperature", 1.0)),
                                       float(params.get("top_p", 1.0)))]
            context = [context[1], INDEX[ch]]
            tokens += 1
            text += ch
            cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
            if cut >= 0 and not stream:  # a stream's stop strings are the server's to cut: it holds text back
                text = text[:cut]
                break
            if stream:
                time.sleep(self.delay)
                sender.send(self._response(ch, prompt, 1))
        if not stream:
            sender.send(self._response(text, prompt, tokens), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        else:
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _sample(self, context, rng, temperature, top_p):
        probs = self.probs[context[0], context[1]]
        if temperature <= 0:
            return int(np.argmax(probs))
        probs = probs ** (1.0 / temperature)
        order = np.argsort(-probs, kind="stable")
        ranked = probs[order] / probs.sum()
        keep = min(len(ranked), int(np.searchsorted(np.cumsum(ranked), top_p)) + 1)  # the nucleus: top_p of the mass
        return int(order[rng.choice(keep, p=ranked[:keep] / ranked[:keep].sum())])

    def _response(self, text, prompt, tokens):
        return pb_utils.InferenceResponse([
            pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_)),
            pb_utils.Tensor("num_input_tokens", np.array([len(prompt)], dtype=np.int32)),
            pb_utils.Tensor("num_output_tokens", np.array([tokens], dtype=np.int32)),
        ])
