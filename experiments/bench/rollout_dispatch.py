"""How long a trainer waits for each batch of rollouts when it drops some groups, with no trainer.

    python3 -m experiments.bench.rollout_dispatch --model DIR [--device cpu|cuda] [--steps 12]
        [--groups 64] [--group-size 8] [--max-new 96] [--accept 0.6] [--train-seconds 0.7]
        [--decoder auto|hf|static] [--trainer sleep|busy] [--server-args='--batching static']
        [--work DIR] [--trace]

A time-to-accuracy row D step is: `prepare_batch` (the wait for rollouts), the update, the weight
push. Dynamic sampling (`skip_uniform_groups`) drops each group whose completions all scored the
same and samples more puzzles until the batch is full. This runs that loop with the update and
the push replaced by a sleep of --train-seconds between a pause and a resume of the dispatcher
(the version set as a push sets it), so what it times is AReaL's dispatcher, the rollout client
and the dev server alone. With --trainer busy the update instead runs Python for --train-seconds
with the dispatcher running, as a small model's update does (its kernel launches hold the
interpreter's lock that the rollout client, a thread of the trainer's process under the local
launcher, needs), and only the push, a pause and a resume, stops it. Which groups are dropped is
drawn from each puzzle's prompt (a share --accept kept), so every run drops the same ones,
whatever the model writes: a tiny model with random weights does. The project's AReaL fixes are
applied as in train.py; AREAL_PATCHES_SKIP turns any off. A dev server that stops answering ends
the bench, in one line, once it has been silent SERVER_GRACE_S. Prints one row: steps, the wait a
step (median and mean), `prepare_batch`'s rounds a step and those whose wait for results ran out
of time (AReaL's round waits at most 1 s, then queues more), episodes started a step, and from
the dev server's log (kept in --work) its busy share and idle gaps over 0.3 s.
"""

from __future__ import annotations

import argparse
import functools
import json
import shlex
import statistics
import time
import zlib
from pathlib import Path

import countdown
from areal_patches import clean_exit, server_watchdog
from devkit.dev_server.client import serve
from experiments.bench import hold_the_interpreter, model_folder
from experiments.bench.pause_windows import read_server_log, summary

SERVER_GRACE_S = 30.0


def kept(accept: float, group: dict) -> bool:
    """Whether dynamic sampling keeps this group: a fixed draw from its prompt's tokens (those of
    its first completion before the loss mask starts: after it come the completion and padding)."""
    mask = group["loss_mask"][0]
    prompt = group["input_ids"][0][: int(mask.argmax()) if mask.any() else len(mask)]
    return zlib.crc32(prompt.numpy().tobytes()) % 1000 < accept * 1000


def timing_rounds(dispatcher, rounds: list[tuple[float, bool]]) -> None:
    """Record each of `prepare_batch`'s rounds on this dispatcher: (seconds waited for results,
    whether the round's wait ran out). AReaL's round waits at most 1 s for the results it still
    needs, then queues more and waits again."""
    wait_results = dispatcher.wait_results

    def timed(count, timeout=None, raise_timeout=True):
        started = time.perf_counter()
        try:
            results = wait_results(count, timeout, raise_timeout)
        except TimeoutError:
            rounds.append((time.perf_counter() - started, True))
            raise
        rounds.append((time.perf_counter() - started, False))
        return results

    dispatcher.wait_results = timed


def run_steps(addr: str, model: Path, args: argparse.Namespace) -> dict:
    """The wait for each step's batch, its rounds, and the dispatcher's counts at the end."""
    import areal_patches
    from areal.api.cli_args import GenerationHyperparameters, InferenceEngineConfig
    from areal.engine import RemoteSGLangEngine
    from torchdata.stateful_dataloader import StatefulDataLoader

    areal_patches.apply()  # as train.py's main() does in the trainer's process
    # the rollout settings of experiments/learning_run.py's rows
    engine = RemoteSGLangEngine(InferenceEngineConfig(
        backend="sglang:d1", max_concurrent_rollouts=2 * args.groups * args.group_size,
        consumer_batch_size=args.groups, max_head_offpolicyness=args.offpolicyness,
        enable_rollout_tracing=args.trace,
    ))  # fmt: skip
    engine.initialize(addr=addr)
    puzzles = countdown.generate_puzzles(args.groups * (args.steps + args.offpolicyness + 8), seed=args.seed)
    loader = StatefulDataLoader(puzzles, batch_size=args.groups, shuffle=False, collate_fn=lambda batch: batch)
    gconfig = GenerationHyperparameters(n_samples=args.group_size, max_new_tokens=args.max_new, temperature=1.0)
    waits, step_rounds, rounds = [], [], []
    timing_rounds(engine.workflow_executor.dispatcher, rounds)
    try:
        for step in range(args.steps):
            rounds.clear()
            started = time.perf_counter()
            batch = engine.prepare_batch(loader, workflow="train.CountDownWorkflow",
                                         workflow_kwargs=dict(gconfig=gconfig, tokenizer=str(model)),
                                         should_accept_fn=functools.partial(kept, args.accept),
                                         group_size=args.group_size)  # fmt: skip
            waits.append(time.perf_counter() - started)
            step_rounds.append(list(rounds))
            assert len(batch) == args.groups, len(batch)
            if args.trainer == "busy":
                hold_the_interpreter(args.train_seconds)
            engine.pause()  # what a push does around its load; for --trainer sleep, the whole update too
            if args.trainer == "sleep":
                time.sleep(args.train_seconds)
            engine.set_version(step + 1)
            engine.resume()
            timed_out = sum(ran_out for _, ran_out in rounds)
            print(f"step {step + 1}/{args.steps}: waited {waits[-1]:.2f} s in {len(rounds)} rounds, "
                  f"{timed_out} of them ran out of time", flush=True)
        stats = engine.workflow_executor.staleness_manager.get_stats()
    finally:
        engine.destroy()
    return {"waits": waits, "rounds": step_rounds,
            "accepted": stats.accepted, "rejected": stats.rejected, "running": stats.running}


def row(label: str, result: dict, server: dict, args: argparse.Namespace) -> str:
    waits = result["waits"][1:]  # the first step also loads the workflow and its tokenizer
    rounds = result["rounds"][1:]
    ran_out = [seconds for step in rounds for seconds, timed_out in step if timed_out]
    groups = result["accepted"] + result["rejected"] + result["running"]
    return (f"| {label} | {len(waits)} | {statistics.median(waits):.2f} | {statistics.mean(waits):.2f} "
            f"| {sum(map(len, rounds)) / len(rounds):.1f} | {len(ran_out) / len(rounds):.2f} | {sum(ran_out) / len(rounds):.2f} "
            f"| {groups * args.group_size / len(result['waits']):.0f} | {server['busy_share']:.0%} "
            f"| {server['idle_gaps']} | {server['idle_in_gaps_s']:.1f} |")


HEADER = ("| run | steps timed | wait a step, median (s) | mean (s) | rounds a step | rounds that ran out of time a step "
          "| seconds in them a step | episodes started a step | server busy | idle gaps over 0.3 s | idle in them (s) |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=model_folder, required=True, help="a model folder with its tokenizer")
    parser.add_argument("--label", default="run", help="the row's name in the table")
    parser.add_argument("--device", default="cpu", help="the dev server's device")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--decoder", choices=["auto", "hf", "static"], default="auto",
                        help="the dev server's decoder (auto: CUDA graphs on a GPU, as in the rows; static on CPU "
                        "batches continuously as there)")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--groups", type=int, default=64, help="puzzles a batch")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new", type=int, default=96)
    parser.add_argument("--accept", type=float, default=0.6, help="the share of groups dynamic sampling keeps")
    parser.add_argument("--train-seconds", type=float, default=0.7, help="the update and the push")
    parser.add_argument("--trainer", choices=["sleep", "busy"], default="sleep",
                        help="sleep: the update and push slept with the dispatcher paused; busy: the update runs "
                        "Python with the dispatcher running")
    parser.add_argument("--offpolicyness", type=int, default=2, help="rollout.max_head_offpolicyness")
    parser.add_argument("--server-args", default="", help="more dev server flags, given with '=' as they start with --")
    parser.add_argument("--work", type=Path, default=Path("runs/rollout_dispatch"), help="where the server's log goes")
    parser.add_argument("--trace", action="store_true", help="rollout.enable_rollout_tracing")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    server_log = args.work / "server.log"
    server_log.unlink(missing_ok=True)
    server_args = ["--decoder", args.decoder, *shlex.split(args.server_args)]
    with serve(args.model, device=args.device, dtype=args.dtype, max_batch=2 * args.groups * args.group_size,
               log_file=server_log, timeout=600, extra_args=server_args) as addr:  # fmt: skip
        # AReaL's client retries a dead server's requests for ever: end the bench instead.
        server_watchdog.watch([addr], grace=SERVER_GRACE_S, interval=2.0, on_dead=lambda _: clean_exit.end_now(
            f"rollout_dispatch: the dev server at {addr} has not answered /health for {SERVER_GRACE_S:.0f} s; "
            f"its log: {server_log}"))  # fmt: skip
        result = run_steps(addr, args.model, args)
    server = summary(read_server_log(server_log.read_text(errors="replace")))
    (args.work / "result.json").write_text(json.dumps({"args": vars(args) | {"model": str(args.model), "work": str(args.work)},
                                                       **result, "server": server}, indent=1))  # fmt: skip
    print(HEADER)
    print(row(args.label, result, server, args))


if __name__ == "__main__":
    main()
