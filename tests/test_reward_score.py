"""Tests for reward_score.py: table-driven cases, hostile inputs, and properties
checked against an independent evaluator (fractions.Fraction, recursive tree walk)."""

import time
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from experiments.bench.hostile_inputs import HOSTILE_COMPLETIONS, PUZZLE
from reward_score import (
    MAX_ANSWER_CHARS,
    Verdict,
    compute_score,
    extract_answer,
    format_reward,
    has_think_answer_format,
    judge,
    parse_expression,
)

C, NA, INV, NUM, VAL = (
    Verdict.CORRECT,
    Verdict.NO_ANSWER,
    Verdict.INVALID_EXPRESSION,
    Verdict.WRONG_NUMBERS,
    Verdict.WRONG_VALUE,
)
ONE_TWO_THREE = {"target": 6, "nums": [1, 2, 3]}
TWENTY_FOUR = {"target": 24, "nums": [8, 3, 8, 3]}
TWO_ONE_ONE = {"target": 2, "nums": [2, 1, 1]}

CASES = [
    # correct answers, in many layouts
    ("<answer>1 + 2 + 3</answer>", ONE_TWO_THREE, C),
    ("<think>1+2=3, 3+3=6</think>\n<answer> (1 + 2) + 3 </answer>", ONE_TWO_THREE, C),
    ("<answer>3*2*1</answer>", ONE_TWO_THREE, C),
    ("<answer>1 + 2 + 3</answer>\nSo the answer is above.", ONE_TWO_THREE, C),  # text after the answer
    ("<answer>\n1 +\n\t2 +\r\n3\n</answer>", ONE_TWO_THREE, C),  # multi-line answer
    ("<answer>1 + 2 + 3 = 6</answer>", ONE_TWO_THREE, C),  # trailing "= <number>" dropped
    ("<answer>1 + 2 + 3 = 7</answer>", ONE_TWO_THREE, C),  # ... whatever the number
    ("<answer>8 / (3 - 8 / 3)</answer>", TWENTY_FOUR, C),  # rational intermediate values
    ("<answer>((((1))) + ((2 + 3)))</answer>", ONE_TWO_THREE, C),
    ("<answer>0</answer> <answer>1 + 2 + 3</answer>", ONE_TWO_THREE, C),  # the last block counts
    ("<answer>1 + 2 + 3</answer> then <answer>1 * 2", ONE_TWO_THREE, C),  # last *complete* block
    ("<answer><answer>1 + 2 + 3</answer></answer>", ONE_TWO_THREE, C),  # nested: innermost block
    ("<answer>1 + 2 + 3</answer></answer>", ONE_TWO_THREE, C),  # stray closing tag
    # no answer block
    ("", ONE_TWO_THREE, NA),
    ("1 + 2 + 3", ONE_TWO_THREE, NA),
    ("<answer>1 + 2 + 3", ONE_TWO_THREE, NA),
    ("1 + 2 + 3</answer>", ONE_TWO_THREE, NA),
    ("</answer>1 + 2 + 3<answer>", ONE_TWO_THREE, NA),
    ("<ANSWER>1 + 2 + 3</ANSWER>", ONE_TWO_THREE, NA),
    # wrong value
    ("<answer>1 + 2 * 3</answer>", ONE_TWO_THREE, VAL),
    ("<answer>1 + 2 + 3</answer> wait, no: <answer>1 * 2 + 3</answer>", ONE_TWO_THREE, VAL),
    ("<answer>(8 * 3) * (8 - 3)</answer>", TWENTY_FOUR, VAL),
    ("<answer>1 / 2 / 3</answer>", ONE_TWO_THREE, VAL),
    # wrong numbers
    ("<answer>1 + 2 + 3 + 3 - 3</answer>", ONE_TWO_THREE, NUM),  # reused
    ("<answer>2 * 3</answer>", ONE_TWO_THREE, NUM),  # missing
    ("<answer>6</answer>", ONE_TWO_THREE, NUM),
    ("<answer>1 + 2 + 3 + 0</answer>", ONE_TWO_THREE, NUM),  # extra
    ("<answer>12 / 2</answer>", ONE_TWO_THREE, NUM),  # digits glued together
    ("<answer>3 * 8 + 3 - 3</answer>", TWENTY_FOUR, NUM),
    # not in the grammar
    ("<answer></answer>", ONE_TWO_THREE, INV),
    ("<answer>   </answer>", ONE_TWO_THREE, INV),
    ("<answer>9**9**9</answer>", ONE_TWO_THREE, INV),
    ("<answer>1 + 2 ** 3</answer>", ONE_TWO_THREE, INV),
    ("<answer>2//1 + 3 + 1</answer>", ONE_TWO_THREE, INV),
    ("<answer>-1 + 2 * 3 + 1</answer>", ONE_TWO_THREE, INV),  # unary minus
    ("<answer>+1 + 2 + 3</answer>", ONE_TWO_THREE, INV),  # unary plus
    ("<answer>1 + -2 + 3</answer>", ONE_TWO_THREE, INV),
    ("<answer>1 + 2 + 3.0</answer>", ONE_TWO_THREE, INV),  # decimal
    ("<answer>1 + 2 + ٣</answer>", ONE_TWO_THREE, INV),  # Arabic-Indic digit
    ("<answer>1 + 2 + ³</answer>", ONE_TWO_THREE, INV),  # superscript digit
    ("<answer>1 + 2²</answer>", ONE_TWO_THREE, INV),
    ("<answer>1 + 2 + ３</answer>", ONE_TWO_THREE, INV),  # fullwidth digit
    ("<answer>1 ＋ 2 + 3</answer>", ONE_TWO_THREE, INV),  # fullwidth plus
    ("<answer>1 × 2 × 3</answer>", ONE_TWO_THREE, INV),
    ("<answer>1\u2003+ 2 + 3</answer>", ONE_TWO_THREE, INV),  # Unicode whitespace
    ("<answer>__import__('os').system('true')</answer>", ONE_TWO_THREE, INV),
    ("<answer>x = 1 + 2 + 3</answer>", ONE_TWO_THREE, INV),
    ("<answer>1 + 2 + 3 = 6 = 6</answer>", ONE_TWO_THREE, INV),
    ("<answer>1 + 2 + 3 = six</answer>", ONE_TWO_THREE, INV),
    ("<answer>1 + 2 + 3 =</answer>", ONE_TWO_THREE, INV),
    ("<answer>= 6</answer>", ONE_TWO_THREE, INV),
    ("<answer>01 + 2 + 3</answer>", ONE_TWO_THREE, INV),  # leading zero
    ("<answer>1 2 + 3</answer>", ONE_TWO_THREE, INV),  # two numbers in a row
    ("<answer>(1 + 2) 3</answer>", ONE_TWO_THREE, INV),
    ("<answer>(1 + 2)(3)</answer>", ONE_TWO_THREE, INV),
    ("<answer>1 + 2 + 3 +</answer>", ONE_TWO_THREE, INV),
    ("<answer>(1 + 2 + 3</answer>", ONE_TWO_THREE, INV),
    ("<answer>1 + 2 + 3)</answer>", ONE_TWO_THREE, INV),
    ("<answer>() 1 + 2 + 3</answer>", ONE_TWO_THREE, INV),
    ("<answer>[1 + 2] + 3</answer>", ONE_TWO_THREE, INV),
    ("<answer>1 + 2 + 3\x00</answer>", ONE_TWO_THREE, INV),
    ("<answer>1 + 2 + \ud8003</answer>", ONE_TWO_THREE, INV),  # lone surrogate
    ("<answer>2 / (1 - 1)</answer>", TWO_ONE_ONE, INV),  # division by zero
    ("<answer>" + "(" * 600 + "1 + 2 + 3" + ")" * 600 + "</answer>", ONE_TWO_THREE, INV),  # over the cap
]


@pytest.mark.parametrize("completion, ground_truth, expected", CASES)
def test_judge_table(completion, ground_truth, expected):
    assert judge(completion, ground_truth) is expected
    score = {C: 1.0, NA: 0.0}.get(expected, 0.1)
    assert compute_score(completion, ground_truth) == score


@pytest.mark.parametrize("target", [24, 24.0, "24", " 24 ", "24.0", "+24"])
def test_target_forms(target):
    assert compute_score("<answer>8 / (3 - 8 / 3)</answer>", {"target": target, "nums": [8, 3, 8, 3]}) == 1.0


def test_nums_forms():
    np = pytest.importorskip("numpy")
    for gt in (
        {"target": 6, "numbers": [1, 2, 3]},
        {"target": 6, "nums": (3, 2, 1)},
        {"target": np.int64(6), "nums": np.array([1, 2, 3])},
        {"target": 6, "nums": [1.0, 2.0, 3.0]},
    ):
        assert compute_score("<answer>1 + 2 + 3</answer>", gt) == 1.0


@pytest.mark.parametrize(
    "ground_truth",
    [
        None,
        {},
        {"nums": [1, 2, 3]},
        {"target": 6},
        {"target": 2.5, "nums": [1, 2, 3]},
        {"target": "six", "nums": [1, 2, 3]},
        {"target": "٦", "nums": [1, 2, 3]},
        {"target": True, "nums": [1, 2, 3]},
        {"target": None, "nums": [1, 2, 3]},
        {"target": 6, "nums": "123"},
        {"target": 6, "nums": 123},
        {"target": 6, "nums": []},
        {"target": 6, "nums": [1, 2, -3]},
        {"target": 6, "nums": [1, 2, 3.5]},
        {"target": 6, "nums": [1, 2, None]},
    ],
)
def test_bad_ground_truth_raises(ground_truth):
    with pytest.raises(ValueError):
        compute_score("<answer>1 + 2 + 3</answer>", ground_truth)


def test_method_and_scores():
    with pytest.raises(ValueError, match="strict"):
        compute_score("<answer>1 + 2 + 3</answer>", ONE_TWO_THREE, method="flexible")
    kwargs = dict(format_score=0.25, score=2.0)
    assert compute_score("<answer>1 + 2 + 3</answer>", ONE_TWO_THREE, **kwargs) == 2.0
    assert compute_score("<answer>1 + 2</answer>", ONE_TWO_THREE, **kwargs) == 0.25
    assert compute_score("no answer", ONE_TWO_THREE, **kwargs) == 0.0


@pytest.mark.parametrize("not_a_string", [None, 6, 6.0, b"<answer>1 + 2 + 3</answer>", ["<answer>1 + 2 + 3</answer>"], object()])
def test_non_string_completion_scores_zero(not_a_string):
    assert compute_score(not_a_string, ONE_TWO_THREE) == 0.0
    assert format_reward(not_a_string) == 0.0


def test_extract_answer_and_parse():
    assert extract_answer("a <answer> x </answer> b <answer>y</answer> c") == "y"
    assert extract_answer("<answer>y") is None
    assert extract_answer(None) is None
    assert parse_expression("(1 + 2) / 3") == ["1", "2", "+", "3", "/"]
    assert parse_expression("1 - 2 - 3") == ["1", "2", "-", "3", "-"]  # left associative
    assert parse_expression("1 - 2 * 3") == ["1", "2", "3", "*", "-"]
    assert parse_expression("1 ** 2") is None


@pytest.mark.parametrize(
    "completion, ok",
    [
        ("<think>reasoning</think><answer>1 + 2 + 3</answer>", True),
        ("<think>\nreasoning\n</think>\n\n<answer>1 + 2 + 3</answer>\n", True),
        ("  <think>r</think> <answer>x</answer>  ", True),  # format only, not correctness
        ("<think>r</think><answer>1</answer> trailing text", False),
        ("preamble <think>r</think><answer>1</answer>", False),
        ("<think>r</think> text <answer>1</answer>", False),
        ("<answer>1</answer><think>r</think>", False),
        ("<think>r</think><answer>1</answer><answer>2</answer>", False),
        ("<think>r</think><think>r</think><answer>1</answer>", False),
        ("<think>r <answer>1</answer>", False),
        ("<think>r</think>", False),
        ("<answer>1</answer>", False),
        ("<think>r</think><answer>1", False),
        ("", False),
    ],
)
def test_format(completion, ok):
    assert has_think_answer_format(completion) is ok
    assert format_reward(completion) == (1.0 if ok else 0.0)


# -----------------------------------------------------------------------------
# hostile inputs: never raise, never slow

@pytest.mark.parametrize("name", HOSTILE_COMPLETIONS)
def test_hostile_inputs_are_fast_and_safe(name):
    text = HOSTILE_COMPLETIONS[name]
    start = time.perf_counter()
    score = compute_score(text, PUZZLE)
    has_think_answer_format(text)
    elapsed = time.perf_counter() - start
    assert score in (0.0, 0.1, 1.0)
    assert elapsed < 0.1, f"{name}: {elapsed * 1e3:.1f} ms"  # a few ms in practice; slack for loaded CI


def test_length_cap_boundary():
    padded = "1 + 2 + 3".ljust(MAX_ANSWER_CHARS)
    assert judge(f"<answer>{padded}</answer>", ONE_TWO_THREE) is C
    assert judge(f"<answer>{padded} </answer>", ONE_TWO_THREE) is INV


FRAGMENTS = ["<answer>", "</answer>", "<think>", "</think>", "1", "2", "3", "0", "+", "-", "*", "/", "**", "//",
             "(", ")", "=", " ", "\n", "6", "٣", "²", ".", "e", "\x00", "\ud800", "<", ">", "answer"]


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(
        st.text(),
        st.binary().map(lambda b: b.decode("latin-1")),
        st.lists(st.sampled_from(FRAGMENTS), max_size=60).map("".join),
        st.tuples(st.sampled_from(FRAGMENTS), st.integers(1, 20_000)).map(lambda t: t[0] * t[1]),
    )
)
def test_any_text_scores_without_raising(text):
    assert compute_score(text, ONE_TWO_THREE) in (0.0, 0.1, 1.0)
    assert compute_score(f"<answer>{text}</answer>", ONE_TWO_THREE) in (0.0, 0.1, 1.0)
    assert isinstance(judge(text, TWENTY_FOUR), Verdict)
    assert isinstance(has_think_answer_format(text), bool)


# -----------------------------------------------------------------------------
# property: random expression trees score as an independent evaluator says

Tree = int | tuple  # a number, or (op, left, right)


def evaluate(tree: Tree) -> Fraction | None:
    """Independent evaluator: recursive walk with Fraction; None on division by zero."""
    if isinstance(tree, int):
        return Fraction(tree)
    op, left, right = tree
    a, b = evaluate(left), evaluate(right)
    if a is None or b is None:
        return None
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return a / b if b != 0 else None


def leaves(tree: Tree) -> list[int]:
    return [tree] if isinstance(tree, int) else leaves(tree[1]) + leaves(tree[2])


def to_text(tree: Tree, space: str) -> str:
    if isinstance(tree, int):
        return str(tree)
    op, left, right = tree
    return f"({to_text(left, space)}{space}{op}{space}{to_text(right, space)})"


@st.composite
def expression_trees(draw) -> Tree:
    """A random binary tree over 1 to 6 numbers, merging random pairs."""
    nodes: list[Tree] = draw(st.lists(st.integers(0, 120), min_size=1, max_size=6))
    while len(nodes) > 1:
        a = nodes.pop(draw(st.integers(0, len(nodes) - 1)))
        b = nodes.pop(draw(st.integers(0, len(nodes) - 1)))
        nodes.append((draw(st.sampled_from("+-*/")), a, b))
    return nodes[0]


@settings(max_examples=500, deadline=None)
@given(expression_trees(), st.sampled_from(["", " ", "\n", " \t "]), st.integers(-3, 3), st.booleans(), st.booleans())
def test_random_trees_match_independent_evaluator(tree, space, target_offset, drop_outer, change_numbers):
    value = evaluate(tree)
    nums = leaves(tree)
    if change_numbers:
        nums = nums[1:] or [nums[0] + 1]
    if value is not None and value.denominator == 1:
        target = int(value) + target_offset
    else:
        target = target_offset  # a non-integral value can never equal an integer target
    text = to_text(tree, space)
    if drop_outer and text.startswith("("):
        text = text[1:-1]
    if change_numbers:
        expected = NUM
    elif value is None:
        expected = INV
    else:
        expected = C if value == target else VAL
    completion = f"<think>...</think>\n<answer>{space}{text}{space}</answer>"
    assert judge(completion, {"target": target, "nums": nums}) is expected
