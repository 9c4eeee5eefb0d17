"""The CPU demo: the whole training loop on a laptop-class machine, no GPU, no downloads.

    python3 -m tools.demo [--launcher single|local]      (what `make demo LAUNCHER=...` runs)

It builds a small Countdown dataset and a tiny Qwen2-architecture model with the project's
own tokenizer, then runs the command a user runs, with the CPU overrides below:

    single  python3 train.py --config train_config.yaml scheduler.type=local ...   (default)
    local   python3 -m areal.infra.launcher.local train.py --config train_config.yaml ...

AReaL starts everything itself (RPC workers, rollout server, trainer). The one difference
from a GPU machine is tools/sglang_seam on PYTHONPATH: the rollout server AReaL starts is the
dev server instead of SGLang. The model starts from random weights, so its reward stays near
zero: the demo shows that every part of the loop runs, not that a tiny model learns (see
docs/results.md for that).

`trainer_launch` and friends run train.py as the SPMD launcher's trainer against a dev server
the caller started (the learning runs and a few tests use that).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


SEAM = ROOT / "tools" / "sglang_seam"
LAUNCHERS = ("single", "local")


def user_command(launcher: str) -> list[str]:
    """The README's training command for `launcher`, before any override."""
    entry = {
        "single": ["train.py", "--config", "train_config.yaml", "scheduler.type=local"],
        "local": ["-m", "areal.infra.launcher.local", "train.py", "--config", "train_config.yaml"],
    }[launcher]
    return [
        sys.executable, *entry, "experiment_name=countdown-grpo", "trial_name=trial1",
        "actor.path=Qwen/Qwen2.5-3B-Instruct", "train_dataset.path=data/countdown/qwen/train_e.jsonl",
        "valid_dataset.path=data/countdown/qwen/test_e.jsonl", "stats_logger.wandb.mode=online",
    ]  # fmt: skip


def launcher_overrides(launcher: str) -> list[str]:
    """What a launcher needs beyond cpu_overrides on this machine."""
    if launcher == "local":
        # AReaL's local launcher takes a finished trainer for a failed one and starts it
        # again recover.retries times (docs/areal-bugs.md); a demo has nothing to recover.
        return ["recover.retries=0"]
    return []


@contextlib.contextmanager
def launcher_cluster(launcher: str, run_dir: Path) -> Iterator[dict[str, str]]:
    """The cluster a launcher submits to, up for the run; yields the environment to add."""
    yield {}


def seam_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment with the dev server in SGLang's place (tools/sglang_seam).

    AReaL starts servers and trainers with a bare `python3` / `torchrun`, so this
    interpreter's bin folder (the project's .venv) goes first on PATH.
    """
    pythonpath = [str(SEAM), os.environ.get("PYTHONPATH", "")]
    return {
        **os.environ,
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "PYTHONPATH": os.pathsep.join(p for p in pythonpath if p),
        # torch.compile of AReaL's log-prob kernels costs ~1 min on CPU, same numbers.
        "TORCHDYNAMO_DISABLE": "1",
        "PYTHONUNBUFFERED": "1",
        **(extra or {}),
    }


def cpu_overrides(run_dir: Path, model: Path, data_dir: Path, steps: int) -> list[str]:
    """How train_config.yaml (8 GPUs, Qwen2.5-3B) is shrunk to one CPU machine."""
    return [
        f"cluster.fileroot={run_dir}",
        f"cluster.name_resolve.nfs_record_root={run_dir}/name_resolve",
        "cluster.n_gpus_per_node=1",
        "allocation_mode=sglang:d1p1t1+fsdp:d1p1t1",
        "rollout.backend=sglang:d1p1t1",
        "actor.backend=fsdp:d1p1t1",
        f"actor.path={model}",
        "actor.dtype=float32",
        "actor.gradient_checkpointing=false",
        "actor.mb_spec.max_tokens_per_mb=4096",
        "actor.ppo_n_minibatches=1",
        "actor.optimizer.lr=1e-4",
        "gconfig.n_samples=4",
        "gconfig.max_new_tokens=40",
        "rollout.max_concurrent_rollouts=16",
        f"train_dataset.path={data_dir}/train_e.jsonl",
        "train_dataset.batch_size=4",
        "train_dataset.pin_memory=false",
        f"valid_dataset.path={data_dir}/test_e.jsonl",
        "valid_dataset.batch_size=16",
        "valid_dataset.pin_memory=false",
        f"total_train_steps={steps}",
        "evaluator.freq_steps=1",
        "saver.freq_steps=null",
        "recover.freq_steps=1",
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_step(title: str, cmd: list[str]) -> None:
    print(f"[demo] {title}", flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)


def trainer_command(
    overrides: list[str], script: str = "train.py", config: str = "train_config.yaml"
) -> list[str]:
    """The command AReaL's local launcher runs for the trainer (areal/infra/launcher/local.py)."""
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1", "--nproc-per-node", "1",
        "--master-addr", "localhost", "--master-port", str(free_port()),
        script, "--config", config, *overrides,
    ]  # fmt: skip


def trainer_env(server_addr: str) -> dict[str, str]:
    """The SPMD launcher's trainer environment, pointed at a server the caller started."""
    return seam_env({"AREAL_SPMD_MODE": "1", "AREAL_LLM_SERVER_ADDRS": server_addr})


PROGRESS = re.compile(r"Train step \d+/\d+ done|Recovering from|Traceback|Error|dev server in place")


def run_trainer(cmd: list[str], env: dict[str, str], log_path: Path, time_limit: float | None = None) -> bool:
    """Run the trainer in its own process group, echo progress lines, always clean up.

    With `time_limit` (seconds) the trainer is stopped when it runs out; returns whether
    that happened (a trainer that fails on its own raises).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True,
        )  # fmt: skip
        expired = threading.Event()

        def stop_at_time_limit() -> None:
            expired.set()
            stop_group(proc)

        timer = threading.Timer(time_limit, stop_at_time_limit) if time_limit else None
        if timer:
            timer.start()
        try:
            for line in proc.stdout:
                log.write(line)
                if PROGRESS.search(line):
                    print(f"[train] {line.strip()[-160:]}", flush=True)
            if proc.wait() != 0 and not expired.is_set():
                raise RuntimeError(f"training failed (exit {proc.returncode}); see {log_path}")
            return expired.is_set()
        finally:
            if timer:
                timer.cancel()
            stop_group(proc)


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the whole process group (torchrun and its workers), SIGKILL if it lingers."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def trainer_launch(run_dir: Path, overrides: list[str], server_addr: str) -> tuple[list[str], dict]:
    """What `python3 -m areal.infra.launcher.local` does for the trainer, with our server.

    Like the launcher, it clears the run's name_resolve records first: a record left by an
    earlier launch (say, the run being resumed) would announce a weight update before the
    new trainer has written it. Returns the command and its environment.
    """
    shutil.rmtree(run_dir / "name_resolve", ignore_errors=True)
    return trainer_command(overrides), trainer_env(server_addr)


def launch_trainer(run_dir: Path, overrides: list[str], server_addr: str, log_path: Path,
                   time_limit: float | None = None) -> bool:
    return run_trainer(*trainer_launch(run_dir, overrides, server_addr), log_path, time_limit)


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


def run_user_command(launcher: str, run_dir: Path, overrides: list[str], time_limit: float) -> None:
    """The README's command for `launcher` with `overrides`; raises unless every step ran.

    The local launcher exits 1 even after a complete run (docs/areal-bugs.md), so success is
    read from what the run wrote: a log line for its last step.
    """
    (run_dir / "name_resolve").mkdir(parents=True, exist_ok=True)  # the launchers require it
    cmd = [*user_command(launcher), *overrides, *launcher_overrides(launcher)]
    log_path = run_dir / "train.log"
    print(f"[demo] {' '.join(cmd[1:])}", flush=True)
    with launcher_cluster(launcher, run_dir) as cluster_env:
        try:
            expired = run_trainer(cmd, seam_env(cluster_env), log_path, time_limit)
        except RuntimeError:
            if launcher != "local":
                raise
            expired = False
    steps = next(o.split("=", 1)[1] for o in overrides if o.startswith("total_train_steps="))
    if expired or f"Train step {steps}/" not in log_path.read_text():
        raise RuntimeError(f"training did not reach step {steps} within {time_limit:.0f} s; see {log_path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the whole GRPO loop on CPU.")
    parser.add_argument("--run-dir", type=Path, default=ROOT / "runs" / "cpu-demo")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--launcher", choices=LAUNCHERS, default="single")
    parser.add_argument("--time-limit", type=float, default=900, help="seconds before the run is stopped")
    args = parser.parse_args(argv)

    start = time.time()
    run_dir = args.run_dir.resolve()
    shutil.rmtree(run_dir, ignore_errors=True)  # a demo always starts from step 0
    data_dir, model_dir = run_dir / "data", run_dir / "model"
    run_step("1/3 puzzles", [sys.executable, "countdown.py", "--out-dir", str(data_dir),
                             "--train-size", "2000", "--test-size", "32"])  # fmt: skip
    run_step("2/3 tiny model", [sys.executable, "-m", "tools.make_tiny_model",
                                "--out", str(model_dir), "--preset", "tiny"])  # fmt: skip
    print(f"[demo] 3/3 training, launcher {args.launcher} (full log: {run_dir / 'train.log'})", flush=True)
    overrides = cpu_overrides(run_dir, model_dir, data_dir, args.steps) + [
        f"actor.path={model_dir}", "stats_logger.wandb.mode=disabled",
    ]  # fmt: skip
    run_user_command(args.launcher, run_dir, overrides, args.time_limit)
    tensorboard_dir = run_dir / "logs" / "tensorboard"
    subprocess.run([sys.executable, "plot.py", str(tensorboard_dir),
                    "--out", str(run_dir / "curves.png")], check=True, cwd=ROOT)  # fmt: skip
    print(summary(tensorboard_dir, time.time() - start))
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
