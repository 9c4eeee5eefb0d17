# `make demo` and `make test` do all set-up on a fresh machine (Python 3.11 or 3.12).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed

.PHONY: setup demo test bench

setup: $(INSTALLED)

$(INSTALLED): requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --progress-bar off -r requirements.txt
	touch $(INSTALLED)

demo: $(INSTALLED)
	$(PY) -m tools.demo

test: $(INSTALLED)
	$(PY) -m pytest -q tests

bench: $(INSTALLED)
	$(PY) bench/bench_countdown.py
	$(PY) bench/bench_reward.py
