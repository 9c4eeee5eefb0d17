"""Dev-server decoding on one GPU: transformers' eager forward against devkit/dev_server/static_decode.py.

    python3 -m experiments.bench.gpu.decode [--model PATH] [--batches 1 64 512 1024] [--new-tokens 128]
                                [--check 512] [--json PATH] [--device cuda]

Both decoders run in this process through the dev server's own Engine (what the HTTP
server calls for a batch), in bfloat16 on the same weights: --model (e.g. the learning
run's warm start) or, by default, the `small` preset with random weights built here.

Speed: one batch per size, 3-4 number Countdown prompts (~90 tokens), --new-tokens sampled
tokens per row (ignore_eos, so every row runs to the end), after one untimed batch of
the same size (it captures the CUDA graph). Reported: milliseconds per decode step
(batch time / new tokens, prefill included) and tokens per second.

Agreement: --check held-out puzzles decoded greedily (256 new tokens, stopping at EOS) by
both decoders, and by the static decoder with continuous batching (a quarter of the puzzles
start the batch, the others join it 16 a decode step, into the rows others leave): how many
completions are identical to transformers', the largest log-prob difference on identical
ones, and the success rate (reward_score.py) of each, which must agree for the fast decoder
to stand in for the slow one in evaluations and rollouts.
"""

from __future__ import annotations

import argparse
import itertools
import json
import tempfile
import time
from collections import deque
from pathlib import Path

import torch

import countdown
from devkit.dev_server.continuous import ContinuousBatch
from devkit.dev_server.engine import Engine
from devkit.dev_server.protocol import GenRequest, SamplingParams
from reward_score import SOLVED_SCORE, compute_score
from devkit.make_tiny_model import make_tiny_model


def requests(prompts: list[list[int]], params: SamplingParams) -> list[GenRequest]:
    return [GenRequest(rid=str(i), input_ids=p, params=params, return_logprob=True,
                       logprob_start_len=-1, loop=None, future=None) for i, p in enumerate(prompts)]


def run_batch(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> tuple[list[dict], float]:
    start = time.perf_counter()
    out = engine.generate_batch(engine.model, requests(prompts, params), should_abort=lambda: False)
    return out, time.perf_counter() - start  # the results are on the host: the GPU is done


def speed(engine: Engine, prompts: list[list[int]], batches: list[int], new_tokens: int) -> dict[int, float]:
    """Seconds per batch of each size (one warm-up batch first)."""
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, ignore_eos=True)
    seconds = {}
    for n in batches:
        rows = [prompts[i % len(prompts)] for i in range(n)]
        run_batch(engine, rows, params)
        seconds[n] = run_batch(engine, rows, params)[1]
    return seconds


def run_continuous(engine: Engine, prompts: list[list[int]], params: SamplingParams, joining: int = 16) -> list[dict]:
    """The prompts through one continuous batch: a quarter start it, the rest join `joining`
    a decode step."""
    reqs = requests(prompts, params)
    start = max(1, len(reqs) // 4)
    arriving, waiting, answers = iter(reqs[start:]), deque(), {}

    def take(room: int, fits) -> list[GenRequest]:
        waiting.extend(itertools.islice(arriving, joining))
        taken = []
        while waiting and len(taken) < room and fits(waiting[0]):
            taken.append(waiting.popleft())
        return taken

    def answer(req: GenRequest, res: dict) -> None:
        answers[req.rid] = res

    ContinuousBatch(engine, engine.model, take, answer, should_abort=lambda: False).run(reqs[:start])
    return [answers[r.rid] for r in reqs]


def agreement(engines: dict[str, Engine], tokenizer, rows: list[dict]) -> dict:
    params = SamplingParams(max_new_tokens=256, temperature=0.0)
    prompts = [countdown.prompt_token_ids(tokenizer, r["messages"]) for r in rows]
    outs = {name: run_batch(e, prompts, params)[0] for name, e in engines.items()}
    outs["continuous"] = run_continuous(engines["static"], prompts, params)
    result = {"puzzles": len(rows)}
    for name in ("static", "continuous"):
        same = [a["output_ids"] == b["output_ids"] for a, b in zip(outs["hf"], outs[name])]
        diffs = [abs(x - y) for a, b, s in zip(outs["hf"], outs[name], same) if s
                 for x, y in zip(a["logprobs"], b["logprobs"])]
        result[name] = {"identical": sum(same), "max_abs_logprob_diff": max(diffs, default=0.0)}
    result["success"] = {
        name: sum(compute_score(tokenizer.decode(o["output_ids"], skip_special_tokens=True), r) == SOLVED_SCORE
                  for o, r in zip(out, rows)) / len(rows)
        for name, out in outs.items()
    }  # fmt: skip
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="HF model folder (default: the small preset, random weights)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64, 512, 1024])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--check", type=int, default=512, help="puzzles for the agreement check (0: skip)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--device", default="cuda", help="cpu runs the static decoder without graphs (a smoke test)")
    args = parser.parse_args()
    model = args.model or make_tiny_model(Path(tempfile.mkdtemp()) / "small", preset="small", verbose=False)
    engines = {
        name: Engine(str(model), args.device, "bfloat16", seed=0, decoder=name, max_batch=max(args.batches))
        for name in ("hf", "static")
    }  # fmt: skip
    tokenizer = engines["hf"].tokenizer
    rows = countdown.generate_puzzles(max(args.check, 64), seed=12345)
    prompts = [countdown.prompt_token_ids(tokenizer, r["messages"]) for r in rows]
    gpu = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    results = {"gpu": gpu, "model": str(args.model or "small preset, random weights"),
               "new_tokens": args.new_tokens, "seconds": {}}  # fmt: skip
    for name, engine in engines.items():
        results["seconds"][name] = speed(engine, prompts, args.batches, args.new_tokens)
    print(f"\n{results['gpu']}, {results['model']}, bf16, {args.new_tokens} new tokens per row\n")
    print("| rows | hf ms/step | static ms/step | hf tokens/s | static tokens/s | speed-up |")
    print("|---|---|---|---|---|---|")
    for n in args.batches:
        hf, st = results["seconds"]["hf"][n], results["seconds"]["static"][n]
        ms = 1000 / args.new_tokens
        print(f"| {n} | {hf * ms:.2f} | {st * ms:.2f} | {n * args.new_tokens / hf:,.0f} | "
              f"{n * args.new_tokens / st:,.0f} | {hf / st:.1f}x |")
    if args.check:
        results["agreement"] = check = agreement(engines, tokenizer, rows[: args.check])
        for name in ("static", "continuous"):
            print(f"greedy, {check['puzzles']} puzzles, {name} against hf: {check[name]['identical']} identical "
                  f"completions, max |logprob diff| on those {check[name]['max_abs_logprob_diff']:.4f}")
        print("success: " + ", ".join(f"{name} {rate:.1%}" for name, rate in check["success"].items()))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
