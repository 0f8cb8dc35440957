# `make test` works on a fresh clone: it builds .venv when missing, then lints and tests.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test lint format bench-cpu clean serve

# pip's own output shows the progress: a first install takes a few minutes.
$(STAMP): pyproject.toml
	@echo "fleetlm: installing the Python environment in $(VENV) (first run, ~2-3 min)..."
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# One resolve. torch pinned: its CPU build from local disk (2.13.0+cpu sorts above the
	# index's 2.13.0), so nothing pulls a CUDA build. --no-compile: byte-compiling every module
	# of torch and transformers took a large part of the install; Python compiles what a run
	# imports, once, on first use.
	$(BIN)/pip install --no-compile torch==2.13.0 triton==3.6.0 -e '.[dev]'
	touch $(STAMP)
	@echo "fleetlm: Python environment ready in $(VENV) (source $(BIN)/activate puts fleetlm on PATH)"

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# Two processes for the most part (most tests wait on the servers they start, not on the CPU),
# each module on one of them, the slow directories first (tests/conftest.py), then the `serial`
# tests alone: they measure what the machine sustains (overload at 3x its capacity) and must not
# share it with the rest.
test: $(STAMP) lint
	TRITON_INTERPRET=1 $(BIN)/pytest -q -n 2 --dist loadscope --no-loadscope-reorder \
		-m "not serial" --durations=20
	TRITON_INTERPRET=1 $(BIN)/pytest -q -m serial --durations=5

# Everything on this machine: embedded Redis + Postgres, the API and one worker per GPU.
serve: $(STAMP)
	$(BIN)/fleetlm serve

bench-cpu: $(STAMP)
	$(BIN)/python -m benchmarks.scheduler_overhead

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
