"""Turn a training run's metrics into a CSV and a PNG.

    python3 plot.py RUN_DIR [--out curves.png]

RUN_DIR is any folder holding the TensorBoard event files that AReaL's StatsLogger writes
(`stats_logger.tensorboard.path`). The reader below parses the TFRecord framing itself, so
plotting needs neither TensorBoard nor TensorFlow, only the protobuf classes that ship with
tensorboardX.
"""

from __future__ import annotations

import argparse
import csv
import struct
import sys
from collections import defaultdict
from pathlib import Path

# (panel title, metric tags drawn on it); tags missing from a run are skipped.
PANELS = [
    ("reward (train rollouts)", ["rollout/reward"]),
    ("success rate", ["rollout/success", "eval-rollout/success"]),
    ("eval pass@1 by number count", ["eval-rollout/success_3nums", "eval-rollout/success_4nums"]),
    ("completion length (tokens)", ["rollout/completion_len", "eval-rollout/completion_len"]),
]


def read_event_scalars(path: Path) -> dict[str, dict[int, float]]:
    """{tag: {step: value}} from one TensorBoard event file (last value wins per step)."""
    from tensorboardX.proto import event_pb2

    scalars: dict[str, dict[int, float]] = defaultdict(dict)
    data = path.read_bytes()
    pos = 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        record = data[pos + 12 : pos + 12 + length]
        pos += 12 + length + 4
        if len(record) < length:
            break  # a file still being written ends mid-record
        event = event_pb2.Event.FromString(record)
        for value in event.summary.value:
            scalars[value.tag][event.step] = value.simple_value
    return scalars


def load_run(run_dir: Path) -> dict[str, dict[int, float]]:
    """Merge the scalars of every event file under `run_dir` (a resumed run writes several)."""
    files = sorted(run_dir.rglob("events.out.tfevents.*"))
    if not files:
        raise FileNotFoundError(
            f"no TensorBoard event files under {run_dir}; point plot.py at the folder set "
            "as stats_logger.tensorboard.path"
        )
    merged: dict[str, dict[int, float]] = defaultdict(dict)
    for f in files:
        for tag, points in read_event_scalars(f).items():
            merged[tag].update(points)
    return merged


def write_csv(scalars: dict[str, dict[int, float]], out: Path) -> None:
    """One row per step, one column per metric: easy to read in any tool."""
    tags = sorted(scalars)
    steps = sorted({s for points in scalars.values() for s in points})
    with out.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["step", *tags])
        for step in steps:
            writer.writerow([step, *(scalars[t].get(step, "") for t in tags)])


def plot(scalars: dict[str, dict[int, float]], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for ax, (panel, tags) in zip(axes.flat, PANELS):
        for tag in tags:
            points = sorted(scalars.get(tag, {}).items())
            if points:
                steps, values = zip(*points)
                ax.plot([s + 1 for s in steps], values, marker="o", markersize=3, label=tag)
        ax.set_title(panel)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="folder with TensorBoard event files")
    parser.add_argument("--out", type=Path, help="PNG path (default RUN_DIR/curves.png)")
    args = parser.parse_args(argv)
    try:
        scalars = load_run(args.run_dir)
    except FileNotFoundError as e:
        print(f"plot.py: {e}", file=sys.stderr)
        return 2
    out = args.out or args.run_dir / "curves.png"
    write_csv(scalars, out.with_suffix(".csv"))
    plot(scalars, out, title=str(args.run_dir))
    print(f"wrote {out} and {out.with_suffix('.csv')} ({len(scalars)} metrics)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
