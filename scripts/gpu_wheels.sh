#!/usr/bin/env bash
# Download, here, the wheels the lent GPU machine lacks, into the git-ignored .gpu-wheels/ (then carry it there:
# run(carry=[".gpu-wheels"], command="bash scripts/gpu_check.sh")). That machine has python3.12, torch, a newer
# transformers and tokenizers, pytest, safetensors, huggingface_hub, numpy, PyYAML... but no megatron-core, no
# Megatron-Bridge and no registry (docs/development.md, "The GPU check"). Versions: requirements/constraints.txt.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="${GPU_WHEELS:-$ROOT/.gpu-wheels}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY=python3
pin() { grep -i "^$1==" "$ROOT/requirements/constraints.txt" | head -n1; }
# megatron-core / megatron-bridge: absent there. transformers / tokenizers: Bridge 0.6.2 wants transformers
# <= 5.12.1, which checks tokenizers <= 0.23.0 at import (the machine has 5.17.0 / 0.23.2). omegaconf: Bridge's
# config side. Not carried: Bridge's training package (finetune(), its checkpoints) also imports at least datasets (with
# pyarrow: its 26.0.1 wheel alone is 55 MB) and TensorBoard: with these 19 MB, over the 64 MiB that travel; the
# finetune test skips there.
# GPU_EXTRA_WHEELS="name ..." adds other pinned distributions (no dependencies) where a machine takes more.
PACKAGES=(megatron-core megatron-bridge transformers tokenizers omegaconf)
mkdir -p "$DEST"
for name in "${PACKAGES[@]}" ${GPU_EXTRA_WHEELS:-}; do
  spec="$(pin "$name")"
  [ -n "$spec" ] || { echo "gpu_wheels: $name is not pinned in requirements/constraints.txt" >&2; exit 1; }
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d "$DEST" "$spec"
done
ls -l "$DEST"
du -sh "$DEST"
