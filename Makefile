# Two commands do everything on a fresh machine with only Python:
#   make demo   -- create .venv if missing, then run `memnets demo`
#   make test   -- create .venv if missing, then run the fast test tier
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# pytest-xdist workers for the test tiers: one per core, at most 4 (each imports torch); files stay
# whole on one worker (--dist loadfile). TEST_WORKERS=0 (or no pytest-xdist) runs one process.
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print(max(1, min(4, len(os.sched_getaffinity(0)))))" 2>/dev/null || echo 2)
XDIST  = $$($(BIN)/python -c "import xdist" 2>/dev/null && echo "$(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)")

.PHONY: demo test test-slow test-fla test-triton bench venv clean

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
	$(BIN)/python -m pytest -q -m "not slow and not interpret" --timeout=600 $(XDIST)

# The NAM -> fla mapping on fla's reference recurrences and, through Triton's interpreter, on
# fla's own step-by-step kernels (CPU): installs the `gpu` extra (~300 MB of triton) and numpy.
test-fla: $(STAMP)
	$(BIN)/python -m pip install -q -e '.[dev,gpu]' numpy
	$(BIN)/python -m pytest -q tests/test_nam_scan_fla.py tests/test_fla_interpret.py

# Every Triton kernel of memnets (the recurrent memories' CUDA path) on CPU tensors through
# Triton's interpreter, against the references in float32 and float64, plus the fla checks above.
# TRITON_INTERPRET is set for the whole run: triton decorates its own library when it is first
# imported, so a process runs Triton either interpreted or compiled, never both.
test-triton: test-fla
	TRITON_INTERPRET=1 $(BIN)/python -m pytest -q -m "interpret and not slow" --timeout=1800 $(XDIST)

# The C kernels (src/memnets/ops/_native) built with AddressSanitizer and UBSan, any finding
# fatal, through the native tests and their edge cases (large and zero sizes, NaN, the cache):
# it passes only when the sanitizers report nothing. Needs gcc or clang with their runtimes.
SAN_CC     ?= $(or $(CC_SAN),gcc)
SAN_FLAGS  := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g
SAN_CACHE  ?= build/sanitize-cache
test-sanitize: $(STAMP)
	@rm -rf $(SAN_CACHE)
	CC=$(SAN_CC) MEMNETS_NATIVE_CFLAGS="$(SAN_FLAGS)" MEMNETS_CACHE=$(abspath $(SAN_CACHE)) \
	LD_PRELOAD="$$($(SAN_CC) -print-file-name=libasan.so) $$($(SAN_CC) -print-file-name=libubsan.so)" \
	ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:halt_on_error=1 \
	UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/test_native.py tests/test_hardening_native.py tests/test_ntm_access.py \
		tests/test_hardening_nan.py

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

bench: $(STAMP)
	$(BIN)/memnets bench ops

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info .pytest_cache

# On a fresh GPU machine holding torch and triton (no network): the CUDA tests, then the GPU bench
# rows that the speed targets name, in at most 8 minutes; wheels/*.whl installed first when present
# (`pip download --no-deps fla-core==0.6.0 pytest-xdist execnet -d wheels` prepares them: fla's rows,
# its warm-up beside the tests, the tests on xdist workers). Writes out/gpu-check/gpu-check.{json,md}
# (and to $OUT when set); docs/bench.md.
.PHONY: gpu-check
gpu-check:
	PYTHONPATH=src$${PYTHONPATH:+:$$PYTHONPATH} $(PYTHON) -m memnets.bench.gpu_check --out out/gpu-check

# Paper-scale runs on a GPU (the Fib presets the paper trains for 40,000 steps of 128): each of
# PAPER_PRESETS trains for PAPER_MIN minutes of wall time and is scored where it stops, in
# $(PAPER_OUT)/paper/<preset> (resumed when that folder is there). Their records (metrics.jsonl,
# config, env, results; not the checkpoints, some 280 MB each) go to
# $(PAPER_OUT)/paper-runs.tar.gz and, when OUT is set, to $OUT/paper-runs.tar.gz.
# `make gpu-check gpu-paper PAPER_MIN=2` fits one lease.
PAPER_MIN     ?= 2
PAPER_PRESETS ?= paper/fib-nam_tm paper/fib-transformer
PAPER_OUT     ?= out
.PHONY: gpu-paper
gpu-paper:
	@set -e; for p in $(PAPER_PRESETS); do n=$$(basename $$p); \
	  PYTHONPATH=src$${PYTHONPATH:+:$$PYTHONPATH} $(PYTHON) -m memnets.cli.main train $$p \
	    time_limit_min=$(PAPER_MIN) --run-dir "$(PAPER_OUT)/paper/$$n" --resume --quiet || echo "$$p: exit $$?"; \
	done; \
	(cd "$(PAPER_OUT)" && tar czf paper-runs.tar.gz $$(ls -d paper/*/metrics.jsonl paper/*/config.json \
	  paper/*/env.json paper/*/results.json 2>/dev/null)); \
	if [ -n "$$OUT" ]; then cp "$(PAPER_OUT)/paper-runs.tar.gz" "$$OUT/"; fi; \
	echo "written: $(PAPER_OUT)/paper-runs.tar.gz"
