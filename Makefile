# Two commands do all the set-up: `make demo` (the main job) and `make test` (the test suite).
# Each creates or reuses .venv by itself (scripts/bootstrap.sh).
VENV ?= .venv
PY := $(VENV)/bin/python
export BRIDGE_FREEZE_VENV := $(VENV)

.PHONY: venv demo test test-fast test-gpu gpu-wheels gpu-rehearse lint bench clean

venv:
	@scripts/bootstrap.sh

demo: venv
	@$(VENV)/bin/bridge-freeze demo

# the whole suite in TEST_WORKERS processes (pytest-xdist; each takes whole files, in order); TEST_WORKERS=0: one process
TEST_WORKERS ?= 2
test: venv
	@$(PY) -m pytest $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)

# the pure tests (no Bridge model, no process started, nothing marked slow): under a minute, while you work
# (in TEST_WORKERS processes too)
test-fast: venv
	@$(PY) -m pytest -m "not bridge and not spawns and not slow" -q $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)

test-gpu: venv
	@$(PY) -m pytest tests/gpu

# the GPU check (docs/development.md, "The GPU check"): the wheels a lent GPU machine lacks, and a rehearsal here
gpu-wheels: venv
	@PYTHON=$(PY) scripts/gpu_wheels.sh

gpu-rehearse: gpu-wheels
	@VENV_PY=$(PY) scripts/gpu_rehearse.sh

lint: venv
	@$(VENV)/bin/ruff check .

bench: venv
	@$(PY) -m benchmarks.run

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis
