"""The CPU demo's two modes without running them: which steps and settings each one takes,
the summary line, and the warm start's checkpoint; the runs themselves are in
test_launchers.py (`--quick`) and docs/results/cpu-demo.md (the default, which learns)."""

import shutil
from pathlib import Path

import pytest
from tensorboardX import SummaryWriter

from devkit.launch import training
from devkit import demo


class TrainingStarted(Exception):
    """Stands in for the training run: the test stops there."""


@pytest.fixture
def planned(monkeypatch, tmp_path):
    """main(argv) up to the GRPO run: the titles of the steps it ran, the seed it built a warm
    start with (None: none built), and the overrides it gave the training command."""
    plan = {"steps": [], "warm_start": None}

    def warm_start(run_dir, data_dir, model_dir, seed):
        plan["warm_start"] = seed
        return Path("/warm/start"), 0.25

    def run_user_command(launcher, run_dir, overrides, extra, stop, echo):
        plan["overrides"] = sum(overrides, [])
        raise TrainingStarted

    monkeypatch.setattr(demo, "run_step", lambda title, cmd: plan["steps"].append(title))
    monkeypatch.setattr(demo, "warm_start", warm_start)
    monkeypatch.setattr(demo, "run_user_command", run_user_command)

    def plan_of(*argv: str) -> dict:
        with pytest.raises(TrainingStarted):
            demo.main(["--run-dir", str(tmp_path / "demo"), *argv])
        return plan

    return plan_of


def test_the_default_demo_warm_starts_then_trains_with_the_learning_settings(planned):
    plan = planned()
    assert plan["warm_start"] == 1 and "seed=1" in plan["overrides"]
    overrides = plan["overrides"]
    assert f"total_train_steps={demo.GRPO_STEPS}" in overrides
    assert overrides[-len(demo.LEARN) - 2 : -2] == demo.LEARN  # after cpu_overrides
    assert overrides.index("actor.path=/warm/start") < overrides.index(demo.LEARN[0])


def test_quick_trains_the_random_model_for_three_steps_with_the_cpu_overrides_only(planned):
    plan = planned("--quick")
    assert plan["warm_start"] is None
    assert plan["steps"] == ["1/3 puzzles", "2/3 tiny model"]
    assert "total_train_steps=3" in plan["overrides"]
    after_cpu_overrides = plan["overrides"][plan["overrides"].index("recover.freq_steps=1") + 1 :]
    assert after_cpu_overrides == ["stats_logger.wandb.mode=disabled", "seed=1", "saver.freq_steps=3"]


def test_the_learning_run_saves_every_few_steps_so_that_a_stopped_run_has_a_model(planned):
    assert planned()["overrides"][-1] == f"saver.freq_steps={demo.SAVE_EVERY}" and demo.SAVE_EVERY < demo.GRPO_STEPS


def test_seed_reaches_the_warm_start_and_the_training(planned):
    plan = planned("--seed", "7")
    assert plan["warm_start"] == 7 and plan["overrides"][-2:] == ["seed=7", f"saver.freq_steps={demo.SAVE_EVERY}"]


def write_events(folder: Path, rows: dict[int, dict[str, float]]) -> Path:
    with SummaryWriter(str(folder / "exp" / "trial")) as writer:
        for step, row in rows.items():
            for tag, value in row.items():
                writer.add_scalar(tag, value, step)
    return folder


def test_summary_shows_held_out_pass_at_1_before_and_after(tmp_path):
    tb_dir = write_events(tmp_path, {
        step: {"rollout/reward": 0.5, "rollout/format_ok": 1.0, **({"eval-rollout/success": 0.2 + step / 100}
                                                                    if step % 10 == 9 else {})}
        for step in range(40)
    })  # fmt: skip
    line = demo.summary(tb_dir, 512.3, before=0.314)
    assert line.startswith("[demo] done in 512 s: 40 steps")
    assert f"held-out pass@1 31.4% -> 59.0% ({demo.HELD_OUT} puzzles, greedy)" in line


def test_summary_of_a_stopped_run_gives_its_cause_its_steps_and_its_last_saves_pass_at_1(tmp_path):
    tb_dir = write_events(tmp_path, {
        step: {"rollout/reward": 0.5, "rollout/format_ok": 1.0, **({"eval-rollout/success": 0.3} if step == 24 else {})}
        for step in range(44)
    })  # fmt: skip
    line = demo.summary(tb_dir, 1973.2, 0.174, demo.Stopped("no step finished in 600 s", 50, (40, 0.25)))
    assert line == ("[demo] stopped (no step finished in 600 s) after 1973 s: 44 of 50 steps, last reward 0.500, "
                    f"held-out pass@1 17.4% -> 25.0% (the step-40 save, {demo.HELD_OUT} puzzles, greedy), "
                    "format rate 1.000")  # fmt: skip
    no_save = demo.summary(tb_dir, 1973.2, 0.174, demo.Stopped("time limit (900 s)", 50, None))
    assert "stopped (time limit (900 s))" in no_save and "17.4% -> 30.0% (500 puzzles, greedy)" in no_save
    assert "eval pass@1 0.250 (the step-40 save)" in demo.summary(tb_dir, 60, None, demo.Stopped("x", 50, (40, 0.25)))


def test_summary_of_a_run_too_short_to_evaluate_says_so(tmp_path):
    tb_dir = write_events(tmp_path, {step: {"rollout/reward": 0.5} for step in range(3)})
    assert "held-out pass@1 31.4% -> n/a" in demo.summary(tb_dir, 60, before=0.314)
    assert "eval pass@1 n/a" in demo.summary(tb_dir, 60, before=None)


def saves(fileroot: Path, model: Path, *steps: int) -> Path:
    """Whole saves of `model` at these global steps, where the Saver puts them; their folder."""
    folder = fileroot / "checkpoints" / "root" / "countdown-sft" / "warmstart" / "default"
    for step in steps:
        shutil.copytree(model, folder / f"epoch0epochstep{step}globalstep{step}")
    return folder


def test_latest_checkpoint_is_the_highest_global_step_not_the_newest_or_last_name(tmp_path, tiny_model_dir):
    saves(tmp_path, tiny_model_dir, 10, 9)  # 9: newest, last by name
    assert training.latest_checkpoint(tmp_path, "countdown-sft").name == "epoch0epochstep10globalstep10"
    with pytest.raises(FileNotFoundError):
        training.latest_checkpoint(tmp_path, "countdown-grpo")


def cut_weights(folder: Path) -> None:
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


@pytest.mark.parametrize("cut", [cut_weights, lambda folder: (folder / "tokenizer.json").unlink(),
                                 lambda folder: (folder / "config.json").write_text('{"vocab')],
                         ids=["weights-half-written", "tokenizer-not-yet-written", "config-half-written"])  # fmt: skip
def test_latest_checkpoint_passes_over_a_save_cut_short(tmp_path, tiny_model_dir, cut):
    """A trainer stopped by its time limit can be stopped inside a save (a GPU learning run's
    step-215 save was): the newest folder then does not load, and the one before it is the model."""
    folder = saves(tmp_path, tiny_model_dir, 4, 9)
    cut(folder / "epoch0epochstep9globalstep9")
    assert training.latest_checkpoint(tmp_path, "countdown-sft").name == "epoch0epochstep4globalstep4"
    cut(folder / "epoch0epochstep4globalstep4")
    with pytest.raises(FileNotFoundError, match=r"no whole saved model .*\(2 cut short\)"):
        training.latest_checkpoint(tmp_path, "countdown-sft")


def test_the_evaluation_command_names_the_last_whole_save_or_fails_in_one_line(tmp_path, tiny_model_dir):
    """The demo's last line; with no whole save, a RuntimeError, which `__main__` prints as
    `[demo] failed: ...` (a FileNotFoundError gave a traceback)."""
    (tmp_path / "data").mkdir()
    folder = saves(tmp_path, tiny_model_dir, 49)
    command = demo.evaluate_command(tmp_path, "--max-new-tokens", "72")
    assert command[:4] == ["python3", "evaluate.py", "--model", str(folder / "epoch0epochstep49globalstep49")]
    assert command[-2:] == ["--max-new-tokens", "72"]
    cut_weights(folder / "epoch0epochstep49globalstep49")
    with pytest.raises(RuntimeError, match=r"no trained model to evaluate: no whole saved model .*\(1 cut short\); see .*train\.log"):
        demo.evaluate_command(tmp_path)


def test_the_trainers_own_error_lines_are_echoed_whole(capsys):
    """A bad-input line of train.py or sft.py is the first real error: shown whole, not cut to 160."""
    why = "x" * 300
    for line in [f"train.py: {why}\n", f"sft.py: retry_probability=2.0: {why}\n"]:
        training.echo_progress(line)
        assert capsys.readouterr().out == f"[train] {line}"
    training.echo_progress("some other Error " + why + "\n")
    assert capsys.readouterr().out == f"[train] {('some other Error ' + why)[-160:]}\n"
    training.echo_progress("an ordinary line\n")
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize("launcher", ["single", "local"])
def test_the_training_command_gives_each_key_once_with_the_value_that_won_before(launcher, tmp_path):
    """The README's command names placeholders (a 3B model, W&B online) that the CPU overrides
    replace, and the demo's settings replace some CPU overrides: only the last of each stays."""
    from devkit.launch.preflight import key_of_override, override_value, overrides_in

    _, *readme = training.user_command(launcher)
    groups = [readme, training.cpu_overrides(tmp_path, tmp_path / "model", tmp_path / "data", 50),
              ["stats_logger.wandb.mode=disabled", *demo.LEARN], training.launcher_overrides(launcher),
              ["actor.optimizer.lr=2e-4"]]  # fmt: skip
    once = training.each_key_once(groups)
    flat, kept = sum(groups, []), overrides_in(sum(once, []))
    keys = [key_of_override(o) for o in kept]
    assert len(keys) == len(set(keys)) == len({key_of_override(o) for o in overrides_in(flat)})
    assert all(override_value(kept, key) == override_value(flat, key) for key in keys)
    assert [arg for arg in once[0] if "=" not in arg] == [arg for arg in readme if "=" not in arg]
    assert "actor.path=Qwen/Qwen2.5-3B-Instruct" not in kept and "gconfig.n_samples=4" not in kept
    assert once[-1] == ["actor.optimizer.lr=2e-4"]
