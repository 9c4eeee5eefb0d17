"""Reward for the Countdown numbers game: safe, exact and fast.

A completion earns `score` (1.0) when its last `<answer>...</answer>` block holds an
arithmetic expression that uses exactly the puzzle's numbers and equals the target,
`format_score` (0.1) when it has an answer block that is not a correct solution, and
0.0 when it has no answer block at all.

Rules (docs/task.md, "Reward", says the same):

- The answer is the block opened by the last `<answer>` tag that has a `</answer>`
  after it; its content ends at the first `</answer>` after that tag. It may span
  lines and be followed by more text.
- A trailing `= <number>` inside the answer is dropped before scoring.
- Grammar: ASCII integer literals written without leading zeros, `+ - * /`,
  parentheses and ASCII whitespace. No unary signs, `**`, `//`, decimals, Unicode
  digits, names or calls. Answers longer than MAX_ANSWER_CHARS are invalid.
- The literals must be exactly the given multiset of numbers, and the value must
  equal the target exactly. Arithmetic is exact rational arithmetic, so non-integer
  intermediate values are fine: 8 / (3 - 8 / 3) = 24 uses 8, 3, 8, 3 correctly.
  Division by zero makes the expression invalid.

Model output is hostile input. Nothing here calls eval/exec/compile; the parser is
non-recursive (shunting-yard); every scan is a linear str method or a regex made
of a single character class, so there is no backtracking; and the answer length cap
bounds the parser's work and the size of every intermediate integer. A realistic
completion is scored in about 10 us, a 10 MB adversarial one in a few ms
(experiments/bench/bench_reward.py), and `compute_score` never raises because of the
completion. A malformed `ground_truth` is a data or programming error and raises
ValueError instead of being scored as a wrong answer.
"""

import re
from collections.abc import Mapping
from enum import StrEnum
from fractions import Fraction

MAX_ANSWER_CHARS = 1000  # longest answer content (whitespace included) ever parsed
SOLVED_SCORE = 1.0  # compute_score's default `score`: a correct solution

OPEN, CLOSE = "<answer>", "</answer>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

_WS = " \t\n\r\f\v"  # ASCII whitespace only; "\s" would also admit Unicode spaces
_ALLOWED = re.compile(rf"[0-9+\-*/(){_WS}]*")  # one character class: linear, no backtracking
_TOKEN = re.compile(r"[0-9]+|[-+*/()]")
_RESULT = re.compile(rf"[{_WS}]*[0-9]+[{_WS}]*")  # the "65" in "... = 65"
_TARGET_STR = re.compile(r"[+-]?[0-9]+(?:\.0*)?")
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}
_INT_ONLY = frozenset({int})  # the element types of valid 'nums'; built once, checked for every completion

Step = tuple[int | Fraction, str, int | Fraction, int | Fraction]  # (left, operator, right, value)


class Verdict(StrEnum):
    """Why a completion got its score; evaluation buckets failures by these."""

    CORRECT = "correct"
    NO_ANSWER = "no_answer"
    INVALID_EXPRESSION = "invalid_expression"
    WRONG_NUMBERS = "wrong_numbers"
    WRONG_VALUE = "wrong_value"


def compute_score(
    solution_str: object,
    ground_truth: Mapping,
    method: str = "strict",
    format_score: float = 0.1,
    score: float = SOLVED_SCORE,
) -> float:
    """Score a completion: `score` if correct, `format_score` if it has an answer
    block that is not a correct solution, 0.0 if it has none (or is not a str).

    `ground_truth` is the data row: `target` (int, integral float or numeric string)
    and `nums` or `numbers` (an iterable of ints). `method` exists for signature
    compatibility with the Countdown recipes; only "strict" is supported.
    Raises ValueError only for a bad `method` or `ground_truth`, never because of
    `solution_str`.
    """
    if method != "strict":
        raise ValueError(f"unsupported method {method!r}: only 'strict' is implemented")
    verdict = judge(solution_str, ground_truth)
    if verdict is Verdict.CORRECT:
        return float(score)
    if verdict is Verdict.NO_ANSWER:
        return 0.0
    return float(format_score)


def judge(solution_str: object, ground_truth: Mapping) -> Verdict:
    """Classify a completion. Checks run in this order, the first failure deciding:
    answer block present, length and grammar (INVALID_EXPRESSION), numbers used,
    division by zero (INVALID_EXPRESSION), value."""
    target, nums = _parse_ground_truth(ground_truth)  # validated even if there is no answer
    if not isinstance(solution_str, str):
        return Verdict.NO_ANSWER
    start = _answer_start(solution_str)
    if start < 0:
        return Verdict.NO_ANSWER
    end = solution_str.find(CLOSE, start, start + MAX_ANSWER_CHARS + len(CLOSE))  # never scans further
    if end < 0:
        return Verdict.INVALID_EXPRESSION  # longer than MAX_ANSWER_CHARS
    parsed = _parse(_drop_result(solution_str[start:end]))
    if parsed is None:
        return Verdict.INVALID_EXPRESSION
    postfix, literals = parsed
    # Literal strings, compared before any conversion (leading zeros are rejected,
    # so equal strings mean equal numbers).
    if sorted(literals) != sorted(map(str, nums)):
        return Verdict.WRONG_NUMBERS
    value = evaluate(postfix)
    if value is None:
        return Verdict.INVALID_EXPRESSION  # division by zero
    return Verdict.CORRECT if value == target else Verdict.WRONG_VALUE


def extract_answer(solution_str: object) -> str | None:
    """Content of the last complete `<answer>...</answer>` block, or None."""
    if not isinstance(solution_str, str):
        return None
    start = _answer_start(solution_str)
    return None if start < 0 else solution_str[start : solution_str.find(CLOSE, start)]


def parse_expression(expr: str) -> list[str] | None:
    """Parse an answer expression into postfix tokens (shunting-yard), or None if it
    is not in the grammar. `parse_expression("(1 + 2) / 3") == ["1", "2", "+", "3", "/"]`.
    """
    parsed = _parse(expr)
    return None if parsed is None else parsed[0]


def _parse(expr: str) -> tuple[list[str], list[str]] | None:
    """(postfix tokens, number literals in order of appearance), or None."""
    if len(expr) > MAX_ANSWER_CHARS or not _ALLOWED.fullmatch(expr):
        return None
    output: list[str] = []
    literals: list[str] = []
    stack: list[str] = []  # operators and "("
    expect_operand = True
    for token in _TOKEN.findall(expr):
        if expect_operand:
            if token == "(":
                stack.append(token)
            elif token[0] in "123456789" or token == "0":
                output.append(token)
                literals.append(token)
                expect_operand = False
            else:
                return None  # unary sign, ")", operator or leading zero ("07") where a number belongs
        elif token in _PRECEDENCE:
            precedence = _PRECEDENCE[token]
            while stack and stack[-1] != "(" and _PRECEDENCE[stack[-1]] >= precedence:
                output.append(stack.pop())
            stack.append(token)
            expect_operand = True
        elif token == ")":
            while stack and stack[-1] != "(":
                output.append(stack.pop())
            if not stack:
                return None  # unbalanced ")"
            stack.pop()
        else:
            return None  # a number or "(" right after an operand
    if expect_operand:
        return None  # empty, or ends with an operator or "("
    while stack:
        token = stack.pop()
        if token == "(":
            return None  # unbalanced "("
        output.append(token)
    return output, literals


def has_think_answer_format(solution_str: object) -> bool:
    """True for `<think>...</think>`, optional whitespace, `<answer>...</answer>`, with
    exactly one of each tag and nothing but whitespace around the whole."""
    if not isinstance(solution_str, str):
        return False
    text = solution_str.strip()
    if not (text.startswith(THINK_OPEN) and text.endswith(CLOSE)):
        return False
    think_end, answer_start = _only(text, THINK_CLOSE), _only(text, OPEN)
    return (
        _only(text, THINK_OPEN) == 0
        and _only(text, CLOSE) >= 0
        and 0 <= think_end < answer_start
        and text[think_end + len(THINK_CLOSE) : answer_start].strip() == ""
    )


def _only(text: str, tag: str) -> int:
    """Position of the single occurrence of `tag`, or -1 if it occurs 0 or 2+ times.
    Two reverse scans that together cover the text once (on CPython 3.11 rfind is
    several times faster than find or count on long strings)."""
    last = text.rfind(tag)
    return last if last >= 0 and text.rfind(tag, 0, last) < 0 else -1


def format_reward(solution_str: object) -> float:
    """1.0 if `has_think_answer_format`, else 0.0; usable as a separate reward term."""
    return 1.0 if has_think_answer_format(solution_str) else 0.0


def _answer_start(text: str) -> int:
    """Where the content of the answer block starts, or -1: the block opened by the
    last `<answer>` before the last `</answer>`; it ends at the first `</answer>`
    after that. Two C-level scans, linear whatever the number of tags."""
    last_close = text.rfind(CLOSE)
    start = text.rfind(OPEN, 0, last_close) if last_close >= 0 else -1
    return start + len(OPEN) if start >= 0 else -1


def _drop_result(expr: str) -> str:
    """'1 + 2 = 3' -> '1 + 2 '; anything else is returned unchanged."""
    head, equals, tail = expr.rpartition("=")
    return head if equals and _RESULT.fullmatch(tail) else expr


def evaluate(postfix: list[str], steps: list[Step] | None = None) -> int | Fraction | None:
    """Exact value of `parse_expression`'s output, or None on division by zero. Stays
    in plain ints (fast) and switches to Fraction only at an inexact division; the
    length cap bounds sizes. Each operation is appended to `steps` when it is given,
    so that a solution can be explained in the very arithmetic that scores it
    (sft_formats.completions.worked_out)."""
    stack: list[int | Fraction] = []
    for token in postfix:
        if token not in _PRECEDENCE:
            stack.append(int(token))
            continue
        b = stack.pop()
        a = stack.pop()
        value = apply_operator(a, token, b)
        if value is None:
            return None
        stack.append(value)
        if steps is not None:
            steps.append((a, token, b, value))
    return stack[0]


def apply_operator(a: int | Fraction, op: str, b: int | Fraction) -> int | Fraction | None:
    """`a op b` exactly, or None on division by zero; an exact division stays an int."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if b == 0:
        return None
    return a // b if a % b == 0 else Fraction(a) / b


def puzzle_problem(nums: object, target: object) -> str | None:
    """What is wrong with a puzzle's numbers and target, or None if nothing is.

    The one statement of the rule, for the reward (after it converts lenient forms
    such as numpy integers or "24") and for countdown's file loaders (which take JSON
    values as they are): `nums` is a non-empty list of non-negative integers and
    `target` an integer, both of type int exactly, so bool, float and str are refused."""
    if not (isinstance(nums, list) and {*map(type, nums)} == _INT_ONLY and min(nums) >= 0):
        return f"'nums' must be a non-empty list of non-negative integers, got {nums!r}"
    if type(target) is not int:
        return f"'target' must be an integer, got {target!r}"
    return None


def _parse_ground_truth(ground_truth: Mapping) -> tuple[int, list[int]]:
    """(target, numbers) from a data row, validated by `puzzle_problem`; lenient forms
    are converted only when the row fails as it is, so JSON rows take one check."""
    try:
        target = ground_truth["target"]
        nums = ground_truth["nums"] if "nums" in ground_truth else ground_truth["numbers"]
    except (KeyError, TypeError, IndexError) as e:
        raise ValueError(
            f"ground_truth must be a mapping with 'target' and 'nums' (or 'numbers'), got {ground_truth!r}"
        ) from e
    if puzzle_problem(nums, target) is None:
        return target, nums
    target, nums = _as_int(target, "target"), _as_ints(nums)
    problem = puzzle_problem(nums, target)
    if problem is not None:
        raise ValueError(f"ground_truth {problem}")
    return target, nums


def _as_ints(nums: object) -> list[int]:
    """An iterable of integer-valued items -> list of int; anything else -> ValueError.
    A string is refused although it iterates: "123" is no list of numbers."""
    try:
        if isinstance(nums, (str, bytes)):
            raise TypeError
        return [_as_int(n, "each number") for n in nums]
    except TypeError as e:
        raise ValueError(f"ground_truth 'nums' must be an iterable of integers, got {nums!r}") from e


def _as_int(value: object, what: str) -> int:
    """int, integral float or numeric string -> int; anything else -> ValueError."""
    if isinstance(value, bool):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    if isinstance(value, str):
        if not _TARGET_STR.fullmatch(value.strip()):
            raise ValueError(f"{what} must be an integer, got {value!r}")
        return int(value.strip().partition(".")[0])
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"{what} must be an integer, got {value!r}")
        return int(value)
    try:
        return value.__index__()  # int and numpy integers
    except (AttributeError, TypeError):
        raise ValueError(f"{what} must be an integer, got {value!r}") from None
