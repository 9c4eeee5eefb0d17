"""devkit/rollout_scalars_check: a step whose rollout scalars mix two sets of episodes is found.

The episodes are logged by train.py's `log_episode_stats` into AReaL's real `stats_tracker`,
and the CSV goes through `plot.write_csv`, as in a run; only the episodes are made up."""

from __future__ import annotations

import random

from areal.utils import stats_tracker

import train
from areal_patches.rollout_stats import merge_exports
from plot import write_csv
from devkit import rollout_scalars_check as check


def record_episodes(rng: random.Random, n: int, nums: int, p_solved: float) -> None:
    """n episodes of `nums`-number puzzles, logged by train.py's own `log_episode_stats`."""
    for _ in range(n):
        reward = float(rng.random() < p_solved)
        train.log_episode_stats({"nums": [1] * nums}, "", reward, rng.randint(60, 190), "stop")


def a_step_of_two_exports(merge) -> dict[str, float]:
    """A step's stats as PPOTrainer builds them under SPMD: the actor's export, then the rollout
    engine's, which holds the 3 episodes that finished in between."""
    rng = random.Random(0)
    stats_tracker.export_all()  # start from empty trackers
    record_episodes(rng, 170, nums=3, p_solved=0.6)
    record_episodes(rng, 160, nums=4, p_solved=0.2)
    actor_export = stats_tracker.export_all()
    record_episodes(rng, 3, nums=3, p_solved=1.0)
    return merge(actor_export, stats_tracker.export_all())


def areal_update(earlier: dict, later: dict) -> dict:
    return {**earlier, **later}


def write_curves(tmp_path, steps: dict[int, dict[str, float]]):
    scalars: dict[str, dict[int, float]] = {}
    for step, stats in steps.items():
        for key, value in stats.items():
            if not key.endswith("__count"):  # StatsLogger drops the counts, as here
                scalars.setdefault(key, {})[step] = value
    out = tmp_path / "curves.csv"
    write_csv(scalars, out)
    return out


def test_one_set_of_episodes_fits_and_a_mix_does_not(tmp_path):
    curves = write_curves(tmp_path, {
        1: a_step_of_two_exports(merge_exports),
        2: a_step_of_two_exports(areal_update),
    })
    assert check.mixed_steps(curves) == (2, [2])


def test_a_step_of_one_number_count_needs_its_success_to_match(tmp_path):
    whole = {"rollout/success": 0.5, "rollout/completion_len": 101.0, "rollout/success_3nums": 0.5}
    mixed = {**whole, "rollout/success": 1.0}
    curves = write_curves(tmp_path, {1: whole, 2: mixed})
    assert check.mixed_steps(curves) == (2, [2])


def test_a_file_without_the_scalars_is_named_and_exits_2(tmp_path, capsys):
    other = tmp_path / "eval.csv"
    other.write_text("step,eval-rollout/success\n1,0.5\n")
    assert check.main([str(other)]) == 2
    err = capsys.readouterr().err
    assert str(other) in err and "plot.py" in err
