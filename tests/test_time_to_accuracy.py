"""experiments/time_to_accuracy.py on CPU, with the project's tiny model.

Real: row C runs TRL's GRPOTrainer for real (its generation, reward calls, loss and optimizer
steps, the held-out callback's model.generate and scoring, the stop at --seconds), and row A
runs experiments/learning_run.py's grpo phase for real (the dev server, train.py under torchrun,
AReaL's evaluations every --eval-seconds, the stop --seconds after the first rollout,
evaluate.py before and after). Not real: the model (1.4M parameters, random weights: it
solves nothing, so every pass@1 is 0 and no group has a reward spread, hence
--no-skip-uniform-groups for row A), the sizes (a handful of puzzles, 16-24 new tokens), the
device and the time (an 8 s clock, not 450 s). The GPU rows are run by the commands in
docs/results/time-to-accuracy.md. The TensorBoard arithmetic is checked on event files written here.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tensorboardX import SummaryWriter

from devkit import ROOT
import plot
from experiments import time_to_accuracy as tta

TOY = ["--device", "cpu", "--dtype", "float32", "--preset", "tiny", "--train-size", "300", "--test-size", "8",
       "--batch", "4", "--n-samples", "2"]  # fmt: skip


def run_row(row: str, model: Path, tmp_path: Path, *args: str, name: str) -> dict:
    """Run one row at toy size; its record, read from OUT/`name`.json."""
    cmd = [sys.executable, "-m", "experiments.time_to_accuracy", "--row", row, "--init", str(model),
           "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work"), *TOY, *args]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((tmp_path / "out" / f"{name}.json").read_text())


def check_common_fields(record: dict, row: str, seconds: float) -> None:
    assert record["row"] == row and record["device"] == "cpu" and record["date"]
    assert record["command"].startswith(f"python3 -m experiments.time_to_accuracy --row {row}")
    assert record["points"][0] == {"seconds": 0.0, "step": 0, "pass@1": 0.0}  # the warm start, before training
    assert len(record["points"]) >= 2, record["points"]  # at least one evaluation during training
    times = [p["seconds"] for p in record["points"]]
    assert times == sorted(times) and times[-1] < record["final"]["seconds"]
    assert all(0.0 <= p["pass@1"] <= 1.0 for p in record["points"])
    assert set(record["final"]["pass@1"]) == {"all", "3 numbers", "4 numbers"}
    assert all(0.0 <= v <= 1.0 for v in record["final"]["pass@1"].values())
    assert record["steps"] >= 1 and record["steps_per_minute"] > 0
    assert seconds <= record["training_seconds"] < seconds + 20  # stopped by the clock, at a step's end
    assert record["seconds_per_step"]["step"] > 0


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_row_c_trains_with_trl_evaluates_and_stops_on_the_clock(tiny_model_dir, tmp_path):
    record = run_row("C", tiny_model_dir, tmp_path, "--seconds", "8", "--eval-seconds", "2", "--max-new-tokens",
                     "16", "--train-max-new-tokens", "16", "--trl-eval-batch", "4", "--set", "seed=7",
                     name="row_C_seed7")  # fmt: skip
    check_common_fields(record, "C", 8)
    assert record["framework"] == "TRL 1.16.0"
    assert record["optimizer_steps"] == 2 * record["steps"]  # two minibatches per batch, as AReaL's
    assert {"rollout", "update", "eval"} <= set(record["seconds_per_step"])
    trl = record["settings"]["trl"]
    assert (trl["learning_rate"], trl["num_generations"], trl["max_completion_length"]) == (1e-5, 2, 16)
    assert (trl["generation_batch_size"], trl["steps_per_generation"], trl["per_device_train_batch_size"]) == (8, 2, 4)
    assert (trl["beta"], trl["epsilon"], trl["loss_type"], trl["scale_rewards"]) == (0.0, 0.2, "dapo", "group")
    assert (trl["warmup_steps"], trl["weight_decay"], trl["max_grad_norm"], trl["seed"]) == (6, 0.01, 1.0, 7)
    assert record["settings"]["learning_run"]["grpo_lr"] == 1e-5
    assert record["settings"]["areal_knobs"]["actor.optimizer.lr"] == 1e-5
    assert {"schedule", "dynamic sampling", "advantages", "loss aggregation", "KL"} <= set(record["differences"])
    assert any("rewards/countdown_reward/mean" in entry for entry in record["log_history"])


@pytest.mark.timeout(180)
def test_trl_micro_batches_leave_the_optimizer_step_alone(tiny_model_dir, tmp_path, monkeypatch):
    """--trl-micro-batches 2 (TRL's gradient accumulation, for a GPU that cannot hold a minibatch's
    logits) gives the first optimizer step the gradient norm of one micro-batch a minibatch.
    The tiny model solves nothing, so the Countdown reward has no spread; a reward on the completion's
    length gives TRL advantages to step on (the one stand-in here)."""
    from transformers import AutoTokenizer

    from experiments import learning_run, trl_row

    monkeypatch.setattr(trl_row, "countdown_reward", lambda completions, **_: [len(c[-1]["content"]) % 5 / 4.0
                                                                               for c in completions])
    _, lr_args = tta.parse_args(["--row", "C", "--init", str(tiny_model_dir), "--out", str(tmp_path), "--work",
                                 str(tmp_path / "work"), *TOY, "--train-max-new-tokens", "12", "--set", "seed=3"])
    data = learning_run.make_data(lr_args)
    knobs = trl_row.areal_knobs(lr_args, tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir, local_files_only=True)
    firsts = []
    for micro_batches in (1, 2):
        config = trl_row.trl_config(lr_args, knobs, tmp_path / f"trl_{micro_batches}", micro_batches)
        assert (config.generation_batch_size, trl_row.optimizer_steps_per_batch(config)) == (8, 2)
        assert config.per_device_train_batch_size == 4 // micro_batches
        config.max_steps, config.logging_steps = 1, 1
        trainer = trl_row.make_trainer(tiny_model_dir, config, data, tokenizer, [])
        trainer.train()
        assert trainer.state.global_step == 1
        firsts.append(trainer.state.log_history[0])
    whole, split = firsts
    assert whole["grad_norm"] > 0 and whole["reward_std"] > 0  # a step with a signal
    assert split["grad_norm"] == pytest.approx(whole["grad_norm"], rel=1e-4)
    with pytest.raises(ValueError, match="must split evenly; pick a divisor of 4"):
        trl_row.trl_config(lr_args, knobs, tmp_path / "trl_3", 3)


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_row_a_runs_learning_runs_grpo_phase_and_stops_on_the_clock(tiny_model_dir, tmp_path):
    earlier_run = "".join(f"2026-12-01 20:40:{2 * i:02d},000 dev_server[6] INFO generation paused (mode=abort)\n"
                          f"2026-12-01 20:40:{2 * i + 1:02d},000 dev_server[6] INFO generation continued (0 queued)\n"
                          for i in range(20))  # fmt: skip
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "server.log").write_text(earlier_run)  # the dev server appends: the row must not count it
    record = run_row("A", tiny_model_dir, tmp_path, "--seconds", "8", "--eval-seconds", "2",
                     "--max-new-tokens", "24", "--train-max-new-tokens", "24", "--no-skip-uniform-groups",
                     "--set", "seed=9137", name="row_A_seed9137")  # fmt: skip
    check_common_fields(record, "A", 8)
    assert record["framework"] == "AReaL 1.0.4"
    assert {"rollout", "train_step", "update_weights", "eval"} <= set(record["seconds_per_step"])
    areal = record["settings"]["areal"]
    assert areal["evaluator"]["freq_secs"] == 2 and areal["evaluator"]["freq_steps"] is None
    assert areal["eval_gconfig"]["greedy"] and areal["eval_gconfig"]["max_new_tokens"] == 24
    assert areal["rollout"]["max_head_offpolicyness"] == 2  # asynchronous, as shipped
    assert record["settings"]["learning_run"]["decoder"] == "hf"
    server = record["server"]  # from the run's server.log and train.log
    assert record["steps"] - 1 <= server["pushes"] <= record["steps"]  # a pause and a load per push
    assert server["load_median_s"] > 0 and server["client_load_wait_median_s"] >= server["load_median_s"]
    assert server["output_tokens"] > 0 and 0 < server["busy_share"] <= 1 and server["batches"] >= 1
    for name in ("train.log", "server.log", "eval_after.md"):
        assert (tmp_path / "out" / "row_A_seed9137" / name).stat().st_size > 0


def test_rows_b_and_d_each_change_one_setting_of_row_a(tmp_path, capsys):
    common = ["--init", str(tmp_path), "--out", str(tmp_path)]
    rows = {row: vars(tta.parse_args(["--row", row, *common])[1]) for row in "ABCD"}
    assert rows["A"]["decoder"] == "hf" and rows["A"]["set"] == []
    assert rows["B"] == {**rows["A"], "set": ["rollout.max_head_offpolicyness=0"], "work": rows["B"]["work"]}
    assert rows["D"] == {**rows["A"], "decoder": "static", "work": rows["D"]["work"]}
    assert rows["C"]["set"] == [] and rows["A"]["eval_seconds"] == 60
    assert rows["A"]["grpo_seconds"] == 450 + tta.STARTUP_ALLOWANCE_S  # Deadline stops it at 450 s
    assert tta.parse_args(["--row", "C", *common, "--set", "seed=3"])[1].set == ["seed=3"]  # TRL's seed
    with pytest.raises(SystemExit):
        tta.parse_args(["--row", "C", *common, "--set", "seed=3", "--set", "rollout.max_concurrent_rollouts=8"])
    assert "--set rollout.max_concurrent_rollouts=8 would not apply" in capsys.readouterr().err
    mapped = ["--set", "actor.gradient_checkpointing=true"]  # a setting TRL takes over (trl_row.KNOBS)
    assert tta.parse_args(["--row", "C", *common, *mapped])[1].set == ["actor.gradient_checkpointing=true"]


def test_a_seed_other_than_the_configs_gets_its_own_row_file(tmp_path):
    common = ["--init", str(tmp_path), "--out", str(tmp_path)]
    runs = [("A", []), ("D", ["--set", "seed=1"]), ("D", ["--set", "seed=3"]), ("C", ["--set", "seed=2"])]
    names = [tta.row_file_stem(row, tta.parse_args(["--row", row, *common, *extra])[1]) for row, extra in runs]
    assert names == ["row_A", "row_D", "row_D_seed3", "row_C_seed2"]


def test_a_row_without_its_warm_start_stops_before_making_anything(tmp_path):
    for row in "AC":
        cmd = [sys.executable, "-m", "experiments.time_to_accuracy", "--row", row, "--init", str(tmp_path / "nowhere"),
               "--out", str(tmp_path / "out"), "--work", str(tmp_path / row)]  # fmt: skip
        run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert run.returncode == 1
        assert "no warm-started model at " in run.stderr and "nowhere: run the sft phase first, or pass --init" in run.stderr
        assert not (tmp_path / row).exists() and not (tmp_path / "out").exists()  # no data, no empty folders


def write_steps(folder: Path, steps: dict[int, tuple[float, dict[str, float]]]) -> None:
    """Event files as AReaL's StatsLogger writes them: {step: (wall time, {tag: value})}."""
    with SummaryWriter(str(folder)) as writer:
        for step, (wall_time, row) in steps.items():
            for tag, value in row.items():
                writer.add_scalar(tag, value, step, walltime=wall_time)


def test_first_rollout_and_points_count_back_the_timed_sections(tmp_path):
    sections = {"timeperf/rollout": 3.0, "timeperf/train_step": 1.5, "timeperf/update_weights": 0.5}
    write_steps(tmp_path, {
        0: (1000.0, {**sections, "timeperf/eval": 0.0}),
        1: (1004.0, {**sections, "timeperf/eval": 1.0, "eval-rollout/success": 0.25}),
    })  # fmt: skip
    run = plot.read_run(tmp_path)
    start = tta.first_rollout(run)
    assert start == pytest.approx(995.0)  # the first commit less the first step's 5 s of sections
    assert tta.areal_points(run, start) == [{"seconds": 8.0, "step": 2, "pass@1": 0.25}]  # 1004 - 1 s of eval
    assert tta.areal_step_split(run)["step"] == pytest.approx(4.0)


def test_the_split_can_leave_out_the_first_steps_start_up(tmp_path):
    write_steps(tmp_path, {
        0: (1000.0, {"timeperf/rollout": 10.0, "timeperf/train_step": 0.5}),  # the servers' start in its wait
        1: (1002.0, {"timeperf/rollout": 1.0, "timeperf/train_step": 0.5}),
        2: (1004.0, {"timeperf/rollout": 1.0, "timeperf/train_step": 0.7}),
    })  # fmt: skip
    run = plot.read_run(tmp_path)
    assert tta.areal_step_split(run) == pytest.approx({"step": 2.0, "rollout": 4.0, "train_step": 1.7 / 3})
    assert tta.areal_step_split(run, skip_first_step=True) == pytest.approx({"step": 2.0, "rollout": 1.0,
                                                                             "train_step": 0.6})


def test_first_rollout_waits_for_the_second_step(tmp_path):
    """Until a later step is on disk, the first step's sections may not all be."""
    write_steps(tmp_path, {0: (1000.0, {"timeperf/rollout": 3.0})})
    assert tta.first_rollout(plot.read_run(tmp_path)) is None
