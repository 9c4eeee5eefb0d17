"""areal_patches/progress_total: AReaL's `Train step N/M` counts to the run's real total."""

from __future__ import annotations

import pytest
from areal.api.cli_args import GRPOConfig
from areal.api.io_struct import FinetuneSpec
from areal.utils import stats_logger as stats_logger_module
from areal.utils.stats_logger import StatsLogger

from areal_patches import progress_total


def spec(epochs: int = 1, puzzles: int = 100_000, batch: int = 128) -> FinetuneSpec:
    return FinetuneSpec(total_train_epochs=epochs, dataset_size=puzzles, train_batch_size=batch)


@pytest.mark.parametrize(
    "total_train_steps, expected",
    [(200, 200), (None, 781), (781, 781), (5000, 781)],  # the epochs end a longer run first
)
def test_the_total_is_the_step_the_run_ends_at(total_train_steps, expected):
    counted = progress_total.run_spec(spec(), total_train_steps)
    assert counted.total_train_steps == expected
    assert (counted.steps_per_epoch, counted.total_train_epochs) == (781, 1)  # the rest stays AReaL's


def test_the_stats_loggers_progress_line_counts_to_total_train_steps(tmp_path, caplog):
    config = GRPOConfig(experiment_name="progress", trial_name="t", total_train_epochs=1, total_train_steps=3)
    config.stats_logger.experiment_name, config.stats_logger.trial_name = "progress", "t"
    config.stats_logger.fileroot = str(tmp_path)
    config.stats_logger.wandb.mode = "disabled"
    config.stats_logger.tensorboard.path = None
    progress_total.install()
    logger = StatsLogger(config, spec(puzzles=1000, batch=10))
    # AReaL's loggers do not propagate to the root logger that caplog listens on, and AReaL
    # replaces the logging manager as it goes: listen on the module's own logger object.
    areal_logger = stats_logger_module.logger
    areal_logger.addHandler(caplog.handler)
    try:
        logger.commit(epoch=0, step=0, global_step=0, data={"reward": 0.5})
    finally:
        areal_logger.removeHandler(caplog.handler)
        logger.close()
    assert "Train step 1/3 done" in caplog.text  # AReaL alone: 1/100, the epoch's length
