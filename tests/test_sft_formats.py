"""Tests for sft_formats: every reasoning format of the SFT warm start works out its steps
exactly, scores full marks with the reward and ends in the target format."""

import itertools
import random
import re
from fractions import Fraction

import pytest

import evaluate
from countdown import generate_puzzles, make_row
from reward_score import compute_score, has_think_answer_format
from sft_formats import completions
from test_countdown import check_solution


def test_reference_completion_scores_full_marks():
    for row in generate_puzzles(300, seed=3, min_numbers=2, max_numbers=6):
        completion = completions.reference_completion(row)
        assert compute_score(completion, row) == 1.0
        assert has_think_answer_format(completion)
        assert completion.endswith(f"<answer>{row['solution']}</answer>")
    assert completions.solution_steps("(1 + 2) * 3") == ["1 + 2 = 3", "3 * 3 = 9"]
    assert completions.solution_steps("8 / (3 - 8 / 3)") == ["8 / 3 = 8/3", "3 - 8/3 = 1/3", "8 / 1/3 = 24"]
    for invalid in ("1 ** 2", "1 / (2 - 2)"):  # what the reward calls an invalid expression
        with pytest.raises(ValueError, match="not a valid Countdown expression"):
            completions.solution_steps(invalid)


def test_failed_attempts_use_every_number_once_and_miss_the_target():
    rng = random.Random(0)
    for row in generate_puzzles(300, seed=4, min_numbers=2, max_numbers=5):
        attempts = completions.failed_attempts(row, 2, rng)
        assert len(attempts) == 2
        for attempt in attempts:
            value = Fraction(completions.solution_steps(attempt)[-1].split(" = ")[-1])
            lo, hi = completions.FAILED_VALUE_RANGE
            assert value != row["target"] and lo <= value <= hi
            assert compute_score(f"<think>x</think><answer>{attempt}</answer>", row) < 1.0
            check_solution(row["nums"], int(value), attempt)
    # A puzzle whose every expression hits the target has no failed attempt to show.
    assert completions.failed_attempts({"nums": [999, 999], "target": 1}, 1, rng) == []


def test_retry_format_shows_each_failure_rejected_then_the_solution():
    row = make_row([90, 4, 3], 78, "90 - 4 * 3")
    completion = completions.reference_completion(row, ["4 - 3 + 90", "90 / (4 - 3)"])
    assert completion == (
        "<think>\nI need to make 78 from 90, 4, 3, using each number once.\n"
        "4 - 3 = 1\n1 + 90 = 91\nThat makes 91, not 78.\n"
        "4 - 3 = 1\n90 / 1 = 90\nThat makes 90, not 78.\n"
        "4 * 3 = 12\n90 - 12 = 78\nSo 90 - 4 * 3 = 78.\n</think>\n<answer>90 - 4 * 3</answer>"
    )
    assert compute_score(completion, row) == 1.0


def test_numbers_left_follow_every_step_but_an_attempts_last():
    row = make_row([90, 4, 3], 78, "90 - 4 * 3")
    completion = completions.reference_completion(row, ["4 - 3 + 90"], numbers_left=True)
    assert completion == (
        "<think>\nI need to make 78 from 90, 4, 3, using each number once.\n"
        "4 - 3 = 1\nLeft: 90, 1\n1 + 90 = 91\nThat makes 91, not 78.\n"
        "4 * 3 = 12\nLeft: 90, 12\n90 - 12 = 78\nSo 90 - 4 * 3 = 78.\n</think>\n<answer>90 - 4 * 3</answer>"
    )
    fractions = completions.reference_completion(make_row([8, 3, 8, 3], 24, "8 / (3 - 8 / 3)"), numbers_left=True)
    assert "\n8 / 3 = 8/3\nLeft: 8, 3, 8/3\n3 - 8/3 = 1/3\nLeft: 8, 1/3\n" in fractions
    rng = random.Random(0)
    for row in generate_puzzles(300, seed=7, min_numbers=2, max_numbers=5):
        completion = completions.reference_completion(
            row, completions.failed_attempts(row, 1, rng), columns=True, numbers_left=True
        )
        assert compute_score(completion, row) == 1.0
        steps = len(completions.solution_steps(row["solution"]))
        lefts = [line for line in completion.split("\n") if line.startswith("Left: ")]
        # the solution's states (the last steps - 1) shrink by one number a step, down to two
        assert [len(line.split(", ")) for line in lefts[len(lefts) - steps + 1 :]] == list(
            range(len(row["nums"]) - 1, 1, -1)
        )


def test_numbers_after_step_refuses_a_step_that_uses_a_number_not_left():
    with pytest.raises(ValueError, match="7 is not among the numbers left"):
        completions.numbers_after_step([90, 4, 3], 7, 3, 21)


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
                work = completions.column_work(a, op, b)
                if value < 0:
                    assert work is None  # the puzzles' steps never subtract the larger number
                    continue
                assert column_result(work) == value, (a, op, b, work)
                for part in work.split("; "):  # every part's own arithmetic is right
                    sums, result = part.split(",")[0].split(" is ")
                    assert small_sum(sums) == int(result), work
    assert completions.column_work(49, "+", 89) == "9 + 9 is 18, carry 1; 4 + 8 + 1 is 13"
    assert completions.column_work(82, "-", 49) == "12 - 9 is 3, borrow 1; 8 - 1 - 4 is 3"
    assert completions.column_work(6, "*", 7) is None and completions.column_work(8, "/", 2) is None


def test_columns_format_shows_the_work_before_each_plus_and_minus_step():
    row = make_row([90, 4, 3], 78, "90 - 4 * 3")
    completion = completions.reference_completion(row, ["4 - 3 + 90"], columns=True)
    assert completion == (
        "<think>\nI need to make 78 from 90, 4, 3, using each number once.\n"
        "4 - 3: 4 - 3 is 1; 0 - 0 is 0\n4 - 3 = 1\n1 + 90: 1 + 0 is 1; 0 + 9 is 9\n1 + 90 = 91\n"
        "That makes 91, not 78.\n"
        "4 * 3 = 12\n90 - 12: 10 - 2 is 8, borrow 1; 9 - 1 - 1 is 7\n90 - 12 = 78\n"
        "So 90 - 4 * 3 = 78.\n</think>\n<answer>90 - 4 * 3</answer>"
    )
    fractions = completions.reference_completion(make_row([8, 3, 8, 3], 24, "8 / (3 - 8 / 3)"), columns=True)
    assert "\n3 - 8/3 = 1/3\n" in fractions and " is " not in fractions  # a fraction's step stays plain
    for row in generate_puzzles(300, seed=5, min_numbers=2, max_numbers=5):
        completion = completions.reference_completion(row, columns=True)
        assert compute_score(completion, row) == 1.0
        # evaluate.py's exact steps read the step lines only, not the column work
        steps = len(completions.solution_steps(row["solution"]))
        assert evaluate.worked_steps(completion) == (steps, steps)


def test_signs_completion_finds_the_numbers_to_subtract_by_arithmetic():
    completion = completions.signs_completion(make_row([19, 36, 55, 7], 65, "55 + 36 - 7 - 19"))
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
        completion = completions.signs_completion(row)
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
    completion = completions.signs_completion(make_row([54, 96, 81], 64, "54 * 96 / 81"))
    assert "\n231 - 64 = 167\n167 is odd.\nSo + and - alone cannot make 64.\n" in completion
    assert completion.endswith("54 * 96 = 5184\n5184 / 81 = 64\nSo 54 * 96 / 81 = 64.\n</think>\n<answer>54 * 96 / 81</answer>")
    smaller = completions.signs_completion(make_row([2, 3], 6, "2 * 3"))
    assert "\n2 + 3 = 5\n5 is less than 6.\nSo + and - alone cannot make 6.\n" in smaller
    assert smaller.endswith("<answer>2 * 3</answer>")
