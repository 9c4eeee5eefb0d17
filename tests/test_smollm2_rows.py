"""experiments/smollm2_rows.py: the commands it plans for each card, and how it runs them.

The GPU steps themselves cannot run here; the plan is checked against the option parsers of the
scripts it calls, and the runner with small stand-in commands."""

import sys
from pathlib import Path

import pytest

from experiments import learning_run, smollm2_rows, time_to_accuracy
from experiments.smollm2_rows import RowSpec, Step


def planned(memory_gib: float, rows: list[str], tmp_path: Path) -> dict[str, Step]:
    specs = [smollm2_rows.parse_row(text) for text in rows]
    return {step.name: step for step in smollm2_rows.plan(specs, 400, tmp_path / "w", tmp_path / "o", memory_gib)}


def script_args(step: Step) -> list[str]:
    """The arguments after `python3 -m MODULE`."""
    return step.command[3:]


def test_an_80_gb_card_gets_the_smaller_settings_and_an_h200_the_defaults(tmp_path):
    small = planned(79.2, ["D:1", "C:2"], tmp_path)
    assert "actor.mb_spec.max_tokens_per_mb=32768" in small["warm_start"].command
    assert "actor.mb_spec.max_tokens_per_mb=16384" in small["row_D_seed1"].command
    assert small["row_D_seed1"].env == {"DEV_SERVER_ARGS": "--max-batch 512"}
    assert small["row_C_seed2"].command[-2:] == ["--trl-micro-batches", "4"] and small["row_C_seed2"].env == {}
    large = planned(139.8, ["D:1", "C:2"], tmp_path)
    for step in large.values():
        assert not any("max_tokens_per_mb" in part or "micro-batches" in part for part in step.command), step.name
        assert step.env == {}


def test_every_planned_command_is_accepted_by_the_script_it_calls(tmp_path):
    steps = planned(79.2, ["D:1", "C:2", "D:2:3e-5"], tmp_path)
    sft = learning_run.parse_args(script_args(steps["warm_start"]))
    assert (sft.phase, sft.sft_lr, sft.train_size, sft.init) == ("sft", 1e-4, 60000, tmp_path / "w" / "model")
    args, lr_args = time_to_accuracy.parse_args(script_args(steps["row_D_seed2_lr3e-5"]))
    assert (args.row, args.seconds, lr_args.grpo_lr, learning_run.trainer_seed(lr_args)) == ("D", 400, 3e-5, 2)
    assert args.out == tmp_path / "o" / "lr3e-5"  # its row file cannot overwrite seed 2's at the default rate
    args, lr_args = time_to_accuracy.parse_args(script_args(steps["row_C_seed2"]))
    assert (args.row, args.trl_micro_batches, learning_run.trainer_seed(lr_args)) == ("C", 4, 2)


@pytest.mark.parametrize("text", ["D", "E:1", "D:one", "D:1:fast", "D:1:1e-5:9"])
def test_a_malformed_row_ends_with_one_line_that_shows_the_form(text, tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        smollm2_rows.main(["--work", str(tmp_path), "--out", str(tmp_path), "--rows", text,
                           "--dry-run", "--memory-gib", "80"])  # fmt: skip
    assert stop.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert repr(text) in error and "D:2:3e-5" in error


def test_a_kept_folder_is_not_made_again_and_a_failed_row_does_not_stop_the_next(tmp_path, capsys):
    made = tmp_path / "model" / "config.json"
    made.parent.mkdir()
    made.write_text("{}")
    python = sys.executable
    steps = [
        Step("folder", [python, "-c", "raise SystemExit('must not run')"], makes=made),
        Step("row_D_seed1", [python, "-c", "import sys; print('row D'); sys.exit(3)"]),
        Step("row_C_seed1", [python, "-c", "import os; print(os.environ['MARK'])"], {"MARK": "env reached"}),
    ]
    assert smollm2_rows.run_steps(steps, tmp_path) == 1
    assert not (tmp_path / "folder.log").exists()
    assert (tmp_path / "row_D_seed1.log").read_text() == "row D\n"
    assert (tmp_path / "row_C_seed1.log").read_text() == "env reached\n"
    assert "row_D_seed1: exit 3" in capsys.readouterr().out


def test_a_failed_warm_start_stops_the_rows(tmp_path):
    python = sys.executable
    steps = [
        Step("warm_start", [python, "-c", "raise SystemExit(1)"], makes=tmp_path / "warm_start" / "config.json"),
        Step("row_D_seed1", [python, "-c", f"open({str(tmp_path / 'ran')!r}, 'w')"]),
    ]
    assert smollm2_rows.run_steps(steps, tmp_path) == 1
    assert not (tmp_path / "row_D_seed1.log").exists() and not (tmp_path / "ran").exists()


def test_row_names_keep_seeds_and_learning_rates_apart():
    names = {RowSpec("D", 1).name, RowSpec("D", 2).name, RowSpec("D", 2, "3e-5").name, RowSpec("C", 2).name}
    assert len(names) == 4
