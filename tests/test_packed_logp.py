"""AReaL's FSDP actor with sdpa on packed micro-batches, against unpacked Hugging Face forwards
(a tiny Qwen2 here; SmolLM2's Llama in tests/test_smollm2.py).

Runs as its own process (the `single_rank` fixture): the actor initialises torch.distributed
(gloo, CPU) for its process.
"""

import pytest

SCRIPT = r"""
import json, sys
import torch
from transformers import AutoModelForCausalLM
from areal.api import FinetuneSpec
from areal.api.alloc_mode import ModelAllocation
from areal.api.cli_args import MicroBatchSpec, OptimizerConfig, PPOActorConfig
from areal.engine import FSDPPPOActor
from areal.utils.data import concat_batch
from areal_patches import mask_mapping, packed_sdpa

model_path, with_fix = sys.argv[2], sys.argv[3] == "fix"
if with_fix:
    packed_sdpa.install()
    mask_mapping.install()  # Llama's decoder takes no per-attention-type mask; Qwen2's does
config = PPOActorConfig(
    experiment_name="test", trial_name="test", path=model_path, attn_impl="sdpa",
    dtype="float32", backend="fsdp:d1", mb_spec=MicroBatchSpec(max_tokens_per_mb=4096),
    optimizer=OptimizerConfig(lr=1e-4),
)
actor = FSDPPPOActor(config)
actor.create_process_group(parallel_strategy=ModelAllocation.from_str("fsdp:d1").parallel)
actor.initialize(None, FinetuneSpec(total_train_epochs=1, dataset_size=4, train_batch_size=4))

gen = torch.Generator().manual_seed(0)
batch = []
for length in (17, 40, 29, 5):  # one micro-batch of four packed sequences
    ids = torch.randint(5, 800, (1, length), generator=gen)
    batch.append(dict(
        input_ids=ids, attention_mask=torch.ones(1, length, dtype=torch.bool),
        loss_mask=torch.ones(1, length, dtype=torch.int32), logprobs=torch.zeros(1, length),
        versions=torch.zeros(1, length, dtype=torch.int32), rewards=torch.zeros(1),
    ))
packed = actor.compute_logp(batch)
# packed_sdpa's varlen path trusts that AReaL pads a micro-batch by appending one more
# sequence, so that cu_seq_lens_q ends at the row's length; check it on a padded micro-batch
micro_batches = actor._prepare_mb_list(concat_batch(batch)[0]).padded_mbs
cu_ends_at_row_length = [
    int(mb["cu_seq_lens_q"][-1]) == mb["input_ids"].shape[-1] > 91 and isinstance(mb["max_length_q"], int)
    for mb in micro_batches
]
actor.destroy()

hf = AutoModelForCausalLM.from_pretrained(model_path, attn_implementation="eager", dtype=torch.float32).eval()
errors = []
for item, logp in zip(batch, packed):
    ids = item["input_ids"]
    with torch.no_grad():
        logits = hf(ids).logits[0]
    ref = torch.log_softmax(logits[:-1].float(), -1).gather(-1, ids[0, 1:, None])[:, 0]
    errors.append((logp.reshape(-1)[:-1] - ref).abs().max().item())
print("RESULT", json.dumps(dict(errors=errors, cu_ends_at_row_length=cu_ends_at_row_length)))
"""


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_packed_logp_matches_unpacked_forward_with_fix(tiny_model_dir, single_rank):
    result = single_rank(SCRIPT, tiny_model_dir, "fix")
    errors = result["errors"]
    assert len(errors) == 4
    assert max(errors) < 1e-4, errors
    assert result["cu_ends_at_row_length"] == [True], "AReaL's micro-batches no longer end with cu_seqlens"


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_plain_sdpa_leaks_across_packed_sequences(tiny_model_dir, single_rank):
    """The trap itself: without the fix, only the first packed sequence is right.

    If this starts failing, AReaL or transformers fixed packing for sdpa and packed_sdpa.py
    may no longer be needed.
    """
    errors = single_rank(SCRIPT, tiny_model_dir, "nofix")["errors"]
    assert errors[0] < 1e-4
    assert min(errors[1:]) > 1e-2, errors


def test_sequence_bounds_keep_padding_apart_and_skip_empty_sequences():
    import torch

    from areal_patches import packed_sdpa

    assert packed_sdpa.sequence_bounds(torch.tensor([0, 3, 3, 7]), 9) == [0, 3, 7, 9]
    assert packed_sdpa.sequence_bounds(torch.tensor([0, 4, 9]), 9) == [0, 4, 9]


def test_varlen_kernel_is_only_used_where_it_applies():
    """CPU or fp32 inputs take the per-sequence path (the varlen kernel is CUDA bf16/fp16)."""
    import torch

    from areal_patches import packed_sdpa

    module = torch.nn.Module()
    assert not packed_sdpa.varlen_usable(module, torch.zeros(1, 4, 8, 16, dtype=torch.bfloat16))
    assert not packed_sdpa.varlen_usable(module, torch.zeros(1, 4, 8, 16), scaling=0.25)
