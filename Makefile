# The two commands the README promises:
#   make demo   builds .venv, installs gpudiag (+ torch==2.13.0), runs the bundled CPU training
#               script (a small CNN behind a slow DataLoader) under `gpudiag profile` and prints
#               the verdict. No GPU needed.
#   make test   builds .venv with the test extras, installs the system packages the tests
#               drive (Debian's chromium and prometheus, when missing) and runs ruff and pytest.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch is pinned: a CPU wheel of 2.13.0 is what the test machines carry; an unpinned torch
# pulls a multi-GB CUDA build.
TORCH := torch==2.13.0

.PHONY: demo test lint clean system-deps

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed-core: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q $(TORCH) -e .
	touch $@

$(VENV)/.installed-test: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q $(TORCH) -e '.[test]'
	touch $@ $(VENV)/.installed-core

demo: $(VENV)/.installed-core
	rm -rf runs/demo
	$(BIN)/gpudiag profile --out runs/demo -- $(BIN)/python benchmarks/workloads/demo_train.py

lint: $(VENV)/.installed-test
	$(BIN)/ruff check .

system-deps:
	bash .ci/install-test-deps.sh

test: $(VENV)/.installed-test system-deps
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) runs .bench .pytest_cache
