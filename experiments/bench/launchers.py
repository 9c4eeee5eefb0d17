"""Seconds a GRPO step under each launcher: the README's training command, side by side.

    python3 -m experiments.bench.launchers --steps 10 --launchers single local --repeats 2 [-- OVERRIDES]

AReaL's single controller (`scheduler.type=local`, the README's first command) runs the rollout
client and the workflow in a rollout worker of their own. AReaL's SPMD local launcher
(`python3 -m areal.infra.launcher.local`, the path of every time-to-accuracy row) runs them in a
thread of the trainer's process, where their Python shares the interpreter with the update.
Which is faster on one machine is what this measures: it runs the demo (`devkit/demo.py
--quick`: the README's command for that launcher with the CPU settings, a model with random
weights, then the OVERRIDES) once per launcher, in turn, `--repeats` times, and prints a line per
run of AReaL's own timings (`timeperf/*`) in plot.py's step table. The overrides put it on a GPU
(the command of docs/results/launch-paths.md). Nothing is learnt with random weights: steps, not
accuracy.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import plot
from devkit import ROOT
from experiments.time_to_accuracy import areal_step_split


def run_demo(launcher: str, steps: int, run_dir: Path, overrides: list[str]) -> dict:
    """One demo run under `launcher`; seconds a step and AReaL's timed parts, from its second step."""
    command = [sys.executable, "-m", "devkit.demo", "--quick", "--steps", str(steps), "--launcher", launcher,
               "--run-dir", str(run_dir), *overrides]  # fmt: skip
    print(f"[launchers] {launcher}: {' '.join(command[1:])}", flush=True)
    subprocess.run(command, cwd=ROOT, check=True)
    return areal_step_split(plot.read_run(run_dir / "logs" / "tensorboard"), skip_first_step=True)


def table(runs: list[tuple[str, int, dict]]) -> str:
    """plot.py's table of where a step's time goes, a line per run ("other": the step less every timed part)."""
    return plot.step_table([{"row": launcher, "variant": f"run {repeat}", "seconds_per_step": split}
                            for launcher, repeat, split in runs])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="GRPO steps a run (the first, with start-up, "
                        "is not timed: at least 3)")
    parser.add_argument("--launchers", nargs="+", default=["single", "local"], choices=["single", "local"])
    parser.add_argument("--repeats", type=int, default=1, help="rounds of one run per launcher, in turn")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_launchers", help="the runs' folders")
    parser.add_argument("overrides", nargs="*", help="key=value for train.py, after the demo's (after `--`)")
    args = parser.parse_args(argv)
    if args.steps < 3:
        parser.error("--steps: at least 3 (the first step is not timed, and a split needs two more)")
    rows = []
    for repeat in range(1, args.repeats + 1):
        for launcher in args.launchers:
            rows.append((launcher, repeat, run_demo(launcher, args.steps, args.out / f"{launcher}_{repeat}",
                                                    args.overrides)))
    print(table(rows))


if __name__ == "__main__":
    try:
        main()
    except subprocess.CalledProcessError as failed:  # the demo has said why, above
        sys.exit(f"[launchers] stopped: {' '.join(failed.cmd[1:6])} ... exited {failed.returncode}")
