"""The CPU that AReaL's rollout client spends on each episode, in the process that runs it.

    python3 -m experiments.bench.rollout_client --model DIR [--groups 64] [--group-size 8]
        [--max-new 96] [--repeats 3] [--device cpu|cuda] [--trainer idle|busy]

Under AReaL's local launcher, as in the time-to-accuracy rows, the rollout client runs in the
trainer's own process, in a thread beside the update: for every episode of
`train.CountDownWorkflow` it renders the prompt through the chat template, sends the request to
a server, decodes and scores the completion and builds its tensors, and AReaL's dispatcher
gathers the episodes into groups. That work holds the interpreter's lock, which the update's
own kernel launches need too. This runs the same client, with the project's AReaL fixes, on
batches of --groups x --group-size episodes against the dev server, a process of its own whose
CPU is not counted, and prints for each batch its seconds, the client process's CPU seconds
(user and system, every thread) and the CPU an episode. The first batch also pays for
loading the workflow and its tokenizer. With --trainer busy, a thread runs Python while each
batch runs, as the update of a small model does (its kernel launches hold the lock), and its
own CPU is left out of the client's: the batch's seconds then show how long the client takes
to get its turns.
"""

from __future__ import annotations

import argparse
import contextlib
import threading
import time
from pathlib import Path

import countdown
from devkit.dev_server.client import serve
from experiments.bench import hold_the_interpreter, model_folder


class BusyTrainer:
    """A thread that runs Python from `with` to its end, and the CPU seconds it took."""

    def __enter__(self):
        self.stop, self.cpu_s = threading.Event(), 0.0
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()
        return self

    def run(self) -> None:
        cpu = time.thread_time()
        hold_the_interpreter(float("inf"), self.stop)
        self.cpu_s = time.thread_time() - cpu

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


def measure(addr: str, model: Path, groups: int, group_size: int, max_new: int, repeats: int,
            seed: int, busy_trainer: bool = False) -> list[dict]:
    """One row a batch: the client's wall and CPU seconds for `groups` puzzles of `group_size`
    sampled episodes each, through AReaL's RemoteSGLangEngine and train.CountDownWorkflow, with
    a thread running Python beside it if `busy_trainer`."""
    import areal_patches
    from areal.api.cli_args import GenerationHyperparameters, InferenceEngineConfig
    from areal.engine import RemoteSGLangEngine

    areal_patches.apply()  # as train.py's main() does in the trainer's process
    engine = RemoteSGLangEngine(InferenceEngineConfig(
        backend="sglang:d1", max_concurrent_rollouts=groups * group_size, consumer_batch_size=groups,
        max_head_offpolicyness=10**6,  # no trainer here: never hold rollouts back
    ))  # fmt: skip
    engine.initialize(addr=addr)
    gconfig = GenerationHyperparameters(n_samples=group_size, max_new_tokens=max_new, temperature=1.0)
    puzzles = countdown.generate_puzzles(groups * repeats, seed=seed)
    rows = []
    try:
        for i in range(repeats):
            trainer = BusyTrainer() if busy_trainer else contextlib.nullcontext()
            started, cpu = time.perf_counter(), time.process_time()
            with trainer:
                done = engine.rollout_batch(puzzles[i * groups:(i + 1) * groups], workflow="train.CountDownWorkflow",
                                            workflow_kwargs=dict(gconfig=gconfig, tokenizer=str(model)),
                                            group_size=group_size)  # fmt: skip
            seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
            cpu -= trainer.cpu_s if busy_trainer else 0.0
            episodes = sum(int(group["input_ids"].shape[0]) for group in done)
            tokens = sum(int(group["loss_mask"].sum()) for group in done)
            rows.append({"batch": i + 1, "episodes": episodes, "output_tokens": tokens,
                         "seconds": round(seconds, 2), "client_cpu_s": round(cpu, 3),
                         "client_cpu_ms_per_episode": round(1000 * cpu / episodes, 3)})  # fmt: skip
    finally:
        engine.destroy()
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| batch | episodes | output tokens | seconds | client CPU (s) | client CPU an episode (ms) |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['batch']} | {r['episodes']} | {r['output_tokens']:,} | {r['seconds']:.2f} | "
              f"{r['client_cpu_s']:.3f} | {r['client_cpu_ms_per_episode']:.3f} |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=model_folder, required=True, help="a model folder with its tokenizer")
    parser.add_argument("--device", default="cpu", help="the dev server's device")
    parser.add_argument("--groups", type=int, default=64)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trainer", choices=["idle", "busy"], default="idle",
                        help="busy: a thread runs Python beside the client, as a small model's update does")
    args = parser.parse_args(argv)
    dtype = "float32" if args.device == "cpu" else "bfloat16"
    with serve(args.model, device=args.device, dtype=dtype, max_batch=args.groups * args.group_size) as addr:
        rows = measure(addr, args.model, args.groups, args.group_size, args.max_new, args.repeats, args.seed,
                       busy_trainer=args.trainer == "busy")
    print(table(rows))


if __name__ == "__main__":
    main()
