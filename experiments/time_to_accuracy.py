"""Time to accuracy: held-out pass@1 against seconds of training, one row per GPU session.

    python3 -m experiments.time_to_accuracy --row A|B|C|D --init WARM_START --out OUT [--seconds 450]
        [--eval-seconds 60] [any experiments/learning_run.py option, e.g. --train-size 50000 or --set seed=2]

Row C takes only the `--set` overrides TRL maps (experiments/trl_row.py's KNOBS: `seed`, with it TRL's data
order, `actor.gradient_checkpointing`, ...).

Every row starts from the same warm start and trains on the same train and test files
(countdown.py, seed 0), with the same reward, prompt, group size, puzzles per step, learning
rate and max new tokens (experiments/learning_run.py's settings), on one GPU:

  A  this example, asynchronous (rollouts up to 2 versions ahead, as train_config.yaml ships),
     the dev server decoding with transformers (--decoder hf)
  B  A, synchronous (rollout.max_head_offpolicyness=0)
  C  TRL's GRPOTrainer, generating with its own model.generate (experiments/trl_row.py)
  D  A with the dev server's CUDA-graph decoder (--decoder static)

The clock starts at the first rollout; each row trains for --seconds of it. Held-out pass@1
(greedy, the test file's puzzles) is measured before training (evaluate.py for A, B and D,
experiments/trl_row.py's callback for C), about every --eval-seconds during training (AReaL's
evaluator.freq_secs; the callback for C) and at the end (evaluate.py on the weights the dev
server holds; the callback for C). Evaluations run on the clock, as they do in a real run; a
point is dated when its evaluation begins, and each row records its evaluations' total.

For A, B and D this is experiments/learning_run.py's grpo phase, with one addition: `Deadline`
stops the trainer --seconds after its first rollout, which it dates from the first step's
TensorBoard scalars (their wall time less the step's timed sections, timeperf/*). The
trainer's start-up (imports, model, data) is not on the clock.

Writes OUT/row_<X>.json: the row, its settings (every knob: learning_run's, and AReaL's
resolved config or TRL's GRPOConfig), device, date, steps, seconds per step and its parts
(for A, B and D also the dev server's pauses, loads, busy share and batches, from its log:
experiments/bench/pause_windows.py),
the (seconds, pass@1) points and the final pass@1 overall and by number count; for A, B and
D also the run's logs in OUT/row_<X>/. With --set seed=N other than train_config.yaml's, the
names are row_<X>_seed<N>.json and row_<X>_seed<N>/. `python3 plot.py --compare
OUT/row_*.json` draws the rows.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import yaml

import plot
from devkit import ROOT
from devkit.launch import preflight
from experiments import learning_run
from experiments.bench import pause_windows

POLL_S = 2.0  # how often Deadline looks for the first step's scalars
STARTUP_ALLOWANCE_S = 90  # A, B, D: the trainer's own limit is --seconds + this, should Deadline see no step


@dataclass
class Row:
    description: str
    learning_run_args: list[str]  # A, B, D: how the row's learning_run grpo phase differs


ROWS = {
    "A": Row("AReaL, asynchronous, dev server (transformers)", ["--decoder", "hf"]),
    "B": Row("AReaL, synchronous, dev server (transformers)",
             ["--decoder", "hf", "--set", "rollout.max_head_offpolicyness=0"]),
    "C": Row("TRL GRPOTrainer, model.generate", []),
    "D": Row("AReaL, asynchronous, dev server (CUDA graphs)", ["--decoder", "static"]),
}  # fmt: skip


def first_rollout(run: plot.Run) -> float | None:
    """Wall time at which the trainer's first rollout began, once its second step is logged.

    AReaL's training step is a sequence of timed sections (timeperf/*: rollout, advantages,
    train_step, update_weights, save, eval, ...) followed by the commit of the step's
    scalars; the first step's sections, counted back from its commit, give its start. A
    later step's scalars on disk mean all of the first step's are (events are written in order).
    """
    if len(run.times) < 2:
        return None
    sections = (points.get(0, 0.0) for tag, points in run.scalars.items() if tag.startswith("timeperf/"))
    return run.times[0] - sum(sections)


class Deadline:
    """Sets `stop` `seconds` after the trainer's first rollout, read from its TensorBoard files.

    experiments/learning_run.py's trainer ends when `stop` is set; it sets `stop` itself when the
    trainer ends first, which ends the watch.
    """

    def __init__(self, tb_dir: Path, seconds: float):
        self.tb_dir, self.seconds = tb_dir, seconds
        self.stop = threading.Event()
        self.stopped_at: float | None = None  # wall time at which the deadline stopped the trainer
        self.since = time.time()  # a run left in the folder by an earlier call began before this

    def watch(self) -> None:
        while not self.stop.wait(POLL_S):
            start = self.first_rollout()
            if start is not None:
                if not self.stop.wait(max(0.0, start + self.seconds - time.time())):
                    self.stopped_at = time.time()
                    self.stop.set()
                return

    def first_rollout(self) -> float | None:
        try:
            start = first_rollout(plot.read_run(self.tb_dir))
        except (FileNotFoundError, ValueError):  # not written yet
            return None
        return start if start is not None and start >= self.since else None


def areal_points(run: plot.Run, start: float) -> list[dict]:
    """AReaL's in-training evaluations: (seconds since the first rollout, step, pass@1), each
    dated when it began (its step's commit less the evaluation's own time)."""
    evaluations = run.scalars.get("eval-rollout/success", {})
    return [
        {"seconds": round(run.times[step] - run.scalars["timeperf/eval"][step] - start, 1), "step": step + 1,
         "pass@1": value}
        for step, value in sorted(evaluations.items())
    ]  # fmt: skip


def areal_step_split(run: plot.Run, skip_first_step: bool = False) -> dict:
    """Seconds per step, first to last commit, and the mean of each timed section (timeperf/*),
    over every step or, with `skip_first_step`, over the steps the step time spans (the first
    step's wait for rollouts holds the servers' start)."""
    steps = sorted(run.times)
    if len(steps) < 2:
        return {}
    split = {"step": (run.times[steps[-1]] - run.times[steps[0]]) / (len(steps) - 1)}
    for tag, points in sorted(run.scalars.items()):
        if tag.startswith("timeperf/"):
            kept = [v for step, v in points.items() if not (skip_first_step and step == steps[0])]
            if kept:
                split[tag.removeprefix("timeperf/")] = statistics.mean(kept)
    return split


def areal_row(lr_args: argparse.Namespace, seconds: float) -> dict:
    """Train with learning_run's grpo phase until `seconds` after the first rollout; the row's record."""
    run_dir = lr_args.work / "grpo"
    deadline = Deadline(run_dir / "logs" / "tensorboard", seconds)
    threading.Thread(target=deadline.watch, daemon=True).start()
    server_log = lr_args.work / "server.log"
    server_log_start = server_log.stat().st_size if server_log.exists() else 0  # the dev server appends to it
    learning_run.grpo_phase(lr_args, stop=deadline.stop)
    results = json.loads((lr_args.work / "results.json").read_text())
    run = plot.read_run(run_dir / "logs" / "tensorboard")
    start = first_rollout(run)
    if start is None:
        raise RuntimeError(f"the trainer logged fewer than 2 steps; see {lr_args.work / 'train.log'}")
    end = deadline.stopped_at or run.times[max(run.times)]
    steps = int(results["weight_version_evaluated"])
    config = next((run_dir / "logs").glob("*/countdown-learn/run/config.yaml"))
    return {
        "framework": f"AReaL {metadata.version('areal')}",
        "steps": steps,
        "steps_logged": results["grpo_steps"],
        "training_seconds": round(end - start, 1),
        "seconds_per_step": areal_step_split(run),
        "eval_seconds_on_clock": round(sum(run.scalars.get("timeperf/eval", {}).values()), 1),
        "server": pause_windows.summary(pause_windows.read_server_log(pause_windows.run_logs(server_log, server_log_start))),
        "points": [{"seconds": 0.0, "step": 0, "pass@1": results["pass@1_before"]["all"]}, *areal_points(run, start)],
        "pass@1_before": results["pass@1_before"],
        "final": {"seconds": round(end - start, 1), "step": steps, "pass@1": results["pass@1_after"]},
        "settings": {"learning_run": results["settings"]["grpo"], "areal": yaml.safe_load(config.read_text())},
    }


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, argparse.Namespace]:
    """This script's options, and the row's learning_run settings (its defaults, the row's
    changes, then any learning_run option given here)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="Other options go to "
                                     "experiments/learning_run.py's grpo phase (see its --help).")  # fmt: skip
    parser.add_argument("--row", choices=sorted(ROWS), required=True)
    parser.add_argument("--init", type=Path, required=True, help="the warm-started model folder")
    parser.add_argument("--out", type=Path, required=True, help="row_<X>.json (and A, B, D's logs) go here")
    parser.add_argument("--work", type=Path, help="scratch folder (default runs/time_to_accuracy/row_<X>)")
    parser.add_argument("--seconds", type=float, default=450,
                        help="training time from the first rollout (450: A, B and D's start-up, final "
                        "evaluation and wheel install fit the rest of a 600 s call)")
    parser.add_argument("--eval-seconds", type=int, default=60, help="held-out evaluation about this often")
    parser.add_argument("--trl-eval-batch", type=int, default=1000, help="C: puzzles per model.generate call")
    parser.add_argument("--trl-micro-batches", type=int, default=1,
                        help="C: split each minibatch into this many for the forward and backward passes (TRL's "
                        "gradient accumulation; the same optimizer steps), where its logits do not fit the GPU")
    args, rest = parser.parse_known_args(argv)
    args.work = args.work or ROOT / "runs" / "time_to_accuracy" / f"row_{args.row}"
    lr_args = learning_run.parse_args([
        "grpo", "--work", str(args.work), "--init", str(args.init), "--train-size", "50000",
        "--eval-seconds", str(args.eval_seconds), "--grpo-seconds", str(args.seconds + STARTUP_ALLOWANCE_S),
        *ROWS[args.row].learning_run_args, *rest,
    ])  # fmt: skip
    if args.row == "C":
        from experiments.trl_row import KNOBS  # TRL only here: it need not be installed for rows A, B and D

        not_for_trl = [s for s in lr_args.set if preflight.key_of_override(s) not in KNOBS]
        if not_for_trl:
            parser.error(f"row C runs TRL: of AReaL's overrides it takes only those it maps ({', '.join(KNOBS)}); "
                         f"--set {' '.join(not_for_trl)} would not apply")
    return args, lr_args


def run_row(args: argparse.Namespace, lr_args: argparse.Namespace, command: str) -> dict:
    learning_run.make_data(lr_args)
    if args.row == "C":
        from experiments import trl_row  # TRL only here: it need not be installed for rows A, B and D

        part = trl_row.run(lr_args, args.seconds, args.eval_seconds, args.trl_eval_batch, args.trl_micro_batches)
    else:
        part = areal_row(lr_args, args.seconds)
    return {
        "row": args.row,
        "description": ROWS[args.row].description,
        "device": learning_run.device_name(lr_args.device),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "seconds_asked": args.seconds,
        "eval_seconds": args.eval_seconds,
        **part,
        "steps_per_minute": round(60 * part["steps"] / part["training_seconds"], 2),
    }


def row_file_stem(row: str, lr_args: argparse.Namespace) -> str:
    """row_<X>, or row_<X>_seed<N> for a seed other than train_config.yaml's: several seeds of a
    row can then share one --out folder (and `plot.py --compare OUT/row_*.json`) without
    overwriting each other."""
    seed = learning_run.trainer_seed(lr_args)
    default = learning_run.train_setting([], "seed")
    return f"row_{row}" if seed == default else f"row_{row}_seed{seed}"


def main() -> None:
    argv = sys.argv[1:]
    args, lr_args = parse_args(argv)
    learning_run.warm_start_model(lr_args)  # before any folder, the data, and TRL's or AReaL's start-up
    lr_args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = row_file_stem(args.row, lr_args)
    with learning_run.sigterm_exits():
        try:
            record = run_row(args, lr_args, shlex.join(["python3", "-m", "experiments.time_to_accuracy", *argv]))
        finally:
            if args.row != "C":
                learning_run.copy_outputs(lr_args.work, args.out / stem)
    path = args.out / f"{stem}.json"
    path.write_text(json.dumps(record, indent=2, default=str) + "\n")
    final = record["final"]["pass@1"]
    print(f"[time_to_accuracy] row {args.row}: {record['steps']} steps in {record['training_seconds']} s, "
          f"held-out pass@1 {record['points'][0]['pass@1']:.3f} -> {final['all']:.3f}; wrote {path}")  # fmt: skip


if __name__ == "__main__":
    main()
