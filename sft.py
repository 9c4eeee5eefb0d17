"""Supervised warm start on countdown.py's reference solutions, with AReaL's SFTTrainer.

A model built from scratch (devkit/make_tiny_model.py) cannot earn any reward, so GRPO would
have nothing to reinforce. A short round of supervised fine-tuning on the stored solutions,
written in the `<think>...</think><answer>...</answer>` format (sft_formats/completions.py),
gives it a non-zero success rate to start from (docs/results/learning.md).

    python3 sft.py --config configs/sft_warm_start.yaml  (AReaL's single controller, as train.py)
    torchrun --nproc-per-node 1 sft.py --config configs/sft_warm_start.yaml  (AREAL_SPMD_MODE=1)

Several examples share one row (`examples_per_row`), so a batch of B rows trains on
B * examples_per_row examples. Why: AReaL's SPMD trainer moves every row to the GPU and
broadcasts it as separate tensors, a cost per row that on the GPU machine outweighed the
whole update of a 25M model on 512 short rows (docs/results/learning.md). Attention inside a row is
causal across its examples (no cross-example masking), as in naive SFT packing: each
example still sees its own full prompt, and the first example of every row sees nothing
else, as at inference.
"""

from __future__ import annotations

import os
import random
import sys
from dataclasses import dataclass, field

if __name__ == "__main__":  # a mistake costs one line, not the slow imports below
    from devkit.launch import preflight

    preflight.check_trainer_command("sft.py", sys.argv[1:], ("train_dataset.path",))

import torch
from datasets import Dataset

import countdown
import areal_patches
from areal_patches import clean_exit, ray_workers
from devkit.launch import config_errors, preflight
from sft_formats.completions import failed_attempts, reference_completion, signs_completion
from areal import SFTTrainer
from areal.api.cli_args import SFTConfig
from areal.utils.hf_utils import load_hf_tokenizer

MAX_FAILED_ATTEMPTS = 2


def sft_examples(
    tokenizer,
    rows: list[dict],
    retry_probability: float = 0.0,
    seed: int = 0,
    columns: bool = False,
    numbers_left: bool = False,
    signs: bool = False,
) -> list[dict[str, list[int]]]:
    """Prompt (chat template, as in training) + reference completion + EOS; loss on the latter.

    With `retry_probability`, some completions show failed attempts before the solution.
    They are learned too: a model trained only on steps that end at the target learns to
    fake the last step's arithmetic rather than to check it (docs/results/goal-65.md, the retry format).
    With `columns`, + and - steps show their column arithmetic
    (sft_formats.completions.column_work), and with `numbers_left` each step is followed by
    the numbers left to use. With `signs`, the reasoning finds a + and - solution by
    arithmetic (`signs_completion`), and the other three options are ignored. A row with
    `completions` (the model's own correct answers, from evaluate.py --solved-out) gives one
    example for each of them instead of the reference: rejection-sampling fine-tuning.
    """
    rng = random.Random(seed)
    prompts = countdown.batch_prompt_token_ids(tokenizer, [row["messages"] for row in rows])
    pairs = []
    for prompt, row in zip(prompts, rows):
        texts = row.get("completions") or [reference_text(row, rng, retry_probability, columns, numbers_left, signs)]
        pairs += [(prompt, text) for text in texts]
    completions = tokenizer([text for _, text in pairs], add_special_tokens=False)
    examples = []
    for (prompt, _), completion in zip(pairs, completions["input_ids"]):
        completion = [*completion, tokenizer.eos_token_id]
        examples.append({"input_ids": prompt + completion, "loss_mask": [0] * len(prompt) + [1] * len(completion)})
    return examples


def reference_text(
    row: dict, rng: random.Random, retry_probability: float, columns: bool, numbers_left: bool, signs: bool
) -> str:
    """The completion written from the stored solution, in the format the options ask for."""
    if signs:
        return signs_completion(row)
    attempts = failed_attempts(row, failed_count(rng, retry_probability), rng)
    return reference_completion(row, attempts, columns, numbers_left)


def failed_count(rng: random.Random, retry_probability: float) -> int:
    """How many failed attempts an example shows: one more with `retry_probability` each
    time, up to MAX_FAILED_ATTEMPTS (so that the longest completion fits in 256 tokens)."""
    count = 0
    while count < MAX_FAILED_ATTEMPTS and rng.random() < retry_probability:
        count += 1
    return count


def pack_examples(examples: list[dict[str, list[int]]], per_row: int) -> list[dict[str, list[int]]]:
    """Concatenate consecutive examples, `per_row` at a time (the last row may hold fewer)."""
    return [
        {key: [token for example in examples[i : i + per_row] for token in example[key]] for key in examples[i]}
        for i in range(0, len(examples), per_row)
    ]


@dataclass
class WarmStartConfig(SFTConfig):
    examples_per_row: int = field(default=1, metadata={"help": "examples concatenated into one training row"})
    retry_probability: float = field(
        default=0.0,
        metadata={"help": "chance that a reference reasoning shows one more failed attempt before the solution"},
    )
    column_work: bool = field(
        default=False,
        metadata={"help": "show the column arithmetic of every + and - step (sft_formats.completions.column_work)"},
    )
    numbers_left: bool = field(
        default=False,
        metadata={"help": "follow every step with the numbers left to use (sft_formats.completions.step_lines)"},
    )
    signs: bool = field(
        default=False,
        metadata={"help": "find a + and - solution by arithmetic (sft_formats.completions.signs_completion); "
                  "the three options above must stay off"},
    )  # fmt: skip
    deterministic: bool = field(
        default=False,
        metadata={"help": "deterministic CUDA kernels: the same command on the same GPU and software "
                  "writes the same weights, a little slower (use_deterministic_kernels)"},
    )  # fmt: skip


def use_deterministic_kernels() -> None:
    """Make the GPU's reductions add in a fixed order.

    Why: with the data order, seed and initial weights all fixed, two runs of the warm start
    still drift apart on a GPU, because some kernels (flash attention's backward among them)
    add with atomics, in whatever order their threads finish. The drift can move the step
    where the loss leaves its early plateau, and with it the warm start's accuracy
    (docs/results/learning.md, "Reproducibility of the warm start"). Not warn_only: PyTorch's flash
    attention takes its deterministic backward only then, and an op that has no deterministic
    version stops the run with its name instead of drifting quietly. cuBLAS needs the fixed
    workspace for the same guarantee.
    """
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)


def main(argv: list[str]) -> None:
    areal_patches.apply(skip={"weight_push", "fast_step"})  # no rollouts; SFTTrainer's LM engine
    config, _ = config_errors.load_config(argv, WarmStartConfig, "sft.py")
    if config.deterministic:
        use_deterministic_kernels()
        print("[sft] deterministic kernels: torch.use_deterministic_algorithms(True), "
              f"CUBLAS_WORKSPACE_CONFIG={os.environ['CUBLAS_WORKSPACE_CONFIG']}", flush=True)  # fmt: skip
    if not 0 <= config.retry_probability <= 1:
        preflight.exit_bad_input("sft.py", f"retry_probability={config.retry_probability}: give a probability from 0 to 1")
    if config.signs and (config.retry_probability or config.column_work or config.numbers_left):
        preflight.exit_bad_input(
            "sft.py", "signs=true has its own format: leave retry_probability, column_work and numbers_left off"
        )
    try:
        rows = countdown.load_puzzles(config.train_dataset.path)
    except countdown.DataError as e:
        preflight.exit_bad_input("sft.py", e)
    tokenizer = load_hf_tokenizer(config.tokenizer_path)
    examples = sft_examples(
        tokenizer, rows, config.retry_probability, config.seed, config.column_work, config.numbers_left, config.signs
    )
    train_set = Dataset.from_list(pack_examples(examples, config.examples_per_row))
    counted = f"{len(rows)} puzzles in {len(train_set)} rows of up to {config.examples_per_row} examples"
    if problem := preflight.too_few_for_a_batch(config.train_dataset, counted, len(train_set)):
        preflight.exit_bad_input("sft.py", problem)
    ray_workers.install(config.scheduler.type)  # scheduler.type=ray: the fixes in its workers too
    with clean_exit.no_process_left(), SFTTrainer(config, train_dataset=train_set) as trainer:
        trainer.train()


if __name__ == "__main__":
    # Run as the module `sft`, not as `__main__`: in single-controller mode AReaL sends the
    # config to its workers, which rebuild WarmStartConfig by its module name.
    import sft

    sft.main(sys.argv[1:])
