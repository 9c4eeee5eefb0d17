"""devkit/launch/progress.py: what a run's output becomes on screen, and when the stall guard stops a
run; fed AReaL's own log lines (its StatsLogger's step line and stats table, as
areal.utils.printing.tabulate_stats prints them), with the clock set by the test."""

from __future__ import annotations

import threading

import pytest

from areal.utils.printing import tabulate_stats
from devkit.launch import progress
from devkit.launch.progress import StepWatch

GRPO_SHOWN = {"reward": ("rollout/reward", ".3f"), "held-out pass@1": ("eval-rollout/success", ".1%")}


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(progress.time, "monotonic", clock)
    return clock


def step_lines(step: int, total: int, stats: dict[str, float]) -> list[str]:
    """What AReaL's StatsLogger.commit logs for one step."""
    return [f"(AReaL) 20261204-02:01:12.365 StatsLogger INFO: Epoch 1/1 Step {step}/287 Train step {step}/{total} done.\n",
            "(AReaL) 20261204-02:01:12.366 StatsLogger INFO: Stats (1/1):\n",
            *(line + "\n" for line in tabulate_stats(stats).splitlines())]  # fmt: skip


def feed(watch: StepWatch, clock: Clock, seconds: float, *lines: str) -> None:
    clock.now += seconds
    for line in lines:
        watch.line(line)


def stats(reward: float, **more: float) -> dict[str, float]:
    return {"ppo_actor/update/n_tokens": 2659.0, "rollout/reward": reward, "rollout/success": 0.25,
            "timeperf/train_step": 1.5, **more}  # fmt: skip


def test_a_grpo_step_shows_its_reward_the_time_left_and_the_held_out_result_when_evaluated(clock, capsys):
    watch = StepWatch("grpo", GRPO_SHOWN)
    feed(watch, clock, 60, *step_lines(1, 50, stats(0.1)))
    feed(watch, clock, 8, *step_lines(2, 50, stats(0.2)))
    feed(watch, clock, 8, *step_lines(3, 50, stats(0.3, **{"eval-rollout/success": 0.256})))
    watch.finish()
    assert capsys.readouterr().out.splitlines() == [
        "[grpo] Train step 1/50 done: reward 0.100",
        "[grpo] Train step 2/50 done: reward 0.200, about 6 min left",  # 48 steps at 8 s
        "[grpo] Train step 3/50 done: reward 0.300, held-out pass@1 25.6%, about 6 min left",
        "[grpo] expected on this machine: about 8 min for all 50 steps (60 s to the first, start-up included, "
        "then 8.0 s a step)",
    ]


def test_other_lines_go_to_echo_progress_and_the_tables_do_not(clock, capsys):
    watch = StepWatch("grpo", GRPO_SHOWN)
    feed(watch, clock, 1, "[rank0]: Traceback (most recent call last):\n", "an ordinary line\n",
         *step_lines(1, 3, stats(0.5)), "RuntimeError: after the table\n")  # fmt: skip
    assert capsys.readouterr().out.splitlines() == [
        "[train] [rank0]: Traceback (most recent call last):",
        "[grpo] Train step 1/3 done: reward 0.500",
        "[train] RuntimeError: after the table",
    ]


def test_the_last_step_is_shown_when_the_run_ends_before_its_table_does(clock, capsys):
    watch = StepWatch("grpo", GRPO_SHOWN)
    feed(watch, clock, 1, *step_lines(1, 1, stats(0.5))[:4])
    assert capsys.readouterr().out == ""
    watch.finish()
    assert capsys.readouterr().out == "[grpo] Train step 1/1 done: reward 0.500\n"


def test_lines_thins_the_steps_to_about_that_many_lines(clock, capsys):
    watch = StepWatch("sft", lines=10, estimate_after=0)
    for step in range(1, 430):
        feed(watch, clock, 0.5, *step_lines(step, 429, {"loss": 1.0}))
    shown = [int(line.split()[3].split("/")[0]) for line in capsys.readouterr().out.splitlines()]
    assert shown == [1, 43, 86, 129, 172, 215, 258, 301, 344, 387, 429]


def test_the_stall_guard_stops_a_run_with_no_step_in_the_limit_and_shows_nothing_after(clock, capsys):
    watch, stop = StepWatch("grpo", GRPO_SHOWN, stall_limit=600), threading.Event()
    feed(watch, clock, 590, *step_lines(1, 50, stats(0.1)))  # the start counts as a step
    clock.now += 599
    guard = threading.Thread(target=watch.guard, args=(stop, 0.01))
    guard.start()
    assert not stop.wait(0.2) and watch.cause is None
    clock.now += 1
    assert stop.wait(5)
    guard.join(5)
    feed(watch, clock, 1, "[rank0]: Traceback (most recent call last):\n", *step_lines(2, 50, stats(0.2)))
    watch.finish()
    out = capsys.readouterr().out.splitlines()
    assert out == ["[grpo] Train step 1/50 done: reward 0.100",
                   "[demo] stopped: no step finished in 600 s, after step 1 of 50; stopping the run (what its "
                   "processes print about the stop goes to the log only)"]  # fmt: skip
    assert watch.cause == "no step finished in 600 s" and watch.last_step == 1


@pytest.mark.parametrize(
    "now, last_step, stall_limit, time_limit, cause",
    [
        (599, None, 600, None, None),  # the start counts as a step
        (600, None, 600, None, "no step finished in 600 s"),
        (1000, 500, 600, None, None),
        (1100, 500, 600, None, "no step finished in 600 s"),
        (5000, 4999, 600, 3000, "time limit (3000 s)"),
        (10**6, None, 0, None, None),  # 0: never
        (10**6, None, None, 0, None),
    ],
)
def test_stop_cause(now, last_step, stall_limit, time_limit, cause):
    assert progress.stop_cause(now, 0, last_step, stall_limit, time_limit) == cause


@pytest.mark.parametrize(
    "now, last_step, cause",
    [
        (299, None, None),  # the start waits the first step's limit, not the stall limit
        (300, None, "no step finished in 300 s"),
        (329, 300, None),  # after the first step, the stall limit
        (330, 300, "no step finished in 30 s"),
    ],
)
def test_the_first_step_may_have_a_limit_of_its_own(now, last_step, cause):
    assert progress.stop_cause(now, 0, last_step, 30, None, first_step_limit=300) == cause


@pytest.mark.parametrize("seconds, text", [(0.4, "0 s"), (89, "89 s"), (90, "2 min"), (3569, "59 min"),
                                           (3600, "1 h 00 min"), (3 * 3600 + 7 * 60, "3 h 07 min")])  # fmt: skip
def test_duration(seconds, text):
    assert progress.duration(seconds) == text
