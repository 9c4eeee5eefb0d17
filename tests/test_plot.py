"""plot.py: TensorBoard event files (as AReaL writes them, with tensorboardX) in, a CSV and a
PNG out; and time-to-accuracy rows (as experiments/time_to_accuracy.py writes them) in one PNG."""

import csv
import json
import math
from datetime import datetime, timezone

import numpy as np
import pytest
from tensorboardX import SummaryWriter

import plot

RATE_TAGS = ["rollout/reward", "rollout/success", "rollout/success_3nums", "rollout/success_4nums",
             "rollout/format_ok", "rollout/truncated", "eval-rollout/success",
             "eval-rollout/success_3nums", "eval-rollout/success_4nums"]  # fmt: skip
WALL_TIME = datetime(2025, 3, 14, 9, 26, tzinfo=timezone.utc).timestamp()


def write_run(folder, values, suffix=""):
    """Event files as AReaL's StatsLogger writes them: values[step][tag], one minute a step."""
    with SummaryWriter(str(folder), filename_suffix=suffix) as writer:
        for step, row in values.items():
            for tag, value in row.items():
                writer.add_scalar(tag, value, step, walltime=WALL_TIME + 60 * step)


def zero_run(tmp_path, steps=3):
    """The CPU demo's picture: every rate 0 (a random model solves nothing) for 3 steps."""
    tb_dir = tmp_path / "logs" / "tensorboard"
    row = {**dict.fromkeys(RATE_TAGS, 0.0), "rollout/completion_len": 40.0}
    write_run(tb_dir / "countdown-cpu-demo" / "demo", dict.fromkeys(range(steps), row))
    return tb_dir


def figure_of(monkeypatch, tb_dir, *options):
    """Run the CLI and keep the Figure it saved."""
    figures, make_figure = [], plot.figure

    def keep(*args):
        figures.append(make_figure(*args))
        return figures[-1]

    monkeypatch.setattr(plot, "figure", keep)
    assert plot.main([str(tb_dir), *options]) == 0
    return figures[0]


def panel(fig, title):
    return next(ax for ax in fig.axes if ax.get_title() == title)


def test_plot_writes_csv_and_png(tmp_path):
    run = tmp_path / "run"
    values = {s: {"rollout/reward": 0.1 * s, "rollout/success": 0.05 * s} for s in range(4)}
    for step in (0, 2):
        values[step]["eval-rollout/success"] = 0.2 * step
    write_run(run / "logs", values)
    assert plot.main([str(run)]) == 0

    with open(run / "curves.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["step", "eval-rollout/success", "rollout/reward", "rollout/success"]
    assert [r[0] for r in rows[1:]] == ["1", "2", "3", "4"]  # AReaL's step 0 is training step 1
    assert float(rows[3][2]) == pytest.approx(0.2)
    assert rows[2][1] == ""  # no eval at training step 2
    assert (run / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_event_files_exits_2(tmp_path, capsys):
    assert plot.main([str(tmp_path)]) == 2
    assert "no TensorBoard event files" in capsys.readouterr().err


def test_plot_refuses_to_merge_two_runs(tmp_path, capsys):
    write_run(tmp_path / "exp" / "a", {0: {"rollout/reward": 0.5}})
    write_run(tmp_path / "exp" / "b", {0: {"rollout/reward": 0.7}})
    assert plot.main([str(tmp_path)]) == 2
    assert "several runs" in capsys.readouterr().err


def test_load_run_round_trips_values_at_the_logged_steps(tmp_path):
    values = {s: {"rollout/reward": 0.1 * s + 0.01, "timeperf/rollout": 12.5 * s} for s in range(9)}
    write_run(tmp_path / "exp" / "trial", values)
    scalars = plot.load_run(tmp_path)
    assert sorted(scalars) == ["rollout/reward", "timeperf/rollout"]
    for tag, points in scalars.items():
        assert points == pytest.approx({s: row[tag] for s, row in values.items()}, rel=1e-6)


def test_load_run_keeps_every_point_of_a_long_run(tmp_path):
    write_run(tmp_path, {step: {"rollout/reward": 0.5} for step in range(10_050)})
    assert sorted(plot.load_run(tmp_path)["rollout/reward"]) == list(range(10_050))


def test_resumed_run_takes_the_values_of_the_run_that_went_on(tmp_path):
    """A run killed after logging step 5 and resumed from its step-3 checkpoint logs steps 4-5
    again, into a second event file."""
    write_run(tmp_path, {step: {"rollout/reward": 0.0} for step in range(6)}, suffix=".1")
    write_run(tmp_path, {step: {"rollout/reward": 1.0} for step in range(4, 8)}, suffix=".2")
    rewards = plot.load_run(tmp_path)["rollout/reward"]
    assert rewards == {0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 1, 6: 1, 7: 1}


def test_every_panel_has_labelled_axes_and_integer_steps(tmp_path, monkeypatch):
    fig = figure_of(monkeypatch, zero_run(tmp_path))
    assert len(fig.axes) == len(plot.PANELS)
    for ax in fig.axes:
        assert ax.get_ylabel()
        ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
        assert ticks and all(t == int(t) for t in ticks)
    assert {ax.get_xlabel() for ax in fig.axes[-3:]} == {"training step"}


def test_rate_panels_span_0_to_1_even_when_every_value_is_0(tmp_path, monkeypatch):
    fig = figure_of(monkeypatch, zero_run(tmp_path))
    for title in ["reward", "success", "success by number count", "<think><answer> format",
                  "cut at max_new_tokens"]:
        assert panel(fig, title).get_ylim() == (0, 1)
    assert panel(fig, "completion length").get_ylim()[0] == 0


def test_before_is_a_line_on_the_success_panel_at_the_pass_at_1_it_gives(tmp_path, monkeypatch):
    fig = figure_of(monkeypatch, zero_run(tmp_path), "--before", "0.314")
    before = [line for line in panel(fig, "success").lines if "before training" in line.get_label()]
    assert len(before) == 1 and set(before[0].get_ydata()) == {0.314}
    assert "31.4%" in before[0].get_label()
    others = [line for ax in fig.axes if ax is not panel(fig, "success") for line in ax.lines]
    assert not any("before" in line.get_label() for line in others)


def test_without_before_no_panel_has_that_line(tmp_path, monkeypatch):
    fig = figure_of(monkeypatch, zero_run(tmp_path))
    assert not any("before" in line.get_label() for ax in fig.axes for line in ax.lines)


def test_title_names_the_run_and_its_date_not_the_folder(tmp_path, monkeypatch):
    fig = figure_of(monkeypatch, zero_run(tmp_path))
    title = fig.get_suptitle()
    assert "countdown-cpu-demo/demo" in title
    assert "2025-03-14 09:26 to 09:28 UTC" in title
    assert str(tmp_path) not in title


def test_csv_steps_are_the_steps_on_the_x_axis(tmp_path, monkeypatch):
    tb_dir = zero_run(tmp_path)
    fig = figure_of(monkeypatch, tb_dir)
    with open(tb_dir / "curves.csv", newline="") as f:
        csv_steps = [int(row["step"]) for row in csv.DictReader(f)]
    assert csv_steps == [1, 2, 3]
    for ax in fig.axes:
        for line in ax.lines:
            assert list(line.get_xdata()) == csv_steps


def test_noisy_metric_gets_a_smoothed_line_over_its_points(tmp_path, monkeypatch):
    noisy = {step: {"rollout/reward": 0.3 + 0.2 * math.sin(step * 2.0)} for step in range(30)}
    write_run(tmp_path / "exp" / "trial", noisy)
    raw, smoothed = panel(figure_of(monkeypatch, tmp_path), "reward").lines
    assert list(raw.get_xdata()) == list(smoothed.get_xdata()) == list(range(1, 31))
    assert smoothed.get_label() == "training (moving average)"
    assert np.ptp(smoothed.get_ydata()) < np.ptp(raw.get_ydata()) / 2
    assert min(raw.get_ydata()) <= min(smoothed.get_ydata())
    assert max(smoothed.get_ydata()) <= max(raw.get_ydata())


def row_file(tmp_path, row, points, final, steps_per_minute, settings=None, name=None):
    """A row as experiments/time_to_accuracy.py writes it (the fields plot.py reads), in row_X.json or ``name``."""
    record = {
        "row": row, "description": f"row {row}", "device": "NVIDIA H100 80GB HBM3", "date": "2026-11-25T10:00:00+00:00",
        "steps_per_minute": steps_per_minute,
        "points": [{"seconds": s, "step": i, "pass@1": v} for i, (s, v) in enumerate(points)],
        "final": {"seconds": final[0], "step": 99, "pass@1": {"all": final[1], "3 numbers": 0.6, "4 numbers": 0.3}},
    }  # fmt: skip
    if settings is not None:
        record["settings"] = settings
    path = tmp_path / (name or f"row_{row}.json")
    path.write_text(json.dumps(record))
    return path


def test_compare_draws_one_line_per_row_against_seconds(tmp_path, monkeypatch):
    rows = [row_file(tmp_path, "A", [(0.0, 0.35), (61.5, 0.40), (122.0, 0.45)], (450.0, 0.5), 15.24),
            row_file(tmp_path, "C", [(0.0, 0.35), (60.2, 0.37)], (451.0, 0.41), 6.0)]  # fmt: skip
    figures, make_figure = [], plot.compare_figure
    monkeypatch.setattr(plot, "compare_figure", lambda rows: figures.append(make_figure(rows)) or figures[-1])
    assert plot.main(["--compare", *map(str, rows), "--out", str(tmp_path / "tta.png")]) == 0
    assert (tmp_path / "tta.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    (ax,) = figures[0].axes
    assert ax.get_xlabel() == "seconds of training since the first rollout"
    assert ax.get_ylabel() == "held-out pass@1 (greedy)"
    assert ax.get_ylim() == pytest.approx((0.30, 0.55))  # the rows' range, 0.05 either side
    assert ax.get_xlim()[0] == 0 and ax.get_xlim()[1] >= 451
    assert len(ax.lines) == 2  # one per row: its points, then its final evaluation
    assert list(ax.lines[0].get_xdata()) == [0.0, 61.5, 122.0, 450.0]
    assert list(ax.lines[0].get_ydata()) == [0.35, 0.40, 0.45, 0.5]
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert labels == ["A: row A (15.2 steps/min)", "C: row C (6.0 steps/min)"]  # no settings: no seed
    assert "NVIDIA H100 80GB HBM3" in figures[0].get_suptitle() and "2026-11-25" in figures[0].get_suptitle()


def test_compare_names_the_seed_of_each_row(tmp_path):
    rows = []
    for name, settings in [("A", {"learning_run": {"decoder": "hf"}, "areal": {"seed": 1}}),
                           ("C", {"areal_knobs": {"seed": 1}, "trl": {"seed": 1}}), ("D", {"areal": {"seed": 2}})]:  # fmt: skip
        rows.append(json.loads(row_file(tmp_path, name, [(0.0, 0.0), (60.0, 1.0)], (450.0, 1.0), 10.0, settings).read_text()))
    ax = plot.compare_figure(rows).axes[0]
    assert [text.get_text().split(":")[0] for text in ax.get_legend().get_texts()] == ["A (seed 1)", "C (seed 1)", "D (seed 2)"]
    assert ax.get_ylim() == (0.0, 1.0)  # a rate's range is never left


def test_compare_writes_beside_the_first_row_by_default(tmp_path):
    row = row_file(tmp_path, "D", [(0.0, 0.35)], (450.0, 0.5), 20.0)
    assert plot.main(["--compare", str(row)]) == 0
    assert (tmp_path / "time_to_accuracy.png").stat().st_size > 0


def test_compare_with_an_unreadable_row_exits_2(tmp_path, capsys):
    assert plot.main(["--compare", str(tmp_path / "row_A.json")]) == 2
    assert "cannot read a row" in capsys.readouterr().err


def test_compare_names_a_row_file_that_is_cut_short_and_writes_nothing(tmp_path, capsys):
    good = row_file(tmp_path, "C", [(0.0, 0.35)], (400.0, 0.43), 8.0)
    cut = tmp_path / "row_A.json"
    cut.write_text(row_file(tmp_path, "A", [(0.0, 0.35)], (390.0, 0.45), 6.0).read_text()[:60])
    assert plot.main(["--compare", str(good), str(cut), "--out", str(tmp_path / "tta.png")]) == 2
    err = capsys.readouterr().err
    assert str(cut) in err and "not a JSON row file" in err and "experiments.time_to_accuracy" in err
    assert not (tmp_path / "tta.png").exists()


def test_compare_names_the_fields_a_row_lacks(tmp_path, capsys):
    other = tmp_path / "results.json"
    other.write_text(json.dumps({"row": "A", "points": []}))
    assert plot.main(["--compare", str(other), "--out", str(tmp_path / "tta.png")]) == 2
    err = capsys.readouterr().err
    assert f"{other}: not a row of experiments/time_to_accuracy.py" in err
    assert "description, device, date, steps_per_minute, final" in err


def test_a_run_folder_or_rows_but_not_both(tmp_path):
    for argv in ([], [str(tmp_path), "--compare", str(tmp_path / "row_A.json")]):
        with pytest.raises(SystemExit):
            plot.main(argv)


def test_seconds_to_reach_interpolates_between_evaluations(tmp_path):
    row = json.loads(row_file(tmp_path, "A", [(0.0, 0.30), (60.0, 0.40), (120.0, 0.50)], (400.0, 0.45), 6.0).read_text())
    assert plot.seconds_to_reach(row, 0.45) == pytest.approx(90.0)
    assert plot.seconds_to_reach(row, 0.30) == 0.0
    assert plot.seconds_to_reach(row, 0.51) is None


def test_compare_prints_how_soon_each_row_reaches_trls_final(tmp_path, capsys):
    rows = [row_file(tmp_path, "D", [(0.0, 0.35), (60.0, 0.40), (120.0, 0.46)], (390.0, 0.5), 10.6),
            row_file(tmp_path, "A", [(0.0, 0.35), (300.0, 0.37)], (390.0, 0.40), 6.2),
            row_file(tmp_path, "C", [(0.0, 0.35), (200.0, 0.44)], (390.0, 0.43), 7.7)]  # fmt: skip
    assert plot.main(["--compare", *map(str, rows), "--out", str(tmp_path / "tta.png")]) == 0
    out = capsys.readouterr().out
    assert "C's final held-out pass@1 (43.0%; C trained 390 s)" in out
    assert "| D | 10.6 | 50.0% | 90 | 4.33x |" in out  # 0.43 is reached half-way from 60 s to 120 s
    assert "| A | 6.2 | 40.0% | never | - |" in out
    assert "| C | 7.7 | 43.0% | 178 | 2.19x |" in out  # C itself first passed its final before the end


def test_with_several_runs_of_c_the_bar_is_their_mean(tmp_path, capsys):
    rows = [row_file(tmp_path, "C", [(0.0, 0.35), (300.0, 0.40)], final, 8.0, {"trl": {"seed": seed}}, f"row_C_seed{seed}.json")
            for seed, final in [(1, (380.0, 0.42)), (2, (400.0, 0.44))]]  # fmt: skip
    rows.append(row_file(tmp_path, "D", [(0.0, 0.35), (100.0, 0.41), (200.0, 0.45)], (390.0, 0.46), 10.5))
    assert plot.main(["--compare", *map(str, rows), "--out", str(tmp_path / "tta.png")]) == 0
    out = capsys.readouterr().out
    assert "C (mean of 2 runs)'s final held-out pass@1 (43.0%; C (mean of 2 runs) trained 390 s)" in out
    assert "| D | 10.5 | 46.0% | 150 | 2.60x |" in out  # 0.43 is reached half-way from 100 s to 200 s
    assert "| C (seed 1) | 8.0 | 42.0% | never | - |" in out


def test_compare_prints_where_each_rows_step_goes(tmp_path, capsys):
    paths = [row_file(tmp_path, "D", [(0.0, 0.3)], (400.0, 0.4), 9.8), row_file(tmp_path, "C", [(0.0, 0.3)], (400.0, 0.35), 6.8),
             row_file(tmp_path, "A", [(0.0, 0.3)], (400.0, 0.3), 5.0)]  # fmt: skip
    extra = {"D": {"seconds_per_step": {"step": 6.0, "rollout": 2.8, "compute_advantage": 0.2, "train_step": 1.5,
                                        "update_weights": 1.0, "eval": 0.4, "save": 0.05},
                   "server": {"paused_per_push_median_s": 0.31, "client_load_wait_median_s": 0.12, "busy_share": 0.64}},
             "C": {"seconds_per_step": {"step": 8.6, "rollout": 6.8, "update": 0.9, "eval": 0.9},
                   "log_history": [{"frac_reward_zero_std": 0.25}, {"loss": 0.1}, {"frac_reward_zero_std": 0.35}]},
             "A": {}}  # a row written before rows carried their parts  # fmt: skip
    for path in paths:
        record = json.loads(path.read_text())
        path.write_text(json.dumps({**record, **extra[record["row"]]}))
    assert plot.main(["--compare", *map(str, paths), "--out", str(tmp_path / "tta.png")]) == 0
    lines = capsys.readouterr().out.splitlines()
    table = lines[lines.index("where a step's time goes (seconds a step, mean):") + 1:]
    assert table[0].startswith("| row | step | rollouts") and table[0].count("|") == table[1].count("|")
    # D: "other" is the step less every timed part, the save included
    assert table[2] == "| D | 6.00 | 2.80 | 0.20 | 1.50 | 1.00 | 0.40 | 0.05 | 0.31 | 0.12 | 64% | - |"
    assert table[3] == "| C | 8.60 | 6.80 | - | 0.90 | - | 0.90 | 0.00 | - | - | - | 30% |"  # TRL's mean share
    assert table[4] == "| A | - | - | - | - | - | - | - | - | - | - | - |"


def test_variants_of_one_row_are_named_by_their_folder(tmp_path, capsys):
    (tmp_path / "static").mkdir()
    paths = [row_file(tmp_path, "D", [(0.0, 0.3)], (400.0, 0.40), 9.8),
             row_file(tmp_path / "static", "D", [(0.0, 0.3)], (400.0, 0.38), 8.1),
             row_file(tmp_path, "C", [(0.0, 0.3)], (400.0, 0.35), 6.8)]  # fmt: skip
    assert plot.main(["--compare", *map(str, paths), "--out", str(tmp_path / "tta.png")]) == 0
    out = capsys.readouterr().out
    assert f"| D [{tmp_path.name}] | 9.8 |" in out and "| D [static] | 8.1 |" in out
    assert "| C | 6.8 |" in out  # a row with no namesake keeps its name


def test_one_number_count_draws_no_panel_that_repeats_the_success_panel(tmp_path, monkeypatch):
    """The CPU demo's puzzles all have two numbers: success_2nums is success again."""
    tb_dir = tmp_path / "logs"
    row = {"rollout/success": 0.2, "rollout/success_2nums": 0.2, "eval-rollout/success": 0.3,
           "eval-rollout/success_2nums": 0.3, "rollout/reward": 0.1}  # fmt: skip
    write_run(tb_dir / "exp" / "trial", dict.fromkeys(range(3), row))
    fig = figure_of(monkeypatch, tb_dir)
    titles = [ax.get_title() for ax in fig.axes]
    assert plot.BY_NUMBER_COUNT not in titles and len(titles) == len(plot.PANELS) - 1
    # The panel above the freed place shows the steps.
    assert panel(fig, "reward").get_xlabel() == "" and fig.axes[2].get_xlabel() == "training step"
    assert [t.get_text() for t in fig.axes[2].get_xticklabels() if t.get_visible() and t.get_text()]
    with open(tb_dir / "curves.csv", newline="") as f:
        assert "rollout/success_2nums" in next(csv.reader(f))  # the CSV keeps every metric


def test_the_runs_config_puts_each_curves_decoding_in_its_legend(tmp_path, monkeypatch):
    """Training samples at a temperature and the held-out evaluation is greedy: why the training
    success sits below the held-out one, said where the curves are."""
    config = tmp_path / "config.yaml"
    config.write_text("gconfig:\n  greedy: false\n  temperature: 0.7\neval_gconfig:\n  greedy: true\n  temperature: 1.0\n")
    fig = figure_of(monkeypatch, zero_run(tmp_path), "--config", str(config), "--before", "0.2")
    labels = [line.get_label() for line in panel(fig, "success").lines if not line.get_label().startswith("_")]
    assert labels == ["training (sampled, T 0.7)", "held-out (greedy)", "held-out, before training (20.0%)"]
    assert "held-out (greedy), 3 numbers" in [line.get_label() for line in panel(fig, plot.BY_NUMBER_COUNT).lines]


def test_a_config_that_is_not_a_runs_yaml_exits_2(tmp_path, capsys):
    config = tmp_path / "config.yaml"
    config.write_text("- a list\n")
    assert plot.main([str(zero_run(tmp_path)), "--config", str(config)]) == 2
    assert "not a run's config.yaml" in capsys.readouterr().err
