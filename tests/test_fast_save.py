"""fast_save.py writes the same folder as AReaL's `_save_model_to_hf`. The saves run as the only
rank of their own process (`single_rank`): AReaL's engine initialises torch.distributed (gloo,
CPU) there."""

import filecmp

import pytest

SCRIPT = r"""
import json, sys
import torch
from areal.api import FinetuneSpec
from areal.api.alloc_mode import ModelAllocation
from areal.api.cli_args import OptimizerConfig, PPOActorConfig
from areal.engine import FSDPPPOActor
from areal.engine.fsdp_engine import FSDPEngine
from areal_patches import fast_save

model_path, out, dtype = sys.argv[2], sys.argv[3], sys.argv[4]
upstream = FSDPEngine._save_model_to_hf
fast_save.install()
config = PPOActorConfig(experiment_name="test", trial_name="test", path=model_path, dtype=dtype, attn_impl="sdpa",
                        backend="fsdp:d1", optimizer=OptimizerConfig(lr=1e-4))
actor = FSDPPPOActor(config)
actor.create_process_group(parallel_strategy=ModelAllocation.from_str("fsdp:d1").parallel)
actor.initialize(None, FinetuneSpec(total_train_epochs=1, dataset_size=4, train_batch_size=4))
master = {p.dtype for p in actor.model.parameters()}
with torch.no_grad():  # weights bf16 cannot hold exactly: a cast must round as upstream's does
    for p in actor.model.parameters():
        p.add_(torch.randn_like(p) * 1e-3)
upstream(actor, out + "/upstream", actor.tokenizer, None)
FSDPEngine._save_model_to_hf(actor, out + "/fast", actor.tokenizer, None)
FSDPEngine._save_model_to_hf(actor, out + "/fast_again", actor.tokenizer, None)  # the reused buffers
print("RESULT " + json.dumps({"master": sorted(map(str, master))}))
"""


@pytest.mark.e2e
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])  # a cast from float32 masters; none (tied weights shared)
def test_fast_save_writes_the_same_files_as_areal(single_rank, tiny_model_dir, tmp_path, dtype):
    result = single_rank(SCRIPT, tiny_model_dir, tmp_path, dtype)
    assert result["master"] == ["torch.float32"]
    upstream = tmp_path / "upstream"
    names = sorted(p.name for p in upstream.iterdir())
    assert "model.safetensors" in names and "config.json" in names
    for other in ("fast", "fast_again"):
        assert sorted(p.name for p in (tmp_path / other).iterdir()) == names
        for name in names:
            assert filecmp.cmp(upstream / name, tmp_path / other / name, shallow=False), (other, name)

