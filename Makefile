# Two commands on a fresh machine:
#   make run    set everything up and train the quick-start recipe on CPU
#   make test   set everything up and run the whole test suite
# Both create .venv when missing and install torch pinned to 2.13.0 (an unpinned torch pulls a ~5 GB CUDA build).

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
TORCH  ?= torch==2.13.0

.PHONY: run test test-fast setup clean bench

$(BIN)/fastgen: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check "$(TORCH)" -e ".[dev]"
	touch $(BIN)/fastgen

setup: $(BIN)/fastgen

run: setup
	$(BIN)/fastgen train

test: setup
	$(BIN)/python -m pytest -q -n auto --maxprocesses 4 --dist loadfile --no-loadscope-reorder

test-fast: setup
	$(BIN)/python -m pytest -q -m "not slow"

bench: setup
	$(BIN)/python benchmarks/overhead.py

clean:
	rm -rf $(VENV) FASTGEN_OUTPUT .pytest_cache
