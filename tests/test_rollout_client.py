"""experiments/bench/rollout_client: AReaL's real RemoteSGLangEngine and train.CountDownWorkflow
against the dev server (standing in for SGLang), at toy size: every episode is counted and
the client's own CPU is measured."""

import subprocess
import sys

import pytest

from devkit import ROOT


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_the_bench_counts_every_episode_and_the_clients_cpu(tiny_model_dir):
    run = subprocess.run([sys.executable, "-m", "experiments.bench.rollout_client", "--model", str(tiny_model_dir),
                          "--groups", "3", "--group-size", "2", "--max-new", "8", "--repeats", "2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=280)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [line.strip("| ").split(" | ") for line in run.stdout.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [row[0] for row in rows] == ["1", "2"]
    for _, episodes, tokens, seconds, cpu, per_episode in rows:
        assert int(episodes) == 3 * 2 and 6 <= int(tokens.replace(",", "")) <= 6 * 8  # 1-8 new tokens each
        assert float(seconds) > 0 and float(cpu) > 0
        assert float(per_episode) == pytest.approx(1000 * float(cpu) / 6, abs=0.1)  # cpu is printed to 1 ms


def test_a_folder_without_a_model_is_refused_in_one_line(tmp_path):
    run = subprocess.run([sys.executable, "-m", "experiments.bench.rollout_client", "--model", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "no config.json" in run.stderr and "Traceback" not in run.stderr


def test_a_busy_trainer_runs_python_until_its_block_ends_and_counts_its_own_cpu():
    import time

    from experiments.bench.rollout_client import BusyTrainer

    with BusyTrainer() as trainer:
        time.sleep(0.3)  # the main thread waits, as the bench does for its batch
    assert not trainer.thread.is_alive()
    assert 0.1 < trainer.cpu_s < 1.0  # it ran Python most of the block, and stopped with it
