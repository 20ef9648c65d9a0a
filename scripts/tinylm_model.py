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
With ``return_logprobs`` true it also carries ``logprobs`` as the vLLM backend gives them: JSON, one object
per character of the response, ``{token_id: {"logprob", "rank", "decoded_token"}}`` with the sampled
character first, then the ``sampling_parameters.logprobs`` most likely ones (the model's own distribution,
before temperature and top_p, as vLLM's default). A client that goes away stops the generation
(``is_cancelled``).
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
        top_n = int(params.get("logprobs") or 0) if bool(_input(request, "return_logprobs", False)) else None
        stops = params.get("stop") or []
        stops = [stops] if isinstance(stops, str) else stops
        rng = np.random.default_rng(params.get("seed"))
        context = [INDEX.get(ch, INDEX[" "]) for ch in (" " + " " + prompt)[-2:]]
        text, entries, generated = "", [], 0
        if stream and echo:
            sender.send(self._response(prompt, prompt, 0, [] if top_n is not None else None))
        for _ in range(int(params.get("max_tokens", 16))):
            if sender.is_cancelled():
                pb_utils.Logger.log_info(f"tiny_lm: request cancelled after {generated} tokens")
                break
            probs = self.probs[context[0], context[1]]
            token = self._sample(probs, rng, float(params.get("temperature", 1.0)), float(params.get("top_p", 1.0)))
            entry = None if top_n is None else self._logprobs(probs, token, top_n)
            context = [context[1], token]
            generated += 1
            if stream:  # a stream's stop strings are the server's to cut: it holds text back
                time.sleep(self.delay)
                sender.send(self._response(ALPHABET[token], prompt, 1, None if entry is None else [entry]))
                continue
            text += ALPHABET[token]
            entries.append(entry)
            cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
            if cut >= 0:
                text, entries = text[:cut], entries[:cut]
                break
        if not stream:
            sender.send(self._response((prompt if echo else "") + text, prompt, generated,
                                       None if top_n is None else entries),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        else:
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _sample(self, probs, rng, temperature, top_p):
        if temperature <= 0:
            return int(np.argmax(probs))
        probs = probs ** (1.0 / temperature)
        order = np.argsort(-probs, kind="stable")
        ranked = probs[order] / probs.sum()
        keep = min(len(ranked), int(np.searchsorted(np.cumsum(ranked), top_p)) + 1)  # the nucleus: top_p of the mass
        return int(order[rng.choice(keep, p=ranked[:keep] / ranked[:keep].sum())])

    def _logprobs(self, probs, token, top_n):
        """vLLM's entry for one generated token: the sampled one first, then the top_n most likely."""
        order = np.argsort(-probs, kind="stable")  # ties: the alphabet's order, as argmax breaks them
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(1, len(order) + 1)
        return {str(int(i)): {"logprob": float(np.log(probs[i])), "rank": int(rank[i]), "decoded_token": ALPHABET[i]}
                for i in (token, *order[:top_n])}

    def _response(self, text, prompt, tokens, logprobs=None):
        tensors = [
            pb_utils.Tensor("text_output", np.array([text.encode()], dtype=np.object_)),
            pb_utils.Tensor("num_input_tokens", np.array([len(prompt)], dtype=np.int32)),
            pb_utils.Tensor("num_output_tokens", np.array([tokens], dtype=np.int32)),
        ]
        if logprobs is not None:
            tensors.append(pb_utils.Tensor("logprobs", np.array([json.dumps(logprobs).encode()], dtype=np.object_)))
        return pb_utils.InferenceResponse(tensors)
