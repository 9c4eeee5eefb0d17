"""Tests for countdown.py: generated data is solvable (checked by an independent
evaluator), deduplicated, leak-free and deterministic; files and CLI fail cleanly."""

import ast
import itertools
import json
import random
import re
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

import countdown
import evaluate
from countdown import DataError, generate_puzzles, load_puzzles, make_messages, make_row, puzzle_key, solve
from reward_score import compute_score, has_think_answer_format

ROOT = Path(__file__).resolve().parent.parent
BIN_OPS = {ast.Add: Fraction.__add__, ast.Sub: Fraction.__sub__, ast.Mult: Fraction.__mul__, ast.Div: Fraction.__truediv__}


def check_solution(nums: list[int], target: int, solution: str, smallest: int = 1) -> None:
    """Independent check with Python's own parser (ast.parse only parses, it runs
    nothing): every number used once, integer intermediates >= `smallest`, exact target."""
    used: list[int] = []

    def walk(node: ast.expr) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used.append(node.value)
            return Fraction(node.value)
        assert isinstance(node, ast.BinOp) and type(node.op) in BIN_OPS, ast.dump(node)
        value = BIN_OPS[type(node.op)](walk(node.left), walk(node.right))
        assert value.denominator == 1 and value >= smallest, f"intermediate {value} in {solution}"
        return value

    assert walk(ast.parse(solution, mode="eval").body) == target, solution
    assert sorted(used) == sorted(nums), solution


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "countdown.py"), *args], cwd=cwd, capture_output=True, text=True)


# -----------------------------------------------------------------------------
# rows and prompts


def test_make_row_and_messages():
    row = make_row([1, 2, 3], 6, "1 + 2 + 3")
    assert list(row) == ["nums", "target", "solution", "messages"]
    system, user = row["messages"]
    assert system == {"role": "system", "content": countdown.SYSTEM_PROMPT}
    assert user["role"] == "user"
    assert user["content"] == (
        "Using the numbers [1, 2, 3], create an equation that equals 6. You can use basic arithmetic "
        "operations (+, -, *, /) and each number must be used exactly once. Show your work in <think> </think> "
        "tags. And return the final answer in <answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>."
    )
    assert "<|im_start|>" not in json.dumps(row)  # no chat template baked in
    assert puzzle_key(row) == puzzle_key(make_row([3, 1, 2], 6, "3 * 2 * 1")) == ((1, 2, 3), 6)


def test_prompt_token_ids_returns_plain_ints():
    class FakeTokenizer:
        def apply_chat_template(self, conversations, tokenize, add_generation_prompt):
            assert tokenize is False and add_generation_prompt is True
            return ["".join(f"<{m['role']}>{m['content']}" for m in c) + "<assistant>" for c in conversations]

        def __call__(self, texts, add_special_tokens):
            assert add_special_tokens is False
            return {"input_ids": [tuple(ord(c) for c in text) for text in texts]}  # not lists, like some return

    ids = countdown.prompt_token_ids(FakeTokenizer(), make_messages([1, 2, 3], 6))
    assert type(ids) is list and all(type(i) is int for i in ids)
    assert "".join(map(chr, ids)).endswith("</answer>.<assistant>")


def test_reference_completion_scores_full_marks():
    for row in generate_puzzles(300, seed=3, min_numbers=2, max_numbers=6):
        completion = countdown.reference_completion(row)
        assert compute_score(completion, row) == 1.0
        assert has_think_answer_format(completion)
        assert completion.endswith(f"<answer>{row['solution']}</answer>")
    assert countdown.solution_steps("(1 + 2) * 3") == ["1 + 2 = 3", "3 * 3 = 9"]
    assert countdown.solution_steps("8 / (3 - 8 / 3)") == ["8 / 3 = 8/3", "3 - 8/3 = 1/3", "8 / 1/3 = 24"]
    for invalid in ("1 ** 2", "1 / (2 - 2)"):  # what the reward calls an invalid expression
        with pytest.raises(ValueError, match="not a valid Countdown expression"):
            countdown.solution_steps(invalid)


def test_failed_attempts_use_every_number_once_and_miss_the_target():
    rng = random.Random(0)
    for row in generate_puzzles(300, seed=4, min_numbers=2, max_numbers=5):
        attempts = countdown.failed_attempts(row, 2, rng)
        assert len(attempts) == 2
        for attempt in attempts:
            value = Fraction(countdown.solution_steps(attempt)[-1].split(" = ")[-1])
            lo, hi = countdown.FAILED_VALUE_RANGE
            assert value != row["target"] and lo <= value <= hi
            assert compute_score(f"<think>x</think><answer>{attempt}</answer>", row) < 1.0
            check_solution(row["nums"], int(value), attempt)
    # A puzzle whose every expression hits the target has no failed attempt to show.
    assert countdown.failed_attempts({"nums": [999, 999], "target": 1}, 1, rng) == []


def test_retry_format_shows_each_failure_rejected_then_the_solution():
    row = make_row([90, 4, 3], 78, "90 - 4 * 3")
    completion = countdown.reference_completion(row, ["4 - 3 + 90", "90 / (4 - 3)"])
    assert completion == (
        "<think>\nI need to make 78 from 90, 4, 3, using each number once.\n"
        "4 - 3 = 1\n1 + 90 = 91\nThat makes 91, not 78.\n"
        "4 - 3 = 1\n90 / 1 = 90\nThat makes 90, not 78.\n"
        "4 * 3 = 12\n90 - 12 = 78\nSo 90 - 4 * 3 = 78.\n</think>\n<answer>90 - 4 * 3</answer>"
    )
    assert compute_score(completion, row) == 1.0


def test_numbers_left_follow_every_step_but_an_attempts_last():
    row = make_row([90, 4, 3], 78, "90 - 4 * 3")
    completion = countdown.reference_completion(row, ["4 - 3 + 90"], numbers_left=True)
    assert completion == (
        "<think>\nI need to make 78 from 90, 4, 3, using each number once.\n"
        "4 - 3 = 1\nLeft: 90, 1\n1 + 90 = 91\nThat makes 91, not 78.\n"
        "4 * 3 = 12\nLeft: 90, 12\n90 - 12 = 78\nSo 90 - 4 * 3 = 78.\n</think>\n<answer>90 - 4 * 3</answer>"
    )
    fractions = countdown.reference_completion(make_row([8, 3, 8, 3], 24, "8 / (3 - 8 / 3)"), numbers_left=True)
    assert "\n8 / 3 = 8/3\nLeft: 8, 3, 8/3\n3 - 8/3 = 1/3\nLeft: 8, 1/3\n" in fractions
    rng = random.Random(0)
    for row in generate_puzzles(300, seed=7, min_numbers=2, max_numbers=5):
        completion = countdown.reference_completion(
            row, countdown.failed_attempts(row, 1, rng), columns=True, numbers_left=True
        )
        assert compute_score(completion, row) == 1.0
        steps = len(countdown.solution_steps(row["solution"]))
        lefts = [line for line in completion.split("\n") if line.startswith("Left: ")]
        # the solution's states (the last steps - 1) shrink by one number a step, down to two
        assert [len(line.split(", ")) for line in lefts[len(lefts) - steps + 1 :]] == list(
            range(len(row["nums"]) - 1, 1, -1)
        )


def test_numbers_after_step_refuses_a_step_that_uses_a_number_not_left():
    with pytest.raises(ValueError, match="7 is not among the numbers left"):
        countdown.numbers_after_step([90, 4, 3], 7, 3, 21)


def column_result(work: str) -> int:
    """Read a column_work text the way the reasoning uses it: the rest's digits, then the ones digit."""
    ones_part, rest_part = work.split("; ")
    return int(rest_part.rsplit(" is ", 1)[1]) * 10 + int(ones_part.split(" is ")[1].split(",")[0]) % 10


def small_sum(text: str) -> int:
    """'8 - 1 - 4' -> 3."""
    first, *rest = text.split()
    value = int(first)
    for op, number in zip(rest[::2], rest[1::2]):
        value += int(number) if op == "+" else -int(number)
    return value


def test_column_work_adds_up_to_each_sum_and_difference():
    for a in range(0, 1200):
        for b in range(0, 120):
            for op, value in (("+", a + b), ("-", a - b)):
                work = countdown.column_work(a, op, b)
                if value < 0:
                    assert work is None  # the puzzles' steps never subtract the larger number
                    continue
                assert column_result(work) == value, (a, op, b, work)
                for part in work.split("; "):  # every part's own arithmetic is right
                    sums, result = part.split(",")[0].split(" is ")
                    assert small_sum(sums) == int(result), work
    assert countdown.column_work(49, "+", 89) == "9 + 9 is 18, carry 1; 4 + 8 + 1 is 13"
    assert countdown.column_work(82, "-", 49) == "12 - 9 is 3, borrow 1; 8 - 1 - 4 is 3"
    assert countdown.column_work(6, "*", 7) is None and countdown.column_work(8, "/", 2) is None


def test_columns_format_shows_the_work_before_each_plus_and_minus_step():
    row = make_row([90, 4, 3], 78, "90 - 4 * 3")
    completion = countdown.reference_completion(row, ["4 - 3 + 90"], columns=True)
    assert completion == (
        "<think>\nI need to make 78 from 90, 4, 3, using each number once.\n"
        "4 - 3: 4 - 3 is 1; 0 - 0 is 0\n4 - 3 = 1\n1 + 90: 1 + 0 is 1; 0 + 9 is 9\n1 + 90 = 91\n"
        "That makes 91, not 78.\n"
        "4 * 3 = 12\n90 - 12: 10 - 2 is 8, borrow 1; 9 - 1 - 1 is 7\n90 - 12 = 78\n"
        "So 90 - 4 * 3 = 78.\n</think>\n<answer>90 - 4 * 3</answer>"
    )
    fractions = countdown.reference_completion(make_row([8, 3, 8, 3], 24, "8 / (3 - 8 / 3)"), columns=True)
    assert "\n3 - 8/3 = 1/3\n" in fractions and " is " not in fractions  # a fraction's step stays plain
    for row in generate_puzzles(300, seed=5, min_numbers=2, max_numbers=5):
        completion = countdown.reference_completion(row, columns=True)
        assert compute_score(completion, row) == 1.0
        # evaluate.py's exact steps read the step lines only, not the column work
        steps = len(countdown.solution_steps(row["solution"]))
        assert evaluate.worked_steps(completion) == (steps, steps)


def test_signs_completion_finds_the_numbers_to_subtract_by_arithmetic():
    completion = countdown.signs_completion(make_row([19, 36, 55, 7], 65, "55 + 36 - 7 - 19"))
    assert completion == (
        "<think>\nI need to make 65 from 19, 36, 55, 7, using each number once.\n"
        "19 + 36: 9 + 6 is 15, carry 1; 1 + 3 + 1 is 5\n19 + 36 = 55\n"
        "55 + 55: 5 + 5 is 10, carry 1; 5 + 5 + 1 is 11\n55 + 55 = 110\n"
        "110 + 7: 0 + 7 is 7; 11 + 0 is 11\n110 + 7 = 117\n"
        "117 - 65: 7 - 5 is 2; 11 - 6 is 5\n117 - 65 = 52\n"
        "Half of 52 is 26: the numbers to subtract add up to 26.\n"
        "65 + 26: 5 + 6 is 11, carry 1; 6 + 2 + 1 is 9\n65 + 26 = 91\n"
        "The numbers to keep add up to 91.\n"
        "19 + 36: 9 + 6 is 15, carry 1; 1 + 3 + 1 is 5\n19 + 36 = 55, not 26 or 91.\n"
        "19 + 55: 9 + 5 is 14, carry 1; 1 + 5 + 1 is 7\n19 + 55 = 74, not 26 or 91.\n"
        "19 + 7: 9 + 7 is 16, carry 1; 1 + 0 + 1 is 2\n19 + 7 = 26\n"
        "So 36 + 55 - 19 - 7 = 65.\n</think>\n<answer>36 + 55 - 19 - 7</answer>"
    )


def test_signs_completion_says_cannot_make_exactly_when_no_signs_work():
    endings = set()
    for row in generate_puzzles(300, seed=9, min_numbers=2, max_numbers=5):
        nums, target = row["nums"], row["target"]
        completion = countdown.signs_completion(row)
        assert compute_score(completion, {"numbers": nums, "target": target}) == 1.0
        assert has_think_answer_format(completion)
        signs_work = any(
            sum(s * n for s, n in zip(signs, nums)) == target for signs in itertools.product((1, -1), repeat=len(nums))
        )
        assert ("cannot make" in completion) == (not signs_work), (nums, target)
        answer = completion.split("<answer>")[1].removesuffix("</answer>")
        if signs_work:
            assert "*" not in answer and "/" not in answer
            check_solution(nums, target, answer)  # every number once, no step below 1
        else:
            assert answer == row["solution"]
        for a, op, b, value in re.findall(r"^(\d+) ([-+]) (\d+) = (\d+)", completion, re.M):
            assert int(a) + (int(b) if op == "+" else -int(b)) == int(value), (a, op, b, value)
        endings |= {e for e in ("is less than", "is odd.", "No numbers add up", "is one of the numbers",
                                "Nothing to subtract", ", not ") if e in completion}  # fmt: skip
    assert len(endings) == 6  # every way the search can end is exercised


def test_signs_completion_falls_back_to_the_stored_solution():
    completion = countdown.signs_completion(make_row([54, 96, 81], 64, "54 * 96 / 81"))
    assert "\n231 - 64 = 167\n167 is odd.\nSo + and - alone cannot make 64.\n" in completion
    assert completion.endswith("54 * 96 = 5184\n5184 / 81 = 64\nSo 54 * 96 / 81 = 64.\n</think>\n<answer>54 * 96 / 81</answer>")
    smaller = countdown.signs_completion(make_row([2, 3], 6, "2 * 3"))
    assert "\n2 + 3 = 5\n5 is less than 6.\nSo + and - alone cannot make 6.\n" in smaller
    assert smaller.endswith("<answer>2 * 3</answer>")


# -----------------------------------------------------------------------------
# generation


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"min_numbers": 2, "max_numbers": 2},
        {"min_numbers": 5, "max_numbers": 6},
        {"min_numbers": 3, "max_numbers": 3, "num_range": (1, 10), "target_range": (1, 30)},
        {"min_numbers": 4, "max_numbers": 4, "num_range": (50, 500), "target_range": (900, 1000)},
    ],
)
def test_generated_puzzles_are_valid_distinct_and_solvable(settings):
    rows = generate_puzzles(500, seed=1, **settings)
    lo, hi = settings.get("num_range", (1, 99))
    target_lo, target_hi = settings.get("target_range", (10, 100))
    sizes = range(settings.get("min_numbers", 3), settings.get("max_numbers", 4) + 1)
    assert len(rows) == 500
    assert len({puzzle_key(row) for row in rows}) == 500
    assert {len(row["nums"]) for row in rows} == set(sizes)  # every allowed size occurs
    for row in rows:
        assert all(lo <= n <= hi for n in row["nums"])
        assert target_lo <= row["target"] <= target_hi
        assert row["messages"] == make_messages(row["nums"], row["target"])
        check_solution(row["nums"], row["target"], row["solution"])


def test_generation_is_deterministic_and_seeded():
    assert generate_puzzles(1000, seed=7) == generate_puzzles(1000, seed=7)
    assert generate_puzzles(1000, seed=7) != generate_puzzles(1000, seed=8)
    assert generate_puzzles(1000, seed=7)[:10] == generate_puzzles(10, seed=7)  # larger n extends smaller n


def test_exclude_prevents_leaks():
    small = dict(min_numbers=2, max_numbers=2, num_range=(1, 20))  # about 350 puzzles exist
    test = generate_puzzles(200, seed=0, **small)
    exclude = {puzzle_key(row) for row in test}
    train = generate_puzzles(150, seed=1, exclude=exclude, **small)
    assert not exclude & {puzzle_key(row) for row in train}
    assert exclude & {puzzle_key(row) for row in generate_puzzles(150, seed=1, **small)}  # would have leaked


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"min_numbers": 4, "max_numbers": 3}, "min numbers <= max numbers"),
        ({"min_numbers": 1, "max_numbers": 3}, "2 <= min numbers"),
        ({"min_numbers": 3, "max_numbers": 7}, "<= 6"),
        ({"num_range": (0, 9)}, "1 <= number min"),
        ({"num_range": (9, 1)}, "number min <= number max"),
        ({"target_range": (100, 10)}, "target min <= target max"),
        ({"min_numbers": 2, "max_numbers": 2, "num_range": (1, 2), "target_range": (1, 1)}, "at most 3"),
        ({"min_numbers": 2, "max_numbers": 2, "num_range": (1, 2), "target_range": (50, 60)}, "found only 0 of 5"),
    ],
)
def test_generation_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        generate_puzzles(5, seed=0, **kwargs)


@pytest.mark.parametrize(
    "nums, target",
    [([8, 3, 8, 3], 2), ([1, 2, 3], 6), ([25, 50, 75, 100, 3, 6], 952), ([5, 5, 7, 1], 1), ([44, 19, 35], 98), ([7, 7], 0)],
)
def test_solve_finds_solutions(nums, target):
    check_solution(nums, target, solve(nums, target), smallest=0)  # the solver allows zero


def test_solve_reports_impossible():
    assert solve([1, 1], 5) is None
    assert solve([2, 2, 2], 100) is None
    with pytest.raises(ValueError):
        solve(list(range(1, 8)), 10)


# -----------------------------------------------------------------------------
# files


def write_lines(path: Path, lines: list) -> str:
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return str(path)


def test_write_and_load_round_trip(tmp_path):
    rows = generate_puzzles(200, seed=5)
    countdown.write_jsonl([(tmp_path / "a" / "rows.jsonl", rows)])
    assert load_puzzles(str(tmp_path / "a" / "rows.jsonl")) == rows
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["rows.jsonl"]  # no temporary files left


GOOD = make_row([1, 2, 3], 6, "1 + 2 + 3")
BAD_ROWS = [
    ("{not json", "not valid JSON"),
    ([1, 2], "expected a JSON object"),
    ({k: v for k, v in GOOD.items() if k != "solution"}, "missing key 'solution'"),
    ({**GOOD, "nums": [1, 2, "3"]}, "'nums' must be"),
    ({**GOOD, "nums": []}, "'nums' must be"),
    ({**GOOD, "target": 6.0}, "'target' must be an integer"),
    ({**GOOD, "target": True}, "'target' must be an integer"),
    ({**GOOD, "solution": "1 + 2 * 3"}, "does not solve the puzzle (wrong_value)"),
    ({**GOOD, "solution": "1 ** 2 + 3"}, "does not solve the puzzle (invalid_expression)"),
    ({**GOOD, "solution": None}, "'solution' must be a string"),
    ({**GOOD, "messages": "hi"}, "'messages' must be"),
    ({**GOOD, "messages": [{"role": "user"}]}, "'messages' must be"),
    ({**GOOD, "completions": []}, "'completions' must be a non-empty list of strings"),
    ({**GOOD, "completions": "<answer>1 + 2 + 3</answer>"}, "'completions' must be"),
    ({**GOOD, "completions": ["<answer>1 + 2 + 3</answer>", 7]}, "'completions' must be"),
    ({**GOOD, "completions": None}, "'completions' must be"),
    (make_row([3, 2, 1], 6, "3 * 2 * 1"), "duplicate of line 1"),
]


@pytest.mark.parametrize("bad, message", BAD_ROWS)
def test_load_puzzles_names_file_and_line(tmp_path, bad, message):
    path = write_lines(tmp_path / "data.jsonl", [GOOD, "", bad, GOOD])
    with pytest.raises(DataError) as error:
        load_puzzles(path)
    assert str(error.value).startswith(f"{path}:3: ")
    assert message in str(error.value)


@pytest.mark.parametrize(
    "nums, target", [([], 6), ([1, 2, -3], 6), ([1, 2, "x"], 6), ([True, 2, 3], 6), ([1, 2, 3], 6.5), ([1, 2, 3], True)]
)
def test_numbers_and_target_refused_alike_by_loaders_and_reward(tmp_path, nums, target):
    """One rule (reward_score.puzzle_problem): what the reward refuses even after
    converting lenient forms, loading and converting refuse too."""
    with pytest.raises(ValueError):
        compute_score("<answer>1 + 2 + 3</answer>", {"nums": nums, "target": target})
    with pytest.raises(DataError, match=r"rows\.jsonl:1: '(nums|target)' must be"):
        load_puzzles(write_lines(tmp_path / "rows.jsonl", [{**GOOD, "nums": nums, "target": target}]))
    with pytest.raises(DataError, match="line 1: need 'nums'"):
        countdown.convert_countdown_tasks(write_lines(tmp_path / "tasks.jsonl", [{"nums": nums, "target": target}]))


def test_load_puzzles_missing_empty_and_binary(tmp_path):
    with pytest.raises(DataError, match=r"no such file; run `python3 countdown\.py`"):
        load_puzzles(str(tmp_path / "absent.jsonl"))
    with pytest.raises(DataError, match="no puzzles"):
        load_puzzles(write_lines(tmp_path / "empty.jsonl", []))
    (tmp_path / "binary.jsonl").write_bytes(b"\xff\xfe\x00garbage\n")
    with pytest.raises(DataError, match=r"binary\.jsonl:1: not valid JSON"):
        load_puzzles(str(tmp_path / "binary.jsonl"))
    with pytest.raises(DataError, match="cannot read"):
        load_puzzles(str(tmp_path))  # a folder


TASKS = [
    {"nums": [44, 19, 35], "target": 98},
    {"nums": [19, 44, 35], "target": 98},  # duplicate of the first
    {"nums": [1, 1, 1], "target": 99},  # unsolvable
    {"nums": [63, 95, 96], "target": 64},
    {"nums": [95, 11, 56], "target": 28},
    {"nums": [19, 74, 45], "target": 48},
    {"nums": [2, 3, 5, 7], "target": 24},
]


def test_convert_countdown_tasks_jsonl(tmp_path, capsys):
    path = write_lines(tmp_path / "tasks.jsonl", TASKS)
    rows = countdown.convert_countdown_tasks(path)
    assert [row["nums"] for row in rows] == [t["nums"] for i, t in enumerate(TASKS) if i not in (1, 2)]
    for row in rows:
        check_solution(row["nums"], row["target"], row["solution"], smallest=0)
        assert row == make_row(row["nums"], row["target"], row["solution"])
    assert "7 tasks, 1 duplicates dropped, 1 unsolvable dropped, 5 converted" in capsys.readouterr().out
    assert len(countdown.convert_countdown_tasks(path, limit=2, seed=0)) == 2


def test_convert_countdown_tasks_parquet(tmp_path):
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        (tmp_path / "tasks.parquet").write_bytes(b"PAR1")
        with pytest.raises(DataError, match="needs pyarrow"):
            countdown.convert_countdown_tasks(str(tmp_path / "tasks.parquet"))
        return
    pq.write_table(pa.Table.from_pylist(TASKS), tmp_path / "tasks.parquet")
    assert len(countdown.convert_countdown_tasks(str(tmp_path / "tasks.parquet"))) == 5


@pytest.mark.parametrize(
    "lines, message",
    [
        ([TASKS[0], {"nums": [1, 2]}], r"tasks\.jsonl: line 2: need 'nums'"),
        ([TASKS[0], {"nums": [1, 2, 3, 4, 5, 6, 7], "target": 5}], "line 2: need 'nums'"),
        (["{oops"], r"tasks\.jsonl:1: not valid JSON"),
        ([], "no tasks"),
    ],
)
def test_convert_countdown_tasks_errors(tmp_path, lines, message):
    with pytest.raises(DataError, match=message):
        countdown.convert_countdown_tasks(write_lines(tmp_path / "tasks.jsonl", lines))


# -----------------------------------------------------------------------------
# command line


def test_cli_writes_deterministic_leak_free_splits(tmp_path):
    args = ("--train-size", "3000", "--test-size", "300", "--seed", "11")
    first = run_cli(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    out = tmp_path / "data" / "countdown" / "qwen"  # the default --out-dir
    assert sorted(p.name for p in out.iterdir()) == ["test_e.jsonl", "train_e.jsonl"]
    assert run_cli(*args, "--out-dir", "again", cwd=tmp_path).returncode == 0
    for name in ("test_e.jsonl", "train_e.jsonl"):
        assert (out / name).read_bytes() == (tmp_path / "again" / name).read_bytes()
    test, train = load_puzzles(str(out / "test_e.jsonl")), load_puzzles(str(out / "train_e.jsonl"))
    assert (len(test), len(train)) == (300, 3000)
    assert not {puzzle_key(r) for r in test} & {puzzle_key(r) for r in train}


def test_cli_from_countdown_tasks(tmp_path):
    tasks = write_lines(tmp_path / "tasks.jsonl", TASKS)
    result = run_cli("--from-countdown-tasks", tasks, "--test-size", "2", "--train-size", "3", "--out-dir", "out", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    test, train = load_puzzles(str(tmp_path / "out" / "test_e.jsonl")), load_puzzles(str(tmp_path / "out" / "train_e.jsonl"))
    assert (len(test), len(train)) == (2, 3)
    assert not {puzzle_key(r) for r in test} & {puzzle_key(r) for r in train}


@pytest.mark.parametrize(
    "args",
    [
        ("--min-numbers", "4", "--max-numbers", "3"),
        ("--max-numbers", "7"),
        ("--num-min", "0"),
        ("--target-min", "50", "--target-max", "40"),
        ("--train-size", "0"),
        ("--test-size", "-5"),
        ("--seed", "abc"),
        ("--bogus",),
        ("--min-numbers", "2", "--max-numbers", "2", "--num-min", "1", "--num-max", "3", "--target-min", "1", "--target-max", "2"),
        ("--min-numbers", "2", "--max-numbers", "2", "--num-max", "2", "--target-min", "50", "--target-max", "60"),
        ("--from-countdown-tasks", "missing.parquet"),
        ("--from-countdown-tasks", "tasks.jsonl"),  # only 5 solvable puzzles for 1,100 wanted
    ],
)
def test_cli_errors_are_one_line_and_write_nothing(tmp_path, args):
    write_lines(tmp_path / "tasks.jsonl", TASKS)
    out = tmp_path / "out"
    out.mkdir()
    (out / "test_e.jsonl").write_text("old\n")
    sizes = () if "--train-size" in args or "--test-size" in args else ("--train-size", "1000", "--test-size", "100")
    result = run_cli(*args, *sizes, "--out-dir", "out", cwd=tmp_path)
    assert result.returncode == 2
    assert "wrote" not in result.stdout
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("countdown.py: error: "), result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["test_e.jsonl"]  # untouched, nothing new
    assert (out / "test_e.jsonl").read_text() == "old\n"


def test_cli_help():
    result = run_cli("--help", cwd=ROOT)
    assert result.returncode == 0
    for option in ("--out-dir", "--train-size", "--test-size", "--seed", "--min-numbers", "--max-numbers",
                   "--num-min", "--num-max", "--target-min", "--target-max", "--from-countdown-tasks"):
        assert option in result.stdout
