"""One convention for bad input across the project's commands: one line on stderr naming what
is wrong, exit status 2, and nothing started (README, "Exit codes")."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import countdown
from dev_server.client import find_free_port

ROOT = Path(__file__).resolve().parent.parent
MISSING = "/no/such/dir/test_e.jsonl"


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
def test_bad_input_is_one_line_and_exit_status_2(command, expected, tmp_path):
    proc = subprocess.run([sys.executable, *command], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(expected), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["retry_probability=1.5"], "retry_probability=1.5: give a probability from 0 to 1"),
        (["signs=true", "column_work=true"],
         "signs=true has its own format: leave retry_probability, column_work and numbers_left off"),
    ],
)  # fmt: skip
def test_sft_settings_that_cannot_work_are_one_line(overrides, message, tmp_path):
    data = tmp_path / "train.jsonl"
    countdown.write_jsonl([(data, countdown.generate_puzzles(4, seed=0))])
    command = ["sft.py", "--config", "configs/sft_warm_start.yaml", f"train_dataset.path={data}", *overrides]
    proc = subprocess.run([sys.executable, *command], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == f"sft.py: {message}"


def test_a_training_set_smaller_than_one_batch_is_refused(tiny_model_dir, tmp_path):
    """AReaL's loaders drop an incomplete batch, so fewer rows than one batch would train
    nothing while the trainer reports a completed run."""
    data = tmp_path / "train.jsonl"
    countdown.write_jsonl([(data, countdown.generate_puzzles(6, seed=0))])
    common = [f"train_dataset.path={data}", f"actor.path={tiny_model_dir}", f"cluster.fileroot={tmp_path}"]
    sft = ["sft.py", "--config", "configs/sft_warm_start.yaml", *common, f"tokenizer_path={tiny_model_dir}",
           "examples_per_row=2", "train_dataset.batch_size=4"]  # fmt: skip
    train = ["train.py", "--config", "train_config.yaml", "scheduler.type=local", *common, f"valid_dataset.path={data}",
             "train_dataset.batch_size=8"]  # fmt: skip
    for command, expected in [
        (sft, f"sft.py: {data}: 6 puzzles in 3 rows of up to 2 examples, fewer than one batch (train_dataset.batch_size=4)"),
        (train, f"train.py: {data}: 6 puzzles, fewer than one batch (train_dataset.batch_size=8)"),
    ]:
        proc = subprocess.run([sys.executable, *command], cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert proc.stderr.strip().splitlines()[-1].startswith(expected), proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("program", ["train.py", "sft.py"])
def test_scheduler_ray_with_no_cluster_at_ray_address_stops_in_one_line(program, tiny_model_dir, tmp_path):
    """Ray's own connect would retry for minutes (docs/areal-bugs.md); the subprocess timeout
    is what fails this test if the check is gone."""
    data = tmp_path / "train.jsonl"
    countdown.write_jsonl([(data, countdown.generate_puzzles(16, seed=0))])
    common = [f"train_dataset.path={data}", f"actor.path={tiny_model_dir}", f"cluster.fileroot={tmp_path}",
              "scheduler.type=ray", "train_dataset.batch_size=4"]  # fmt: skip
    config = "train_config.yaml" if program == "train.py" else "configs/sft_warm_start.yaml"
    extra = [f"valid_dataset.path={data}"] if program == "train.py" else [f"tokenizer_path={tiny_model_dir}"]
    address = f"127.0.0.1:{find_free_port()}"  # nothing listens there
    proc = subprocess.run([sys.executable, program, "--config", config, *common, *extra], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "RAY_ADDRESS": address})  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(
        f"scheduler.type=ray: nothing answers at RAY_ADDRESS={address} (Connection refused)"
    ), proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
