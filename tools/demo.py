"""The CPU demo: the whole training loop on a laptop-class machine, no GPU, no downloads.

    python3 -m tools.demo [--launcher single|local|ray|slurm]      (`make demo LAUNCHER=...`)

It builds a small Countdown dataset and a tiny Qwen2-architecture model with the project's
own tokenizer, then runs the command a user runs, with the CPU overrides of
`launch.training.cpu_overrides` (and any given after the options):

    single  python3 train.py --config train_config.yaml scheduler.type=local ...   (default)
    local   python3 -m areal.infra.launcher.local train.py --config train_config.yaml ...
    ray     the same with areal.infra.launcher.ray, on a one-node Ray cluster started for it
    slurm   the same with areal.infra.launcher.slurm, on a one-node Slurm cluster (root)

AReaL starts everything itself (RPC workers, rollout server, trainer). The one difference
from a GPU machine is dev_server/sglang_seam on PYTHONPATH: the rollout server AReaL starts
is the dev server instead of SGLang. The model starts from random weights, so its reward
stays near zero: the demo shows that every part of the loop runs, not that a tiny model
learns (see docs/results.md for that).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

from launch.training import CPU_BATCH_SIZE, LAUNCHERS, ROOT, cpu_overrides, run_user_command


def run_step(title: str, cmd: list[str]) -> None:
    print(f"[demo] {title}", flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)


def summary(tensorboard_dir: Path, seconds: float) -> str:
    import plot

    scalars = plot.load_run(tensorboard_dir)

    def last(tag: str) -> str:
        points = scalars.get(tag)
        return f"{points[max(points)]:.3f}" if points else "n/a"

    steps = len(scalars.get("rollout/reward", {}))
    return (
        f"[demo] done in {seconds:.0f} s: {steps} steps, last reward {last('rollout/reward')}, "
        f"eval pass@1 {last('eval-rollout/success')}, "
        f"format rate {last('rollout/format_ok')}"
    )


def evaluate_command(run_dir: Path) -> str:
    """The README's evaluation command for the model the run saved last, on its test split."""
    saved = max(run_dir.glob("checkpoints/*/*/*/default/epoch*globalstep*"), key=lambda p: p.stat().st_mtime)
    return f"python3 evaluate.py --model {saved} --data {run_dir / 'data' / 'test_e.jsonl'}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the whole GRPO loop on CPU.")
    parser.add_argument("--run-dir", type=Path, default=ROOT / "runs" / "cpu-demo")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--launcher", choices=LAUNCHERS, default="single")
    parser.add_argument("--time-limit", type=float, default=900, help="seconds before the run is stopped")
    parser.add_argument("overrides", nargs="*", help="more key=value overrides for train.py, applied last")
    args = parser.parse_args(argv)

    start = time.time()
    final_dir = args.run_dir.resolve()
    # A demo starts from step 0, in a folder of its own: the previous run's stays until this
    # one has completed, so an interrupted demo loses nothing.
    run_dir = final_dir.with_name(final_dir.name + ".partial")
    shutil.rmtree(run_dir, ignore_errors=True)
    data_dir, model_dir = run_dir / "data", run_dir / "model"
    # One epoch is the whole run: AReaL counts its progress ("Train step 1/N") in epochs.
    train_size = args.steps * CPU_BATCH_SIZE
    run_step("1/3 puzzles", [sys.executable, "countdown.py", "--out-dir", str(data_dir),
                             "--train-size", str(train_size), "--test-size", "32"])  # fmt: skip
    run_step("2/3 tiny model", [sys.executable, "-m", "tools.make_tiny_model",
                                "--out", str(model_dir), "--preset", "tiny"])  # fmt: skip
    print(f"[demo] 3/3 training, launcher {args.launcher} (full log: {run_dir / 'train.log'}): AReaL starts "
          "its workers and the rollout server, then the first batch of rollouts; the first step takes longest",
          flush=True)  # fmt: skip
    overrides = cpu_overrides(run_dir, model_dir, data_dir, args.steps) + [
        f"actor.path={model_dir}", "stats_logger.wandb.mode=disabled",
        f"saver.freq_steps={args.steps}",  # the trained model, as a Hugging Face folder
    ]  # fmt: skip
    run_user_command(args.launcher, run_dir, overrides, args.time_limit, args.overrides)
    shutil.rmtree(final_dir, ignore_errors=True)
    run_dir.rename(final_dir)
    tensorboard_dir = final_dir / "logs" / "tensorboard"
    subprocess.run([sys.executable, "plot.py", str(tensorboard_dir),
                    "--out", str(final_dir / "curves.png")], check=True, cwd=ROOT)  # fmt: skip
    print(summary(tensorboard_dir, time.time() - start))
    print(f"[demo] evaluate the trained model: {evaluate_command(final_dir)}")
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
