"""Tests for countdown.py: generated data is solvable (checked by an independent
evaluator), deduplicated, leak-free and deterministic; files and CLI fail cleanly."""

import ast
import json
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

import countdown
from conftest import heavy_imports
from countdown import DataError, generate_puzzles, load_puzzles, make_messages, make_row, puzzle_key, solve
from devkit import ROOT
from reward_score import compute_score

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


def test_the_data_the_reward_and_the_sft_formats_import_no_areal_or_torch():
    """countdown.py, reward_score.py and sft_formats run where AReaL is not installed (the
    reward inside any RL stack, the data on any machine), so they import the standard library
    only; a fresh interpreter shows what importing them pulls in."""
    heavy = {"areal", "torch", "transformers", "datasets"}
    assert heavy_imports("countdown, reward_score, sft_formats.completions", heavy) == []


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
