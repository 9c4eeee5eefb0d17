"""areal_patches/rollout_stats: a step's rollout scalars average every episode they cover."""

from __future__ import annotations

import pytest
from areal.trainer.rl_trainer import PPOTrainer
from areal.utils import stats_tracker

import train
from areal_patches import rollout_stats


def test_a_scalar_in_both_exports_is_averaged_by_their_counts():
    earlier = {"rollout/success": 0.25, "rollout/success__count": 8, "ppo_actor/loss": 1.5}
    later = {"rollout/success": 1.0, "rollout/success__count": 1, "rollout/reward": 1.0,
             "rollout/reward__count": 1}
    merged = rollout_stats.merge_exports(earlier, later)
    assert merged["rollout/success"] == pytest.approx((0.25 * 8 + 1.0) / 9)
    assert merged["rollout/success__count"] == 9
    assert merged["rollout/reward"] == 1.0  # only in the later export: taken as it is
    assert merged["ppo_actor/loss"] == 1.5


def test_without_counts_the_later_export_wins_as_in_areal():
    """The single controller's rollout export has no counts (RolloutController averages them
    away) and covers other processes' episodes: AReaL's `update` stays right there."""
    earlier = {"rollout/success": 0.25, "rollout/success__count": 8}
    merged = rollout_stats.merge_exports(earlier, {"rollout/success": 0.5})
    assert merged == {"rollout/success": 0.5}


class TrackerExport:
    """Stands in for an engine under the SPMD launchers: FSDPEngine's and RemoteSGLangEngine's
    `export_stats` both return `stats_tracker.export_all()` of the trainer's process. A real
    engine needs a model and an inference server; what is tested is only how the two exports
    of one step are merged."""

    def __init__(self, finishing_meanwhile=()):
        self.finishing_meanwhile = finishing_meanwhile

    def export_stats(self):
        stats = stats_tracker.export_all()
        for solved, nums in self.finishing_meanwhile:  # episodes done before the next export
            record_episode(solved, nums)
        return stats


class CommittedStats:
    def commit(self, epoch, step, global_step, data):
        self.data = data


def record_episode(solved: bool, nums: int) -> None:
    """One episode of a `nums`-number puzzle, logged by train.py's own `log_episode_stats`."""
    train.log_episode_stats({"nums": [1] * nums}, "", float(solved), 100, "stop")


def test_a_step_logs_the_success_of_all_its_episodes(monkeypatch):
    monkeypatch.delenv("AREAL_SPMD_MODE", raising=False)  # no process group here: skip the barrier
    stats_tracker.export_all()  # start from empty trackers
    for solved, nums in [(True, 3), (True, 3), (False, 3), (False, 3)] + [(False, 4)] * 4:
        record_episode(solved, nums)
    trainer = PPOTrainer.__new__(PPOTrainer)
    trainer.actor = TrackerExport(finishing_meanwhile=[(True, 3)])
    trainer.rollout, trainer.eval_rollout = TrackerExport(), None
    trainer.stats_logger = CommittedStats()

    rollout_stats.install()
    trainer._export_and_commit_stats(epoch=0, epoch_step=0, global_step=0)

    logged = trainer.stats_logger.data
    assert logged["rollout/success"] == pytest.approx(3 / 9)  # AReaL alone: 1.0, the one late episode
    assert logged["rollout/success_3nums"] == pytest.approx(3 / 5)
    assert logged["rollout/success_4nums"] == 0.0
