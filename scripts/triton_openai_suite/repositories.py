"""The repositories the shim serves in place of Triton's test repositories, written once per run.

* Triton's ``vllm_models`` (one vLLM model, ``llama-3.1-8b-instruct``): ``tiny_lm`` alone (the shim's
  ``model`` fixture names it), so ``/v1/models`` lists one model as the tests expect of vLLM;
* ``vllm_embedding_models`` (``all-MiniLM-L6-v2`` through vLLM): the MiniLM pipeline of ``scripts/minilm.py``
  (the same real weights), its ensemble named ``all-MiniLM-L6-v2``;
* ``test_models`` (``mock_llm``, ``identity_py``): served as they are, Triton's own Python models.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

WORK = Path(os.environ.get("TRITON_OPENAI_SHIM_WORK", Path(__file__).resolve().parents[1]))
REPO_ROOT = Path(os.environ["TRITON_ACTOR_ROOT"])


def _scripts() -> None:
    if str(REPO_ROOT / "scripts") not in sys.path:
        sys.path.insert(0, str(REPO_ROOT / "scripts"))


def generation() -> str:
    repo = WORK / "repos" / "generation"
    if not (repo / "tiny_lm").exists():
        _scripts()
        import tinylm

        tinylm.write_model(repo, token_delay_ms=0)
    return str(repo)


def embeddings() -> str:
    repo = WORK / "repos" / "embeddings"
    if not (repo / "all-MiniLM-L6-v2").exists():
        _scripts()
        import minilm

        minilm.write_pipeline(repo)
        config = (repo / "minilm_ensemble" / "config.pbtxt").read_text()
        (repo / "minilm_ensemble").rename(repo / "all-MiniLM-L6-v2")
        (repo / "all-MiniLM-L6-v2" / "config.pbtxt").write_text(
            config.replace('name: "minilm_ensemble"', 'name: "all-MiniLM-L6-v2"'))
    return str(repo)


def ours(triton_repository: str) -> str:
    name = Path(triton_repository).name
    if name.endswith("_embedding_models"):
        return embeddings()
    if name.endswith("_models") and name != "test_models":  # vllm_models, tensorrtllm_models, ..._mistral_models
        return generation()
    if name == "test_models":
        shutil.copytree(triton_repository, WORK / "repos" / "test_models", dirs_exist_ok=True)
        return str(WORK / "repos" / "test_models")
    return triton_repository
