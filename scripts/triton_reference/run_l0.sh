#!/usr/bin/env bash
# Run one of Triton's qa/L0_* suites (its test.sh, unchanged) with triton_actor as the tritonserver it starts.
#
#   git -C <server mirror> archive HEAD qa docs/examples | tar x -C /tmp/l0
#   scripts/triton_reference/run_l0.sh /tmp/l0/qa/L0_simple_ensemble [> out.txt]
#
# The suites start /opt/tritonserver/bin/tritonserver and dial localhost:8000/8001, so test.sh runs in
# namespaces of its own (unshare: user, mount, network): a tmpfs over /opt holds a tritonserver that
# execs `python -m triton_actor "$@"` (this venv's, installed with pip -e: this checkout), and the network namespace has its own
# loopback, so other servers on this machine are neither reached nor disturbed. The suite's Python
# clients run on this venv's python (first on PATH); CLIENT_DEPS (a pip --target folder) is put on
# PYTHONPATH for what the suites import besides tritonclient (ml_dtypes<=0.5.4, psutil, attrdict);
# NVIDIA_TRITON_SERVER_VERSION, which most suites require, is 24.10 (Triton 2.51's release) unless set.
# What a suite needs from Triton's data (DATADIR, /data/inferenceserver) or its C++ clients is missing
# here: those parts fail, the rest runs as in Triton's CI.
set -euo pipefail
suite=$(cd "$1" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
py="$root/.venv/bin/python"
exec unshare -rmn bash -c '
  set -e
  ip link set lo up
  mount -t tmpfs tmpfs /opt
  mkdir -p /opt/tritonserver/bin /opt/tritonserver/backends
  printf "#!/bin/bash\nexec %q -m triton_actor \"\$@\"\n" "$3" > /opt/tritonserver/bin/tritonserver
  chmod +x /opt/tritonserver/bin/tritonserver
  ln -s "$(dirname "$1")" /opt/tritonserver/qa  # some suites take python_models from ${TRITON_DIR}/qa
  cd "$1"
  PATH="$(dirname "$3"):$PATH" PYTHONPATH="${CLIENT_DEPS:-}" \
    NVIDIA_TRITON_SERVER_VERSION="${NVIDIA_TRITON_SERVER_VERSION:-24.10}" bash test.sh
' run_l0 "$suite" "$root" "$py"
