#!/usr/bin/env bash
# Wheels for running the test suite on a GPU host that reaches no package registry (the lent H100
# host: CPython 3.12, with torch (CUDA), numpy, grpcio and onnxruntime already installed). Downloads
# cp312 manylinux wheels of everything else the server and the suite import into .whl/ (about 11 MB;
# git-ignored). Then, on that host, from the repository root:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:.
#   python3 -m pytest -p no:cacheprovider -q -m "not host_tools" tests
# Tests that need Debian or npm tools the host cannot install (chromium, graphite-carbon, the StatsD
# daemon) are deselected by that marker (host_tools); everything else runs, the KIND_AUTO / CPU-runtime cases included.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
platforms=()
for p in manylinux_2_34_x86_64 manylinux_2_31_x86_64 manylinux_2_28_x86_64 manylinux_2_27_x86_64 \
         manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64 any; do
  platforms+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" -d .whl \
  "gevent>=24.2,<27" "greenlet>=3" zope.event zope.interface "flask>=3,<4" werkzeug jinja2 itsdangerous \
  click blinker markupsafe "protobuf>=6.31.1,<7" "hpack>=4,<5" orjson "watchdog>=4,<8" "gunicorn>=23,<28" \
  prometheus-client "statsd>=4,<5" packaging pytest pytest-timeout pluggy iniconfig \
  "tritonclient[all]>=2.50" geventhttpclient certifi brotli python-rapidjson urllib3 \
  hypothesis sortedcontainers attrs pyyaml
du -sh .whl
