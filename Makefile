# `make demo` and `make test` do all set-up on a fresh machine (Python 3.11 or 3.12).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
# pip keeps no cache: the CUDA wheels (about 4.5 GB) would otherwise sit on disk twice.
PIP_INSTALL := $(PY) -m pip install --no-cache-dir --progress-bar off
TORCH := $(shell grep -E '^torch==' requirements.txt)
# Which of the README's training commands the demo runs: single (controller), local, ray, slurm.
LAUNCHER ?= single

.PHONY: setup demo test bench

setup: $(INSTALLED)

# torch and its CUDA libraries go in first, alone, so their downloaded wheels are deleted
# before the rest of areal's dependencies are fetched: that keeps the peak disk use down.
# The disk check is for a first install; an existing .venv only needs what changed.
$(INSTALLED): requirements.txt pyproject.toml
	test -d $(VENV) || $(PYTHON) scripts/check_disk.py .
	$(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) --quiet --upgrade pip
	$(PIP_INSTALL) "$(TORCH)"
	$(PIP_INSTALL) -r requirements.txt
	$(PIP_INSTALL) --no-deps -e .
	touch $(INSTALLED)

demo: $(INSTALLED)
	$(PY) -m tools.demo --launcher $(LAUNCHER)

test: $(INSTALLED)
	$(PY) -m pytest -q tests

bench: $(INSTALLED)
	$(PY) bench/bench_countdown.py
	$(PY) bench/bench_reward.py
