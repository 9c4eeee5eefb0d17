"""The CPU demo: a tiny model trained on Countdown, warm start then GRPO, on a laptop-class
machine, no GPU, no downloads.

    python3 -m devkit.demo [--quick] [--seed N] [--launcher single|single-ray|single-slurm|local|ray|slurm]   (`make demo`)

By default (what it takes and what it reaches: docs/results/cpu-demo.md, "The CPU demo learns"):

1. puzzles: two numbers from 1-50 and a target from 1-100 (countdown.py), 2,300 to train
   on and 500 held out;
2. a 1.4M-parameter Qwen2-architecture model from random weights, with the project's own
   tokenizer (devkit/make_tiny_model.py --preset demo);
3. a warm start: sft.py (AReaL's SFTTrainer) on the reference solutions, as
   experiments/learning_run.py's sft phase runs it (`SFT`);
4. the warm start's held-out pass@1 (evaluate.py, greedy);
5. GRPO: the command a user runs, with the CPU overrides of `devkit.launch.training.cpu_overrides`,
   the demo's learning settings (`LEARN`) and any given after the options:

    single  python3 train.py --config train_config.yaml scheduler.type=local ...   (default)
    single-ray  the same with scheduler.type=ray, on a one-node Ray cluster started for it
    single-slurm  the same with scheduler.type=slurm, on a one-node Slurm cluster (root)
    local   python3 -m areal.infra.launcher.local train.py --config train_config.yaml ...
    ray     the same with areal.infra.launcher.ray, on a one-node Ray cluster started for it
    slurm   the same with areal.infra.launcher.slurm, on a one-node Slurm cluster (root)

AReaL evaluates the held-out puzzles every 25 steps and the run saves the model every 5;
each step shows its reward and the time left, and after the first steps one line gives the
run's expected time on this machine (devkit/launch/progress.py). The run ends with curves.png and
"held-out pass@1 X% -> Y%" (the warm start, then the trained model's last evaluation).

The time limit guards against a hang, it is no budget: the training stops only when no step
has finished for `--stall-limit` seconds (the start counts as one, or waits
`--first-step-limit` if one is given), or after `--time-limit` seconds if one is given. A
stopped run says why first, then shows what it reached: the last whole save evaluated on the
held-out puzzles, the curves and the summary line with the steps done, exit status 0. Stopped before its first step, it has nothing to show: exit status 1.

`--quick` runs only the last step, on the model from random weights (preset tiny), for 3
steps: every part of the loop runs, nothing is learnt (its reward stays near zero). The
tests use it.

AReaL starts everything itself (RPC workers, rollout server, trainer). The one difference
from a GPU machine is devkit/dev_server/sglang_seam on PYTHONPATH: the rollout server AReaL starts is
the dev server instead of SGLang.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import countdown
from devkit import ROOT
from devkit.launch import config_errors, preflight
from devkit.launch.progress import StepWatch
from devkit.launch.training import (CPU_BATCH_SIZE, LAUNCHERS, cpu_overrides, latest_checkpoint, run_sft,
                                    run_user_command, saved_global_step)
from devkit.processes import sigterm_raises

PUZZLES = ["--min-numbers", "2", "--max-numbers", "2", "--num-max", "50", "--target-min", "1", "--target-max", "100"]
TRAIN_PUZZLES, HELD_OUT = 2300, 500
MAX_NEW_TOKENS = 72  # the longest reference completion of these puzzles is 71 tokens
GRPO_STEPS = 50
SAVE_EVERY = 5  # steps: what a stopped run has to show is at most this many steps old
STALL_LIMIT = 600  # seconds with no step finished before the training is stopped
# What each GRPO step's line shows: {label: (AReaL's stat, format)}; the held-out pass@1 on
# the steps it was evaluated.
GRPO_SHOWN = {"reward": ("rollout/reward", ".3f"), "held-out pass@1": ("eval-rollout/success", ".1%")}
# sft.py on the train puzzles, in configs/sft_warm_start.yaml's data order whatever --seed says:
# the demo was tuned in that order, and in seed 1's this short SFT gave a far weaker warm start
# (docs/results/cpu-demo.md, "The CPU demo learns"). One example per row: with that config's
# packing (made for a per-row cost of the GPU machine) the tiny model learnt to copy the
# prompt's numbers late or not at all (docs/results/cpu-demo.md).
SFT = ["actor.dtype=float32", "actor.optimizer.lr=3e-3", "total_train_epochs=3",
       "examples_per_row=1", "train_dataset.batch_size=16"]  # fmt: skip
# train.py, after cpu_overrides: more samples per puzzle (a spread of rewards to learn from),
# only puzzles whose samples disagree, the whole held-out set evaluated at the middle and the
# end only (on a CPU, evaluations take the time that GRPO steps need).
LEARN = [
    "train_dataset.batch_size=8", "gconfig.n_samples=8", "gconfig.temperature=0.7",
    f"gconfig.max_new_tokens={MAX_NEW_TOKENS}", "actor.optimizer.lr=1e-4", "skip_uniform_groups=true",
    "actor.mb_spec.max_tokens_per_mb=16384", "rollout.max_concurrent_rollouts=128",
    f"valid_dataset.batch_size={HELD_OUT}", "evaluator.freq_steps=25",
]  # fmt: skip


def run_step(title: str, cmd: list[str]) -> None:
    print(f"[demo] {title}", flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)


@dataclass
class Stopped:
    """How a stopped training run ended: why, the steps it was to make, and the last whole
    save with its held-out pass@1 (None: no save was written whole)."""

    cause: str
    total: int
    save: tuple[int, float] | None


def summary(tensorboard_dir: Path, seconds: float, before: float | None, stopped: Stopped | None = None) -> str:
    """One line; `before`: the warm start's held-out pass@1, shown next to the last evaluation
    (of a stopped run: its last whole save's, when it has one)."""
    import plot

    scalars = plot.load_run(tensorboard_dir)

    def last(tag: str, form: str = ".3f") -> str:
        points = scalars.get(tag)
        return format(points[max(points)], form) if points else "n/a"

    steps = len(scalars.get("rollout/reward", {}))
    form, of = (".1%", f"{HELD_OUT} puzzles, greedy") if before is not None else (".3f", "")
    after = last("eval-rollout/success", form)
    if stopped and stopped.save:
        step, pass_at_1 = stopped.save
        after, of = format(pass_at_1, form), ", ".join(filter(None, [f"the step-{step} save", of]))
    after += f" ({of})" if of else ""
    held_out = f"eval pass@1 {after}" if before is None else f"held-out pass@1 {before:.1%} -> {after}"
    ending = f"done in {seconds:.0f} s: {steps} steps"
    if stopped:
        ending = f"stopped ({stopped.cause}) after {seconds:.0f} s: {steps} of {stopped.total} steps"
    return f"[demo] {ending}, last reward {last('rollout/reward')}, {held_out}, format rate {last('rollout/format_ok')}"


def evaluate_command(run_dir: Path, *options: str) -> list[str]:
    """The evaluation command (docs/results/cpu-demo.md) for the model the run saved last, on its test split.

    Raises RuntimeError (the demo's `[demo] failed: ...` line, after the summary) when no save
    was written whole: a trainer stopped inside its last save leaves a folder that does not load.
    """
    try:
        saved = latest_checkpoint(run_dir, experiment="*")
    except FileNotFoundError as e:
        raise RuntimeError(f"no trained model to evaluate: {e}; see {run_dir / 'train.log'}") from None
    data = run_dir / "data" / countdown.TEST_FILE
    return ["python3", "evaluate.py", "--model", str(saved), "--data", str(data), *options]


def held_out_pass_at_1(title: str, model: Path, data: Path, out_dir: Path, max_new_tokens: int) -> float:
    """evaluate.py's greedy pass@1 of `model` on the held-out puzzles `data`, at its default
    concurrency: on a CPU, batches of that size take less time than the whole set in one, and
    the progress lines come as they finish (docs/results/cpu-demo.md)."""
    run_step(title, [
        sys.executable, "evaluate.py", "--model", str(model), "--data", str(data), "--device", "cpu",
        "--max-new-tokens", str(max_new_tokens), "--out-dir", str(out_dir),
    ])  # fmt: skip
    return json.loads((out_dir / "eval.json").read_text())["overall"]["pass@1"]


def warm_start(run_dir: Path, data_dir: Path, model_dir: Path, seed: int) -> tuple[Path, float]:
    """Steps 1-4 of the docstring: the warm-started model and its held-out pass@1."""
    run_step("1/5 puzzles", [sys.executable, "countdown.py", "--out-dir", str(data_dir), *PUZZLES,
                             "--train-size", str(TRAIN_PUZZLES), "--test-size", str(HELD_OUT)])  # fmt: skip
    run_step("2/5 tiny model", [sys.executable, "-m", "devkit.make_tiny_model", "--out", str(model_dir),
                                "--preset", "demo", "--seed", str(seed)])  # fmt: skip
    print(f"[demo] 3/5 warm start: sft.py on the reference solutions (log: {run_dir / 'sft.log'})", flush=True)
    sft_overrides = [f"actor.path={model_dir}", f"train_dataset.path={data_dir / countdown.TRAIN_FILE}", *SFT]
    watch = StepWatch("sft", lines=10, estimate_after=20)
    sft_model = run_sft(run_dir / "sft", sft_overrides, run_dir / "sft.log", echo=watch.line)
    watch.finish()
    before = held_out_pass_at_1("4/5 held-out pass@1 of the warm start", sft_model, data_dir / countdown.TEST_FILE,
                                run_dir / "eval_warm_start", MAX_NEW_TOKENS)  # fmt: skip
    return sft_model, before


def last_save(run_dir: Path, max_new_tokens: int) -> tuple[int, float] | None:
    """A stopped run's last whole save, as (its training step, its held-out pass@1); None when
    no save was written whole."""
    try:
        saved = latest_checkpoint(run_dir, experiment="*")
    except FileNotFoundError as e:
        print(f"[demo] {e}: nothing to evaluate", flush=True)
        return None
    step = saved_global_step(saved) + 1
    pass_at_1 = held_out_pass_at_1(f"held-out pass@1 of the last whole save (step {step})", saved,
                                   run_dir / "data" / countdown.TEST_FILE, run_dir / "eval_last_save", max_new_tokens)  # fmt: skip
    return step, pass_at_1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the whole GRPO loop on CPU.")
    parser.add_argument("--run-dir", type=Path, default=ROOT / "runs" / "cpu-demo",
                        help="where the run goes (default: runs/cpu-demo)")
    parser.add_argument("--quick", action="store_true",
                        help="random weights, a few steps: every part runs, nothing is learnt")
    parser.add_argument("--steps", type=int, help=f"GRPO steps (default {GRPO_STEPS}; --quick: 3)")
    parser.add_argument("--seed", type=int, default=1,
                        help="the model's random weights, train.py's shuffling and sampling (the SFT keeps one "
                        "order; default %(default)s)")
    parser.add_argument("--launcher", choices=LAUNCHERS, default="single", help="default %(default)s")
    parser.add_argument("--stall-limit", type=float, default=STALL_LIMIT, metavar="SECONDS",
                        help="stop the training when no step has finished for this long, its start counting "
                        "as one, and show what it reached (default %(default)g; 0: never)")
    parser.add_argument("--first-step-limit", type=float, metavar="SECONDS",
                        help="the wait for the first step, start-up included (default: the stall limit)")
    parser.add_argument("--time-limit", type=float, default=0, metavar="SECONDS",
                        help="stop the training this long after its start whatever its progress, and show "
                        "what it reached (default %(default)g: no limit)")
    parser.add_argument("overrides", nargs="*", help="more key=value overrides for train.py, applied last")
    args = parser.parse_args(argv)
    if problem := config_errors.config_override_problem(args.overrides, str(ROOT / "train_config.yaml"),
                                                       "train:CountDownConfig"):
        parser.error(problem)
    # The trainer runs in a session of its own: `kill` or `timeout` must stop the demo the way
    # Ctrl-C does, through the clean-up that stops the trainer's processes too.
    with sigterm_raises():
        return run_demo(args)


def run_demo(args: argparse.Namespace) -> int:
    """Puzzles, model (and on the learning run a warm start), GRPO, plot and summary."""
    start = time.time()
    final_dir = args.run_dir.resolve()
    # A demo starts from step 0, in a folder of its own: the previous run's stays until this
    # one has something to show, so an interrupted demo loses nothing.
    run_dir = final_dir.with_name(final_dir.name + ".partial")
    shutil.rmtree(run_dir, ignore_errors=True)
    data_dir, model_dir = run_dir / "data", run_dir / "model"
    if args.quick:
        steps, before, settings, n = args.steps or 3, None, [], 3
        # One epoch is the whole run: AReaL counts its progress ("Train step 1/N") in epochs.
        run_step("1/3 puzzles", [sys.executable, "countdown.py", "--out-dir", str(data_dir),
                                 "--train-size", str(steps * CPU_BATCH_SIZE), "--test-size", "32"])  # fmt: skip
        run_step("2/3 tiny model", [sys.executable, "-m", "devkit.make_tiny_model",
                                    "--out", str(model_dir), "--preset", "tiny", "--seed", str(args.seed)])  # fmt: skip
        model = model_dir
    else:
        steps, settings, n = args.steps or GRPO_STEPS, LEARN, 5
        model, before = warm_start(run_dir, data_dir, model_dir, args.seed)
        print(f"[demo] warm start: held-out pass@1 {before:.1%} on {HELD_OUT} puzzles", flush=True)
    print(f"[demo] {n}/{n} GRPO training, launcher {args.launcher} (full log: {run_dir / 'train.log'}): AReaL "
          "starts its workers and the rollout server, then the first batch of rollouts; the first step takes longest",
          flush=True)  # fmt: skip
    cpu = cpu_overrides(run_dir, model, data_dir, steps)
    demo_settings = ["stats_logger.wandb.mode=disabled", *settings, f"seed={args.seed}",
                     f"saver.freq_steps={min(steps, SAVE_EVERY)}"]  # the trained model, as a Hugging Face folder
    watch = StepWatch("grpo", GRPO_SHOWN, stall_limit=args.stall_limit, time_limit=args.time_limit,
                      first_step_limit=args.first_step_limit, estimate_after=5)
    stop = threading.Event()
    threading.Thread(target=watch.guard, args=(stop,), daemon=True).start()
    was_stopped = run_user_command(args.launcher, run_dir, [cpu, demo_settings], args.overrides, stop, watch.line)
    watch.finish()
    stopped = None
    if was_stopped:
        stopped = Stopped(str(watch.cause), steps, None)
        with (run_dir / "train.log").open("a") as log:
            log.write(f"[demo] the demo stopped this run ({stopped.cause}) after step {watch.last_step} of {steps}: "
                      "the lines from the stop on are its processes' reaction to it, and a 'Training completes!' "
                      "line among them does not mean that every step ran\n")  # fmt: skip
        if not watch.finished:
            raise RuntimeError(f"the training stopped before its first step ({stopped.cause}): nothing to show; "
                               f"see {run_dir / 'train.log'}")  # fmt: skip
    shutil.rmtree(final_dir, ignore_errors=True)
    run_dir.rename(final_dir)
    all_overrides = [*cpu, *demo_settings, *args.overrides]
    max_new_tokens = int(preflight.override_value(all_overrides, "gconfig.max_new_tokens"))
    if stopped:
        stopped.save = last_save(final_dir, max_new_tokens)
    tensorboard_dir = final_dir / "logs" / "tensorboard"
    plot_options = [] if before is None else ["--before", str(before)]
    configs = sorted(final_dir.glob("logs/*/*/*/config.yaml"))  # AReaL's copy of the run's config
    plot_options += ["--config", str(configs[-1])] if configs else []
    subprocess.run([sys.executable, "plot.py", str(tensorboard_dir), "--out", str(final_dir / "curves.png"),
                    *plot_options], check=True, cwd=ROOT)  # fmt: skip
    print(summary(tensorboard_dir, time.time() - start, before, stopped))
    if stopped is None or stopped.save:
        options = [] if args.quick else ["--max-new-tokens", str(MAX_NEW_TOKENS)]
        print(f"[demo] evaluate the trained model: {' '.join(evaluate_command(final_dir, *options))}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (RuntimeError, subprocess.CalledProcessError) as e:
        print(f"[demo] failed: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("[demo] interrupted; all processes stopped", file=sys.stderr)
        sys.exit(130)
