"""experiments/bench/launchers.py: the README's command under the single controller and the SPMD
local launcher, one table. On CPU with the demo's tiny model (random weights), 3 steps a run."""

import pytest

from experiments.bench import launchers


def test_a_row_gives_steps_a_minute_and_the_untimed_rest():
    split = {"step": 2.0, "rollout": 1.0, "train_step": 0.5, "update_weights": 0.25, "save": 0.1}
    assert launchers.row("single", 1, split) == ("| single | 1 | 2.000 | 30.0 | 1.000 | 0.000 | 0.000 | 0.500 | 0.250 "
                                                 "| 0.000 | 0.250 |")  # the save is in the rest


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
    assert [r.split(" | ")[0] for r in rows] == ["| single", "| local"]
    for r in rows:
        cells = [c.strip() for c in r.strip("|").split("|")]
        seconds, per_minute, wait = float(cells[2]), float(cells[3]), float(cells[4])
        assert seconds > 0 and per_minute == pytest.approx(60 / seconds, abs=0.1) and wait >= 0
    assert (tmp_path / "single_1" / "logs" / "tensorboard").is_dir() and (tmp_path / "local_1").is_dir()
