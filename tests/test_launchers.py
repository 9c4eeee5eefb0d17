"""The commands users type, run for real on CPU: AReaL's single controller (`make demo`'s) and its
local, Ray and Slurm launchers end to end (`python3 -m devkit.demo --launcher ...`), what the
demo makes of each run, and the faults they must survive.

The only double in every test here is the dev server, which starts where AReaL would start
SGLang (devkit/dev_server/sglang_seam): AReaL's scheduler, launchers, RPC workers, server wrapper,
name_resolve, disk weight pushes, evaluation and recover retries are its own code, and the
Ray and Slurm launchers submit to real (one-node) Ray and Slurm clusters that the demo starts
and stops (devkit/launch/ray_cluster.py, devkit/launch/slurm_cluster.py; Slurm needs root).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

import plot
from devkit import ROOT
from conftest import CLUSTER_LAUNCHERS, marked, ray_workers_without_fixes, run_env, wandb_history
from test_readme_commands import readme_training_commands

LAUNCHERS = ["single", "single-ray", "single-slurm", "local", "ray", "slurm"]
pytestmark = [pytest.mark.launchers, pytest.mark.timeout(900)]

# The random tiny model earns no reward, so GRPO's advantages, and the weight updates, would
# all be zero. A constant negative reward without normalisation (and no warm-up) gives every
# sampled token a non-zero advantage: each push must then change what the server computes.
WEIGHTS_MOVE = [
    "actor.reward_norm=null", "actor.adv_norm=null", "actor.reward_bias=-0.5",
    "actor.optimizer.lr=1e-3", "actor.optimizer.warmup_steps_proportion=0",
]  # fmt: skip
# What a run starts besides processes naming its folder: Ray's and Slurm's daemons.
CLUSTER_PROCESS = re.compile(r"ray::|raylet|gcs_server|default_worker|slurmctld|slurmd|slurmstepd|munged")
SERVER_LOAD = re.compile(
    r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+) dev_server\[(\d+)\] INFO loaded (?:weights from )?(\S+) .*fingerprint=(\S+)\)"
)


# Where AReaL put each worker: its single controller's scheduler, and its local launcher.
WORKER_GPUS = re.compile(r"Worker ([\w-]+)/\d+ started \(PID: \d+, GPUs: \[([^\]]*)\]")
LAUNCHED_ON = re.compile(r"Starting local process with command: .*?CUDA_VISIBLE_DEVICES=([\d,]+) .*tee -a (\S+)")
SERVER_ROLES, TRAINER_ROLES = {"rollout", "llm_server"}, {"actor", "trainer"}


def cuda_devices() -> int:
    import torch

    return torch.cuda.device_count()


def layout(gpus: int, width: int) -> list[str]:
    """train_config.yaml's allocation on `gpus` devices: `width` rollout servers, `width` FSDP ranks."""
    return [f"cluster.n_gpus_per_node={gpus}", f"allocation_mode=sglang:d{width}p1t1+fsdp:d{width}p1t1",
            f"rollout.backend=sglang:d{width}p1t1", f"actor.backend=fsdp:d{width}p1t1"]  # fmt: skip


def needs(launcher: str) -> None:
    if launcher in ("slurm", "single-slurm") and os.geteuid() != 0:
        pytest.skip("the Slurm cluster needs root (slurmd, munged; Slurm is installed with apt)")


def wait_for_line(proc: subprocess.Popen, text: str, timeout: float) -> str:
    """Output up to the first line holding `text` (the demo echoes the run's progress)."""
    seen, deadline = [], time.time() + timeout
    for line in proc.stdout:
        seen.append(line)
        if text in line:
            return "".join(seen)
        assert time.time() < deadline, f"no {text!r} in {timeout:.0f} s:\n" + "".join(seen[-30:])
    raise AssertionError(f"the demo ended before {text!r}:\n" + "".join(seen[-30:]))


def live_processes() -> dict[int, str]:
    """Command lines of the live processes (zombies aside: init reaps them)."""
    found = {}
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["status"] != psutil.STATUS_ZOMBIE:
            found[proc.pid] = " ".join(proc.info["cmdline"] or [])
    return found


def left_behind(run_dir: Path, before: dict[int, str], cluster: bool = False) -> list[str]:
    """Processes of this run still alive: any naming its folder, and cluster daemons that were
    not running before it started: those its environment marks as its own (conftest.run_env),
    or with `cluster` (a run that started a Ray or Slurm cluster; no other test starts one
    meanwhile, conftest.py's group "clusters") any of them."""
    time.sleep(2)
    return [
        cmd[:200] for pid, cmd in live_processes().items()
        if str(run_dir) in cmd
        or (CLUSTER_PROCESS.search(cmd) and pid not in before and (cluster or marked(pid, run_dir)))
    ]  # fmt: skip


def run_processes(run_dir: Path) -> dict[int, str]:
    """Command lines of the run's live processes: naming its folder, or marked as its own."""
    return {pid: cmd for pid, cmd in live_processes().items() if str(run_dir) in cmd or marked(pid, run_dir)}


def is_torchrun(cmd: str) -> bool:
    """torchrun itself, not the shell line that starts it."""
    argv = cmd.split()
    return len(argv) > 1 and argv[1].endswith("/torchrun")


def run_logs(run_dir: Path) -> str:
    """The run's log and its workers' and servers' logs, one after the other."""
    return "".join(path.read_text(errors="replace") for path in [run_dir / "train.log", *run_dir.glob("logs/**/*.log")])


def server_loads(run_dir: Path) -> dict[str, list[tuple[str, float]]]:
    """For each dev server (by port), (model folder, fingerprint) of each load it logged, in
    time order: its start, then each weight push. The same line may reach several of the
    run's logs."""
    lines = {m.groups() for m in SERVER_LOAD.finditer(run_logs(run_dir))}
    loads: dict[str, list[tuple[str, float]]] = {}
    for _, port, folder, fingerprint in sorted(lines):
        loads.setdefault(port, []).append((folder, float(fingerprint)))
    return loads


def gpus_by_role(log: str) -> dict[str, set[int]]:
    """The GPUs each role was given, from the run's log: the single controller's
    `Worker actor/0 started (..., GPUs: [1], ...)`, the local launcher's
    `CUDA_VISIBLE_DEVICES=1 ... | tee -a .../trainer.log`."""
    found: dict[str, set[int]] = {}
    for role, ids in WORKER_GPUS.findall(log):
        found.setdefault(role, set()).update(int(i.strip(" '\"")) for i in ids.split(",") if i.strip())
    for ids, log_file in LAUNCHED_ON.findall(log):
        found.setdefault(Path(log_file).stem, set()).update(int(i) for i in ids.split(","))
    return found


def assert_each_push_changed_the_weights(loads: list[tuple[str, float]]) -> None:
    """One server's loads: the model, then every push, each changing what it computes."""
    assert [Path(folder).name for folder, _ in loads] == ["model", "weight_update_v1", "weight_update_v2"], loads
    fingerprints = [f for _, f in loads]
    assert all(after != before for before, after in zip(fingerprints, fingerprints[1:])), loads


# Under the single controller and the local launcher the README's command also runs
# train_config.yaml's allocation (sglang:d4 + fsdp:d4 on 8 GPUs) at half its width, on CPU: two
# rollout servers behind AReaL's client, two FSDP ranks (gloo), disk pushes to both; and with
# Weights & Biases offline (the README's command says online, which needs a network).
HALF_WIDTH_LAYOUT = ("single", "local")
WANDB_ENV = ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR")  # the run gets no key, no mode but its config's


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_readme_command_trains_pushes_evaluates_plots_and_checkpoints(launcher, start_demo, tmp_path, monkeypatch):
    needs(launcher)
    width, extra = 1, []
    if launcher in HALF_WIDTH_LAYOUT:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")  # the devices AReaL's scheduler hands out
        for name in WANDB_ENV:
            monkeypatch.delenv(name, raising=False)
        width, extra = 2, [*layout(4, width=2), "stats_logger.wandb.mode=offline"]
    before = live_processes()
    run_dir = tmp_path / "run"
    proc = start_demo(run_dir, "--launcher", launcher, "--steps", "2", *WEIGHTS_MOVE, *extra)
    output, log = assert_layout_ran(proc, run_dir, before, width, cluster=launcher in CLUSTER_LAUNCHERS)
    assert "Train step 2/2 done" in output  # the run's real total
    summary, evaluate = output.strip().splitlines()[-2:]
    assert summary.startswith("[demo] done in") and "2 steps" in summary and "eval pass@1" in summary, output[-3000:]
    assert evaluate.startswith("[demo] evaluate the trained model"), output[-3000:]
    model = Path(re.search(r"evaluate.py --model (\S+) --data", evaluate)[1])
    assert (model / "config.json").exists() and list(model.glob("*.safetensors"))
    assert (run_dir / "curves.png").read_bytes().startswith(b"\x89PNG")
    assert "rollout/reward" in (run_dir / "curves.csv").read_text().splitlines()[0]
    assert "\x1b[" not in log  # AReaL's colours stay off the file
    assert not re.search(r"Callback to \S+ failed", output)  # areal_patches/rollout_shutdown.py

    scalars = plot.load_run(run_dir / "logs" / "tensorboard")
    assert sorted(scalars["rollout/reward"]) == [0, 1]
    if launcher == "single-ray":
        workers, without_fixes = ray_workers_without_fixes(log)
        assert len(workers) >= 2, log[-3000:]  # the trainer and the rollout worker at least
        assert not without_fixes, log[-3000:]
    if "stats_logger.wandb.mode=offline" in extra:  # the folder `wandb sync` sends, with every step
        (run_file,) = run_dir.glob("logs/*/countdown-grpo/trial1/wandb/offline-run-*/run-*.wandb")
        history = wandb_history(run_file)
        for key in ("rollout/reward", "eval-rollout/success", "rollout/format_ok"):
            assert history[key] == pytest.approx(scalars[key]), key  # what TensorBoard got


def assert_layout_ran(proc: subprocess.Popen, run_dir: Path, before: dict[int, str], width: int,
                      cluster: bool = False) -> tuple[str, str]:
    """A 2-step run of `width` rollout servers and `width` FSDP ranks: both steps, evaluation,
    a recover checkpoint, every push changing every server's weights alike, nothing left
    running. Returns the demo's output and the run's log."""
    output, _ = proc.communicate(timeout=840)
    assert proc.returncode == 0, output[-4000:]
    log = (run_dir / "train.log").read_text(errors="replace")
    assert f"dp={width}, sp=1, tp=1, ep=1, etp=1, world_size={width}" in run_logs(run_dir)
    scalars = plot.load_run(run_dir / "logs" / "tensorboard")
    assert sorted(scalars["eval-rollout/success"]) == [0, 1]  # held-out evaluation at each step
    assert list(run_dir.glob("checkpoints/*/*/*/default/recover_checkpoint/*"))

    loads = server_loads(run_dir)
    assert len(loads) == width, loads
    for server in loads.values():
        assert_each_push_changed_the_weights(server)
    fingerprints = {tuple(f for _, f in server) for server in loads.values()}
    assert len(fingerprints) == 1, loads  # every server serves the same weights at each version

    assert left_behind(run_dir, before, cluster) == []
    return output, log


@pytest.mark.skipif(cuda_devices() < 2, reason="needs 2 or more GPUs; its GPU run: docs/results/launch-paths.md")
@pytest.mark.parametrize("launcher", ["single", "local"])
def test_the_shipped_layout_on_this_hosts_gpus(launcher, start_demo, tmp_path):
    """train_config.yaml's allocation (sglang:d4 + fsdp:d4 on 8 GPUs) scaled to this host's
    GPUs: half for rollout servers, half for FSDP ranks (NCCL), each on GPUs of its own."""
    gpus = cuda_devices()
    width = gpus // 2
    before = live_processes()
    run_dir = tmp_path / "run"
    proc = start_demo(run_dir, "--launcher", launcher, "--steps", "2", *WEIGHTS_MOVE, *layout(gpus, width))
    _, log = assert_layout_ran(proc, run_dir, before, width)

    placed = gpus_by_role(log)
    servers = set().union(*(ids for role, ids in placed.items() if role in SERVER_ROLES))
    trainers = set().union(*(ids for role, ids in placed.items() if role in TRAINER_ROLES))
    assert len(servers) == len(trainers) == width and servers.isdisjoint(trainers), placed


# The trainer settings that the CPU overrides shrink (devkit.launch.training.cpu_overrides), as
# train_config.yaml ships them.
SHIPPED_TRAINER = ["actor.dtype", "actor.gradient_checkpointing", "actor.mb_spec.max_tokens_per_mb",
                   "actor.ppo_n_minibatches", "gconfig.n_samples", "gconfig.max_new_tokens"]  # fmt: skip


def as_shipped(key: str) -> str:
    """`key=value` with train_config.yaml's value."""
    value = yaml.safe_load((ROOT / "train_config.yaml").read_text())
    for part in key.split("."):
        value = value[part]
    return f"{key}={str(value).lower() if isinstance(value, bool) else value}"


# The README's commands for one and two GPUs, each with a model of the size it names:
# (the command's mark, the model preset, the served model's size in millions of parameters).
README_GPU_RUNS = {
    1: ("cluster.n_gpus_per_node=1 ", "qwen2.5-1.5b", "1543"),
    2: ("cluster.n_gpus_per_node=2 ", "qwen2.5-3b", "3085"),
}


def readme_gpu_overrides(mark: str) -> list[str]:
    """The overrides of the one README training command holding `mark`."""
    (command,) = [c for c in readme_training_commands() if mark in c]
    words = command.split()
    return words[words.index("train_config.yaml") + 1 :]


@pytest.fixture(scope="module")
def readme_gpu_run(tmp_path_factory) -> tuple[int, Path, Path]:
    """For this host's GPUs (two at most): their number, a model of the README command's size
    with random weights (nothing is downloaded), and a folder of 64 training and 32 held-out
    puzzles of 3-4 numbers."""
    gpus = min(cuda_devices(), 2)
    folder = tmp_path_factory.mktemp("readme-gpu-run")
    model, data = folder / "model", folder / "data"
    subprocess.run([sys.executable, "-m", "devkit.make_tiny_model", "--out", str(model), "--preset",
                    README_GPU_RUNS[gpus][1]], cwd=ROOT, check=True)  # fmt: skip
    subprocess.run([sys.executable, "countdown.py", "--out-dir", str(data), "--train-size", "64", "--test-size", "32"],
                   cwd=ROOT, check=True)  # fmt: skip
    return gpus, model, data


@pytest.mark.skipif(cuda_devices() < 1, reason="needs a GPU; its GPU runs: docs/results/launch-paths.md")
@pytest.mark.parametrize("launcher", ["single", "local"])
def test_the_readmes_small_gpu_command_with_a_model_of_its_size(launcher, readme_gpu_run, start_demo, tmp_path,
                                                                monkeypatch):  # fmt: skip
    """The README's command for this host's GPUs (one shared by the server and FSDP, with a
    1.5B-shaped model; or one server GPU and one FSDP GPU, with a 3B-shaped model), with
    train_config.yaml's trainer settings, for 2 steps: each step pushes the weights through
    disk to the server, the held-out puzzles are evaluated, the recover checkpoint holds the
    optimizer state."""
    gpus, model, data = readme_gpu_run
    mark, _, millions = README_GPU_RUNS[gpus]
    monkeypatch.setenv("TORCHDYNAMO_DISABLE", "0")  # the trainer compiles its layers, as users' runs do
    # A step's completions in one CUDA-graph batch (random weights write all 1024 tokens).
    monkeypatch.setenv("DEV_SERVER_ARGS", "--max-batch 256 --static-max-len 1280")
    before = live_processes()
    run_dir = tmp_path / "run"
    proc = start_demo(
        run_dir, "--launcher", launcher, "--steps", "2", *WEIGHTS_MOVE, *readme_gpu_overrides(mark),
        *map(as_shipped, SHIPPED_TRAINER), f"actor.path={model}", f"train_dataset.path={data / 'train_e.jsonl'}",
        f"valid_dataset.path={data / 'test_e.jsonl'}", "recover.freq_steps=2",
    )  # fmt: skip
    _, log = assert_layout_ran(proc, run_dir, before, width=1)
    placed = gpus_by_role(log)
    servers = set().union(*(ids for role, ids in placed.items() if role in SERVER_ROLES))
    trainers = set().union(*(ids for role, ids in placed.items() if role in TRAINER_ROLES))
    assert len(servers) == len(trainers) == 1 and (servers == trainers) == (gpus == 1), placed
    assert re.search(rf"INFO loaded \S+ \({millions}\.\d\d M params\)", run_logs(run_dir)), "not the model"


# The single controller gets the SIGTERM of `kill` and `timeout`, which the demo turns into the
# KeyboardInterrupt of Ctrl-C (devkit/launch/training.py); the others Ctrl-C. Where a Ray or Slurm
# cluster holds the workers, the demo's clean-up stops the trainer's processes and then the
# cluster, whichever launcher submitted them (devkit/launch/training.py's run_user_command): one
# launcher per cluster.
INTERRUPTS = [
    pytest.param("single", signal.SIGTERM, id="single-sigterm"),
    *(pytest.param(launcher, signal.SIGINT, id=f"{launcher}-ctrl-c") for launcher in ["local", "single-ray", "single-slurm"]),
]  # fmt: skip


@pytest.mark.parametrize("launcher, stop", INTERRUPTS)
def test_interrupted_run_leaves_no_process_behind_and_keeps_the_previous_run(launcher, stop, start_demo, tmp_path):
    """Ctrl-C, or SIGTERM as `kill` and `timeout` send it: the trainer runs in a session of its
    own, so only the demo's clean-up can stop it."""
    needs(launcher)
    before = live_processes()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    previous = run_dir / "curves.png"
    previous.write_bytes(b"the previous run's picture")
    proc = start_demo(run_dir, "--launcher", launcher, "--steps", "50")
    wait_for_line(proc, "Train step 1/", timeout=600)
    running = run_processes(run_dir).values()
    assert any("sglang.launch_server" in cmd for cmd in running)
    if launcher in CLUSTER_LAUNCHERS:  # the cluster's daemons carry the run's marker (left_behind)
        assert any(re.search(r"raylet|gcs_server|slurmd|slurmctld", cmd) for cmd in running), running
    proc.send_signal(stop)
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, rest[-2000:]
    assert "interrupted; all processes stopped" in rest
    assert left_behind(run_dir, before, cluster=launcher in CLUSTER_LAUNCHERS) == []
    assert previous.read_bytes() == b"the previous run's picture"


# Who notices a dead server: under the single controller, areal_patches/server_watchdog.py after
# its grace; under the local launcher, AReaL's server wrapper exits with its server and the
# launcher stops every job (the demo's recover.retries=0; with retries it starts the run
# again), and the demo names the server from the wrapper's log line (devkit/launch/training.py).
KILLED_SERVER = [
    pytest.param("single", ["server_health_grace=10"], r"rollout server (\S+) has not answered /health for 10 s",
                 id="single"),
    pytest.param("local", [], r"\[demo\] failed: rollout server (\S+) exited \(returncode -9\) before step 50",
                 id="local"),
]  # fmt: skip


@pytest.mark.parametrize("launcher, args, message", KILLED_SERVER)
def test_a_killed_rollout_server_stops_the_run_with_one_line_naming_it(launcher, args, message, start_demo, tmp_path):
    """A bounded stop, one line naming the killed server and what to do, nothing left running."""
    before = live_processes()
    run_dir = tmp_path / "run"
    proc = start_demo(run_dir, "--launcher", launcher, "--steps", "50", *args)
    wait_for_line(proc, "Train step 1/", timeout=600)
    server = next(p for p, cmd in live_processes().items() if "sglang.launch_server" in cmd and str(run_dir) in cmd)
    port = re.search(r"--port (\d+)", " ".join(psutil.Process(server).cmdline()))[1]
    psutil.Process(server).kill()
    killed = time.time()
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, rest[-2000:]
    assert time.time() - killed < 60
    named = [line for line in rest.splitlines() if re.search(message, line)]
    assert len(named) == 1, rest[-2000:]
    (line,) = named
    assert re.search(message, line)[1].endswith(f":{port}"), line
    assert "Rerun the same command to resume from the last recover checkpoint" in line, line
    assert left_behind(run_dir, before) == []


def test_a_killed_trainer_is_resumed_by_the_local_launchers_retry(start_demo, tmp_path):
    """recover.mode=auto with a retry: AReaL's local launcher starts the trainer again, and it
    resumes from the last recover checkpoint (one per step here) at the right step."""
    before = live_processes()
    run_dir = tmp_path / "run"
    proc = start_demo(run_dir, "--launcher", "local", "--steps", "4", "++recover.retries=1")
    wait_for_line(proc, "Train step 2/", timeout=600)
    trainer = next(p for p, cmd in live_processes().items() if is_torchrun(cmd) and str(run_dir) in cmd)
    for process in [*psutil.Process(trainer).children(recursive=True), psutil.Process(trainer)]:
        process.kill()
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output[-3000:]
    # Everything after the launcher's "is_recover_run=True" is its own retry, not a new command.
    first_run, retry = (run_dir / "train.log").read_text(errors="replace").split("is_recover_run=True", 1)
    before_kill = [int(n) for n in re.findall(r"Train step (\d+)/", first_run)]
    resumed = [int(n) for n in re.findall(r"Train step (\d+)/", retry)]
    # The step after the last logged one, or one more if the kill fell between that step's
    # recover checkpoint and its log line.
    assert resumed[0] in (before_kill[-1] + 1, before_kill[-1] + 2) and resumed[-1] == 4, (before_kill, resumed)
    assert left_behind(run_dir, before) == []


@pytest.mark.parametrize(
    "override, message",
    [
        ("actor.optimizer.lrr=1e-5",
         "unknown config key 'actor.optimizer.lrr': did you mean actor.optimizer.lr? (the keys are those of "
         "train_config.yaml; a field it lacks is set with ++actor.optimizer.lrr=...)"),
        # A type only AReaL's dataclass knows (the file's 8 could be a float): after the imports.
        ("gconfig.n_samples=0.5", "gconfig.n_samples: Value '0.5' of type 'float' could not be converted to Integer"),
        ("recover.retries=2", "'recover.retries' is not in train_config.yaml: set it with ++recover.retries=..."),
    ],
)
def test_a_bad_override_is_one_line_before_anything_starts(override, message, tmp_path):
    before = live_processes()
    data = tmp_path / "data"  # past the data checks, which come first
    subprocess.run([sys.executable, "countdown.py", "--out-dir", str(data), "--train-size", "8", "--test-size", "4"],
                   cwd=ROOT, check=True, capture_output=True)  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "train.py", "--config", "train_config.yaml", "scheduler.type=local",
         f"cluster.fileroot={tmp_path}", f"train_dataset.path={data}/train_e.jsonl",
         f"valid_dataset.path={data}/test_e.jsonl", override],
        cwd=ROOT, capture_output=True, text=True, timeout=300, env=run_env(tmp_path),
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1] == f"train.py: {message}"
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "logs").exists()
    assert left_behind(tmp_path, before) == []
