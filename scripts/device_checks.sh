#!/usr/bin/env bash
# What only the lent GPU host shows, in one run that fits the device tool's limits (10 minutes a command,
# 15 minutes of device time a session, the machine's start included; 64 MiB carried): the GPU tests, the
# workers sweep on 16 cores, then as much of the suite as the time left allows. The host has Python 3.12
# with torch (CUDA), numpy and onnxruntime, and reaches no registry: everything else travels in .whl/.
#
#   here, once per session (about 35 MB):
#     scripts/gpu_host_wheels.sh && scripts/device_checks.sh prepare
#   there (the device tool's run, carry [".whl"], timeout_s 590):
#     bash scripts/device_checks.sh run
#
# Real Triton (a 370 MB tree) does not fit what the tool carries, so the sweep runs our server alone; the
# figure to set it against is Triton 2.51's on such a host (issue 25: 31.6k infer/s, count: 8, c=64).
# Each step writes its output under $OUT (host.txt, gpu_tests.txt, workers.md/.json and workers.txt,
# suite.txt), and a step that fails or runs out of its time leaves the next ones their time.
set -uo pipefail
cd "$(dirname "$0")/.."

prepare() {
    local tools="${BENCH_TOOLS_DIR:-$HOME/.cache/triton_actor_bench}" bench=.whl/bench
    [ -x "$tools/pa-venv/bin/perf_analyzer" ] || { echo "run scripts/install_bench_tools.sh first" >&2; exit 1; }
    [ -d .whl ] || { echo "run scripts/gpu_host_wheels.sh first" >&2; exit 1; }
    mkdir -p "$bench"
    # perf_analyzer and the two libraries the host may lack (the CUDA 12 runtime it links, libb64)
    cp "$tools/pa-venv/bin/perf_analyzer" "$bench/perf_analyzer.bin"
    cp -L "$(find "$tools/pa-venv" -name 'libcudart.so.12' | head -1)" "$bench/"
    cp -L "$(ldconfig -p | awk '/libb64.so.0d/ {print $NF; exit}')" "$bench/"
    cat > "$bench/perf_analyzer" <<'EOF'
#!/usr/bin/env bash
here="$(cd "$(dirname "$0")" && pwd)"
LD_LIBRARY_PATH="$here${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/perf_analyzer.bin" "$@"
EOF
    chmod +x "$bench/perf_analyzer"
    du -sh .whl
}

run() {
    local out="${OUT:-/tmp/device_checks}" started=$SECONDS
    mkdir -p "$out"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "wheels did not install" | tee "$out/host.txt"; exit 1; }
    export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1 BENCH_TOOLS_DIR="$PWD/.whl/bench"
    {
        echo "cores: $(nproc)"; python3 -V; nvidia-smi -L
        python3 -c "import torch, onnxruntime; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), \
'onnxruntime', onnxruntime.__version__, onnxruntime.get_available_providers())"
        "$BENCH_TOOLS_DIR/perf_analyzer" --version 2>&1 | head -2 || echo "perf_analyzer does not run here"
    } > "$out/host.txt" 2>&1
    cat "$out/host.txt"
    echo "[device] GPU tests ($((SECONDS - started)) s)"
    timeout 150 python3 -m pytest -p no:cacheprovider -q -m gpu tests > "$out/gpu_tests.txt" 2>&1
    tail -3 "$out/gpu_tests.txt"
    echo "[device] workers sweep, c=64 ($((SECONDS - started)) s)"
    timeout 240 python3 scripts/bench_workers.py --no-triton --workers 1,4,8,16 --concurrency 64 \
        --protocols grpc,http --window-ms 2000 --out "$out" > "$out/workers.txt" 2>&1
    tail -12 "$out/workers.txt"
    local left=$((560 - (SECONDS - started)))
    echo "[device] the suite for ${left} s"
    if [ "$left" -gt 30 ]; then
        timeout "$left" python3 -m pytest -p no:cacheprovider -q -m "not host_tools" \
            tests > "$out/suite.txt" 2>&1
        tail -5 "$out/suite.txt"
    fi
}

case "${1:-}" in
    prepare) prepare ;;
    run) run ;;
    *) echo "usage: $0 prepare|run" >&2; exit 2 ;;
esac
