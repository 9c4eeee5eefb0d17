"""Hostile completions for the reward, in one table: tests/test_reward_score.py checks
that each scores without raising and quickly, and experiments/bench/bench_reward.py times each
against the regex + eval baseline. A case added here is covered by both.

Model output is hostile input: these are huge texts, floods of tags, deep nesting,
numbers too long for int(), eval bait and invalid Unicode. The sums in them are
written for PUZZLE."""

PUZZLE = {"target": 6, "nums": [1, 2, 3]}

HOSTILE_COMPLETIONS: dict[str, str] = {
    "10 MB of text, no tags": "x" * 10_000_000,
    "10 MB inside one answer": "<answer>" + "1 + " * 2_500_000 + "1</answer>",
    "100k nested parentheses": "<answer>" + "(" * 100_000 + "1 + 2 + 3" + ")" * 100_000 + "</answer>",
    "100k <answer> tags": "<answer>" * 100_000 + "1 + 2 + 3</answer>",
    "100k </answer> tags": "<answer>1 + 2 + 3" + "</answer>" * 100_000,
    "100k unclosed <answer> tags after an answer": "<answer>1 + 2 + 3</answer>" + "<answer>" * 100_000,
    "100k answer blocks": "<answer>1 + 2</answer>" * 100_000,
    "100k one-number answer blocks": "<answer>1</answer>" * 100_000,
    "1 MB of NUL bytes in answer": "<answer>" + "\x00" * 1_000_000 + "</answer>",
    "1,000 <answer> tags each followed by NUL": "<answer>\x00" * 1000 + "</answer>",
    "5,000-digit number": "<answer>" + "9" * 5000 + "</answer>",
    "9**9**9 (power tower)": "<answer>9**9**9</answer>",
    "9**9**9**9**9 (power tower)": "<answer>9**9**9**9**9</answer>",
    "lone surrogates": "<think>\ud800\udfff</think><answer>\udc00</answer>",
}
