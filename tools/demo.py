"""The CPU demo: the whole training loop on a laptop-class machine, no GPU, no downloads.

    python3 -m tools.demo            (what `make demo` runs)

It builds a small Countdown dataset and a tiny Qwen2-architecture model with the project's
own tokenizer, starts the development inference server (tools/dev_server.py, speaking the
SGLang HTTP protocol), and runs the production entry point exactly as AReaL's SPMD launcher
would (`torchrun train.py --config train_config.yaml <overrides>` with AREAL_SPMD_MODE=1),
with the CPU overrides below. The model starts from random weights, so its reward stays near
zero: the demo shows that every part of the loop runs, not that a tiny model learns (see
docs/results.md for that).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cpu_overrides(run_dir: Path, model: Path, data_dir: Path, steps: int) -> list[str]:
    """How train_config.yaml (8 GPUs, Qwen2.5-3B) is shrunk to one CPU process."""
    return [
        "experiment_name=countdown-cpu-demo",
        "trial_name=demo",
        f"cluster.fileroot={run_dir}",
        f"cluster.name_resolve.nfs_record_root={run_dir}/name_resolve",
        "cluster.n_gpus_per_node=0",
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


# The SGLang release whose HTTP protocol tools/dev_server.py speaks.
EMULATED_SGLANG = "0.5.10.post1"


def sglang_metadata_stub(root: Path) -> Path:
    """A folder holding only the package metadata of SGLang, for PYTHONPATH.

    Why: PPOTrainer builds SGLang server arguments even when it launches no server (SPMD
    mode) and refuses to start unless `importlib.metadata` reports sglang >= 0.5.10.post1.
    Here the dev server stands in for SGLang, so the trainer's environment declares the
    version it emulates. No `sglang` module is created: nothing can import it.
    """
    dist_info = root / f"sglang-{EMULATED_SGLANG}.dist-info"
    dist_info.mkdir(parents=True, exist_ok=True)
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: sglang\nVersion: {EMULATED_SGLANG}\n"
    )
    return root


def trainer_env(server_addr: str, sglang_stub: Path) -> dict[str, str]:
    pythonpath = [str(sglang_stub), os.environ.get("PYTHONPATH", "")]
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in pythonpath if p),
        "AREAL_SPMD_MODE": "1",
        "AREAL_LLM_SERVER_ADDRS": server_addr,
        # torch.compile of AReaL's log-prob kernels costs ~1 min on CPU, same numbers.
        "TORCHDYNAMO_DISABLE": "1",
        "PYTHONUNBUFFERED": "1",
    }


PROGRESS = re.compile(r"Train step \d+/\d+ done|Recovering from|Traceback|Error")


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
    env = trainer_env(server_addr, sglang_metadata_stub(run_dir / "sglang-stub"))
    return trainer_command(overrides), env


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the whole GRPO loop on CPU.")
    parser.add_argument("--run-dir", type=Path, default=ROOT / "runs" / "cpu-demo")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from tools import dev_server

    start = time.time()
    run_dir = args.run_dir.resolve()
    shutil.rmtree(run_dir, ignore_errors=True)  # a demo always starts from step 0
    data_dir, model_dir = run_dir / "data", run_dir / "model"
    run_step("1/4 puzzles", [sys.executable, "countdown.py", "--out-dir", str(data_dir),
                             "--train-size", "2000", "--test-size", "32"])  # fmt: skip
    run_step("2/4 tiny model", [sys.executable, "-m", "tools.make_tiny_model",
                                "--out", str(model_dir), "--preset", "tiny"])  # fmt: skip
    print("[demo] 3/4 inference server", flush=True)
    with dev_server.serve(str(model_dir), log_file=run_dir / "server.log") as addr:
        print(f"[demo] 4/4 training against {addr} (full log: {run_dir / 'train.log'})")
        overrides = cpu_overrides(run_dir, model_dir, data_dir, args.steps)
        launch_trainer(run_dir, overrides, addr, run_dir / "train.log")
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
