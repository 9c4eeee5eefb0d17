"""GRPO on the Countdown numbers game with AReaL.

Read top to bottom: the workflow that turns one puzzle into one scored completion, the
data loading, and a short main that hands everything to AReaL's PPOTrainer (FSDP actor,
SGLang rollouts, disk weight pushes, saver, recover handler, evaluator, stats logger).

    python3 countdown.py                                   # data/countdown/qwen/*.jsonl
    python3 train.py --config train_config.yaml scheduler.type=local
    python3 -m areal.infra.launcher.local train.py --config train_config.yaml
"""

from __future__ import annotations

import functools
import os
import sys
import uuid
from dataclasses import dataclass, field

if __name__ == "__main__":  # a mistake costs one line, not the slow imports below
    from devkit.launch import preflight

    preflight.check_trainer_command("train.py", sys.argv[1:], ("train_dataset.path", "valid_dataset.path"))

import numpy as np
import torch
from datasets import Dataset
from transformers import PreTrainedTokenizerFast

import areal_patches
import countdown
from areal_patches import clean_exit, ray_workers, server_watchdog
from devkit.launch import config_errors, preflight
from areal import PPOTrainer, workflow_context
from areal.api import InferenceEngine, ModelRequest, RolloutWorkflow
from areal.api.cli_args import GenerationHyperparameters, GRPOConfig, PPOActorConfig
from areal.utils import stats_tracker
from areal.utils.hf_utils import load_hf_tokenizer
from reward_score import SOLVED_SCORE, compute_score, has_think_answer_format


class CountDownWorkflow(RolloutWorkflow):
    """One puzzle in, one sampled and scored completion out.

    AReaL calls `arun_episode` `gconfig.n_samples` times per puzzle and concatenates the
    results into one GRPO group, so this never returns None: a missing trajectory would
    shrink the group and shift every later group's reward normalisation.
    """

    def __init__(self, gconfig: GenerationHyperparameters, tokenizer: PreTrainedTokenizerFast | str):
        if isinstance(tokenizer, str):
            tokenizer = load_hf_tokenizer(tokenizer)
        self.tokenizer = tokenizer
        self.gconfig = gconfig.new_with_stop_and_pad_token_ids(tokenizer).new(n_samples=1)
        # A group's episodes share their puzzle: its prompt is rendered and encoded once.
        self.encoded_prompt = functools.lru_cache(maxsize=1024)(self.encode_prompt)

    def encode_prompt(self, conversation: tuple[tuple[str, str], ...]) -> tuple[int, ...]:
        messages = [{"role": role, "content": content} for role, content in conversation]
        return tuple(countdown.prompt_token_ids(self.tokenizer, messages))

    async def arun_episode(self, engine: InferenceEngine, data: dict) -> dict:
        conversation = tuple((m["role"], m["content"]) for m in data["messages"])
        request = ModelRequest(
            rid=uuid.uuid4().hex,
            input_ids=list(self.encoded_prompt(conversation)),
            gconfig=self.gconfig,
            tokenizer=self.tokenizer,
        )
        response = await engine.agenerate(request)
        completion = self.tokenizer.decode(response.output_tokens, skip_special_tokens=True)
        reward = compute_score(completion, data)
        log_episode_stats(data, completion, reward, response.output_len, response.stop_reason)
        return trajectory(response, reward)


def log_episode_stats(data: dict, completion: str, reward: float, completion_len: int, stop_reason: str) -> None:
    """Per-episode scalars; AReaL averages them per step under `rollout/` or `eval-rollout/`."""
    solved = float(reward == SOLVED_SCORE)
    stats_tracker.get(workflow_context.stat_scope()).scalar(
        reward=reward,
        success=solved,
        format_ok=float(has_think_answer_format(completion)),
        completion_len=completion_len,
        truncated=float(stop_reason == "length"),
        **{f"success_{len(data['nums'])}nums": solved},
    )


def trajectory(response, reward: float) -> dict[str, torch.Tensor]:
    """The [1, seqlen] tensors AReaL's actor trains on; the loss covers completion tokens only.

    Built in numpy: torch reads a Python list several times slower, and the rollout client runs
    this for every episode, in the trainer's process under the SPMD launchers.
    """
    n_prompt = response.input_len
    length = n_prompt + response.output_len
    loss_mask = np.zeros(length, dtype=np.int32)
    loss_mask[n_prompt:] = 1
    logprobs = np.zeros(length, dtype=np.float32)
    logprobs[n_prompt:] = response.output_logprobs
    versions = np.full(length, -1, dtype=np.int64)
    versions[n_prompt:] = response.output_versions
    input_ids = np.array(response.input_tokens + response.output_tokens, dtype=np.int64)
    return {
        "input_ids": torch.from_numpy(input_ids[None]),
        "attention_mask": torch.ones(1, length, dtype=torch.bool),
        "loss_mask": torch.from_numpy(loss_mask[None]),
        "logprobs": torch.from_numpy(logprobs[None]),
        "versions": torch.from_numpy(versions[None]),
        "rewards": torch.tensor([float(reward)]),
    }


def has_reward_spread(group: dict[str, torch.Tensor]) -> bool:
    """Whether a puzzle's completions earned different rewards.

    With rewards normalised per group, a group whose completions all score the same (all
    solved, or all failed) has zero advantage on every token: it costs a training pass and
    teaches nothing. `skip_uniform_groups` drops such groups and samples more puzzles until
    the batch is full (DAPO's dynamic sampling).
    """
    rewards = group["rewards"]
    return bool(rewards.max() > rewards.min())


@dataclass
class CountDownActorConfig(PPOActorConfig):
    layers_not_checkpointed: int = field(
        default=0,
        metadata={"help": "with gradient checkpointing on, the last N decoder layers keep their "
                  "activations (areal_patches/fast_step.py): faster steps for more memory; 0 is AReaL's"},
    )


@dataclass
class CountDownConfig(GRPOConfig):
    actor: CountDownActorConfig = field(default_factory=CountDownActorConfig)
    skip_uniform_groups: bool = field(
        default=False, metadata={"help": "train only on puzzles whose completions got different rewards"}
    )
    server_health_grace: float = field(
        default=60.0, metadata={"help": "seconds a rollout server may not answer before the run stops (0: never)"}
    )


def load_split(path: str) -> Dataset:
    """Validated puzzles (file and line named on any bad row) as a `datasets.Dataset`."""
    return Dataset.from_list(countdown.load_puzzles(path))


def start_trainer(config: GRPOConfig, train_set: Dataset, valid_set: Dataset) -> PPOTrainer:
    """PPOTrainer, with an actionable message when the inference servers never answer."""
    try:
        return PPOTrainer(config, train_dataset=train_set, valid_dataset=valid_set)
    except TimeoutError as e:
        addrs = os.environ.get("AREAL_LLM_SERVER_ADDRS") or "the launched servers"
        raise SystemExit(
            f"train.py: inference server(s) at {addrs} did not answer GET /health within "
            f"rollout.setup_timeout={config.rollout.setup_timeout:.0f}s; check that they "
            "are running, reachable from this node, and that AREAL_LLM_SERVER_ADDRS is right"
        ) from e


def main(argv: list[str]) -> None:
    areal_patches.apply()  # in this process: the trainer under the SPMD launchers
    config, _ = config_errors.load_config(argv, CountDownConfig, "train.py")
    try:
        preflight.check_model_path(config.actor.path)
        train_set = load_split(config.train_dataset.path)
        valid_set = load_split(config.valid_dataset.path)
    except (countdown.DataError, FileNotFoundError) as e:
        preflight.exit_bad_input("train.py", e)
    if problem := preflight.too_few_for_a_batch(config.train_dataset, f"{len(train_set)} puzzles", len(train_set)):
        preflight.exit_bad_input("train.py", problem)
    ray_workers.install(config.scheduler.type)  # scheduler.type=ray: the fixes in its workers too
    tokenizer_path = config.tokenizer_path
    with clean_exit.no_process_left(), start_trainer(config, train_set, valid_set) as trainer:
        server_watchdog.watch_rollout_servers(trainer, config.server_health_grace)
        trainer.train(
            workflow="train.CountDownWorkflow",
            workflow_kwargs=dict(gconfig=config.gconfig, tokenizer=tokenizer_path),
            eval_workflow="train.CountDownWorkflow",
            eval_workflow_kwargs=dict(gconfig=config.eval_gconfig, tokenizer=tokenizer_path),
            dynamic_filter_fn="train.has_reward_spread" if config.skip_uniform_groups else None,
        )


if __name__ == "__main__":
    # Run as the module `train`, not as `__main__`: in single-controller mode AReaL sends the
    # config to its workers, which rebuild CountDownConfig by its module name.
    import train

    train.main(sys.argv[1:])
