#!/usr/bin/env bash
# Rehearse the GPU check HERE, before spending device time: run scripts/gpu_check.sh with only the packages the
# lent GPU machine has (docs/development.md, "The GPU check"). A folder of links to just those packages in the
# project's .venv (the machine's list: /work/shared/reference/gpu-device.md, copied below) is the only
# site-packages of a `python -S` interpreter; the wheels of .gpu-wheels/ (scripts/gpu_wheels.sh) are installed into
# a target folder as there. Without CUDA the GPU tests skip and the GPU benchmark says it has no GPU: what this
# shows is that everything imports and runs up to the GPU, with exactly what will be there.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV_PY="${VENV_PY:-$ROOT/.venv/bin/python}"
[ -x "$VENV_PY" ] || { echo "gpu_rehearse: no $VENV_PY (run make venv, or set VENV_PY)" >&2; exit 1; }
WORK="${REHEARSAL_DIR:-$(mktemp -d /tmp/gpu-rehearsal.XXXXXX)}"
SITE="$WORK/site"
mkdir -p "$SITE"
# The distributions the machine has (its python3's own), by distribution name; absent here ones are reported.
MACHINE_HAS="torch triton numpy PyYAML regex rich markdown-it-py mdurl Pygments einops pytest pluggy iniconfig
packaging pytest-mock pytest-xdist execnet pytest-timeout hypothesis sortedcontainers attrs safetensors
huggingface_hub hf-xet httpx httpcore h11 anyio idna certifi filelock fsspec tqdm typing_extensions Jinja2 MarkupSafe
networkx sympy mpmath setuptools typer click shellingham annotated-doc requests urllib3 charset-normalizer psutil
peft accelerate"
"$VENV_PY" - "$SITE" $MACHINE_HAS <<'PY'
import importlib.metadata as md, os, sys
site, names = sys.argv[1], sys.argv[2:]
missing = []
for name in names:
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        missing.append(name)
        continue
    tops = {f.parts[0] for f in dist.files or [] if f.parts and f.parts[0] not in ("..", "__pycache__")}
    for top in tops:
        src = os.path.join(str(dist.locate_file("")), top)
        dst = os.path.join(site, top)
        if os.path.exists(src) and not os.path.lexists(dst) and not top.endswith(".pth"):
            os.symlink(src, dst)
print(f"rehearsal site: {len(os.listdir(site))} entries; not in this venv (skipped): {', '.join(missing) or 'none'}")
PY
echo "rehearsal folder: $WORK"
# As on the machine: no site-packages but these (-S), the wheels installed by the venv's pip into a target.
PYTHON="$VENV_PY" PYTHON_FLAGS="-S" GPU_EXTRA_SITE="$SITE" PIP="$VENV_PY -m pip" GPU_TARGET="$WORK/target" \
  OUT="${OUT:-$WORK/out}" bash "$ROOT/scripts/gpu_check.sh"
