"""One convention for bad input across the project's commands: one line on stderr naming what
is wrong, exit status 2, and nothing started (docs/exit-codes.md)."""

import os
import subprocess
import sys

import pytest

from conftest import CONFIGS, puzzle_file, tiny_model_args
from devkit import ROOT
from devkit.processes import find_free_port

MISSING = "/no/such/dir/test_e.jsonl"


def run(command: list[str], timeout: int = 300, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *command], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)


def assert_one_line(proc: subprocess.CompletedProcess, returncode: int, starts_with: str) -> None:
    """The command exited with `returncode`, its last line on stderr begins with `starts_with`,
    and no traceback came before it."""
    assert proc.returncode == returncode, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(starts_with), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "command, expected",
    [
        (["countdown.py", "--min-numbers", "9"], "countdown.py: error:"),
        (["train.py", "--config", "train_config.yaml", f"train_dataset.path={MISSING}"], f"train.py: {MISSING}: no such file"),
        (["sft.py", "--config", "configs/sft_warm_start.yaml", f"train_dataset.path={MISSING}"], f"sft.py: {MISSING}: no such file"),
        (["evaluate.py", "--server", "127.0.0.1:1", "--tokenizer", ".", "--data", MISSING], f"evaluate.py: {MISSING}: no such file"),
        (["plot.py", "/no/such/dir"], "plot.py: "),
    ],
)
def test_bad_input_is_one_line_and_exit_status_2(command, expected):
    assert_one_line(run(command), 2, expected)


@pytest.mark.e2e
@pytest.mark.parametrize(
    "overrides, message",
    [
        (["retry_probability=1.5"], "retry_probability=1.5: give a probability from 0 to 1"),
        (["signs=true", "column_work=true"],
         "signs=true has its own format: leave retry_probability, column_work and numbers_left off"),
    ],
)  # fmt: skip
def test_sft_settings_that_cannot_work_are_one_line(overrides, message, tmp_path):
    proc = run(["sft.py", "--config", CONFIGS["sft.py"], f"train_dataset.path={puzzle_file(tmp_path, 4)}", *overrides])
    assert_one_line(proc, 2, f"sft.py: {message}")
    assert proc.stderr.strip().splitlines()[-1] == f"sft.py: {message}"  # the whole line, nothing after it


@pytest.mark.e2e
@pytest.mark.parametrize(
    "program, overrides, expected",
    [
        ("sft.py", ["examples_per_row=2", "train_dataset.batch_size=4"],
         "6 puzzles in 3 rows of up to 2 examples, fewer than one batch (train_dataset.batch_size=4)"),
        ("train.py", ["scheduler.type=local", "train_dataset.batch_size=8"],
         "6 puzzles, fewer than one batch (train_dataset.batch_size=8)"),
    ],
)  # fmt: skip
def test_a_training_set_smaller_than_one_batch_is_refused(program, overrides, expected, tiny_model_dir, tmp_path):
    """AReaL's loaders drop an incomplete batch, so fewer rows than one batch would train
    nothing while the trainer reports a completed run."""
    data = puzzle_file(tmp_path, 6)
    command = tiny_model_args(program, tiny_model_dir, data, tmp_path, *overrides)
    assert_one_line(run(command), 2, f"{program}: {data}: {expected}")


@pytest.mark.e2e
@pytest.mark.parametrize("program", ["train.py", "sft.py"])
def test_scheduler_ray_with_no_cluster_at_ray_address_stops_in_one_line(program, tiny_model_dir, tmp_path):
    """Ray's own connect would retry for minutes (docs/areal-bugs.md); the subprocess timeout
    is what fails this test if the check is gone."""
    data = puzzle_file(tmp_path, 16)
    command = tiny_model_args(program, tiny_model_dir, data, tmp_path, "scheduler.type=ray", "train_dataset.batch_size=4")
    address = f"127.0.0.1:{find_free_port()}"  # nothing listens there
    proc = run(command, timeout=120, env={**os.environ, "RAY_ADDRESS": address})
    assert_one_line(proc, 1, f"scheduler.type=ray: nothing answers at RAY_ADDRESS={address} (Connection refused)")
