"""One GRPO update with the shipped actor settings moves the policy the right way.

The check that would have saved a GPU session: take one group of completions for one
puzzle, reward half of them, run AReaL's FSDPPPOActor (compute_logp, compute_advantages,
ppo_update) with `train_config.yaml`'s loss and normalisation settings, and compare the
log-probabilities of the completions before and after. Rewarded completions must become
more likely and the others less likely. Runs as its own process (the `single_rank`
fixture) on the tiny model, on CPU.
"""

import pytest

SCRIPT = r"""
import json, sys
root, model_path = sys.argv[1], sys.argv[2]
import torch
from transformers import AutoTokenizer
from areal.api import FinetuneSpec
from areal.api.alloc_mode import ModelAllocation
from areal.api.cli_args import load_expr_config
from areal.engine import FSDPPPOActor
import countdown, train
from areal_patches import packed_sdpa
from reward_score import compute_score

packed_sdpa.install()
config, _ = load_expr_config([
    "--config", f"{root}/train_config.yaml", f"actor.path={model_path}", "actor.dtype=float32",
    "actor.backend=fsdp:d1", "actor.gradient_checkpointing=false", "actor.optimizer.lr=1e-5",
    "actor.optimizer.warmup_steps_proportion=0", "actor.ppo_n_minibatches=1", "gconfig.n_samples=4",
], train.CountDownConfig)
actor = FSDPPPOActor(config.actor)
actor.create_process_group(parallel_strategy=ModelAllocation.from_str("fsdp:d1").parallel)
actor.initialize(None, FinetuneSpec(total_train_epochs=1, dataset_size=100, train_batch_size=1))

tokenizer = AutoTokenizer.from_pretrained(model_path)
puzzle = {"nums": [49, 89, 39], "target": 99}
prompt = countdown.prompt_token_ids(tokenizer, countdown.make_messages(puzzle["nums"], puzzle["target"]))
right = "<think>\n49 + 89 = 138\n138 - 39 = 99\n</think>\n<answer>49 + 89 - 39</answer>"
wrong = "<think>\n89 + 39 = 128\n128 - 49 = 99\n</think>\n<answer>89 + 39 - 49</answer>"

class Response:  # the fields of AReaL's ModelResponse that train.trajectory reads
    def __init__(self, text, logprobs=None):
        self.input_tokens = prompt
        self.output_tokens = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        self.input_len, self.output_len = len(prompt), len(self.output_tokens)
        self.output_logprobs = logprobs or [0.0] * self.output_len
        self.output_versions = [0] * self.output_len

texts = [right, wrong, right, wrong]
rewards = [compute_score(t, puzzle) for t in texts]

def completion_logps(batch):
    out = []
    for logp, item in zip(actor.compute_logp(batch), batch):
        n = int(item["loss_mask"].sum())
        out.append(logp.reshape(-1)[-n - 1:-1])  # logp[t] scores token t+1
    return out

# The server's log-probs for the sampled tokens are the actor's own here (on-policy).
probe = [train.trajectory(Response(t), r) for t, r in zip(texts, rewards)]
before = completion_logps(probe)
batch = [train.trajectory(Response(t, lp.tolist()), r) for t, lp, r in zip(texts, before, rewards)]
for item, logp in zip(batch, actor.compute_logp(batch)):
    item["prox_logp"] = logp
actor.ppo_update(actor.compute_advantages(batch))
after = completion_logps(batch)
actor.destroy()
print("RESULT", json.dumps({"rewards": rewards,
      "delta": [float((a - b).sum()) for a, b in zip(after, before)]}))
"""


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_one_update_raises_rewarded_completions_and_lowers_the_rest(tiny_model_dir, single_rank):
    result = single_rank(SCRIPT, tiny_model_dir)
    assert result["rewards"] == [1.0, 0.1, 1.0, 0.1]
    right, wrong = result["delta"][0], result["delta"][1]
    assert right > 0 > wrong, result["delta"]
    assert result["delta"][2] == pytest.approx(right) and result["delta"][3] == pytest.approx(wrong)
