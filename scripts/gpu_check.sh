#!/usr/bin/env bash
# The GPU check, run ON a lent GPU machine as it is (no registry, no megatron): one command, about 4 to 6 minutes.
#   device tool: run(carry=[".gpu-wheels"], timeout_s=400, command="bash scripts/gpu_check.sh")
# Installs the carried wheels (.gpu-wheels/, made here by scripts/gpu_wheels.sh) into a target folder, puts it first
# on PYTHONPATH, then runs tests/gpu and the GPU benchmark (benchmarks/gpu_memory.py), each under a time limit.
# Everything goes to one folder: $OUT (the device tool's) or gpu-results/. Rehearse it first without a GPU:
# scripts/gpu_rehearse.sh. The environment variables below exist for that rehearsal; on the machine none is needed.
# Within 6 minutes the benchmark measures what its budget allows (every selection's plugin arm first); the rest, on
# a machine still warm, in a second call of about 7 minutes (the benchmark alone; its $OUT comes back as the first's):
#   GPU_SKIP_TESTS=1 GPU_BENCH_S=400 GPU_BENCH_ARGS="--repeats 2 --steps 8 --budget-s 380" bash scripts/gpu_check.sh
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
RESULTS="${OUT:-$ROOT/gpu-results}"
PY="${PYTHON:-python3}"
PYFLAGS="${PYTHON_FLAGS:-}"
PIP="${PIP:-$PY -m pip}"
TARGET="${GPU_TARGET:-/tmp/bridge-freeze-gpu-site}"
WHEELS="${GPU_WHEELS:-$ROOT/.gpu-wheels}"
# Limits: install ~30 s + environment ~20 s + tests + benchmark <= 6 minutes. The benchmark starts no arm that
# would end past its budget (--budget-s), so it always writes its JSON.
TESTS_S="${GPU_TESTS_S:-140}"
BENCH_S="${GPU_BENCH_S:-170}"
BENCH_ARGS="${GPU_BENCH_ARGS:---repeats 2 --steps 8 --budget-s 150}"
mkdir -p "$RESULTS"
started=$(date +%s)
log() { echo "[gpu_check $(( $(date +%s) - started ))s] $*" | tee -a "$RESULTS/check.log"; }

ls "$WHEELS"/*.whl >/dev/null 2>&1 || { log "no wheels in $WHEELS: run scripts/gpu_wheels.sh here and carry .gpu-wheels"; exit 2; }
log "installing $(ls "$WHEELS"/*.whl | wc -l) wheels into $TARGET"
$PIP install -q --no-index --no-deps --upgrade --target "$TARGET" "$WHEELS"/*.whl > "$RESULTS/pip.log" 2>&1 \
  || { log "wheel install failed (pip.log)"; exit 3; }
export PYTHONPATH="$TARGET:$ROOT${GPU_EXTRA_SITE:+:$GPU_EXTRA_SITE}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONDONTWRITEBYTECODE=1

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi";
  $PY $PYFLAGS -c '
import importlib, importlib.metadata as md, torch
print("python", __import__("sys").version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available())
for d in ("megatron-core", "megatron-bridge", "transformers", "tokenizers", "omegaconf"):
    try: print(d, md.version(d))
    except md.PackageNotFoundError: print(d, "absent")
from bridge_freeze_harness.gpu_runtime import spec_choice
print("specs:", spec_choice())
from bridge_freeze_harness.cpu_runtime import import_bridge
import_bridge(); import bridge_freeze_plugin; print("import megatron.bridge + the plugin: ok")
' 2>&1; } | tee "$RESULTS/env.txt"

tests_rc=0
if [ -n "${GPU_SKIP_TESTS:-}" ]; then
  log "tests/gpu skipped (GPU_SKIP_TESTS)"
else
  log "tests/gpu (limit ${TESTS_S}s)"
  timeout -k 10 "$TESTS_S" $PY $PYFLAGS -m pytest tests/gpu -p no:cacheprovider -rA -v \
    --junitxml "$RESULTS/tests.xml" > "$RESULTS/tests.log" 2>&1
  tests_rc=$?
  tail -n 25 "$RESULTS/tests.log"
  log "tests/gpu: exit $tests_rc"
fi

log "GPU benchmark (limit ${BENCH_S}s)"
timeout -k 10 "$BENCH_S" $PY $PYFLAGS -m benchmarks.gpu_memory $BENCH_ARGS --out "$RESULTS/gpu_memory.json" \
  > "$RESULTS/bench.log" 2>&1
bench_rc=$?
tail -n 20 "$RESULTS/bench.log"
log "GPU benchmark: exit $bench_rc"
log "results in $RESULTS"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
