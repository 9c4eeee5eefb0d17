"""areal_patches/wandb_offline: `stats_logger.wandb.mode=offline` writes a wandb run folder
without a W&B account or network (tests/test_launchers.py checks it in a whole run)."""

from __future__ import annotations

import time

import pytest
import wandb
from areal.api.cli_args import GRPOConfig
from areal.api.io_struct import FinetuneSpec
from areal.utils.stats_logger import StatsLogger

from areal_patches import wandb_offline
from conftest import wandb_history


def offline_logger(fileroot, monkeypatch) -> StatsLogger:
    """AReaL's stats logger in offline mode, on a machine that never logged in to W&B."""
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(fileroot / "home"))  # no ~/.netrc, no wandb settings
    wandb.setup()  # as an earlier logger in the process would have
    config = GRPOConfig(experiment_name="offline", trial_name="t", total_train_epochs=1)
    config.stats_logger.experiment_name, config.stats_logger.trial_name = "offline", "t"
    config.stats_logger.fileroot = str(fileroot)
    config.stats_logger.wandb.mode = "offline"
    config.stats_logger.tensorboard.path = None
    return StatsLogger(config, FinetuneSpec(total_train_epochs=1, dataset_size=40, train_batch_size=4))


@pytest.mark.timeout(120)
def test_an_offline_run_needs_no_api_key_and_writes_its_steps_for_wandb_sync(tmp_path, monkeypatch):
    wandb_offline.install()
    logger = offline_logger(tmp_path, monkeypatch)  # in a process whose wandb was set up online

    try:
        for step, reward in enumerate([0.25, 0.5]):
            logger.commit(epoch=0, step=step, global_step=step, data={"rollout/reward": reward})
    finally:
        logger.close()
    (run_file,) = tmp_path.glob("logs/*/offline/t/wandb/offline-run-*/run-*.wandb")
    # wandb's core process may still be writing the file when close() returns (seen on a
    # loaded machine): what `wandb sync` later sends is the file once written.
    expected, deadline = {"rollout/reward": {0: 0.25, 1: 0.5}}, time.monotonic() + 30
    while wandb_history(run_file) != expected and time.monotonic() < deadline:
        time.sleep(0.5)
    assert wandb_history(run_file) == expected
