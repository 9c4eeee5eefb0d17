"""Countdown puzzles: generate, convert, load and prompt.

A puzzle is a few numbers and a target; the player combines every number exactly once
with + - * / and parentheses to hit the target, e.g. [55, 36, 7, 19] -> 65 with
55 + 36 - 7 - 19. `python3 countdown.py` writes the train and test splits as JSONL:

    {"nums": [55, 36, 7, 19], "target": 65, "solution": "55 + 36 - 7 - 19",
     "messages": [{"role": "system", ...}, {"role": "user", ...}]}

`messages` holds the prompt only; the chat template is applied at training time by
whichever tokenizer is used (`prompt_token_ids`), so the data fits any model. A row may
also hold `completions`, a model's own correct answers (`evaluate.py --solved-out`), which
`sft.py` trains on in place of the reasoning it writes from the solution (sft_formats/).

Generation works backwards from a random solution instead of searching for one:
draw the numbers, then repeatedly merge two random sub-expressions with an operator
drawn uniformly from those that keep the value a positive integer (+, *, the larger
minus the smaller, the larger divided by the smaller when exact). The last merge
draws only from the operators whose result lands in the target range (the attempt
fails if there are none), and its result is the target; the puzzle is kept if its
key (sorted numbers, target) is new. For 3-4 numbers about half the attempts succeed,
and the run, JSONL writing included, is orders of magnitude faster than drawing a target
and searching for a solution as the upstream AReaL example does (experiments/bench/bench_countdown.py;
its figures: docs/results/cpu-benchmarks.md). Every puzzle is solvable by
construction and stores the solution that proves it. For the defaults the targets
spread over the whole range (13% in 10-19 tapering to 9% in 90-100), about 3% of
puzzles are solved by adding all the numbers, and half have 3 numbers, half 4.

Integer versus rational intermediates: the reward (reward_score.py) accepts any
exact rational intermediate (8 / (3 - 8 / 3) = 24 is a valid answer), while the
stored reference solutions only ever use integer intermediates. The reward is the
more permissive of the two, so every stored solution scores 1.0.
"""

import argparse
import json
import math
import os
import random
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from reward_score import Verdict, judge, puzzle_problem

SYSTEM_PROMPT = (
    "You are a helpful assistant. You first think about the reasoning process in the mind "
    "and then provide the user with the answer."
)
USER_PROMPT = (
    "Using the numbers {nums}, create an equation that equals {target}. You can use basic "
    "arithmetic operations (+, -, *, /) and each number must be used exactly once. Show your "
    "work in <think> </think> tags. And return the final answer in <answer> </answer> tags, for "
    "example <answer> (1 + 2) / 3 </answer>."
)

DEFAULT_OUT_DIR = "data/countdown/qwen"
TRAIN_FILE, TEST_FILE = "train_e.jsonl", "test_e.jsonl"
SUPPORTED_NUMBERS = (2, 6)  # how many numbers a puzzle may have
MAX_MISSES = 200_000  # consecutive attempts without a new puzzle before giving up

# An expression tree node: (value,) for a number, (value, op, left, right) otherwise.
Node = tuple
SUM, PRODUCT, ATOM = 1, 2, 3  # precedence of an expression's outermost operator


class DataError(ValueError):
    """A data file is missing or not in the expected format."""


# -----------------------------------------------------------------------------
# rows and prompts


def make_messages(nums: list[int], target: int) -> list[dict]:
    """System and user prompt in the wording of the Countdown GRPO recipes (TinyZero)."""
    user = USER_PROMPT.format(nums="[" + ", ".join(map(str, nums)) + "]", target=target)
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def make_row(nums: list[int], target: int, solution: str) -> dict:
    return {"nums": list(nums), "target": target, "solution": solution, "messages": make_messages(nums, target)}


def puzzle_key(row: dict) -> tuple:
    """Identity of a puzzle for deduplication and train/test leak checks."""
    return tuple(sorted(row["nums"])), row["target"]


def prompt_token_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Prompt token ids: the tokenizer's chat template with the generation prompt.

    The one place training and evaluation build prompts. Renders to text and then
    encodes, which is what `apply_chat_template(tokenize=True)` does internally, but
    always yields a plain list (transformers 5 returns a BatchEncoding there).
    """
    return batch_prompt_token_ids(tokenizer, [messages])[0]


def batch_prompt_token_ids(tokenizer, conversations: list[list[dict]]) -> list[list[int]]:
    """`prompt_token_ids` for many prompts at once (the fast tokenizer encodes in parallel)."""
    texts = tokenizer.apply_chat_template(conversations, tokenize=False, add_generation_prompt=True)
    return [[int(t) for t in ids] for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]


# -----------------------------------------------------------------------------
# expression trees, shared by the generator, the solver and the warm start's failed attempts


def _merges(a: Node, b: Node, *, positive: bool) -> list[Node]:
    """Every way to combine two sub-expressions into a non-negative integer: a + b,
    a * b, the larger minus the smaller, and the larger divided by the smaller if
    exact. `positive` leaves out a zero difference."""
    big, small = (a, b) if a[0] >= b[0] else (b, a)
    x, y = big[0], small[0]
    merges = [(x + y, "+", a, b), (x * y, "*", a, b)]
    if x != y or not positive:
        merges.append((x - y, "-", big, small))
    if y and x % y == 0:
        merges.append((x // y, "/", big, small))
    return merges


def render(node: Node) -> str:
    """Expression text with parentheses only where precedence needs them."""
    return _render(node)[0]


def _render(node: Node) -> tuple[str, int]:
    if len(node) == 1:
        return str(node[0]), ATOM
    _, op, a, b = node
    (ta, pa), (tb, pb) = _render(a), _render(b)
    if op == "+":
        return f"{ta} + {tb}", SUM
    if op == "-":
        return f"{ta} - ({tb})" if pb == SUM else f"{ta} - {tb}", SUM
    left = f"({ta})" if pa == SUM else ta
    if op == "*":
        return f"{left} * ({tb})" if pb == SUM else f"{left} * {tb}", PRODUCT
    return f"{left} / ({tb})" if pb != ATOM else f"{left} / {tb}", PRODUCT


def random_tree(rng: random.Random, nums: list[int], target_range: tuple[int, int]) -> Node | None:
    """Merge random pairs of sub-expressions, each time with an operator drawn
    uniformly from those that keep the value a positive integer. The last operator
    is drawn from those that land in `target_range`; None if there are none."""
    lo, hi = target_range
    random_ = rng.random
    nodes = [(n,) for n in nums]
    while True:
        a = nodes.pop(int(random_() * len(nodes)))
        b = nodes.pop(int(random_() * len(nodes)))
        merges = _merges(a, b, positive=True)
        if not nodes:
            merges = [m for m in merges if lo <= m[0] <= hi]
            return merges[int(random_() * len(merges))] if merges else None
        nodes.append(merges[int(random_() * len(merges))])


def solve(nums: list[int], target: int) -> str | None:
    """A solution using every number once with non-negative integer intermediates,
    or None. Exhaustive search over merges of pairs, skipping value multisets
    already explored; up to 6 numbers (a few ms for 4)."""
    if not SUPPORTED_NUMBERS[0] <= len(nums) <= SUPPORTED_NUMBERS[1]:
        raise ValueError(f"can only solve puzzles with 2 to 6 numbers, got {len(nums)}")
    found = _search(tuple((n,) for n in nums), target, set())
    return None if found is None else render(found)


def _search(nodes: tuple[Node, ...], target: int, seen: set) -> Node | None:
    if len(nodes) == 1:
        return nodes[0] if nodes[0][0] == target else None
    state = tuple(sorted(node[0] for node in nodes))
    if state in seen:
        return None
    seen.add(state)
    for i in range(len(nodes)):
        for j in range(i + 1, len(nodes)):
            rest = nodes[:i] + nodes[i + 1 : j] + nodes[j + 1 :]
            for merged in _merges(nodes[i], nodes[j], positive=False):
                found = _search(rest + (merged,), target, seen)
                if found is not None:
                    return found
    return None


# -----------------------------------------------------------------------------
# generation


def generate_puzzles(
    n: int,
    *,
    seed: int,
    min_numbers: int = 3,
    max_numbers: int = 4,
    num_range: tuple[int, int] = (1, 99),
    target_range: tuple[int, int] = (10, 100),
    exclude: set | frozenset = frozenset(),
    progress: bool = False,
) -> list[dict]:
    """n distinct solvable puzzles whose keys are not in `exclude` (see the module
    docstring for the method). The count of numbers is uniform over
    [min_numbers, max_numbers]; the same arguments always give the same rows.
    Raises ValueError when the settings are invalid or n puzzles cannot be found."""
    _check_settings(n, min_numbers, max_numbers, num_range, target_range)
    lo, hi = num_range
    rng = random.Random(seed)
    random_, span = rng.random, hi - lo + 1
    seen = set(exclude)
    rows: list[dict] = []
    for _ in _progress(n, "puzzles", progress):
        k = rng.randint(min_numbers, max_numbers)
        for _ in range(MAX_MISSES):
            nums = [lo + int(random_() * span) for _ in range(k)]
            tree = random_tree(rng, nums, target_range)
            if tree is not None:
                key = (tuple(sorted(nums)), tree[0])
                if key not in seen:
                    seen.add(key)
                    rows.append(make_row(nums, tree[0], render(tree)))
                    break
        else:
            raise ValueError(
                f"found only {len(rows)} of {n} new puzzles: {MAX_MISSES} attempts in a row gave none "
                f"with {k} numbers in {lo}..{hi} and targets in {target_range[0]}..{target_range[1]}; "
                "widen the ranges or ask for fewer puzzles"
            )
    return rows


def max_puzzles(min_numbers: int, max_numbers: int, num_range: tuple[int, int], target_range: tuple[int, int]) -> int:
    """Upper bound on distinct puzzle keys: number multisets times targets."""
    span = num_range[1] - num_range[0] + 1
    multisets = sum(math.comb(span + k - 1, k) for k in range(min_numbers, max_numbers + 1))
    return multisets * (target_range[1] - target_range[0] + 1)


def _check_settings(n: int, min_numbers: int, max_numbers: int, num_range: tuple[int, int], target_range: tuple[int, int]) -> None:
    lo, hi = SUPPORTED_NUMBERS
    if n < 0:
        raise ValueError(f"number of puzzles must be >= 0, got {n}")
    if not lo <= min_numbers <= max_numbers <= hi:
        raise ValueError(f"need {lo} <= min numbers <= max numbers <= {hi}, got {min_numbers} and {max_numbers}")
    if not 1 <= num_range[0] <= num_range[1]:
        raise ValueError(f"need 1 <= number min <= number max, got {num_range[0]} and {num_range[1]}")
    if not 1 <= target_range[0] <= target_range[1]:
        raise ValueError(f"need 1 <= target min <= target max, got {target_range[0]} and {target_range[1]}")
    bound = max_puzzles(min_numbers, max_numbers, num_range, target_range)
    if n > bound:
        raise ValueError(f"cannot make {n} distinct puzzles: these ranges allow at most {bound}")


def _progress(n: int, what: str, enabled: bool) -> Iterator[int]:
    """range(n), drawing a progress line on stderr about every 1% when enabled."""
    step = max(1, n // 100)
    start = time.perf_counter()
    for i in range(n):
        if enabled and i % step == 0:
            print(f"\r{what}: {i}/{n} ({time.perf_counter() - start:.1f} s)", end="", file=sys.stderr, flush=True)
        yield i
    if enabled:
        print(f"\r{what}: {n}/{n} ({time.perf_counter() - start:.1f} s)", file=sys.stderr, flush=True)


# -----------------------------------------------------------------------------
# files


def write_jsonl(paths_rows: Iterable[tuple[str | Path, list[dict]]]) -> None:
    """Write each (path, rows) pair as JSONL, all or nothing: every file goes to a
    temporary file in its folder first and is renamed into place only once all of
    them are complete."""
    done: list[tuple[Path, Path]] = []
    try:
        for path, rows in paths_rows:
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            done.append((tmp, path))
            with open(tmp, "w", encoding="utf-8", newline="\n") as f:
                f.write("".join(json.dumps(row) + "\n" for row in rows))
        for tmp, path in done:
            os.replace(tmp, path)
    finally:
        for tmp, _ in done:
            tmp.unlink(missing_ok=True)


def read_puzzle_file(path: str) -> bytes:
    """The file's bytes, or DataError saying how to create a missing file."""
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: no such file; run `python3 countdown.py` to create it") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror or e}") from None


def load_puzzles(path: str) -> list[dict]:
    """Read and validate a JSONL file of puzzles (the schema in the module docstring).

    Every row must have integer `nums` and `target`, a `solution` that the reward
    scores as correct, and `messages`; no puzzle may appear twice. Raises DataError
    naming the file and 1-based line number of the first problem."""
    data = read_puzzle_file(path)
    rows: list[dict] = []
    first_seen: dict[tuple, int] = {}
    for lineno, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as e:  # JSON and UTF-8 decoding errors
            raise DataError(f"{path}:{lineno}: not valid JSON ({e})") from None
        problem = _row_problem(row)
        if problem is None:
            key = puzzle_key(row)
            if key in first_seen:
                problem = f"duplicate of line {first_seen[key]} (same numbers and target)"
            first_seen[key] = lineno
        if problem is not None:
            raise DataError(f"{path}:{lineno}: {problem}")
        rows.append(row)
    if not rows:
        raise DataError(f"{path}: no puzzles in file; run `python3 countdown.py` to create it")
    return rows


def _row_problem(row: object) -> str | None:
    """What is wrong with a row, or None if it is valid."""
    if not isinstance(row, dict):
        return f"expected a JSON object, got {type(row).__name__}"
    for key in ("nums", "target", "solution", "messages"):
        if key not in row:
            return f"missing key {key!r}"
    solution, messages = row["solution"], row["messages"]
    problem = puzzle_problem(row["nums"], row["target"])
    if problem is not None:
        return problem
    if not isinstance(solution, str):
        return f"'solution' must be a string, got {solution!r}"
    verdict = judge(f"<answer>{solution}</answer>", row)
    if verdict is not Verdict.CORRECT:
        return f"'solution' {solution!r} does not solve the puzzle ({verdict})"
    if not (
        isinstance(messages, list)
        and messages
        and all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in messages)
    ):
        return "'messages' must be a non-empty list of {'role': str, 'content': str} objects"
    if "completions" in row and not (
        isinstance(row["completions"], list) and row["completions"] and all(isinstance(c, str) for c in row["completions"])
    ):
        return "'completions' must be a non-empty list of strings, as evaluate.py --solved-out writes"
    return None


# -----------------------------------------------------------------------------
# Countdown-Tasks-3to4 conversion


def convert_countdown_tasks(path: str, *, limit: int | None = None, seed: int | None = None, progress: bool = False) -> list[dict]:
    """Rows in our schema from a local Countdown-Tasks-3to4 copy (parquet, or JSONL
    with `nums` and `target`). Duplicates are dropped, the rest shuffled with
    `seed` (if given) and solved by exhaustive search (`solve`) until `limit` rows
    are found. Puzzles without a solution are dropped and counted in a summary line
    on stdout; the search uses integer intermediates only, which in a check against
    a rational search on 300 random puzzles lost none."""
    tasks = _read_tasks(path)
    unique, seen = [], set()
    for task in tasks:
        key = (tuple(sorted(task[0])), task[1])
        if key not in seen:
            seen.add(key)
            unique.append(task)
    if seed is not None:
        random.Random(seed).shuffle(unique)
    wanted = len(unique) if limit is None else min(limit, len(unique))
    rows: list[dict] = []
    unsolvable = 0
    remaining = iter(unique)
    for _ in _progress(wanted, "solving", progress):
        for nums, target in remaining:  # until the next solvable task
            solution = solve(nums, target)
            if solution is not None:
                rows.append(make_row(nums, target, solution))
                break
            unsolvable += 1
        else:
            break  # no tasks left
    print(
        f"{path}: {len(tasks)} tasks, {len(tasks) - len(unique)} duplicates dropped, "
        f"{unsolvable} unsolvable dropped, {len(rows)} converted"
    )
    return rows


def _read_tasks(path: str) -> list[tuple[list[int], int]]:
    """(nums, target) pairs from parquet or JSONL; DataError on anything unexpected."""
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file")
    if path.endswith(".parquet"):
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise DataError(f"{path}: reading parquet needs pyarrow (pip install pyarrow), or convert it to JSONL") from None
        try:
            records = pq.read_table(path, columns=["nums", "target"]).to_pylist()
        except Exception as e:  # pyarrow raises many types for bad files
            raise DataError(f"{path}: cannot read parquet: {e}") from None
        where = "row"
    else:
        records, where = [], "line"
        try:
            with open(path, "rb") as f:
                for lineno, line in enumerate(f, 1):
                    if line.strip():
                        try:
                            records.append(json.loads(line))
                        except ValueError as e:
                            raise DataError(f"{path}:{lineno}: not valid JSON ({e})") from None
        except OSError as e:
            raise DataError(f"{path}: cannot read: {e.strerror or e}") from None
    tasks = []
    for i, record in enumerate(records, 1):
        nums = record.get("nums") if isinstance(record, dict) else None
        target = record.get("target") if isinstance(record, dict) else None
        if puzzle_problem(nums, target) is not None or not SUPPORTED_NUMBERS[0] <= len(nums) <= SUPPORTED_NUMBERS[1]:
            raise DataError(f"{path}: {where} {i}: need 'nums' (2 to 6 non-negative integers) and an integer 'target', got {record!r}")
        tasks.append((nums, target))
    if not tasks:
        raise DataError(f"{path}: no tasks in file")
    return tasks


# -----------------------------------------------------------------------------
# command line


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage dump
        self.exit(2, f"{self.prog}: error: {message}\n")


def main(argv: list[str] | None = None) -> None:
    parser = _Parser(
        prog="countdown.py",
        description="Write Countdown train/test puzzles as JSONL (test is generated first; train never repeats a test puzzle).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--out-dir", default=DEFAULT_OUT_DIR, help=f"folder for {TRAIN_FILE} and {TEST_FILE}")
    parser.add_argument("--train-size", type=int, default=100_000, help="puzzles in the train split")
    parser.add_argument("--test-size", type=int, default=1_000, help="puzzles in the test split")
    parser.add_argument("--seed", type=int, default=0, help="same seed, same files (byte for byte)")
    parser.add_argument("--min-numbers", type=int, default=3, help="fewest numbers per puzzle (2 to 6)")
    parser.add_argument("--max-numbers", type=int, default=4, help="most numbers per puzzle (2 to 6)")
    parser.add_argument("--num-min", type=int, default=1, help="smallest number")
    parser.add_argument("--num-max", type=int, default=99, help="largest number")
    parser.add_argument("--target-min", type=int, default=10, help="smallest target")
    parser.add_argument("--target-max", type=int, default=100, help="largest target")
    parser.add_argument(
        "--from-countdown-tasks",
        metavar="PATH",
        help="convert a local Countdown-Tasks-3to4 copy (parquet or JSONL with nums/target) "
        "instead of generating; the number and target options are then ignored",
    )
    args = parser.parse_args(argv)
    show_progress = sys.stderr.isatty()
    start = time.perf_counter()
    try:
        if args.train_size < 1 or args.test_size < 1:
            raise ValueError(f"--train-size and --test-size must be >= 1, got {args.train_size} and {args.test_size}")
        wanted = args.test_size + args.train_size
        if args.from_countdown_tasks:
            rows = convert_countdown_tasks(args.from_countdown_tasks, limit=wanted, seed=args.seed, progress=show_progress)
            if len(rows) < wanted:
                raise ValueError(f"{args.from_countdown_tasks} has only {len(rows)} distinct solvable puzzles, {wanted} needed")
            test, train = rows[: args.test_size], rows[args.test_size :]
        else:
            settings = dict(
                min_numbers=args.min_numbers,
                max_numbers=args.max_numbers,
                num_range=(args.num_min, args.num_max),
                target_range=(args.target_min, args.target_max),
            )
            _check_settings(wanted, **settings)
            # Test first, so --train-size never changes it; train gets its own stream
            # (seed + 1) and skips every test key.
            test = generate_puzzles(args.test_size, seed=args.seed, progress=show_progress, **settings)
            exclude = {puzzle_key(row) for row in test}
            train = generate_puzzles(args.train_size, seed=args.seed + 1, exclude=exclude, progress=show_progress, **settings)
        out = Path(args.out_dir)
        write_jsonl([(out / TEST_FILE, test), (out / TRAIN_FILE, train)])
    except (ValueError, OSError) as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    print(f"wrote {out / TEST_FILE} ({len(test)} puzzles) and {out / TRAIN_FILE} ({len(train)} puzzles) in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
