"""Where a disk weight push's time goes at a Qwen2.5 shape, upstream against areal_patches/fast_save.py.

    python3 -m experiments.bench.gpu.push --shape 1.5b --reps 3 [--json OUT/push.json]

The trainer's half of a push is `FSDPEngine._save_model_to_hf` (one FSDP rank, the model of
experiments/bench/gpu/train_step.py with random weights): upstream's, its parts timed (the state dict
gathered to host memory, the cast to bf16, `save_pretrained`, config, tokenizer), against
fast_save's; both folders are compared file by file. The server's half is timed as the dev
server does it (a new model from the folder, moved to the GPU) against reading the weights
file straight to the GPU, with a plain write of the same bytes beside them for the disk's
own speed. Every figure is one repetition's seconds; the first repetition warms up.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from contextlib import ExitStack, contextmanager
from pathlib import Path

from experiments.bench.gpu import train_step

WORK = Path("/tmp/bench-push")


class Stopwatch:
    """Seconds spent inside wrapped callables, by name, over one repetition."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - start

        return timed


@contextmanager
def patched(owner, name: str, value):
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


def timed_save(actor, save, folder: Path, fast: bool) -> dict[str, float]:
    """One save into a fresh `folder`, with the seconds of its parts."""
    import torch
    from areal.engine import fsdp_engine
    from areal_patches import fast_save

    shutil.rmtree(folder, ignore_errors=True)
    watch = Stopwatch()
    model, config = actor.model, actor.model_config
    parts = [
        patched(model, "save_pretrained", watch.wrap("save_pretrained", model.save_pretrained)),
        patched(type(config), "save_pretrained", watch.wrap("config", type(config).save_pretrained)),
    ]
    if fast:
        parts.append(patched(fast_save, "host_copies", watch.wrap("gather, cast on GPU, copy to pinned host", fast_save.host_copies)))
    else:
        parts += [
            patched(fsdp_engine, "get_model_state_dict",
                    watch.wrap("gather to host (float32)", fsdp_engine.get_model_state_dict)),
            patched(actor, "_cast_to_compute_dtype", watch.wrap("cast on CPU", actor._cast_to_compute_dtype)),
        ]  # fmt: skip
    if actor.tokenizer is not None:
        kind = type(actor.tokenizer)
        parts.append(patched(kind, "save_pretrained", watch.wrap("tokenizer", kind.save_pretrained)))
    sync()
    start = time.perf_counter()
    with ExitStack() as stack:
        for part in parts:
            stack.enter_context(part)
        save(actor, str(folder), actor.tokenizer, None)
    total = time.perf_counter() - start
    return {"total": total, **watch.seconds}


def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def same_folders(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.iterdir())
    return names == sorted(p.name for p in b.iterdir()) and all(
        filecmp.cmp(a / n, b / n, shallow=False) for n in names
    )


def server_loads(folder: Path) -> dict[str, float]:
    """The server's half: the dev server's load (a new model, to the GPU) and a direct read."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    weights = folder / "model.safetensors"
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).to(train_step.DEVICE)
    sync()
    new_model = time.perf_counter() - start
    start = time.perf_counter()
    tensors = load_file(weights, device=train_step.DEVICE)
    sync()
    direct = time.perf_counter() - start
    del model, tensors
    data = weights.read_bytes()
    times = {"dev server: new model to GPU": new_model, "weights file read straight to GPU": direct}
    for name, target in (("plain write, run folder", WORK / "plain.bin"), ("plain write, /dev/shm", Path("/dev/shm/plain.bin"))):
        start = time.perf_counter()
        target.write_bytes(data)
        times[name] = time.perf_counter() - start
        target.unlink()
    return times


def child(shape: str, reps: int, out: Path | None) -> None:
    import torch
    from areal.engine.fsdp_engine import FSDPEngine

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    train_step.DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a check of the code only
    actor = train_step.build_actor(shape, n_seqs=8)
    fast = FSDPEngine._save_model_to_hf
    upstream = fast.__wrapped__
    rows: dict[str, list[dict]] = {"upstream": [], "fast_save": []}
    for rep in range(reps):
        rows["upstream"].append(timed_save(actor, upstream, WORK / "upstream", fast=False))
        rows["fast_save"].append(timed_save(actor, fast, WORK / "fast", fast=True))
        print(f"[push] rep {rep + 1}/{reps}: upstream {rows['upstream'][-1]['total']:.2f} s, "
              f"fast_save {rows['fast_save'][-1]['total']:.2f} s", flush=True)  # fmt: skip
    same = same_folders(WORK / "upstream", WORK / "fast")
    server = [server_loads(WORK / "fast") for _ in range(reps)]
    size_gb = (WORK / "fast" / "model.safetensors").stat().st_size / 1e9
    record = {"shape": shape, "gpu": gpu, "weights_gb": round(size_gb, 3),
              "same_files": same, "trainer": rows, "server": server}  # fmt: skip
    print_table(record)
    if out:
        out.write_text(json.dumps(record, indent=2) + "\n")


def median_after_warmup(values: list[float]) -> float:
    return statistics.median(values[1:] if len(values) > 1 else values)


def print_table(record: dict) -> None:
    print(f"\nshape {record['shape']}: weights {record['weights_gb']:.2f} GB; "
          f"fast_save's folder has the same bytes as upstream's: {record['same_files']}")  # fmt: skip
    print("| save | part | seconds (median after warm-up) |\n|---|---|---|")
    for save, reps in record["trainer"].items():
        for part in reps[0]:
            print(f"| {save} | {part} | {median_after_warmup([r.get(part, 0.0) for r in reps]):.3f} |")
    print("\n| server side | seconds |\n|---|---|")
    for part in record["server"][0]:
        print(f"| {part} | {median_after_warmup([r[part] for r in record['server']]):.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="1.5b", choices=list(train_step.SHAPES))
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the record here too")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.shape, args.reps, args.json)
        return
    from devkit.launch.training import torchrun_command

    WORK.mkdir(parents=True, exist_ok=True)
    cmd = torchrun_command(1, "-m", "experiments.bench.gpu.push", "--child", "--shape", args.shape, "--reps", str(args.reps))
    if args.json:
        cmd += ["--json", str(args.json.resolve())]
    env = dict(os.environ, AREAL_SPMD_MODE="1", PYTHONUNBUFFERED="1")
    sys.exit(subprocess.run(cmd, env=env).returncode)


if __name__ == "__main__":
    main()
