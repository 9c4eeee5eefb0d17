"""The fixed costs of AReaL's GRPO update, counted on CPU: aten ops, host syncs and CPU time by phase.

    python3 -m experiments.bench.update_overheads [--shape tiny] [--seqs 512] [--setting row-d|shipped]
                                                  [--steps 2] [--sites] [--ab FIX]

At the 25M model's size a GPU step is mostly fixed costs: kernel launches, host syncs and the
Python around them. Those do not depend on the model's size, so they are counted here on CPU,
on a small model (`tiny` by default; the shapes of experiments/bench/gpu/train_step.py) and the
batch of the time-to-accuracy rows: groups of 8 completions of one 130-token prompt, 60-140
completion tokens each (~100), one reward each, completion tokens from the last three policy
versions (an asynchronous run). One step is what AReaL's trainer times: compute_logp (when the
setting recomputes the proximal log-probs), compute_advantages, then ppo_update and the
learning-rate step (`timeperf/train_step`); then the export of the step's statistics, which
the trainer does after it.

Settings: `row-d` is experiments/learning_run.py's GRPO phase, which the time-to-accuracy rows
run (2 minibatches, each one micro-batch, no gradient checkpointing, `prox_logp_method:
loglinear`, so no compute_logp); `shipped` is train_config.yaml (4 minibatches, 24k-token
micro-batches, checkpointing, the proximal log-probs recomputed). Weights are float32 on CPU.

Counted with a TorchDispatchMode during one step after a warm-up step, by the innermost phase
running (the table's phases are exclusive: "train_batch" is what train_batch does beside the
phases inside it):

- aten ops: the operators the dispatcher runs below autograd, views and allocations left
  out, about one GPU kernel each (an op on a DTensor, the optimizer's, counts once);
- host syncs: what makes the host wait for the GPU on CUDA: `.item()`, `float()`/`bool()` of
  a tensor, `nonzero`, boolean-mask indexing and assignment, `masked_select`, `unique`,
  `repeat_interleave` without an output size, `equal`, and `.tolist()`, `.cpu()`, `.numpy()`
  of a tensor. Some of the last three read tensors that would be on the host in a GPU run
  too (a DeviceMesh's reads of its own host tensor are left out); `--sites` lists where each sync comes from, to tell them apart.

--ab FIX measures twice in one process: with the fix FIX of areal_patches skipped (upstream's
code for that part), then with it installed, and prints both side by side.

CPU seconds are the mean exclusive time of each phase over --steps further steps, without the
counting. On CPU they include the arithmetic, which a GPU does in a fraction of the time.
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field

from devkit import ROOT

GROUP = 8
PROMPT_LEN = 130
COMPLETION_LENS = (60, 140)  # uniform, inclusive: ~100 tokens, as the 25M model's completions
SETTINGS = {
    "row-d": ["actor.ppo_n_minibatches=2", "actor.gradient_checkpointing=false",
              "actor.mb_spec.max_tokens_per_mb=131072", "actor.prox_logp_method=loglinear"],
    "shipped": [],
}  # fmt: skip
SYNC_OPS = {"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::unique_consecutive",
            "aten::_unique2", "aten::unique_dim", "aten::equal", "aten::is_nonzero"}  # fmt: skip
NO_KERNEL = {"aten::empty", "aten::empty_strided", "aten::lift_fresh", "aten::detach", "aten::alias", "aten::_unsafe_view"}
HOST_CALLERS = "torch/distributed/device_mesh.py"  # reads its mesh, a host tensor
PROJECT_CODE = ("/areal/", "/areal_patches/", "/transformers/", "/train.py")


@dataclass
class Tally:
    ops: int = 0
    syncs: int = 0
    seconds: list[float] = field(default_factory=list)
    sites: collections.Counter = field(default_factory=collections.Counter)


class Phases:
    """A stack of named phases; each phase's exclusive time, ops and syncs."""

    def __init__(self) -> None:
        self.stack = ["other"]
        self.tally: dict[str, Tally] = collections.defaultdict(Tally)
        self.clock: dict[str, float] = collections.defaultdict(float)
        self.mark = time.perf_counter()

    def current(self) -> str:
        return self.stack[-1]

    def _charge(self) -> None:
        now = time.perf_counter()
        self.clock[self.current()] += now - self.mark
        self.mark = now

    @contextmanager
    def phase(self, name: str):
        self._charge()
        self.stack.append(name)
        try:
            yield
        finally:
            self._charge()
            self.stack.pop()

    def enter(self, name: str) -> None:
        self._charge()
        self.stack.append(name)

    def leave(self) -> None:
        self._charge()
        self.stack.pop()

    def lap(self) -> dict[str, float]:
        """Each phase's exclusive seconds since the last lap."""
        self._charge()
        out, self.clock = dict(self.clock), collections.defaultdict(float)
        return out


PHASES = Phases()


def wrap(owner, attr: str, name: str) -> None:
    """`owner.attr` runs inside phase `name`."""
    fn = getattr(owner, attr)

    @functools.wraps(fn)  # a fix installed later still sees the signature it replaces
    def phased(*args, **kwargs):
        with PHASES.phase(name):
            return fn(*args, **kwargs)

    phased.phased = True
    setattr(owner, attr, phased)


def call_site() -> str:
    """The innermost frame of AReaL, the project's fixes or transformers that led here."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if any(part in frame.filename for part in PROJECT_CODE):
            path = frame.filename.split("site-packages/")[-1].removeprefix(f"{ROOT}/")
            return f"{path}:{frame.lineno} {frame.name}"
    return "?"


def from_host_code() -> bool:
    """Whether a DeviceMesh is reading its own mesh, a host tensor (no sync on a GPU)."""
    frame = sys._getframe(2)
    while frame is not None:
        if HOST_CALLERS in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def is_sync(func, args) -> bool:
    import torch

    name = func._schema.name
    if name in SYNC_OPS:
        return True
    if name == "aten::repeat_interleave" and func._overloadname.startswith("Tensor"):
        return True
    if name in ("aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_"):
        return any(torch.is_tensor(i) and i.dtype in (torch.bool, torch.uint8) for i in args[1] if i is not None)
    return False


def counting_mode():
    """A TorchDispatchMode that charges every op to the current phase: a sync or a kernel."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counting(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            tally = PHASES.tally[PHASES.current()]
            if is_sync(func, args) and not from_host_code():
                tally.syncs += 1
                tally.sites[call_site()] += 1
            elif not func.is_view and func._schema.name not in NO_KERNEL:
                tally.ops += 1
            return func(*args, **(kwargs or {}))

    return Counting()


@contextmanager
def counting_reads():
    """`.tolist()`, `.cpu()` and `.numpy()` of a tensor counted as syncs of the current phase
    (they run no aten op on a CPU tensor, so the dispatch mode cannot see them)."""
    import torch

    saved = {name: getattr(torch.Tensor, name) for name in ("tolist", "cpu", "numpy")}

    def counted(name: str, fn: Callable):
        def read(self, *args, **kwargs):
            if not from_host_code():
                tally = PHASES.tally[PHASES.current()]
                tally.syncs += 1
                tally.sites[f"{call_site()} .{name}()"] += 1
            return fn(self, *args, **kwargs)

        return read

    for name, fn in saved.items():
        setattr(torch.Tensor, name, counted(name, fn))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch.Tensor, name, fn)


def install_phases(actor) -> None:
    """Wraps the parts of AReaL's step (after areal_patches.apply(), so around the fixes)."""
    import torch
    from areal.engine.fsdp_engine import FSDPEngine
    from areal.trainer.ppo import actor as actor_module

    wrap(actor_module.PPOActor, "compute_logp", "compute_logp")
    wrap(actor_module.PPOActor, "compute_advantages", "compute_advantages")
    wrap(actor_module.PPOActor, "_ppo_update", "ppo_update: logging, split")
    wrap(actor_module, "grpo_loss_fn", "loss: statistics")
    wrap(actor_module, "ppo_actor_loss_fn", "loss: PPO objective")
    wrap(actor_module, "_log_proximal_approximation_stats", "loss: proximal statistics")
    wrap(actor_module, "_log_version_staleness_stats", "loss: staleness statistics")
    wrap(FSDPEngine, "train_batch", "train_batch: micro-batches, weights")
    wrap(FSDPEngine, "forward_backward_batch", "forward_backward: inputs, packing")
    wrap(FSDPEngine, "_compute_logprobs_and_loss", "log-probs, entropy")
    wrap(FSDPEngine, "_compute_forward_result", "log-probs, entropy")
    wrap(FSDPEngine, "optimizer_step", "optimizer step, clipping")
    wrap(FSDPEngine, "step_lr_scheduler", "lr scheduler")
    wrap(torch.Tensor, "backward", "backward")
    actor.model.register_forward_pre_hook(lambda *_: PHASES.enter("model forward"))
    actor.model.register_forward_hook(lambda *_: PHASES.leave())


def single_rank_environment() -> None:
    from devkit.processes import find_free_port

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(find_free_port()), TORCHDYNAMO_DISABLE="1")  # fmt: skip


def build_actor(shape: str, setting: str, n_seqs: int, skip: str | None = None):
    """experiments/bench/gpu/train_step.py's actor on CPU, with `setting`'s overrides."""
    from experiments.bench.gpu import train_step

    train_step.DEVICE = "cpu"
    return train_step.build_actor(shape, n_seqs, overrides=["actor.optimizer.lr=1e-5", *SETTINGS[setting]],
                                  skip={skip} if skip else frozenset())


def make_batch(n_seqs: int, vocab: int, version: int, seed: int = 0) -> list[dict]:
    """Groups of GROUP trajectories as train.py's workflow hands them over, concatenated per group."""
    import torch
    from areal.utils.data import concat_padded_tensors

    import train

    gen = torch.Generator().manual_seed(seed)
    groups = []
    for _ in range(n_seqs // GROUP):
        prompt = torch.randint(0, vocab, (PROMPT_LEN,), generator=gen).tolist()
        rewards = [0.0, 1.0] + torch.randint(0, 2, (GROUP - 2,), generator=gen).float().tolist()  # a spread
        items = []
        for reward in rewards:
            n_out = int(torch.randint(COMPLETION_LENS[0], COMPLETION_LENS[1] + 1, (1,), generator=gen))
            behind = int(torch.randint(0, 3, (1,), generator=gen))
            response = Response(prompt, torch.randint(0, vocab, (n_out,), generator=gen).tolist(),
                                (-torch.rand(n_out, generator=gen)).tolist(), max(version - behind, 0))  # fmt: skip
            items.append(train.trajectory(response, reward))
        groups.append(concat_padded_tensors(items))
    return groups


@dataclass
class Response:  # the fields of AReaL's ModelResponse that train.trajectory reads
    input_tokens: list[int]
    output_tokens: list[int]
    output_logprobs: list[float]
    version: int

    @property
    def input_len(self) -> int:
        return len(self.input_tokens)

    @property
    def output_len(self) -> int:
        return len(self.output_tokens)

    @property
    def output_versions(self) -> list[int]:
        return [self.version] * self.output_len


def grpo_step(actor, batch: list[dict]) -> None:
    """What AReaL's trainer runs between a rollout and the weight push (rl_trainer.py), then
    the statistics export, as the trainer calls it after the push."""
    if actor.config.should_compute_prox_logp():
        for group, logp in zip(batch, actor.compute_logp(batch)):
            group["prox_logp"] = logp
    actor.ppo_update(actor.compute_advantages(batch))
    actor.step_lr_scheduler()
    with PHASES.phase("stats export (after the step)"):
        actor.export_stats()


def measure(actor, shape: str, n_seqs: int, steps: int) -> dict[str, Tally]:
    """One warm-up step, one counted step, then `steps` timed steps; the tally by phase.
    Each step gets a fresh batch (AReaL's step changes it in place), built outside the
    counting and the clock."""
    from experiments.bench.gpu.train_step import SHAPES

    vocab = SHAPES[shape][5]
    for version in range(3, 5 + steps):
        batch = make_batch(n_seqs, vocab, version, seed=version)
        actor.set_version(version)
        if version == 4:
            PHASES.tally.clear()
            with counting_mode(), counting_reads():
                grpo_step(actor, batch)
            continue
        PHASES.lap()
        grpo_step(actor, batch)
        if version > 4:
            for name, seconds in PHASES.lap().items():
                PHASES.tally[name].seconds.append(seconds)
    return dict(PHASES.tally)


ORDER = ["compute_logp", "compute_advantages", "ppo_update: logging, split", "train_batch: micro-batches, weights",
         "forward_backward: inputs, packing", "model forward", "log-probs, entropy", "loss: PPO objective",
         "loss: statistics", "loss: proximal statistics", "loss: staleness statistics", "backward",
         "optimizer step, clipping", "lr scheduler", "other", "stats export (after the step)"]  # fmt: skip


def print_table(tally: dict[str, Tally], title: str) -> None:
    print(f"\n{title}\n\n| phase | aten ops | host syncs | CPU s |\n|---|---|---|---|")
    total = Tally()
    for name in [n for n in ORDER if n in tally] + [n for n in tally if n not in ORDER]:
        t = tally[name]
        seconds = statistics.mean(t.seconds) if t.seconds else 0.0
        if name == "other" and t.ops == t.syncs == 0:
            continue
        print(f"| {name} | {t.ops} | {t.syncs} | {seconds:.3f} |")
        if name != "stats export (after the step)":
            total.ops, total.syncs = total.ops + t.ops, total.syncs + t.syncs
            total.seconds.append(seconds)
    print(f"| **the step, without the export** | {total.ops} | {total.syncs} | {sum(total.seconds):.3f} |", flush=True)


def print_sites(tally: dict[str, Tally]) -> None:
    print("\n| phase | where | syncs |\n|---|---|---|")
    for name in [n for n in ORDER if n in tally]:
        for site, n in tally[name].sites.most_common():
            print(f"| {name} | `{site}` | {n} |")


def print_side_by_side(upstream: dict[str, Tally], fixed: dict[str, Tally], fix: str) -> None:
    print(f"\n| phase | aten ops, upstream | with {fix} | host syncs, upstream | with {fix} | CPU s, upstream | with {fix} |"
          "\n|---|---|---|---|---|---|---|")  # fmt: skip
    names = [n for n in ORDER if n in upstream or n in fixed]
    for name in names:
        a, b = upstream.get(name, Tally()), fixed.get(name, Tally())
        if (a.ops, a.syncs, b.ops, b.syncs) == (0, 0, 0, 0):
            continue
        seconds = [statistics.mean(t.seconds) if t.seconds else 0.0 for t in (a, b)]
        print(f"| {name} | {a.ops} | {b.ops} | {a.syncs} | {b.syncs} | {seconds[0]:.3f} | {seconds[1]:.3f} |")


def install_fix(fix: str) -> None:
    """Installs areal_patches' `fix` now; the phases it replaced are wrapped again."""
    import importlib

    from areal.trainer.ppo import actor as actor_module

    importlib.import_module(f"areal_patches.{fix}").install()
    if not getattr(actor_module._log_version_staleness_stats, "phased", False):
        wrap(actor_module, "_log_version_staleness_stats", "loss: staleness statistics")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="tiny", help="a shape of experiments/bench/gpu/train_step.py")
    parser.add_argument("--seqs", type=int, default=512, help="sequences per batch (a multiple of 8)")
    parser.add_argument("--setting", default="row-d", choices=list(SETTINGS))
    parser.add_argument("--steps", type=int, default=2, help="timed steps after the counted one")
    parser.add_argument("--sites", action="store_true", help="also list where each host sync comes from")
    parser.add_argument("--ab", metavar="FIX", help="a fix of areal_patches: measure without it, then with it")
    args = parser.parse_args(argv)
    single_rank_environment()
    actor = build_actor(args.shape, args.setting, args.seqs, skip=args.ab)
    install_phases(actor)
    title = f"{args.setting}, shape {args.shape}, {args.seqs} sequences: one step's ops and syncs, CPU seconds the mean of {args.steps} steps"
    tally = measure(actor, args.shape, args.seqs, args.steps)
    print_table(tally, title + (f", without {args.ab}" if args.ab else ""))
    if args.sites:
        print_sites(tally)
    if args.ab:
        install_fix(args.ab)
        PHASES.tally.clear()
        fixed = measure(actor, args.shape, args.seqs, args.steps)
        print_table(fixed, f"{title}, with {args.ab}")
        if args.sites:
            print_sites(fixed)
        print_side_by_side(tally, fixed, args.ab)
    actor.destroy()


if __name__ == "__main__":
    main(sys.argv[1:])
