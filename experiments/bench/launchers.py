"""Seconds a GRPO step under each launcher: the README's training command, side by side.

    python3 -m experiments.bench.launchers --steps 10 --launchers single local --repeats 2 [-- OVERRIDES]

AReaL's single controller (`scheduler.type=local`, the README's first command) runs the rollout
client and the workflow in a rollout worker of their own. AReaL's SPMD local launcher
(`python3 -m areal.infra.launcher.local`, the path of every time-to-accuracy row) runs them in a
thread of the trainer's process, where their Python shares the interpreter with the update.
Which is faster on one machine is what this measures: it runs the demo (`devkit/demo.py
--quick`: the README's command for that launcher with the CPU settings, a model with random
weights, then the OVERRIDES) once per launcher, in turn, `--repeats` times, and prints one row per
run from AReaL's own timings (`timeperf/*`). The overrides put it on a GPU: the commands of
docs/results/time-to-accuracy.md. Nothing is learnt with random weights: steps, not accuracy.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import plot
from devkit import ROOT
from experiments.time_to_accuracy import areal_step_split

PARTS = ["rollout", "recompute_logp", "compute_advantage", "train_step", "update_weights", "eval"]  # timeperf/*
HEADS = ["waited for rollouts", "proximal log-probs", "advantages", "train step", "weight push", "evaluation"]


def run_demo(launcher: str, steps: int, run_dir: Path, overrides: list[str]) -> dict:
    """One demo run under `launcher`; seconds a step and AReaL's timed parts, from its second step."""
    command = [sys.executable, "-m", "devkit.demo", "--quick", "--steps", str(steps), "--launcher", launcher,
               "--run-dir", str(run_dir), *overrides]  # fmt: skip
    print(f"[launchers] {launcher}: {' '.join(command[1:])}", flush=True)
    subprocess.run(command, cwd=ROOT, check=True)
    return areal_step_split(plot.read_run(run_dir / "logs" / "tensorboard"), skip_first_step=True)


def row(launcher: str, repeat: int, split: dict) -> str:
    parts = [split.get(name, 0.0) for name in PARTS]
    other = split["step"] - sum(parts)
    cells = [launcher, str(repeat), f"{split['step']:.3f}", f"{60 / split['step']:.1f}",
             *(f"{p:.3f}" for p in parts), f"{other:.3f}"]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


def table(rows: list[tuple[str, int, dict]]) -> str:
    heads = ["launcher", "run", "s a step", "steps a minute", *HEADS, "other"]
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    return "\n".join(lines + [row(*r) for r in rows])


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
    main()
