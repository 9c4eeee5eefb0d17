"""experiments/bench/launchers.py: the README's command under the single controller and the SPMD
local launcher, one table. On CPU with the demo's tiny model (random weights), 3 steps a run."""

import pytest

from experiments.bench import launchers


def test_a_run_is_a_line_of_plots_step_table_with_the_untimed_rest():
    split = {"step": 2.0, "rollout": 1.0, "train_step": 0.5, "update_weights": 0.25, "save": 0.1}
    lines = launchers.table([("single", 1, split)]).splitlines()
    assert lines[-1] == "| single [run 1] | 2.00 | 1.00 | - | 0.50 | 0.25 | - | 0.15 | - | - | - | - |"  # save: other


def test_too_few_steps_are_refused_in_one_line(capsys):
    with pytest.raises(SystemExit):
        launchers.main(["--steps", "2"])
    assert "--steps: at least 3" in capsys.readouterr().err


@pytest.mark.e2e
@pytest.mark.launchers
@pytest.mark.timeout(900)
def test_both_launchers_run_and_each_gets_a_row(tmp_path, capsys):
    launchers.main(["--steps", "3", "--out", str(tmp_path)])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("| single", "| local"))]
    assert [r.split(" | ")[0] for r in rows] == ["| single [run 1]", "| local [run 1]"]
    for r in rows:
        cells = [c.strip() for c in r.strip("|").split("|")]
        seconds, wait, train = float(cells[1]), float(cells[2]), float(cells[4])
        assert seconds > 0 and wait >= 0 and 0 < train < seconds
    assert (tmp_path / "single_1" / "logs" / "tensorboard").is_dir() and (tmp_path / "local_1").is_dir()
