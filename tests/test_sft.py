"""sft.py run as train.py is: `python3 sft.py --config configs/sft_warm_start.yaml` is AReaL's
single controller (the config's `scheduler.type: local`), which starts its own training worker;
with `scheduler.type=ray`, on a Ray cluster."""

import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from safetensors.torch import load_file

from conftest import alive, command_line, puzzle_file, ray_workers_without_fixes, tiny_model_args
from devkit import ROOT
from devkit.launch import ray_cluster
from devkit.launch.training import launcher_overrides, seam_env

pytestmark = pytest.mark.e2e


def sft_command(model: Path, data: Path, fileroot: Path) -> list[str]:
    """The README's sft.py command on the tiny model, 4 rows a batch."""
    return [sys.executable, *tiny_model_args("sft.py", model, data, fileroot, "train_dataset.batch_size=4")]


@pytest.mark.timeout(600)
def test_sft_runs_as_areals_single_controller(tiny_model_dir, tmp_path):
    data = puzzle_file(tmp_path, 32)
    command = [*sft_command(tiny_model_dir, data, tmp_path), "actor.mb_spec.max_tokens_per_mb=4096"]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # 32 puzzles, 4 to a row, 4 rows a batch: 2 steps an epoch, 2 epochs, saved after each
    saved = sorted(tmp_path.glob("checkpoints/*/countdown-sft/*/default/epoch*/model.safetensors"))
    assert [p.parent.name for p in saved] == ["epoch0epochstep1globalstep1", "epoch1epochstep1globalstep3"]
    scratch, tuned = load_file(tiny_model_dir / "model.safetensors"), load_file(saved[-1])
    assert any(not scratch[name].equal(tuned[name]) for name in scratch)


@pytest.mark.timeout(300)
def test_sigterm_to_sft_leaves_no_worker(tiny_model_dir, tmp_path):
    """`kill` or `timeout` ends the controller through its clean-up: the worker it started goes too."""
    data = puzzle_file(tmp_path, 4096)
    command = sft_command(tiny_model_dir, data, tmp_path)
    controller = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    tree = psutil.Process(controller.pid)
    while not (workers := [p for p in tree.children(recursive=True) if "areal_patches.worker" in command_line(p)]):
        assert controller.poll() is None and time.monotonic() < deadline, "no worker started"
        time.sleep(0.5)
    controller.send_signal(signal.SIGTERM)
    assert controller.wait(timeout=120) == 128 + signal.SIGTERM
    assert not [p for p in workers if alive(p.pid)]


@pytest.mark.timeout(600)
def test_sft_on_a_ray_cluster_trains_in_a_worker_that_has_the_fixes(tiny_model_dir, tmp_path):
    """`scheduler.type=ray` on a one-node Ray cluster (devkit/launch/ray_cluster.py): AReaL's Ray
    actor trains, and the project's fixes reach it through Ray's setup hook."""
    data = puzzle_file(tmp_path, 32)
    command = [*sft_command(tiny_model_dir, data, tmp_path), "actor.mb_spec.max_tokens_per_mb=4096",
               "scheduler.type=ray", *launcher_overrides("single-ray")]  # fmt: skip
    with ray_cluster.cluster(tmp_path / "ray", gpus=1, env=seam_env(), cwd=ROOT) as env:
        proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=480)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    saved = sorted(tmp_path.glob("checkpoints/*/countdown-sft/*/default/epoch*/model.safetensors"))
    assert [p.parent.name for p in saved] == ["epoch0epochstep1globalstep1", "epoch1epochstep1globalstep3"]
    workers, without_fixes = ray_workers_without_fixes(log)
    assert workers and not without_fixes, log[-4000:]
