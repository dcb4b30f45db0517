# Two commands do everything on a fresh machine with only Python:
#   make demo   -- create .venv if missing, then run `memnets demo`
#   make test   -- create .venv if missing, then run the fast test tier
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-slow test-fla bench venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/memnets demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" --timeout=600

# The NAM -> fla mapping on fla's reference recurrences and, through Triton's interpreter, on
# fla's own step-by-step kernels (CPU): installs the `gpu` extra (~300 MB of triton) and numpy.
test-fla: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,gpu]' numpy
	$(BIN)/python -m pytest -q tests/test_nam_scan_fla.py tests/test_fla_interpret.py

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

bench: $(STAMP)
	$(BIN)/memnets bench ops

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache
