"""Turn a training run's metrics into a CSV and a PNG, or compare time-to-accuracy rows.

    python3 plot.py TB_DIR [--out curves.png] [--before PASS_AT_1] [--config CONFIG_YAML]
    python3 plot.py --compare OUT/row_A.json OUT/row_C.json ... [--reference C] [--out time_to_accuracy.png]

TB_DIR is the folder of one run's TensorBoard event files, which AReaL's StatsLogger writes to
`<fileroot>/logs/tensorboard/<experiment>/<trial>`, or any folder above it that holds only
that run. Steps are numbered as the training log numbers them: step 1 is the first training
step (`Train step 1/N`), which AReaL logs to TensorBoard as step 0. `--config` is the run's
config.yaml (AReaL writes it to `<fileroot>/logs/<user>/<experiment>/<trial>/`): the legends
then say how each curve's completions were decoded, sampled at a temperature for training
and greedy for the held-out puzzles in this project's configs, which is why the training
success sits below the held-out one. The success-by-number-count panel is drawn only when
the run logged more than one number count.

`--compare` draws the rows written by experiments/time_to_accuracy.py in one panel: held-out
pass@1 against seconds of training since the first rollout, one line per row (its points,
then its final evaluation), with the row's steps per minute in the legend; rows of one letter
and seed (variants of a row, in folders of their own) are named by their folder. When the reference
row (`--reference`, C by default: TRL's) is among them, it also prints how soon each row
reaches the reference's final pass@1. Then it prints where each row's step goes: the mean
seconds of each timed part (AReaL's `timeperf/*`; TRL's generation, update and evaluation),
and for this example's rows what the dev server's log says of each weight push.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

if __name__ == "__main__":  # the wrong Python costs one line, not a traceback
    from devkit.launch import preflight

    preflight.require_modules("plot.py", ("matplotlib", "tensorboard"))

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
import yaml
from tensorboard.backend.event_processing import event_accumulator

Scalars = dict[str, dict[int, float]]  # {tag: {step: value}}

# (panel title, y-axis label, y-axis top or None for "fit the data", {metric: legend label}).
# Each metric is drawn twice: rollout/<metric> (training) and eval-rollout/<metric> (held-out).
PANELS = [
    ("reward", "mean reward", 1.0, {"reward": ""}),
    ("success", "fraction solved", 1.0, {"success": ""}),
    ("success by number count", "fraction solved", 1.0,
     {"success_3nums": "3 numbers", "success_4nums": "4 numbers", "success_2nums": "2 numbers"}),
    ("<think><answer> format", "fraction of completions", 1.0, {"format_ok": ""}),
    ("completion length", "tokens per completion", None, {"completion_len": ""}),
    ("cut at max_new_tokens", "fraction of completions", 1.0, {"truncated": ""}),
]  # fmt: skip
SOURCES = {"rollout": "training", "eval-rollout": "held-out"}
BY_NUMBER_COUNT = "success by number count"
# A panel's second metric differs in line style and marker too, so that equal values (all 0
# at the start of a run) leave both visible.
SERIES_STYLES = [dict(linestyle="-", marker="D"), dict(linestyle="--", marker="s"), dict(linestyle=":", marker="^")]
MIN_POINTS_TO_SMOOTH = 10


@dataclass
class Run:
    name: str  # "<experiment>/<trial>", from the event files' folder
    scalars: Scalars  # steps as AReaL logs them: 0 is the first training step
    start: float  # wall times of the first and last scalar, seconds since the epoch
    end: float
    times: dict[int, float]  # {step: wall time of its scalars}: when AReaL committed the step


def read_run(run_dir: Path) -> Run:
    folders = sorted({f.parent for f in run_dir.rglob("events.out.tfevents.*")})
    if not folders:
        raise FileNotFoundError(
            f"no TensorBoard event files under {run_dir}; point plot.py at the folder set "
            "as stats_logger.tensorboard.path"
        )
    names = [f"{folder.parent.name}/{folder.name}" for folder in folders]
    if len(folders) > 1:
        raise ValueError(f"several runs under {run_dir} ({', '.join(names)}); pick one")
    # 0 keeps every scalar (the default keeps a random 10,000 per tag). A resumed run appends
    # a new file; when its steps restart below the last logged one, the accumulator drops the
    # old run's later points, so each step keeps the value of the run that went on.
    events = event_accumulator.EventAccumulator(
        str(folders[0]), size_guidance={event_accumulator.SCALARS: 0}
    ).Reload()
    by_tag = {tag: events.Scalars(tag) for tag in events.Tags()["scalars"]}
    wall_times = [e.wall_time for es in by_tag.values() for e in es]
    times: dict[int, float] = {}
    for e in (e for es in by_tag.values() for e in es):
        times[e.step] = min(times.get(e.step, e.wall_time), e.wall_time)
    wall_times = wall_times or [events.FirstEventTimestamp()]
    return Run(
        name=names[0],
        scalars={tag: {e.step: e.value for e in es} for tag, es in by_tag.items()},
        start=min(wall_times),
        end=max(wall_times),
        times=times,
    )


def load_run(run_dir: Path) -> Scalars:
    """{tag: {step: value}} of the run under `run_dir`, steps as AReaL logs them (from 0)."""
    return read_run(run_dir).scalars


def by_training_step(scalars: Scalars) -> Scalars:
    """AReaL's step 0 becomes step 1, as in the training log's `Train step 1/N`."""
    return {tag: {step + 1: v for step, v in points.items()} for tag, points in scalars.items()}


def all_steps(scalars: Scalars) -> list[int]:
    return sorted({step for points in scalars.values() for step in points})


def title(run: Run, steps: list[int]) -> str:
    start, end = (datetime.fromtimestamp(t, timezone.utc) for t in (run.start, run.end))
    when = f"{start:%Y-%m-%d %H:%M}"
    until = f"{end:%H:%M}" if end.date() == start.date() else f"{end:%Y-%m-%d %H:%M}"
    if until != f"{start:%H:%M}":
        when += f" to {until}"
    span = f"training steps {steps[0]}-{steps[-1]}" if steps else "no steps logged"
    return f"{run.name}  ({span}, {when} UTC)"


def ema(values: list[float]) -> list[float]:
    """Exponential moving average over about 5% of the points (at least 5), debiased like
    TensorBoard's smoothing so that it starts at the first value instead of at 0."""
    weight = 1 - 2 / (max(5, len(values) // 20) + 1)
    smoothed, average, norm = [], 0.0, 0.0
    for value in values:
        average = weight * average + (1 - weight) * value
        norm = weight * norm + (1 - weight)
        smoothed.append(average / norm)
    return smoothed


def draw_series(
    ax: Axes, points: dict[int, float], label: str, style: dict, held_out: bool
) -> None:
    """Held-out points (few, every `evaluator.freq_steps`) as hollow markers on top, so that
    training points on the same values still show; training points faint when there are
    enough of them to draw their moving average instead."""
    steps, values = zip(*sorted(points.items()))
    line, marker = style["linestyle"], style["marker"]
    kw = dict(color=style["color"], clip_on=False)  # points at 0 or 1 drawn over the frame
    if held_out:
        ax.plot(steps, values, marker, markerfacecolor="none", markeredgewidth=2, markersize=8,
                label=label, zorder=5, **kw)  # fmt: skip
    elif len(values) >= MIN_POINTS_TO_SMOOTH:
        ax.plot(steps, values, "o", markersize=3, alpha=0.35, zorder=3, **kw)
        ax.plot(steps, ema(list(values)), line, linewidth=2, label=f"{label} (moving average)",
                zorder=4, **kw)  # fmt: skip
    else:
        ax.plot(steps, values, "o", linestyle=line, markersize=4, label=label, zorder=4, **kw)


def decoding(gconfig: Mapping) -> str:
    """How a generation config (AReaL's GenerationHyperparameters, as config.yaml holds it) decodes."""
    return "greedy" if gconfig.get("greedy") else f"sampled, T {gconfig.get('temperature', 1.0):g}"


def source_labels(config: Mapping | None) -> dict[str, str]:
    """SOURCES, with each one's decoding when the run's config is known."""
    if config is None:
        return dict(SOURCES)
    keys = {"rollout": "gconfig", "eval-rollout": "eval_gconfig"}
    return {prefix: f"{name} ({decoding(config[keys[prefix]])})" if keys[prefix] in config else name
            for prefix, name in SOURCES.items()}  # fmt: skip


def panels(scalars: Scalars) -> list[tuple]:
    """PANELS without the number-count panel when the run logged one number count or none:
    it would repeat the success panel."""
    counts = {tag.split("/", 1)[1] for tag in scalars if tag.split("/", 1)[-1].startswith("success_")}
    return [p for p in PANELS if p[0] != BY_NUMBER_COUNT or len(counts) > 1]


def figure(scalars: Scalars, suptitle: str, before: float | None = None, config: Mapping | None = None) -> Figure:
    """One panel per entry of `panels`; `scalars` numbered by training step (by_training_step).
    `before`: held-out pass@1 before training, a dotted line on the success panel. `config`:
    the run's config.yaml, for the legends' decoding (source_labels)."""
    fig = Figure(figsize=(14, 7.5), layout="constrained")
    axes = fig.subplots(2, 3, sharex=True)
    sources = source_labels(config)
    shown = panels(scalars)
    for ax in axes.flat[len(shown):]:
        above = axes.flat[list(axes.flat).index(ax) - 3]
        above.tick_params(labelbottom=True)
        above.set_xlabel("training step")
        ax.remove()
    for ax, (panel, ylabel, top, metrics) in zip(axes.flat, shown):
        for i, (metric, metric_label) in enumerate(metrics.items()):
            for j, (prefix, source) in enumerate(sources.items()):
                points = scalars.get(f"{prefix}/{metric}")
                if points:
                    label = f"{source}, {metric_label}" if metric_label else source
                    style = dict(color=f"C{2 * i + j}", **SERIES_STYLES[i])
                    draw_series(ax, points, label, style, held_out=prefix == "eval-rollout")
        if before is not None and panel == "success":
            label = f"held-out, before training ({before:.1%})"
            ax.axhline(before, color="C1", linestyle=":", linewidth=2, label=label)
        values = [v for line in ax.lines for v in line.get_ydata()]
        ax.set_ylim(0, top or (max([1.0, *values]) * 1.05))
        ax.set_title(panel, pad=10)  # clear of the markers on the frame at 1
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))
        if top is None:
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        if ax.lines:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "not logged in this run", ha="center", transform=ax.transAxes)
    for ax in axes[-1][: len(shown) - 3]:
        ax.set_xlabel("training step")
    fig.suptitle(suptitle)
    return fig


def read_config(path: Path) -> dict:
    """A run's config.yaml as AReaL wrote it; ValueError naming the file when it cannot be read."""
    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ValueError(f"cannot read the run's config {path}: {e}") from e
    if not isinstance(config, dict):
        raise ValueError(f"{path}: not a run's config.yaml (AReaL writes it under <fileroot>/logs/<user>/<experiment>/<trial>/)")
    return config


def write_csv(scalars: Scalars, out: Path) -> None:
    """One row per step, one column per metric. Values are float32 in the event files, so 7
    significant digits are all they hold."""
    tags = sorted(scalars)
    with out.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step", *tags])
        for step in all_steps(scalars):
            row = (f"{scalars[t][step]:.7g}" if step in scalars[t] else "" for t in tags)
            writer.writerow([step, *row])


def row_curve(row: dict) -> tuple[list[float], list[float]]:
    """A time-to-accuracy row's (seconds, held-out pass@1): its points, then its final evaluation."""
    points = [*row["points"], {"seconds": row["final"]["seconds"], "pass@1": row["final"]["pass@1"]["all"]}]
    return [p["seconds"] for p in points], [p["pass@1"] for p in points]


def row_seed(row: dict) -> int | None:
    """The training seed a row ran with (AReaL's `seed`, or TRL's for row C)."""
    return next((part["seed"] for part in row.get("settings", {}).values() if isinstance(part, dict) and "seed" in part), None)


def row_name(row: dict) -> str:
    """The row's letter, its seed, and the folder it came from when another row shares both."""
    seed = row_seed(row)
    name = row["row"] if seed is None else f"{row['row']} (seed {seed})"
    return f"{name} [{row['variant']}]" if "variant" in row else name


def tell_apart(rows: list[dict], paths: list[Path]) -> None:
    """Rows of one letter and seed (variants of a row, e.g. OUT/static/row_D.json beside
    OUT/row_D.json) are named by their file's folder."""
    names = [row_name(row) for row in rows]
    for row, path, name in zip(rows, paths, names):
        if names.count(name) > 1:
            row["variant"] = path.parent.name


def seconds_to_reach(row: dict, target: float) -> float | None:
    """Seconds until the row's held-out pass@1 first reaches ``target``, linear between its
    evaluations; None if it never does."""
    seconds, rates = row_curve(row)
    if rates[0] >= target:
        return seconds[0]
    for (s0, r0), (s1, r1) in zip(zip(seconds, rates), zip(seconds[1:], rates[1:])):
        if r1 >= target:
            return s0 + (s1 - s0) * (target - r0) / (r1 - r0)
    return None


def speedup_table(rows: list[dict], references: list[dict]) -> str:
    """How soon each row reaches the reference rows' final pass@1, against their whole run.

    The time-to-accuracy measure ("A reaches C's final held-out pass@1 in at most half of C's
    wall time"): the ratio is the reference's training seconds over the row's. With several
    runs of the reference row (seeds), the reference is their mean final pass@1 and mean
    training seconds, so that no single seed's luck sets the bar.
    """
    target = sum(row["final"]["pass@1"]["all"] for row in references) / len(references)
    whole = sum(row["final"]["seconds"] for row in references) / len(references)
    name = row_name(references[0]) if len(references) == 1 else f"{references[0]['row']} (mean of {len(references)} runs)"
    lines = [f"seconds to reach {name}'s final held-out pass@1 ({target:.1%}; {name} trained {whole:.0f} s):",
             "| row | steps/min | final pass@1 | seconds to reach | speed-up |", "|---|---|---|---|---|"]
    for row in rows:
        reached = seconds_to_reach(row, target)
        when, ratio = ("never", "-") if reached is None else (f"{reached:.0f}", f"{whole / max(reached, 1e-9):.2f}x")
        lines.append(f"| {row_name(row)} | {row['steps_per_minute']:.1f} | {row['final']['pass@1']['all']:.1%} "
                     f"| {when} | {ratio} |")
    return "\n".join(lines)


STEP_PARTS = (  # (column, the part's key in a row's seconds_per_step: AReaL's timeperf section or TRL's)
    ("rollouts: waited for (AReaL) / generated (TRL)", ("rollout",)),
    ("advantages", ("compute_advantage",)),
    ("train step (AReaL) / update (TRL)", ("train_step", "update")),
    ("weight push", ("update_weights",)),
    ("evaluation", ("eval",)),
)


def cell(value: float | None, spec: str) -> str:
    """A table cell: `value` formatted by `spec`, or "-" where a row has no such figure."""
    return "-" if value is None else format(value, spec)


def uniform_share(row: dict) -> float | None:
    """TRL's mean share of a step's groups whose completions all scored the same (its log's
    `frac_reward_zero_std`): it trains on them at zero advantage, where this example's rows,
    with dynamic sampling, sample other puzzles in their place. None for other rows."""
    shares = [entry["frac_reward_zero_std"] for entry in row.get("log_history", []) if "frac_reward_zero_std" in entry]
    return sum(shares) / len(shares) if shares else None


def step_table(rows: list[dict]) -> str:
    """Mean seconds a step and its parts, one line per row; "other" is the step less every timed
    part. For rows with a dev server (A, B, D): its median pause per push, the inference
    client's median wait for each load (inside the push), and the share of the run it was busy."""
    lines = ["where a step's time goes (seconds a step, mean):",
             f"| row | step | {' | '.join(name for name, _ in STEP_PARTS)} | other "
             "| server paused a push | of the push, the load | server busy | groups at zero advantage (TRL) |",
             "|---|" + "---|" * (len(STEP_PARTS) + 6)]  # fmt: skip
    for row in rows:
        split = row.get("seconds_per_step", {})
        parts = [next((split[key] for key in keys if key in split), None) for _, keys in STEP_PARTS]
        other = split["step"] - sum(v for k, v in split.items() if k != "step") if "step" in split else None
        server = row.get("server") or {}
        cells = [split.get("step"), *parts, other, server.get("paused_per_push_median_s"),
                 server.get("client_load_wait_median_s")]  # fmt: skip
        lines.append(f"| {row_name(row)} | {' | '.join(cell(value, '.2f') for value in cells)} "
                     f"| {cell(server.get('busy_share'), '.0%')} | {cell(uniform_share(row), '.0%')} |")
    return "\n".join(lines)


def compare_figure(rows: list[dict]) -> Figure:
    """Held-out pass@1 against seconds since the first rollout, one line per row. The y axis
    spans the rows' values (within 0..1), so that gaps of a few points stay visible."""
    fig = Figure(figsize=(9, 5.5), layout="constrained")
    ax = fig.subplots()
    longest, rates_drawn = 0.0, []
    for row in rows:
        seconds, rates = row_curve(row)
        label = f"{row_name(row)}: {row['description']} ({row['steps_per_minute']:.1f} steps/min)"
        ax.plot(seconds, rates, marker="o", label=label, clip_on=False)
        longest, rates_drawn = max(longest, *seconds), rates_drawn + rates
    ax.set_xlim(0, longest * 1.02)
    ax.set_ylim(max(0.0, min(rates_drawn) - 0.05), min(1.0, max(rates_drawn) + 0.05))
    ax.set_xlabel("seconds of training since the first rollout")
    ax.set_ylabel("held-out pass@1 (greedy)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    devices = sorted({row["device"] for row in rows})
    dates = sorted({row["date"][:10] for row in rows})
    fig.suptitle(f"Time to accuracy ({', '.join(devices)}; {', '.join(dates)})")
    return fig


ROW_FIELDS = ("row", "description", "device", "date", "steps_per_minute", "points", "final")


def read_row(path: Path) -> dict:
    """A row file of experiments/time_to_accuracy.py; ValueError naming the file when it cannot be
    read, is not JSON or lacks a field the figure and the table use."""
    try:
        row = json.loads(path.read_text())
    except OSError as e:
        raise ValueError(f"cannot read a row: {e}") from e
    except ValueError as e:
        raise ValueError(f"{path}: not a JSON row file ({e}); write it again with "
                         "python3 -m experiments.time_to_accuracy") from e  # fmt: skip
    missing = [field for field in ROW_FIELDS if not isinstance(row, dict) or field not in row]
    if missing:
        raise ValueError(f"{path}: not a row of experiments/time_to_accuracy.py (no {', '.join(missing)})")
    return row


def compare(row_files: list[Path], out: Path | None, reference: str = "C") -> int:
    try:
        rows = [read_row(path) for path in row_files]
    except ValueError as e:
        print(f"plot.py: {e}", file=sys.stderr)
        return 2
    tell_apart(rows, row_files)
    out = out or row_files[0].parent / "time_to_accuracy.png"
    compare_figure(rows).savefig(out, dpi=120)
    print(f"wrote {out} ({len(rows)} rows)")
    references = [row for row in rows if row["row"] == reference]
    if references:
        print(speedup_table(rows, references))
    print(step_table(rows))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, nargs="?", help="folder of one run's TensorBoard event files")
    parser.add_argument("--compare", type=Path, nargs="+", metavar="ROW_JSON",
                        help="row files of experiments/time_to_accuracy.py, drawn in one figure")
    parser.add_argument("--reference", default="C", metavar="ROW",
                        help="with --compare: the row whose final pass@1 the others race to (default %(default)s, TRL's)")
    parser.add_argument("--before", type=float, metavar="PASS_AT_1",
                        help="held-out pass@1 before training (e.g. the CPU demo's warm start), drawn as a line")
    parser.add_argument("--config", type=Path, metavar="CONFIG_YAML",
                        help="the run's config.yaml (under <fileroot>/logs/<user>/<experiment>/<trial>/): the "
                        "legends then say how training and held-out completions were decoded")
    parser.add_argument("--out", type=Path,
                        help="PNG path (default RUN_DIR/curves.png; with --compare, time_to_accuracy.png "
                        "beside the first row)")
    args = parser.parse_args(argv)
    if (args.run_dir is None) == (args.compare is None):
        parser.error("give TB_DIR, or --compare with row files, not both")
    if args.compare:
        return compare(args.compare, args.out, args.reference)
    try:
        run = read_run(args.run_dir)
        config = read_config(args.config) if args.config else None
    except (FileNotFoundError, ValueError) as e:
        print(f"plot.py: {e}", file=sys.stderr)
        return 2
    scalars = by_training_step(run.scalars)
    out = args.out or args.run_dir / "curves.png"
    write_csv(scalars, out.with_suffix(".csv"))
    figure(scalars, title(run, all_steps(scalars)), args.before, config).savefig(out, dpi=120)
    print(f"wrote {out} and {out.with_suffix('.csv')} ({len(scalars)} metrics)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
