"""How the project starts training on one machine: the README's commands, the clusters the
launchers submit to, and the SPMD trainer against a server the caller started.

- `run_user_command(launcher, ...)`: the README's training command for `single` (AReaL's
  single controller), `single-ray` and `single-slurm` (the same on Ray and on Slurm), `local`,
  `ray` or `slurm` (its SPMD launchers), with overrides; a one-node Ray or Slurm cluster is up for the run
  (devkit/launch/ray_cluster.py, devkit/launch/slurm_cluster.py). The demo and tests/test_launchers.py use it.
- `launch_trainer(...)`: train.py as the SPMD launchers run their trainer, against a dev
  server the caller started (the learning runs and tests/test_train.py use it).
- `cpu_overrides(...)`: how train_config.yaml shrinks to one CPU machine.

Every run goes in its own process group with its output in a log file; progress lines are
echoed (`echo_progress`), and every process the run started is stopped when it ends, fails,
runs out of time or is interrupted. `seam_env()` puts the dev server in SGLang's place.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from safetensors import SafetensorError, safe_open

import countdown
from devkit import ROOT
from devkit.launch.preflight import key_of_override
from devkit.processes import RUN_ID, find_free_port, plain, sigterm_raises, stop_group

SEAM = ROOT / "devkit" / "dev_server" / "sglang_seam"
LAUNCHERS = ("single", "single-ray", "single-slurm", "local", "slurm", "ray")

# The actor's scheduling spec, which rollout and ref take too (${actor.scheduling_spec}).
# (++ sets a key whether train_config.yaml has it or not.)
ACTOR_SPEC = "++actor.scheduling_spec.0"
# Each Slurm job (both Slurm paths) asks for spec.cpu CPUs and spec.mem GB per GPU plus 10 GB:
# AReaL's 8 CPUs and 32 GB would stay PENDING for ever on this one node. container_type none
# runs the worker commands as they are (AReaL's default is apptainer; under the single
# controller, areal_patches/slurm_container.py makes the scheduler read it).
SLURM_JOB_ON_THIS_NODE = (f"{ACTOR_SPEC}.container_type=none", f"{ACTOR_SPEC}.cpu=1", f"{ACTOR_SPEC}.mem=1")


def user_command(launcher: str) -> list[str]:
    """The README's training command for `launcher`, before any override."""
    entry = {
        "single": ["train.py", "--config", "train_config.yaml", "scheduler.type=local"],
        "single-ray": ["train.py", "--config", "train_config.yaml", "scheduler.type=ray"],
        "single-slurm": ["train.py", "--config", "train_config.yaml", "scheduler.type=slurm"],
        "local": ["-m", "areal.infra.launcher.local", "train.py", "--config", "train_config.yaml"],
        "slurm": ["-m", "areal.infra.launcher.slurm", "train.py", "--config", "train_config.yaml"],
        "ray": ["-m", "areal.infra.launcher.ray", "train.py", "--config", "train_config.yaml"],
    }[launcher]
    return [
        sys.executable, *entry, "experiment_name=countdown-grpo", "trial_name=trial1",
        "actor.path=Qwen/Qwen2.5-3B-Instruct", "train_dataset.path=data/countdown/qwen/train_e.jsonl",
        "valid_dataset.path=data/countdown/qwen/test_e.jsonl", "stats_logger.wandb.mode=online",
    ]  # fmt: skip


def launcher_overrides(launcher: str) -> list[str]:
    """What a launcher needs beyond cpu_overrides on this machine."""
    if launcher == "single":
        return []
    if launcher == "single-ray":
        import torch

        # AReaL's RayScheduler refuses a worker that asks for a GPU when the controller's torch
        # sees none (`_bundle_spec`): on CPU the workers ask Ray for none.
        return [] if torch.cuda.is_available() else [f"{ACTOR_SPEC}.gpu=0"]
    if launcher == "single-slurm":
        # sbatch passes this environment on, the seam included.
        return list(SLURM_JOB_ON_THIS_NODE)
    # The SPMD launchers start a failed trainer again recover.retries times, and the local one
    # takes a finished trainer for a failed one (docs/areal-bugs.md): a demo has nothing to
    # recover.
    no_retries = ["++recover.retries=0"]
    if launcher == "local":
        return no_retries
    if launcher == "ray":
        # The Ray launcher gives each server whole nodes (all n_gpus_per_node GPUs) and the
        # trainer the n_nodes left (one node of two GPUs leaves it none and fails with
        # ZeroDivisionError), so two one-GPU nodes: on a one-node Ray cluster with two GPUs,
        # its placement groups put both on that node.
        return ["cluster.n_nodes=2", *no_retries]
    # Slurm's SPMD launcher: one job per role, each on whole nodes: the rollout server needs a
    # node of its own (gen world size // GPUs per node), so two one-GPU nodes, both on this
    # machine. Its `srun --export=K=V,...` passes only these variables (no ALL), so the jobs
    # get PATH and the seam from here; a value must not hold a comma (one server's address
    # has none).
    env = seam_env()
    return [
        "cluster.n_nodes=2", *SLURM_JOB_ON_THIS_NODE,
        *(f"{ACTOR_SPEC}.env_vars.{k}={env[k]}" for k in ("PATH", "PYTHONPATH", "TORCHDYNAMO_DISABLE", "PYTHONUNBUFFERED")),
        *no_retries,
    ]  # fmt: skip


@contextlib.contextmanager
def launcher_cluster(launcher: str, run_dir: Path) -> Iterator[dict[str, str]]:
    """The cluster a launcher submits to, up for the run; yields the environment to add.

    The clusters' daemons and jobs run outside the launcher's process group: leaving this
    block stops them, and SIGTERM leaves it the way Ctrl-C does.
    """
    if launcher in ("ray", "single-ray"):
        from devkit.launch import ray_cluster

        # Ray's workers inherit the seam from `ray start` and start in ROOT, as the
        # launcher's relative train.py and train_config.yaml need.
        with sigterm_raises(), ray_cluster.cluster(run_dir / "ray", gpus=2, env=seam_env(), cwd=ROOT) as env:
            yield {"RAY_ADDRESS": env["RAY_ADDRESS"]}
    elif launcher in ("slurm", "single-slurm"):
        from devkit.launch import slurm_cluster

        with sigterm_raises(), slurm_cluster.for_run(run_dir, echo_progress) as env:
            yield env
    else:
        yield {}


def seam_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment with the dev server in SGLang's place (devkit/dev_server/sglang_seam).

    AReaL starts servers and trainers with a bare `python3` / `torchrun`, so this
    interpreter's bin folder (the project's .venv) goes first on PATH.
    """
    pythonpath = [str(SEAM), os.environ.get("PYTHONPATH", "")]
    return {
        **os.environ,
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
        "PYTHONPATH": os.pathsep.join(p for p in pythonpath if p),
        # torch.compile of AReaL's log-prob kernels costs ~1 min on CPU, same numbers. Set
        # TORCHDYNAMO_DISABLE=0 for a GPU run that compiles its step as users' runs do.
        "TORCHDYNAMO_DISABLE": os.environ.get("TORCHDYNAMO_DISABLE", "1"),
        "PYTHONUNBUFFERED": "1",
        **(extra or {}),
    }


CPU_BATCH_SIZE = 4  # puzzles per step on CPU


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
        f"train_dataset.path={data_dir / countdown.TRAIN_FILE}",
        f"train_dataset.batch_size={CPU_BATCH_SIZE}",
        "train_dataset.pin_memory=false",
        f"valid_dataset.path={data_dir / countdown.TEST_FILE}",
        "valid_dataset.batch_size=16",
        "valid_dataset.pin_memory=false",
        f"total_train_steps={steps}",
        "evaluator.freq_steps=1",
        "saver.freq_steps=null",
        "recover.freq_steps=1",
    ]


def torchrun_command(n_procs: int, *args: str) -> list[str]:
    """torchrun with `n_procs` processes on this machine, as AReaL's local launcher starts a
    trainer (areal/infra/launcher/local.py); `args`: a script or `-m module`, then its own."""
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1", "--nproc-per-node", str(n_procs),
        "--master-addr", "localhost", "--master-port", str(find_free_port()),
        *args,
    ]  # fmt: skip


def trainer_command(
    overrides: list[str], script: str = "train.py", config: str = "train_config.yaml"
) -> list[str]:
    """The command AReaL's local launcher runs for the trainer."""
    return torchrun_command(1, script, "--config", config, *overrides)


def trainer_env(server_addr: str) -> dict[str, str]:
    """The SPMD launcher's trainer environment, pointed at a server the caller started."""
    return seam_env({"AREAL_SPMD_MODE": "1", "AREAL_LLM_SERVER_ADDRS": server_addr})


def saved_global_step(folder: Path) -> int:
    """The global step (from 0) of a folder the Saver wrote, epoch{E}epochstep{S}globalstep{G}."""
    return int(folder.name.rsplit("globalstep", 1)[1])


def is_complete_save(folder: Path) -> bool:
    """Whether the Saver finished writing `folder`: its config, whole weights, and the tokenizer
    it writes last. A trainer stopped by a time limit can be stopped inside a save, and that
    folder does not load."""
    weights = list(folder.glob("*.safetensors"))
    try:
        config = json.loads((folder / "config.json").read_text())
        for name in ("tokenizer_config.json", "tokenizer.json"):
            json.loads((folder / name).read_text())
        for path in weights:
            with safe_open(path, framework="pt"):
                pass
    except (OSError, ValueError, SafetensorError):
        return False
    return bool(weights) and "model_type" in config


def latest_checkpoint(fileroot: Path, experiment: str) -> Path:
    """The last HF folder the Saver wrote whole (highest global step)."""
    folders = sorted(fileroot.glob(f"checkpoints/*/{experiment}/*/default/epoch*globalstep*"),
                     key=saved_global_step, reverse=True)  # fmt: skip
    complete = next((folder for folder in folders if is_complete_save(folder)), None)
    if complete is None:
        found = f"{len(folders)} cut short" if folders else "none: the run ended before its first save"
        raise FileNotFoundError(f"no whole saved model under {fileroot}/checkpoints/*/{experiment} ({found})")
    return complete


def run_sft(fileroot: Path, overrides: list[str], log_path: Path,
            echo: Callable[[str], None] | None = None) -> Path:
    """The supervised warm start (sft.py, configs/sft_warm_start.yaml) as AReaL's local
    launcher runs a trainer, its files under `fileroot`; returns the model it saved last.
    `echo`: what is shown of each log line (default `echo_progress`)."""
    overrides = [f"cluster.fileroot={fileroot}", f"cluster.name_resolve.nfs_record_root={fileroot}/name_resolve",
                 *overrides]  # fmt: skip
    cmd = trainer_command(overrides, script="sft.py", config="configs/sft_warm_start.yaml")
    run_trainer(cmd, trainer_env(""), log_path, echo=echo)
    return latest_checkpoint(fileroot, "countdown-sft")


OWN_MESSAGES = ("train.py: ", "sft.py: ")  # the commands' one-line errors (docs/exit-codes.md)
PROGRESS = re.compile(
    r"Train step \d+/\d+ done|Recovering from|Traceback|Error|dev server in place|dev_server\[\d+\] INFO serving on|"
    + "|".join("^" + re.escape(prefix) for prefix in OWN_MESSAGES)
)


def echo_progress(line: str) -> None:
    """Show a run's log line if it marks progress or trouble: train.py's and sft.py's own
    messages whole, others' last 160 characters; in colour only on a terminal."""
    if PROGRESS.search(plain(line)):
        line = (line if sys.stdout.isatty() else plain(line)).strip()
        print(f"[train] {line if plain(line).startswith(OWN_MESSAGES) else line[-160:]}", flush=True)


def run_trainer(
    cmd: list[str], env: dict[str, str], log_path: Path, time_limit: float | None = None,
    stop: threading.Event | None = None, echo: Callable[[str], None] | None = None,
) -> bool:
    """Run the trainer in its own process group, echo progress lines, always clean up: every
    process it started, found by the run's mark in their environment (devkit.processes.RUN_ID).

    The trainer is stopped when `time_limit` (seconds) runs out, or when another thread sets
    `stop` (a limit known only once the run has begun: experiments/time_to_accuracy.py, the
    demo's stall guard); returns whether it was stopped (a trainer that fails on its own
    raises). `stop` is set on return. Every line goes to `log_path` and, until the stop,
    to `echo` (default `echo_progress`): what the processes print once they are being
    stopped (connection errors, tracebacks) is a symptom of the stop, for the log only.

    Stops happen one at a time. Why: `stop_group` finds the processes to stop by walking the
    tree down from the trainer, and a second stop racing the first walks it after the first
    has killed the launcher's torchrun; the worker, in a session of its own, is then no one's
    child and escapes both. (Seen after a Ctrl-C: the worker, its exit stuck on a lock the
    signal left taken, outlived the run.)
    """
    stop = stop or threading.Event()
    echo = echo or echo_progress
    stopping = threading.Lock()
    run_id = uuid.uuid4().hex
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w", buffering=1) as log:  # by lines: `tail -f` shows the run as it goes
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env={**env, RUN_ID: run_id}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True,
        )  # fmt: skip
        expired = threading.Event()

        def stop_when_asked() -> None:
            stop.wait(time_limit or None)
            stop.set()
            with stopping:
                if proc.poll() is None:
                    expired.set()
                    stop_group(proc, run_id=run_id)

        threading.Thread(target=stop_when_asked, daemon=True).start()
        try:
            for line in proc.stdout:
                log.write(plain(line))
                if not stop.is_set():
                    echo(line)
            if proc.wait() != 0 and not expired.is_set():
                raise RuntimeError(f"training failed (exit {proc.returncode}); see {log_path}")
            return expired.is_set()
        finally:
            stop.set()
            with stopping:
                stop_group(proc, run_id=run_id)


def trainer_launch(run_dir: Path, overrides: list[str], server_addr: str) -> tuple[list[str], dict]:
    """What `python3 -m areal.infra.launcher.local` does for the trainer, with our server.

    Like the launcher, it clears the run's name_resolve records first: a record left by an
    earlier launch (say, the run being resumed) would announce a weight update before the
    new trainer has written it. Returns the command and its environment.
    """
    shutil.rmtree(run_dir / "name_resolve", ignore_errors=True)
    return trainer_command(overrides), trainer_env(server_addr)


def launch_trainer(run_dir: Path, overrides: list[str], server_addr: str, log_path: Path,
                   time_limit: float | None = None, stop: threading.Event | None = None) -> bool:
    return run_trainer(*trainer_launch(run_dir, overrides, server_addr), log_path, time_limit, stop)


# AReaL's local, Ray and Slurm launchers exit 1 even after a complete run (docs/areal-bugs.md).
EXIT_1_AFTER_SUCCESS = ("local", "ray", "slurm")
# Their server wrapper's line when a rollout server ends: the wrapper exits, and the launcher
# stops every job (and starts the run again while recover.retries allows).
SERVER_EXIT = re.compile(r"SGLang server (?:https?://)?(\S+) exits, returncode=(-?\d+)")


def unfinished_run_error(log: str, steps: str, log_path: Path) -> str:
    """Why a run ended before its last step, in one line: the rollout server that ended, if
    the log names one, and what to do."""
    if exited := SERVER_EXIT.search(log):
        return (
            f"rollout server {exited[1]} exited (returncode {exited[2]}) before step {steps}, and the "
            f"launcher stopped the run; its output is in {log_path}. Rerun the same command to resume "
            "from the last recover checkpoint (++recover.retries=N has the launcher do it)"
        )
    return f"training ended before step {steps}; see {log_path}"


def each_key_once(groups: list[list[str]]) -> list[list[str]]:
    """The groups of a command's arguments with every KEY=VALUE override but the last of its
    key dropped: the command the trainer reads the same way, each key given once."""
    last = {key_of_override(arg): (g, i) for g, group in enumerate(groups) for i, arg in enumerate(group)
            if "=" in arg and not arg.startswith("-")}  # fmt: skip
    return [[arg for i, arg in enumerate(group)
             if "=" not in arg or arg.startswith("-") or last[key_of_override(arg)] == (g, i)]
            for g, group in enumerate(groups)]  # fmt: skip


def shell_lines(groups: list[list[str]], indent: str = "      ") -> str:
    """A command as a user types it, one group of arguments a line (`\\` continued)."""
    return f" \\\n{indent}".join(shlex.join(group) for group in groups if group)


def run_user_command(
    launcher: str, run_dir: Path, overrides: list[list[str]], extra: list[str] = (),
    stop: threading.Event | None = None, echo: Callable[[str], None] | None = None,
) -> bool:
    """The README's command for `launcher` with the groups of `overrides` (the CPU
    overrides first), the launcher's own and `extra` (in that order: the last value of a key
    wins, and the command gives only that one); returns whether `stop` stopped it, raises
    unless it was stopped or every step ran. `stop` and `echo`: as run_trainer's.

    Success is read from what the run wrote (a log line for its last step), not from the
    exit code alone: some launchers exit 1 after any run.
    """
    (run_dir / "name_resolve").mkdir(parents=True, exist_ok=True)  # the launchers require it
    python, *readme = user_command(launcher)
    groups = each_key_once([readme, *overrides, launcher_overrides(launcher), list(extra)])
    log_path = run_dir / "train.log"
    print("[demo] the README's training command, then the CPU overrides (devkit/launch/training.py), the demo's settings "
          f"and any given; each key once:\n    python3 {shell_lines(groups)}", flush=True)  # fmt: skip
    with launcher_cluster(launcher, run_dir) as cluster_env:
        try:
            stopped = run_trainer([python, *sum(groups, [])], seam_env(cluster_env), log_path, stop=stop, echo=echo)
        except RuntimeError:
            if launcher not in EXIT_1_AFTER_SUCCESS:
                raise
            stopped = False
    steps = next(o.split("=", 1)[1] for o in reversed(sum(overrides, [])) if o.startswith("total_train_steps="))
    if not stopped:
        log = log_path.read_text()
        if f"Train step {steps}/" not in log:
            raise RuntimeError(unfinished_run_error(log, steps, log_path))
    return stopped
