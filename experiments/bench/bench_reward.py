"""Reward throughput: reward_score.compute_score against the common regex + eval
approach (TinyZero style), on the same realistic completions in the same run, plus
worst-case times on adversarial inputs.

    python3 experiments/bench/bench_reward.py [--completions 2000] [--repeats 5]
"""

import argparse
import random
import re
import time

from experiments.bench.hostile_inputs import HOSTILE_COMPLETIONS, PUZZLE
from countdown import generate_puzzles
from reward_score import compute_score

# -----------------------------------------------------------------------------
# the baseline: regex + eval, as in TinyZero's countdown reward (do not use it)


def baseline_compute_score(solution_str, ground_truth, method="strict", format_score=0.1, score=1.0):
    target, numbers = ground_truth["target"], ground_truth["nums"]
    matches = list(re.finditer(r"<answer>(.*?)</answer>", solution_str))
    if not matches:
        return 0.0
    equation = matches[-1].group(1).strip()
    if sorted(int(n) for n in re.findall(r"\d+", equation)) != sorted(numbers):
        return format_score
    try:
        if not re.match(r"^[\d+\-*/().\s]+$", equation):
            return format_score
        result = eval(equation, {"__builtins__": None}, {})  # lets 9**9**9 through
        return score if abs(result - target) < 1e-5 else format_score
    except Exception:
        return format_score


# -----------------------------------------------------------------------------
# a realistic corpus: a few hundred words of reasoning, then an answer

WORDS = (
    "let me try combining the numbers first maybe subtract then multiply that is too big "
    "so divide instead or add the small ones hmm close but not quite check again the target"
).split()


def reasoning(rng: random.Random, row: dict) -> str:
    nums, parts = row["nums"], []
    while sum(len(p.split()) for p in parts) < 300:
        a, b = rng.sample(nums, 2) if len(nums) > 1 else (nums[0], nums[0])
        op = rng.choice("+-*")
        value = a + b if op == "+" else a - b if op == "-" else a * b
        parts.append(" ".join(rng.choices(WORDS, k=rng.randint(8, 20))) + f". {a} {op} {b} = {value}.")
    return "\n".join(parts)


def make_answer(rng: random.Random, row: dict, kind: str) -> str | None:
    solution, nums = row["solution"], row["nums"]
    if kind == "correct":
        return solution
    if kind == "wrong value":
        return " + ".join(map(str, nums))  # rarely equals the target
    if kind == "wrong numbers":
        return solution + f" + {nums[0]} - {nums[0]}"
    if kind == "malformed":
        return rng.choice([solution + " +", f"({solution}", solution.replace(" ", " ** ", 1), "x = " + solution])
    return None  # no answer


KINDS = {"correct": 0.3, "wrong value": 0.25, "wrong numbers": 0.15, "no answer": 0.15, "malformed": 0.15}


def make_corpus(n: int, seed: int = 0) -> list[tuple[str, dict]]:
    rng = random.Random(seed)
    corpus = []
    for row in generate_puzzles(n, seed=seed):
        kind = rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
        answer = make_answer(rng, row, kind)
        completion = "<think>\n" + reasoning(rng, row) + "\n</think>\n"
        completion += f"<answer>{answer}</answer>" if answer is not None else "I could not find it."
        corpus.append((completion, {"target": row["target"], "nums": row["nums"]}))
    return corpus


def throughput(fns: list, corpus: list[tuple[str, dict]], repeats: int) -> list[float]:
    """Best-of-`repeats` completions per second for each function; the functions
    take turns so that a busy machine slows them alike."""
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            for completion, ground_truth in corpus:
                fn(completion, ground_truth)
            best[i] = min(best[i], time.perf_counter() - start)
    return [len(corpus) / t for t in best]


def worst_time(fn, text: str, ground_truth: dict, runs: int = 5) -> float:
    worst = 0.0
    for _ in range(runs):
        start = time.perf_counter()
        fn(text, ground_truth)
        worst = max(worst, time.perf_counter() - start)
    return worst


def baseline_cell(text: str, ground_truth: dict) -> str:
    """The baseline's column: its time, or why there is none. Two kinds of text are
    not run: power towers such as 9**9**9, which eval computes in full (minutes and
    GBs), and `<answer>` tags left open after the last `</answer>`, from each of which
    its lazy regex scans to the end: quadratic, about 1 s per 2e8 (open tags x chars)
    (100k tags in 800 kB took 8 minutes). A number of over 4,300 digits makes its
    int() raise, outside its try."""
    if "**" in text:
        return "not run: hangs"
    tail = text[text.rfind("</answer>") + 1 :]
    if tail.count("<answer>") * len(tail) > 10**9:  # 5 s or more
        return "not run: quadratic"
    try:
        return f"{worst_time(baseline_compute_score, text, ground_truth, runs=1) * 1e3:.2f} ms"
    except ValueError:
        return "raises ValueError"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--completions", type=int, default=2000, help="corpus size")
    parser.add_argument("--repeats", type=int, default=5, help="timing repeats (best is kept)")
    args = parser.parse_args()

    corpus = make_corpus(args.completions)
    words = sum(len(c.split()) for c, _ in corpus) / len(corpus)
    agree = sum(compute_score(c, g) == baseline_compute_score(c, g) for c, g in corpus)
    ours, base = throughput([compute_score, baseline_compute_score], corpus, args.repeats)

    print(f"## Reward throughput ({len(corpus)} completions, {words:.0f} words each on average; "
          f"scores agree on {agree}/{len(corpus)})\n")
    print("| implementation | completions/s | us/completion | ratio |")
    print("|---|---:|---:|---:|")
    print(f"| reward_score.compute_score | {ours:,.0f} | {1e6 / ours:.1f} | {ours / base:.2f}x |")
    print(f"| regex + eval baseline | {base:,.0f} | {1e6 / base:.1f} | 1.00x |")

    print("\n## Worst case on adversarial inputs (max of 5 runs)\n")
    print("| input | size | reward_score | regex + eval baseline |")
    print("|---|---:|---:|---:|")
    for name, text in HOSTILE_COMPLETIONS.items():
        ms = worst_time(compute_score, text, PUZZLE) * 1e3
        print(f"| {name} | {len(text):,} chars | {ms:.2f} ms | {baseline_cell(text, PUZZLE)} |")


if __name__ == "__main__":
    main()
