"""Supervised warm start on countdown.py's reference solutions, with AReaL's SFTTrainer.

A model built from scratch (tools/make_tiny_model.py) cannot earn any reward, so GRPO would
have nothing to reinforce. A short round of supervised fine-tuning on the stored solutions,
written in the `<think>...</think><answer>...</answer>` format, gives it a non-zero success
rate to start from (docs/results.md).

    torchrun --nproc-per-node 1 sft.py --config configs/sft_warm_start.yaml  (AREAL_SPMD_MODE=1)
"""

from __future__ import annotations

import sys

from datasets import Dataset

import countdown
import packed_sdpa
from areal import SFTTrainer
from areal.api.cli_args import SFTConfig, load_expr_config
from areal.utils.hf_utils import load_hf_tokenizer

packed_sdpa.install()


def sft_example(tokenizer, row: dict) -> dict[str, list[int]]:
    """Prompt (chat template, as in training) + reference completion + EOS; loss on the latter."""
    prompt = countdown.prompt_token_ids(tokenizer, row["messages"])
    completion = tokenizer.encode(countdown.reference_completion(row), add_special_tokens=False)
    completion.append(tokenizer.eos_token_id)
    return {"input_ids": prompt + completion, "loss_mask": [0] * len(prompt) + [1] * len(completion)}


def main(argv: list[str]) -> None:
    config, _ = load_expr_config(argv, SFTConfig)
    tokenizer = load_hf_tokenizer(config.tokenizer_path)
    rows = countdown.load_puzzles(config.train_dataset.path)
    train_set = Dataset.from_list([sft_example(tokenizer, row) for row in rows])
    with SFTTrainer(config, train_dataset=train_set) as trainer:
        trainer.train()


if __name__ == "__main__":
    main(sys.argv[1:])
