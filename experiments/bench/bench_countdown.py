"""Puzzle generation rate (generate + write JSONL), against drawing a target and
searching for a solution (the upstream AReaL method), and a look at the targets.
Wall-clock and CPU rates are both shown: they differ when the machine is busy.

    python3 experiments/bench/bench_countdown.py [--n 100000]
"""

import argparse
import random
import tempfile
import time
from collections import Counter
from pathlib import Path

from countdown import generate_puzzles, make_row, solve, write_jsonl


def generate_and_write(n: int, folder: Path, **settings) -> list[dict]:
    rows = generate_puzzles(n, seed=0, **settings)
    write_jsonl([(folder / "puzzles.jsonl", rows)])
    return rows


def draw_and_search(n: int, folder: Path) -> list[dict]:
    """The upstream way: random numbers and target, keep it if a search solves it."""
    rng, rows = random.Random(0), []
    while len(rows) < n:
        nums = [rng.randint(1, 99) for _ in range(rng.randint(3, 4))]
        target = rng.randint(10, 100)
        solution = solve(nums, target)
        if solution is not None:
            rows.append(make_row(nums, target, solution))
    write_jsonl([(folder / "searched.jsonl", rows)])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="puzzles for the 3-4 number run")
    args = parser.parse_args()
    runs = [
        ("random expression trees, 3-4 numbers", lambda d: generate_and_write(args.n, d)),
        ("random expression trees, 5-6 numbers", lambda d: generate_and_write(args.n // 5, d, min_numbers=5, max_numbers=6)),
        ("random expression trees, 2 numbers", lambda d: generate_and_write(5_000, d, min_numbers=2, max_numbers=2)),
        ("draw + exhaustive search, 3-4 numbers", lambda d: draw_and_search(2_000, d)),
    ]
    print("## Generation + JSONL writing (numbers 1..99, targets 10..100)\n")
    print("| method | puzzles | seconds | puzzles/s | puzzles/CPU-s |")
    print("|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, run in runs:
            start, cpu_start = time.perf_counter(), time.process_time()
            rows = run(Path(tmp))
            seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
            print(f"| {name} | {len(rows):,} | {seconds:.2f} | {len(rows) / seconds:,.0f} | {len(rows) / cpu:,.0f} |")
            if name.endswith("3-4 numbers") and name.startswith("random"):
                default_rows = rows

    n = len(default_rows)
    deciles = Counter(min((row["target"] - 10) // 10, 8) for row in default_rows)
    print(f"\n## Targets of the {n:,} default puzzles\n")
    print("| targets | " + " | ".join(f"{10 + 10 * i}-{19 + 10 * i if i < 8 else 100}" for i in range(9)) + " |")
    print("|---|" + "---:|" * 9)
    print("| share | " + " | ".join(f"{deciles[i] / n:.1%}" for i in range(9)) + " |")
    sizes = Counter(len(row["nums"]) for row in default_rows)
    ops = Counter(c for row in default_rows for c in row["solution"] if c in "+-*/")
    print(f"\nnumbers per puzzle: {', '.join(f'{k}: {v / n:.1%}' for k, v in sorted(sizes.items()))}")
    print(f"target = sum of all numbers: {sum(sum(r['nums']) == r['target'] for r in default_rows) / n:.1%}")
    print(f"target is one of the numbers: {sum(r['target'] in r['nums'] for r in default_rows) / n:.1%}")
    print(f"operators in stored solutions: {', '.join(f'{k} {v / ops.total():.0%}' for k, v in ops.most_common())}")


if __name__ == "__main__":
    main()
