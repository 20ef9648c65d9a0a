"""tritonserver flags with no other home here: accepted without effect, or refused unless off.

A command line from NVIDIA's docs, a Helm chart or a k8s manifest must start (argparse refused these as
"unrecognized arguments"). What a flag would change and what it cannot here:

* accepted, no effect: memory pools, devices and threads of Triton's C++ core (we run no CUDA pools, no
  buffer manager, one gevent hub), and directories of backend / repository-agent / cache shared libraries
  (our backends are built in). Each one given is named once in an INFO line at start (``ignored``);
* refused at start (exit status 1, one line) where accepting would mislead: a SageMaker or Vertex AI
  endpoint and model namespacing. Their off spellings (``--allow-sagemaker=false``) are accepted.

The response cache's flags (``--cache-config``, ``--response-cache-byte-size``) are read by
``command_line.py`` into ``Settings.cache_config``; the rate limiter's by ``flags.py``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

_NO_CUDA = "no CUDA memory pools here: tensors are numpy arrays on the host, models allocate their own"
_BUILT_IN = "backends are built in (python, onnxruntime, pytorch)"


def _pair(text: str) -> str:
    """Triton's ``<int>:<number>`` (device id and size or fraction)."""
    device, sep, value = text.partition(":")
    try:
        int(device), float(value)
    except ValueError:
        sep = ""
    if not sep:
        raise argparse.ArgumentTypeError(f"expected <device>:<value>, got '{text}'")
    return text


def _setting(text: str) -> str:
    """Triton's ``<name>,<key>=<value>``."""
    if "," not in text or "=" not in text.partition(",")[2]:
        raise argparse.ArgumentTypeError(f"expected <name>,<setting>=<value>, got '{text}'")
    return text


# flag → (argparse type, repeatable, help, why it has no effect here)
IGNORED: dict[str, tuple[Callable[[str], Any], bool, str, str]] = {
    "--pinned-memory-pool-byte-size": (int, False, "Triton's pinned host memory pool", _NO_CUDA),
    "--cuda-memory-pool-byte-size": (_pair, True, "<device>:<bytes> of Triton's CUDA pool", _NO_CUDA),
    "--cuda-virtual-address-size": (_pair, True, "<device>:<bytes> for growable implicit state", _NO_CUDA),
    "--model-load-gpu-limit": (_pair, True, "<device>:<fraction> of GPU memory a load may find used",
                               "GPU memory is not checked before a load"),
    "--min-supported-compute-capability": (float, False, "GPUs below it are not used by Triton",
                                           "devices are the ones torch / onnxruntime see (CUDA_VISIBLE_DEVICES)"),
    "--buffer-manager-thread-count": (int, False, "Triton's tensor copy threads",
                                      "tensors are copied by the instance threads themselves"),
    "--host-policy": (_setting, True, "<policy>,<setting>=<value> (numa-node, cpu-cores)",
                      "instances are not pinned to NUMA nodes or cores"),
    "--enable-peer-access": (None, False, "CUDA peer access between GPUs", "no CUDA peer copies here"),
    "--http-thread-count": (int, False, "Triton's HTTP threads", "HTTP is served by gevent greenlets on one hub"),
    "--grpc-max-response-pool-size": (int, False, "Triton's pool of gRPC response objects",
                                      "gRPC answers are not pooled"),
    "--backend-directory": (str, False, "folder of backend shared libraries", _BUILT_IN),
    "--repoagent-directory": (str, False, "folder of repository agent libraries", "repository agents are not loaded"),
    "--cache-directory": (str, False, "folder of response cache libraries",
                          "the caches are built in (local and redis, --cache-config)"),
    "--sagemaker-port": (int, False, "SageMaker port (with --allow-sagemaker)", "SageMaker is not served"),
    "--sagemaker-safe-port-range": (str, False, "<low>-<high> (with --allow-sagemaker)", "SageMaker is not served"),
    "--sagemaker-thread-count": (int, False, "SageMaker threads", "SageMaker is not served"),
    "--vertex-ai-port": (int, False, "Vertex AI port (with --allow-vertex-ai)", "Vertex AI is not served"),
    "--vertex-ai-thread-count": (int, False, "Vertex AI threads", "Vertex AI is not served"),
    "--vertex-ai-default-model": (str, False, "Vertex AI's default model", "Vertex AI is not served"),
}


def add_flags(p: argparse.ArgumentParser, flag: Callable[..., None], bool_type: Callable[[str], bool]) -> None:
    """The two groups; ``flag`` adds a Triton boolean (``--flag``, ``--flag=true|false``)."""
    ignored = p.add_argument_group("accepted for tritonserver compatibility, no effect here (logged at start)")
    for name, (kind, many, help_, _why) in IGNORED.items():
        if kind is None:
            flag(ignored, name, None, help_)
        else:
            ignored.add_argument(name, type=kind, action="append" if many else "store", default=None,
                                 metavar="VALUE", help=help_)
    refused = p.add_argument_group("not supported: only the off values are accepted")
    flag(refused, "--allow-sagemaker", False, "SageMaker endpoint (refused when true)")
    flag(refused, "--allow-vertex-ai", False, "Vertex AI endpoint (refused when true)")
    flag(refused, "--model-namespacing", False, "same model name in several repositories (refused when true)")
    cache = p.add_argument_group("response cache (docs/cache.md)")
    cache.add_argument("--cache-config", action="append", default=[], metavar="CACHE,KEY=VALUE",
                       help="a response cache setting: local,size=<bytes> or redis,<key>=<value> (host, port, user, "
                            "password, db, connect_timeout, socket_timeout, pool_size, wait_timeout, cert, key, "
                            "cacert, cacert_dir); repeat it, or give several key=value after the name")
    cache.add_argument("--response-cache-byte-size", type=int, default=0, metavar="BYTES",
                       help="deprecated: the same as --cache-config local,size=BYTES")


def _refusals(args: argparse.Namespace) -> list[str]:
    out = []
    for name, served in (("--allow-sagemaker", "SageMaker's /invocations and /ping"),
                         ("--allow-vertex-ai", "Vertex AI's prediction route")):
        if getattr(args, name[2:].replace("-", "_")):
            out.append(f"{name}=true is not supported: {served} is not served, only KServe V2 over HTTP and "
                       f"gRPC; leave it out or give {name}=false")
    if args.model_namespacing:
        out.append("--model-namespacing=true is not supported: a model name must be unique across the "
                   "repositories; leave it out or give --model-namespacing=false")
    return out


def check(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    """Refused flags → SystemExit naming the first; otherwise the (flag, why) of every ignored flag given."""
    refused = _refusals(args)
    if refused:
        raise SystemExit(f"error: {refused[0]}")
    return tuple((name, why) for name, (_k, _m, _h, why) in IGNORED.items()
                 if getattr(args, name[2:].replace("-", "_")) is not None)
