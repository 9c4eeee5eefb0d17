"""Where a training step's time goes on the GPU, by phase of AReaL's step (experiments/bench/gpu/train_step.py --profile).

A profiler trace shows when each kernel ran and when the CPU launched it, but not which part of
AReaL's step it belongs to, nor why the GPU sat idle in between. `annotate_areal()` wraps the
functions that make up a step (log-probs, advantages, micro-batch packing, forward, loss,
backward, optimizer step, statistics) in profiler ranges; `time_by_phase()` then charges each
kernel's GPU time, and each idle gap before it, to the innermost range that was open when the
CPU launched that kernel. A gap charged to a phase is time the GPU waited for that phase's host
work (Python, small launches, host syncs). Host syncs (cudaStreamSynchronize and the like) are
counted per phase too.

Inside a phase, the ranges that FSDP2 and torch.compile open themselves (FSDP's per-layer
hooks: "FSDP::pre_forward", "FSDP::post_backward_reduce", ...; a compiled layer's "Torch-Compiled
Region") split it further, as "model forward / FSDP::pre_forward": the time left in "model
forward" itself is then the model's code outside those ranges.

Bench-only instrumentation: nothing here changes what AReaL computes.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")  # Triton's kernels launch through the driver API
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
OTHER = "(outside any phase)"
UNLAUNCHED = "(launch not in the trace)"


PHASES = [  # (module, attribute path, phase name) of the AReaL functions that make up a GRPO step
    ("areal.trainer.ppo.actor", "PPOActor._compute_logp", "compute_logp (other)"),
    ("areal.trainer.ppo.actor", "PPOActor._compute_advantages", "compute_advantages"),
    ("areal.trainer.ppo.actor", "PPOActor._ppo_update", "ppo_update (other)"),
    ("areal.trainer.ppo.actor", "split_padded_tensor_dict_into_mb_list", "split into minibatches"),
    ("areal.engine.fsdp_engine", "FSDPEngine._prepare_mb_list", "pack micro-batches"),
    ("areal.engine.fsdp_engine", "FSDPEngine._compute_forward_result", "log-probs from logits (no grad)"),
    ("areal.engine.fsdp_engine", "FSDPEngine._compute_logprobs_and_loss", "log-probs from logits (train)"),
    ("areal.trainer.ppo.actor", "grpo_loss_fn", "GRPO loss and its statistics"),
    ("areal.engine.fsdp_engine", "FSDPEngine.optimizer_step", "optimizer step (clip + AdamW)"),
    ("areal.engine.fsdp_engine", "FSDPEngine.optimizer_zero_grad", "zero grad"),
    ("areal.utils.stats_tracker", "stat", "statistics"),
    ("areal.utils.stats_tracker", "denominator", "statistics"),
    ("torch", "Tensor.backward", "backward"),
]


def detail_name(name: str) -> str | None:
    """The sub-phase of a range FSDP2 or torch.compile opened, without the layer or graph it
    names ("FSDP::pre_forward (model.layers.3)" -> "FSDP::pre_forward"); None for others."""
    if name.startswith("FSDP::"):
        return name.split(" ")[0]
    if name.startswith("Torch-Compiled Region"):
        return "compiled layer"
    return None


def areal_phases() -> list[tuple[object, str, str]]:
    """(owner, attribute, phase name) for PHASES, the owners imported."""
    import importlib

    out = []
    for module, path, name in PHASES:
        owner = importlib.import_module(module)
        *parents, attr = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent)
        out.append((owner, attr, name))
    return out


@contextlib.contextmanager
def annotate_areal(model) -> Iterator[None]:
    """Profiler ranges around AReaL's step functions and `model`'s forward, removed on exit."""
    from torch.profiler import record_function

    def ranged(fn, name):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            with record_function(name):
                return fn(*args, **kwargs)

        return wrapper

    phases = areal_phases()
    saved = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in phases]
    for owner, attr, name in phases:
        setattr(owner, attr, ranged(getattr(owner, attr), name))
    model.forward = ranged(model.forward, "model forward")
    try:
        yield
    finally:
        del model.forward  # the instance attribute; the class's forward shows again
        for owner, attr, fn in saved:
            setattr(owner, attr, fn)


def phase_segments(
    ranges: list[tuple[float, float, str]], details: frozenset[str] = frozenset()
) -> tuple[list[float], list[str]]:
    """Flatten properly nested [start, end) ranges into segments labelled with the innermost one.

    A range named in `details` is labelled with the phase around it: "phase / detail".
    Returns segment starts and labels: time t lies in segment bisect_right(starts, t) - 1.
    """
    starts: list[float] = []
    labels: list[str] = []

    def begin(t: float, label: str) -> None:
        if labels and starts[-1] == t:
            labels[-1] = label
        elif not labels or labels[-1] != label:
            starts.append(t)
            labels.append(label)

    stack: list[tuple[float, str]] = []  # (end, name), innermost last
    for start, end, name in sorted(ranges, key=lambda r: (r[0], -r[1])):
        while stack and stack[-1][0] <= start:
            closed_at = stack.pop()[0]
            begin(closed_at, stack[-1][1] if stack else OTHER)
        if name in details:
            name = f"{stack[-1][1].split(' / ')[0] if stack else OTHER} / {name}"
        stack.append((end, name))
        begin(start, name)
    while stack:
        closed_at = stack.pop()[0]
        begin(closed_at, stack[-1][1] if stack else OTHER)
    return starts, labels


def time_by_phase(events: list[dict], window: tuple[float, float]) -> dict[str, dict[str, float]]:
    """GPU busy and idle time (ms), syncs and CPU time waiting in them, per phase.

    `events`: a Chrome trace's traceEvents (torch.profiler); `window`: the step's [start, end)
    in the trace's microseconds. Busy time counts each kernel once, clipped to the window;
    idle time is each gap between kernels (and before the first), charged to the phase that
    launched the kernel ending it. A kernel whose launch the trace lacks is charged to
    UNLAUNCHED rather than guessed.
    """
    lo, hi = window
    names = {name for _, _, name in PHASES} | {"model forward"}
    ranges = []
    for e in events:
        if e.get("cat") == "user_annotation" and lo <= e["ts"] < hi:
            name = e["name"] if e["name"] in names else detail_name(e["name"])
            if name is not None:
                ranges.append((e["ts"], e["ts"] + e["dur"], name))
    starts, labels = phase_segments(ranges, frozenset(name for _, _, name in ranges) - names)

    def phase_at(t: float) -> str:
        i = bisect.bisect_right(starts, t) - 1
        return labels[i] if i >= 0 else OTHER

    launched = {
        e["args"]["correlation"]: e["ts"]
        for e in events
        if e.get("cat") in LAUNCH_CATEGORIES and "correlation" in e.get("args", {})
    }
    kernels = sorted(
        (
            (e["ts"], e["ts"] + e["dur"], launched.get(e.get("args", {}).get("correlation")))
            for e in events
            if e.get("cat") in GPU_CATEGORIES and e.get("ph") == "X" and lo <= e["ts"] < hi
        ),
        key=lambda kernel: kernel[:2],
    )
    table: dict[str, dict[str, float]] = defaultdict(lambda: dict(busy_ms=0.0, idle_ms=0.0, syncs=0, sync_wait_ms=0.0))
    covered = lo  # the GPU is busy (with some kernel) up to here
    for start, end, launch in kernels:
        row = table[UNLAUNCHED if launch is None else phase_at(launch)]
        if start > covered:
            row["idle_ms"] += (start - covered) / 1e3
        row["busy_ms"] += max(0.0, min(end, hi) - max(start, covered)) / 1e3
        covered = max(covered, end)
    if hi > covered:
        table[OTHER]["idle_ms"] += (hi - covered) / 1e3
    for e in events:
        if e.get("cat") == "cuda_runtime" and e.get("name") in SYNC_CALLS and lo <= e["ts"] < hi:
            row = table[phase_at(e["ts"])]
            row["syncs"] += 1
            row["sync_wait_ms"] += e["dur"] / 1e3
    return dict(table)


def format_phase_table(table: dict[str, dict[str, float]], wall_ms: float) -> str:
    """Markdown rows, costliest phase (busy + idle) first, with totals."""
    lines = [
        "| phase | GPU busy (ms) | GPU idle before its kernels (ms) | host syncs | CPU waiting in them (ms) |",
        "|---|---|---|---|---|",
    ]
    for name, row in sorted(table.items(), key=lambda kv: -(kv[1]["busy_ms"] + kv[1]["idle_ms"])):
        lines.append(
            f"| {name} | {row['busy_ms']:.1f} | {row['idle_ms']:.1f} | {row['syncs']:.0f} | {row['sync_wait_ms']:.1f} |"
        )
    busy = sum(r["busy_ms"] for r in table.values())
    idle = sum(r["idle_ms"] for r in table.values())
    lines.append(f"| **total** (step {wall_ms:.0f} ms) | {busy:.1f} | {idle:.1f} | | |")
    return "\n".join(lines)


def phase_table(trace: Path, step_range: str, wall_ms: float) -> str:
    """The phase table of a Chrome trace whose step ran inside the profiler range `step_range`."""
    events = json.loads(trace.read_text())["traceEvents"]
    step = next(e for e in events if e.get("cat") == "user_annotation" and e.get("name") == step_range)
    return format_phase_table(time_by_phase(events, (step["ts"], step["ts"] + step["dur"])), wall_ms)
