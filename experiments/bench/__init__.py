"""Benchmarks, run as scripts (`python3 experiments/bench/bench_reward.py`). A package so that the
tests import what they share with the benchmarks (experiments.bench.hostile_inputs) by one name,
and the benchmarks what they share with each other."""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path


def model_folder(text: str) -> Path:
    """An argparse type: a Hugging Face model folder, or one line saying how to make one."""
    path = Path(text)
    if not (path / "config.json").is_file():
        raise argparse.ArgumentTypeError(f"{text}: not a Hugging Face model folder (no config.json); "
                                         "make one with python3 -m devkit.make_tiny_model --preset tiny --out DIR")
    return path


def labelled(what: str, inside: str | None = None):
    """An argparse type for LABEL=PATH, PATH being `what` (a folder holding the file `inside`,
    when given, else a file): (label, PATH), or one line saying what to give."""

    def parse(text: str) -> tuple[str, Path]:
        label, sep, path = text.partition("=")
        if not sep or not (Path(path) / inside if inside else Path(path)).is_file():
            raise argparse.ArgumentTypeError(f"{text!r}: give LABEL=PATH, PATH {what}")
        return label, Path(path)

    return parse


def hold_the_interpreter(seconds: float, stop: threading.Event | None = None) -> None:
    """Run Python for `seconds` or until `stop` is set, as a trainer launching a small model's
    kernels does: the interpreter's lock is given up only when the switch interval forces it."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end and not (stop and stop.is_set()):
        sum(range(1000))
