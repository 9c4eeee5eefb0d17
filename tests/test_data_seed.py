"""areal_patches/data_seed: the config's `seed` decides the order of the training data.

The trainers' own `_create_dataloader` runs, on a real `datasets.Dataset`; only the trainer
object around it is a stand-in that carries the config (building a whole PPOTrainer needs
inference servers)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from areal.api.cli_args import TrainDatasetConfig
from areal.trainer.rl_trainer import PPOTrainer
from areal.trainer.sft_trainer import SFTTrainer
from datasets import Dataset

from areal_patches import data_seed

PUZZLES = Dataset.from_list([{"id": i} for i in range(64)])


def order(create_dataloader, seed: int) -> list[int]:
    """The puzzles in the order the loader's sampler hands them out."""
    trainer = SimpleNamespace(config=SimpleNamespace(seed=seed))
    loader = create_dataloader(trainer, PUZZLES, dataset_config=TrainDatasetConfig(batch_size=8), rank=0, world_size=1)
    return [PUZZLES[i]["id"] for i in loader.sampler]


@pytest.mark.parametrize("trainer", [PPOTrainer, SFTTrainer])
def test_the_seed_decides_the_order_and_seed_0_is_areals(trainer):
    # AReaL's own, also where an earlier test of this process installed the patch
    upstream = getattr(trainer._create_dataloader, "__wrapped__", trainer._create_dataloader)
    patched = data_seed.seeded(upstream)
    assert order(upstream, seed=1) == order(upstream, seed=2)  # AReaL: the seed is ignored
    assert order(patched, seed=1) != order(patched, seed=2)
    assert order(patched, seed=1) == order(patched, seed=1)
    assert order(patched, seed=0) == order(upstream, seed=2)
    assert sorted(order(patched, seed=5)) == list(range(64))  # still every puzzle once


def test_install_wraps_both_trainers_once():
    data_seed.install()
    data_seed.install()
    for trainer in (PPOTrainer, SFTTrainer):
        wrapped = trainer._create_dataloader
        assert wrapped.seeds_sampler and not getattr(wrapped.__wrapped__, "seeds_sampler", False)
