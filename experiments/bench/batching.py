"""The dev server's batching, static against continuous, under a trainer's arrival pattern.

    python3 -m experiments.bench.batching --model DIR [--device cpu|cuda] [--groups 64]
        [--gap-ms 20] [--max-new 96] [--max-batch 512] [--repeats 1] [--json PATH]

An asynchronous RL trainer does not send its rollouts at once: each puzzle's group of
samples arrives when the trainer's dispatcher submits it, one group after another. This
starts the dev server once per batching mode (`--batching static`, then `continuous`, with
the static decoder) and sends the same workload to each: `--groups` groups of `--group-size`
sampled requests sharing a Countdown prompt, a group every `--gap-ms`, each request with its
own token budget drawn between a quarter of `--max-new` and `--max-new` (completions differ
in length; with random weights nearly every row runs to its budget). Printed side by side:
the time to serve the whole workload, output tokens a second, and how long a group waits
from its submission to its last answer (what a rollout waits for), mean and 90th
percentile, and the server's batches. `--repeats N` alternates the modes N times, so a
machine's drift reaches both.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import countdown
from devkit.dev_server import client
from experiments.bench import model_folder

MODES = ("static", "continuous")


def workload(model: Path, groups: int, group_size: int, max_new: int, seed: int) -> list[list[dict]]:
    """One /generate payload per request, by group: a Countdown prompt per group, sampled,
    each request with its own budget."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    rng = random.Random(seed)
    puzzles = countdown.generate_puzzles(groups, seed=seed)
    return [[{"input_ids": countdown.prompt_token_ids(tokenizer, p["messages"]),
              "sampling_params": {"max_new_tokens": rng.randint(max(1, max_new // 4), max_new),
                                  "temperature": 1.0, "ignore_eos": False}}
             for _ in range(group_size)]
            for p in puzzles]  # fmt: skip


def run_mode(mode: str, model: Path, device: str, dtype: str, max_batch: int, groups: list[list[dict]],
             gap_s: float) -> dict:
    """Serve `groups` with one batching mode: its wall time, tokens and group latencies."""
    args = ["--decoder", "static", "--batching", mode]
    with client.DevServer(model, device=device, dtype=dtype, max_batch=max_batch, extra_args=args) as server:
        client.http_json(server.addr, "/generate", groups[0][0])  # warm-up: kernels, the first graph
        waits: list[float] = []
        tokens = [0]
        lock = threading.Lock()

        def send_group(group: list[dict], pool: ThreadPoolExecutor) -> None:
            sent = time.perf_counter()
            outs = [f.result() for f in [pool.submit(client.http_json, server.addr, "/generate", r, None, 600)
                                         for r in group]]
            with lock:
                waits.append(time.perf_counter() - sent)
                tokens[0] += sum(len(o["output_ids"]) for o in outs)

        started = time.perf_counter()
        with ThreadPoolExecutor(len(groups) * len(groups[0])) as pool, ThreadPoolExecutor(len(groups)) as senders:
            futures = []
            for i, group in enumerate(groups):
                time.sleep(max(0.0, started + i * gap_s - time.perf_counter()))
                futures.append(senders.submit(send_group, group, pool))
            for f in futures:
                f.result()
        seconds = time.perf_counter() - started
        batches = batches_served(server.addr, 1 + sum(map(len, groups))) - 1  # less the warm-up's
    waits.sort()
    return {"batching": mode, "requests": sum(map(len, groups)), "seconds": round(seconds, 2),
            "output_tokens": tokens[0], "tokens_per_s": round(tokens[0] / seconds),
            "group_wait_mean_s": round(statistics.fmean(waits), 3),
            "group_wait_p90_s": round(waits[int(0.9 * (len(waits) - 1))], 3), "batches": batches}


def batches_served(addr: str, requests: int, timeout: float = 30.0) -> int:
    """The server's batch count once it has counted `requests` (it counts a batch after
    answering it, so the last answer can come first)."""
    deadline = time.monotonic() + timeout
    while True:
        info = client.http_json(addr, "/get_server_info")
        if info["num_requests"] >= requests or time.monotonic() > deadline:
            return info["num_batches"]
        time.sleep(0.05)


def table(rows: list[dict]) -> str:
    lines = ["| batching | requests | seconds | output tokens/s | group wait, mean / p90 (s) | batches |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['batching']} | {r['requests']} | {r['seconds']:.2f} | {r['tokens_per_s']:,} | "
              f"{r['group_wait_mean_s']:.3f} / {r['group_wait_p90_s']:.3f} | {r['batches']} |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=model_folder, required=True, help="a Qwen2 or Llama folder with its tokenizer")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on a GPU, float32 on CPU")
    parser.add_argument("--groups", type=int, default=64)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--gap-ms", type=float, default=20.0, help="between two groups' submissions")
    parser.add_argument("--max-new", type=int, default=96)
    parser.add_argument("--max-batch", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=1, help="run the modes in turn this many times")
    parser.add_argument("--json", type=Path, help="write the rows here too")
    args = parser.parse_args(argv)
    dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    groups = workload(args.model, args.groups, args.group_size, args.max_new, args.seed)
    rows = []
    for repeat in range(args.repeats):
        for mode in MODES:
            print(f"[batching] {mode} ({repeat + 1}/{args.repeats}): {args.groups} groups of {args.group_size}, "
                  f"one every {args.gap_ms:g} ms", flush=True)
            rows.append(run_mode(mode, args.model, args.device, dtype, args.max_batch, groups, args.gap_ms / 1000))
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps({"settings": vars(args) | {"model": str(args.model), "json": None},
                                         "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
