"""Where the time of one CPU demo step goes: generation, reward, log-probs, update, weight push.

    python3 experiments/bench/bench_cpu_step.py [--steps 4]

Runs the quick CPU demo (`devkit/demo.py --quick`: tiny model, dev server, train.py) for a
few steps and reads AReaL's own per-step timers (`timeperf/*`) from its TensorBoard files.
Step 1 pays one-off warm-up, so the table averages the later steps. The reward's share is
measured directly: compute_score over as many realistic completions as one step scores.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import plot
from experiments.bench.bench_reward import make_corpus
from reward_score import compute_score
from devkit import demo

# (what a reader calls it, AReaL's timer)
PHASES = [
    ("generation (rollout, incl. reward)", "timeperf/rollout"),
    ("log-probs (recompute_logp)", "timeperf/recompute_logp"),
    ("advantages", "timeperf/compute_advantage"),
    ("PPO update", "timeperf/train_step"),
    ("weight push (save to disk + server load)", "timeperf/update_weights"),
    ("recover checkpoint", "timeperf/checkpoint_for_recover"),
    ("evaluation (held-out set)", "timeperf/eval"),
]


def reward_seconds(n_completions: int) -> float:
    corpus = make_corpus(n_completions, seed=0)
    start = time.perf_counter()
    for text, row in corpus:
        compute_score(text, row)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        demo.main(["--quick", "--run-dir", str(run_dir), "--steps", str(args.steps)])
        scalars = plot.load_run(run_dir / "logs" / "tensorboard")

    later = [s for s in sorted(scalars["timeperf/rollout"]) if s > 0] or [0]
    mean = {tag: statistics.mean(scalars[tag][s] for s in later) for _, tag in PHASES if tag in scalars}
    n_seqs = int(statistics.mean(scalars["ppo_actor/n_seqs"][s] for s in later))
    total = sum(mean.values())
    reward = reward_seconds(n_seqs)

    print(f"\nCPU demo step, mean of steps {later[0] + 1}..{later[-1] + 1} ({n_seqs} completions per step)\n")
    print(f"| {'phase':<42} | {'seconds':>8} | {'share':>6} |")
    print(f"|{'-' * 44}|{'-' * 10}|{'-' * 8}|")
    for name, tag in PHASES:
        if tag in mean:
            print(f"| {name:<42} | {mean[tag]:8.3f} | {mean[tag] / total:6.1%} |")
    print(f"| {'  reward (compute_score), part of generation':<42} | {reward:8.4f} | {reward / total:6.1%} |")
    print(f"| {'step total':<42} | {total:8.3f} | {1:6.1%} |")


if __name__ == "__main__":
    main()
