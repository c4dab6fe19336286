# Two commands do all the set-up on a fresh machine:
#   make demo   - the main job: every kernel in the simulator, checked and modeled on trn2
#   make test   - the test suite (fast tier); `make sweep` runs the wide sweep,
#                 `make fuzz` the fuzz tier (1000 random cases per op, both CPU backends)
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.nki-kernels-installed

.PHONY: setup demo test sweep fuzz build benchmark publish-dry-run nki-library clean

setup: $(STAMP)

# torch is installed first and pinned: an unpinned torch would pull a multi-GB CUDA build.
# Which build "torch==2.13.0" resolves to is pip's choice: where pip is configured with a
# local CPU wheel (find-links, as on the CI machine) it takes that; on a machine with only
# PyPI it takes the CUDA build, so pass TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu".
TORCH_PIP_ARGS ?=
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH_PIP_ARGS) "torch==2.13.0"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: setup
	$(PY) benchmarks/model_report.py $(ARGS)

# The suite runs on TEST_WORKERS processes (pytest-xdist), all of a test file's tests on one
# of them (--dist loadfile: a file's module fixtures are built once). On one process it took
# 13 min 51 s on the 2-core CI machine of 2026-12-06, on two 8 min 07 s to 9 min 53 s; on two
# 8 min 13 s to 8 min 37 s there on 2026-12-07, after that day's simulator and cost-model
# speed-ups.
# TEST_WORKERS=0 runs it in this process (pytest's own order; needed for ARGS=--pdb).
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

test: setup
	$(PY) -m pytest $(XDIST) $(ARGS)

sweep: setup
	$(PY) -m pytest -m sweep $(XDIST) $(ARGS)

fuzz: setup
	$(PY) -m tests.fuzz $(ARGS)

# ARGS go to the goal named on the command line: `make build ARGS="--id x"` to the builder,
# `make benchmark ARGS=...` / `make publish-dry-run ARGS=--push` to kernels benchmark /
# publish_hub.py (their build step then takes BUILD_ARGS, empty by default)
build: setup
	$(PY) tools/build_hub.py $(if $(filter build,$(MAKECMDGOALS)),$(ARGS),$(BUILD_ARGS))

# `kernels benchmark` on the Hub tree: measured on this host (CPU-sized workloads on a CPU host)
benchmark: build
	mkdir -p out
	$(VENV)/bin/kernels benchmark build --output out/kernels_benchmark.json $(ARGS)

publish-dry-run: build
	$(PY) tools/publish_hub.py $(ARGS)

# AWS's nki-library kernels in our simulator, against AWS's references (docs/simulator.md):
#   make nki-library NKILIB=/path/to/aws-neuron/nki-library
nki-library: setup
	$(PY) -m pip install --quiet -e ".[dev,aws-tests]"
	$(PY) tools/run_nki_library.py $(NKILIB) --patch-known-defects $(ARGS)

clean:
	rm -rf build out .pytest_cache
