# seal-rl developer entry points. `make demo` and `make test` are the whole set-up.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.seal-installed
BFCL   := bfcl-eval==2026.3.23

.PHONY: install demo test bench clean

install: $(STAMP)

# Idempotent: re-runs only when the pins or the package metadata change.
$(STAMP): pyproject.toml requirements/lock.txt Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements/lock.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps $(BFCL)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

DEMO_TASKS := multi_turn_base_1,multi_turn_miss_func_1,multi_turn_miss_param_1,multi_turn_long_context_1

# The closed loop on one CPU: SEAL-train a tiny random model (2 rounds), evaluate it strictly on
# four test tasks, and print the failure profile of that evaluation.
demo: install
	rm -rf runs/demo
	$(BIN)/seal train --config configs/smoke-cpu.yaml --out runs/demo/train
	$(BIN)/seal eval --policy hf:runs/demo/train/model --tasks $(DEMO_TASKS) --max-new-tokens 24 --out runs/demo/eval
	$(BIN)/seal diagnose runs/demo/eval
	$(BIN)/seal report runs/demo/train
	$(BIN)/seal report runs/demo/eval

test: install
	$(BIN)/python -m pytest -n 2 -q

bench: install
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) runs .pytest_cache
