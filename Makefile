# `make demo` and `make test` do all set-up on a fresh machine (Python 3.11 or 3.12).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
# pip keeps no cache: the wheels would otherwise sit on disk twice.
PIP_INSTALL := $(PY) -m pip install --no-cache-dir --progress-bar off
TORCH := $(shell grep -E '^torch==' requirements-cpu.txt)
# Which of the README's training commands the demo runs: single (controller), local, ray, slurm.
LAUNCHER ?= single

.PHONY: setup demo test test-fast bench

setup: $(INSTALLED)

# requirements-cpu.txt pins every package, with a CPU build of torch in place of the CUDA
# one that requirements.txt resolves to (its header says why). torch goes in first with its
# own dependencies: where pip finds no CPU build, the CUDA build it takes needs its nvidia-*
# libraries. The rest go in with --no-deps, which keeps pip from swapping torch back.
# The disk check is for a first install; an existing .venv only needs what changed.
$(INSTALLED): requirements-cpu.txt pyproject.toml
	test -d $(VENV) || $(PYTHON) devkit/check_disk.py .
	$(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) --quiet --upgrade pip
	$(PIP_INSTALL) "$(TORCH)"
	$(PIP_INSTALL) --no-deps -r requirements-cpu.txt
	$(PIP_INSTALL) --no-deps -e .
	touch $(INSTALLED)

demo: $(INSTALLED)
	$(PY) -m devkit.demo --launcher $(LAUNCHER)

# The 15 slowest tests close the report: the suite has to stay well inside CI's 90 minutes.
# Two pytest-xdist workers: the whole runs mostly wait, and the tests that see every process
# of the machine run in one of them, one after another (tests/conftest.py, "machine").
test: $(INSTALLED)
	$(PY) -m pytest -q -n 2 --dist loadgroup --durations=15 tests

# The loop while editing: every test but the whole runs (pyproject.toml's `launchers` and `e2e`
# markers), which `make test` adds.
test-fast: $(INSTALLED)
	$(PY) -m pytest -q --durations=10 -m "not launchers and not e2e" tests

bench: $(INSTALLED)
	$(PY) experiments/bench/bench_countdown.py
	$(PY) experiments/bench/bench_reward.py
