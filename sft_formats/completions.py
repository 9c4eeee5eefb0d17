"""The reference completions the SFT warm start learns (sft.py), written from a puzzle's
stored solution in the target format: the reasoning in <think>, then <answer>.

Each step is worked out by the reward's own parser and evaluator (`worked_out`), so the
reasoning shown is the arithmetic that scores it. The formats, each measured in
docs/results/goal-65.md:

- direct (`reference_completion`): the solution's steps, one line each.
- retry (`failed` attempts from `failed_attempts`): wrong expressions worked out first, each
  rejected by a check against the target; a model that checks and tries again turns several
  guesses into one answer ("The retry format").
- column arithmetic (`columns`, `column_work`): each + and - step after its sum done on
  paper; a small model that writes `a op b = v` in one go guesses v ("Steps that compute").
- numbers left (`numbers_left`): each step followed by the numbers still to use; a model
  that computes its steps but does not track them reuses, drops or invents numbers
  ("Steps that compute and track").
- signs (`signs_completion`): a + and - solution found by arithmetic instead of guessed
  ("A warm start that finds a + and - solution by arithmetic").

Like countdown.py, standard library only, no AReaL import.
"""

import itertools
import random
from collections.abc import Sequence
from fractions import Fraction

from countdown import random_tree, render
from reward_score import Step, evaluate, parse_expression

FAILED_VALUE_RANGE = (1, 999)  # a failed attempt's value: short enough to read back
FAILED_ATTEMPT_DRAWS = 20  # random expressions drawn per failed attempt asked for


def reference_completion(
    row: dict, failed: Sequence[str] = (), columns: bool = False, numbers_left: bool = False
) -> str:
    """A completion in the exact target format, reasoning step by step through the
    stored solution; for supervised warm-start and tokenizer training.

    `failed` expressions are worked out first, each rejected by a line that checks its
    value against the target ("That makes 330, not 65."), the retry format: a model that
    checks and tries again turns several guesses into one answer (docs/results/goal-65.md).
    With `columns`, each + and - step is preceded by its column arithmetic
    (`column_work`): a small model that writes `a op b = v` in one go guesses v
    (docs/results/goal-65.md, exact steps), and a check against the target is only worth as much
    as the value it checks.
    With `numbers_left`, each step but an attempt's last is followed by the numbers still to
    use ("Left: 90, 12"), the state of the search: a model that computes its steps but
    does not track them reuses, drops or invents numbers (docs/results/goal-65.md, steps that compute).
    """
    target = row["target"]
    lines = [f"I need to make {target} from {', '.join(map(str, row['nums']))}, using each number once."]
    left = row["nums"] if numbers_left else None
    for attempt in failed:
        steps = worked_out(attempt)
        lines += [*step_lines(steps, columns, left), f"That makes {steps[-1][-1]}, not {target}."]
    solution = row["solution"]
    lines += [*step_lines(worked_out(solution), columns, left), f"So {solution} = {target}."]
    return think_answer(lines, solution)


def signs_completion(row: dict) -> str:
    """A completion that finds a + and - solution by arithmetic instead of guessing one.

    Any expression of + and - alone adds some numbers and subtracts the others, so it equals
    the sum of all the numbers minus twice the ones subtracted: those add up to
    (sum - target) / 2. The reasoning adds all the numbers, takes away the target, halves
    the difference and looks for numbers that add up to the half, every sum in column
    arithmetic (`column_work`). Most puzzles have such a solution (docs/results/goal-65.md); for
    the others it says so and works through the stored solution, which then needs * or /.
    """
    nums, target = row["nums"], row["target"]
    lines = [f"I need to make {target} from {', '.join(map(str, nums))}, using each number once."]
    search, subtracted = subtraction_search(nums, target)
    lines += sum_lines(nums) + search
    if subtracted is None:
        answer = row["solution"]
        lines += step_lines(worked_out(answer), columns=True)
    else:
        kept = without(nums, subtracted)
        answer = " + ".join(map(str, kept)) + "".join(f" - {n}" for n in subtracted)
    lines.append(f"So {answer} = {target}.")
    return think_answer(lines, answer)


def think_answer(lines: list[str], answer: str) -> str:
    """The target format of every reference completion: the reasoning's lines, then the answer."""
    return "<think>\n" + "\n".join(lines) + "\n</think>\n<answer>" + answer + "</answer>"


def subtraction_search(nums: Sequence[int], target: int) -> tuple[list[str], list[int] | None]:
    """The lines of `signs_completion` after the sum of all `nums`, and the numbers to
    subtract they find, or None when + and - alone cannot make `target`.

    The numbers subtracted add up to half = (total - target) / 2 and the numbers kept to
    target + half. One number is checked against both; then, with four numbers or more,
    the groups that hold the first number (every split of the numbers in two has one
    side that holds it)."""
    cannot, total = f"So + and - alone cannot make {target}.", sum(nums)
    if total < target:
        return [f"{total} is less than {target}.", cannot], None
    lines = step_lines([(total, "-", target, total - target)], columns=True)
    if (total - target) % 2:
        return [*lines, f"{total - target} is odd.", cannot], None
    half = (total - target) // 2
    lines.append(f"Half of {total - target} is {half}: the numbers to subtract add up to {half}.")
    if half == 0:
        return [*lines, "Nothing to subtract."], []
    if half in nums:
        return [*lines, f"{half} is one of the numbers."], [half]
    keep = target + half
    lines += step_lines([(target, "+", half, keep)], columns=True)
    lines.append(f"The numbers to keep add up to {keep}.")
    if keep in nums:
        return [*lines, f"{keep} is one of the numbers."], without(nums, [keep])
    first, others = nums[0], list(nums[1:])
    for size in range(1, len(others) - 1):
        for group in itertools.combinations(others, size):
            lines += sum_lines([first, *group])
            partial = first + sum(group)
            if partial == half:
                return lines, [first, *group]
            if partial == keep:
                return lines, without(others, group)
            lines[-1] += f", not {half} or {keep}."
    return [*lines, f"No numbers add up to {half} or {keep}.", cannot], None


def sum_lines(numbers: Sequence[int]) -> list[str]:
    """The lines that add `numbers` up from the left, each sum after its column arithmetic."""
    steps, total = [], numbers[0]
    for n in numbers[1:]:
        steps.append((total, "+", n, total + n))
        total += n
    return step_lines(steps, columns=True)


def without(values: Sequence, taken: Sequence) -> list:
    """`values` less one occurrence of each of `taken` (a puzzle may repeat a number).
    ValueError, naming the first one missing, if `values` does not hold them all."""
    rest = list(values)
    for n in taken:
        if n not in rest:
            raise ValueError(f"{n} is not among the numbers left {list(values)}")
        rest.remove(n)
    return rest


def step_lines(steps: list[Step], columns: bool, nums: Sequence[int] | None = None) -> list[str]:
    """The steps' lines, each + and - of whole numbers after its column arithmetic when
    `columns`; with the puzzle's `nums`, each step but the last is followed by the numbers
    left to use. ValueError if such a step uses a number that is not left (the last step is
    not checked: no line follows it)."""
    lines, left = [], nums
    for i, (a, op, b, value) in enumerate(steps):
        work = column_work(a, op, b) if columns and isinstance(a, int) and isinstance(b, int) else None
        lines += [f"{a} {op} {b}: {work}"] if work else []
        lines.append(f"{a} {op} {b} = {value}")
        if nums is not None and i < len(steps) - 1:
            left = numbers_after_step(left, a, b, value)
            lines.append("Left: " + ", ".join(map(str, left)))
    return lines


def numbers_after_step(left: Sequence, a: int | Fraction, b: int | Fraction, value: int | Fraction) -> list:
    """The numbers to use after a step: `a` and `b` taken out, `value` added at the end."""
    try:
        return [*without(left, (a, b)), value]
    except ValueError as e:
        raise ValueError(f"step {a}, {b}: {e}") from None


def column_work(a: int, op: str, b: int) -> str | None:
    """`a op b` the way it is done on paper, ones first, then the rest with the carry or
    borrow: 49 + 89 -> "9 + 9 is 18, carry 1; 4 + 8 + 1 is 13" (so 138); 82 - 49 ->
    "12 - 9 is 3, borrow 1; 8 - 1 - 4 is 3" (so 33). Each part is a sum of small numbers,
    and the result is the rest's digits then the ones digit. None for * and /, and for a
    negative difference (the puzzles' steps never have one)."""
    ones_a, ones_b, rest_a, rest_b = a % 10, b % 10, a // 10, b // 10
    if op == "+":
        ones = ones_a + ones_b
        if ones < 10:
            return f"{ones_a} + {ones_b} is {ones}; {rest_a} + {rest_b} is {rest_a + rest_b}"
        return f"{ones_a} + {ones_b} is {ones}, carry 1; {rest_a} + {rest_b} + 1 is {rest_a + rest_b + 1}"
    if op == "-" and a >= b:
        if ones_a >= ones_b:
            return f"{ones_a} - {ones_b} is {ones_a - ones_b}; {rest_a} - {rest_b} is {rest_a - rest_b}"
        return (f"{ones_a + 10} - {ones_b} is {ones_a + 10 - ones_b}, borrow 1; "
                f"{rest_a} - 1 - {rest_b} is {rest_a - 1 - rest_b}")  # fmt: skip
    return None


def failed_attempts(row: dict, count: int, rng: random.Random) -> list[str]:
    """`count` random expressions that use each of the row's numbers once and miss its
    target, for `reference_completion`; fewer in the rare puzzle where a bounded number
    of draws finds no such expression."""
    attempts: list[str] = []
    for _ in range(FAILED_ATTEMPT_DRAWS * count):
        if len(attempts) == count:
            break
        tree = random_tree(rng, row["nums"], FAILED_VALUE_RANGE)
        if tree is not None and tree[0] != row["target"]:
            attempts.append(render(tree))
    return attempts


def solution_steps(solution: str) -> list[str]:
    """'(1 + 2) * 3' -> ['1 + 2 = 3', '3 * 3 = 9']: one line per operation (`worked_out`)."""
    return step_lines(worked_out(solution), columns=False)


def worked_out(solution: str) -> list[Step]:
    """The operations of `solution` in order, with their values, worked out by the reward's
    own parser and evaluator, so the reasoning shown in a reference completion is the
    arithmetic that scores it. ValueError for anything the reward would call an invalid
    expression, division by zero included."""
    postfix = parse_expression(solution)
    steps: list[Step] = []
    if postfix is None or evaluate(postfix, steps) is None:
        raise ValueError(f"not a valid Countdown expression: {solution!r}")
    return steps
