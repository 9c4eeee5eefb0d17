"""plot.py: TensorBoard event files in, a CSV and a PNG out."""

import csv

import pytest
from tensorboardX import SummaryWriter

import plot


def test_plot_writes_csv_and_png(tmp_path):
    run = tmp_path / "run"
    with SummaryWriter(str(run / "logs")) as writer:
        for step in range(4):
            writer.add_scalar("rollout/reward", 0.1 * step, step)
            writer.add_scalar("rollout/success", 0.05 * step, step)
            if step % 2 == 0:
                writer.add_scalar("eval-rollout/success", 0.2 * step, step)
    assert plot.main([str(run)]) == 0

    with open(run / "curves.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["step", "eval-rollout/success", "rollout/reward", "rollout/success"]
    assert [r[0] for r in rows[1:]] == ["0", "1", "2", "3"]
    assert float(rows[3][2]) == pytest.approx(0.2)
    assert rows[2][1] == ""  # no eval at step 1
    assert (run / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_event_files_exits_2(tmp_path, capsys):
    assert plot.main([str(tmp_path)]) == 2
    assert "no TensorBoard event files" in capsys.readouterr().err
