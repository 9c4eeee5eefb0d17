"""Which steps of a run's `curves.csv` log rollout scalars that no one set of episodes gives.

    python3 -m devkit.rollout_scalars_check runs/learn/*/curves.csv

Why: AReaL logs each per-episode scalar as a mean and drops its count, so a step that mixed
two sets of episodes (what `areal_patches/rollout_stats.py` fixes) looks like any other. Its
means still betray it. One set of n episodes, n3 with 3 numbers and n4 with 4, gives a
`rollout/success` times n, a `success_3nums` times n3 and a `success_4nums` times n4 that are
whole numbers, the last two adding up to the first, and a `completion_len` times n that is
whole too. A step where no counts fit is a mix. The check can miss a mix (a late set that
replaced every key fits), but it never flags one set of up to `max_episodes`: `plot.py`
writes 7 significant digits, and the tolerance covers that rounding and float32's.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path

import numpy as np

SUCCESS, LENGTH = "rollout/success", "rollout/completion_len"
BY_COUNT = re.compile(r"rollout/success_\d+nums")


def counts_of(mean: float, max_episodes: int) -> set[int]:
    """The counts n <= max_episodes for which `mean` is some whole number over n, up to the
    CSV's rounding."""
    n = np.arange(1, max_episodes + 1)
    fits = np.abs(np.round(mean * n) / n - mean) <= 1e-6 * max(abs(mean), 1e-2)
    return set(n[fits].tolist())


def split_fits(n: int, solved: int, groups: list[tuple[float, set[int]]]) -> bool:
    """Whether n episodes, `solved` of them solved, split into groups of >= 1 with these means.

    Each group is (its mean, the counts it can be a mean of)."""
    (mean, counts), rest = groups[0], groups[1:]
    if not rest:
        return n in counts and round(mean * n) == solved
    return any(split_fits(n - k, solved - round(mean * k), rest) for k in counts if k < n)


def one_set_fits(success: float, length: float, by_count: list[float],
                 max_episodes: int = 8192) -> bool:
    """Whether one set of n episodes gives the step's success, mean length and success by count."""
    groups = [(mean, counts_of(mean, max_episodes)) for mean in by_count]
    totals = counts_of(success, max_episodes) & counts_of(length, max_episodes)
    return any(split_fits(n, round(success * n), groups) for n in sorted(totals))


def mixed_steps(path: Path) -> tuple[int, list[int]]:
    """(steps that log success by number count, those of them that no one set of episodes fits)."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        columns = reader.fieldnames or []
        by_count = [c for c in columns if BY_COUNT.fullmatch(c)]
        if SUCCESS not in columns or LENGTH not in columns or not by_count:
            raise ValueError(f"{path}: no {SUCCESS}, {LENGTH} or rollout/success_Nnums column; "
                             "pass the curves.csv that plot.py writes for a GRPO run of train.py")
        checked, mixed = 0, []
        for row in reader:
            means = [float(row[c]) for c in by_count if row[c]]
            if not (row[SUCCESS] and row[LENGTH] and means):
                continue
            checked += 1
            if not one_set_fits(float(row[SUCCESS]), float(row[LENGTH]), means):
                mixed.append(int(row["step"]))
    return checked, mixed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("csv", nargs="+", type=Path, help="curves.csv files, one per run")
    args = parser.parse_args(argv)
    for path in args.csv:
        try:
            n, mixed = mixed_steps(path)
        except (OSError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"{path}: {n} steps checked, mixed at steps {mixed or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
