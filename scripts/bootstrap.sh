#!/usr/bin/env bash
# Create or reuse the project's virtual environment (.venv by default; BRIDGE_FREEZE_VENV overrides).
# Idempotent: a second run only compares a stamp and returns (well under a second).
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${BRIDGE_FREEZE_VENV:-.venv}"
# Two stamps: the dependencies (a rebuild of the venv when they change) and the project's own packaging
# (only a re-install of the project, seconds, when pyproject.toml / setup.py / the .pth line change).
REQS=(requirements/constraints.txt requirements/base.txt requirements/training.txt requirements/megatron.txt requirements/dev.txt requirements/skyrl-tests.txt scripts/bootstrap.sh)
PROJECT=(pyproject.toml setup.py bridge_freeze_plugin.pth)
want="$(cat "${REQS[@]}" | sha256sum | cut -c1-16)"
want_project="$(cat "${PROJECT[@]}" | sha256sum | cut -c1-16)"
stamp="$VENV/.bridge-freeze-stamp"
stamp_project="$VENV/.bridge-freeze-project-stamp"

install_project() {
  "$VENV/bin/python" -m pip --disable-pip-version-check -q install -c requirements/constraints.txt \
    --no-deps --no-build-isolation -e .
  # A wheel install puts bridge_freeze_plugin.pth (the autoload line) into site-packages; an editable
  # install does not ship it, so put it there as the wheel would.
  cp bridge_freeze_plugin.pth "$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/"
  echo "$want_project" > "$stamp_project"
}

if [[ -x "$VENV/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  if [[ ! -f "$stamp_project" || "$(cat "$stamp_project")" != "$want_project" ]]; then
    echo "bootstrap: the project's packaging changed; re-installing it into $VENV" >&2
    install_project
  fi
  exit 0
fi

find_python312() {
  local candidates=("${PYTHON312:-}" python3.12)
  local root
  root="$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"
  candidates+=("$root"/versions/3.12*/bin/python3.12 /usr/local/bin/python3.12 /usr/bin/python3.12)
  for c in "${candidates[@]}"; do
    [[ -n "$c" ]] || continue
    # A pyenv shim exists even when 3.12 is not the active version: check that it really runs.
    if "$c" -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1; then
      command -v "$c" || echo "$c"
      return 0
    fi
  done
  return 1
}

PY="$(find_python312)" || {
  echo "bootstrap: Python 3.12 is required (megatron-bridge needs >=3.12,<3.13) and none was found." >&2
  echo "bootstrap: install it (e.g. 'pyenv install 3.12') or set PYTHON312=/path/to/python3.12." >&2
  exit 1
}

echo "bootstrap: building $VENV with $PY (first run: a few minutes, about 3 GB of downloads)" >&2
rm -rf "$VENV"
"$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)
# Every version comes from requirements/constraints.txt (the other requirements files only name packages).
CONSTRAINTS=(-c requirements/constraints.txt)
"${PIP[@]}" install "${CONSTRAINTS[@]}" -r requirements/base.txt -r requirements/training.txt -r requirements/dev.txt
# The full megatron-bridge / megatron-core dependency trees do not install without CUDA; what they
# import for building and training models is in base.txt. See docs/development.md.
"${PIP[@]}" install "${CONSTRAINTS[@]}" --no-deps -r requirements/megatron.txt
# SkyRL's release for the tests that check check-config against its own config loader (see the file).
"${PIP[@]}" install "${CONSTRAINTS[@]}" --no-deps -r requirements/skyrl-tests.txt
install_project
echo "$want" > "$stamp"
echo "bootstrap: $VENV ready" >&2
