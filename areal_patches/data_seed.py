"""The config's `seed` decides the order of the training data.

Upstream behaviour (areal 1.0.4): `areal.utils.dataloader.create_dataloader` builds torch's
`DistributedSampler` without a seed, so it shuffles with torch's default, 0, whatever the
config's `seed` says. Two GRPO or SFT runs that differ only in `seed` see the same puzzles in
the same order, and with the same weights to start from, a "second seed" is the first run
again, apart from timing.

Effect: the samplers of PPOTrainer and SFTTrainer shuffle with `config.seed`; `seed: 0`
gives AReaL's order. A run recovered with the same `seed` replays the same order. Measured
with train.py on CPU (docs/results/areal-fixes.md, "What seed meant"): before, seeds 1 and 2 drew the same
puzzles at each step; after, they draw different ones, and a seed repeats its own.

Off: `areal_patches.apply(skip={"data_seed"})`.

Upstream: unchanged on AReaL's main as of cbff54d (2026-08-22) and in the v2.0.0 tag; not
reported.
"""

from __future__ import annotations

from torch.utils.data import DistributedSampler

from areal_patches.patching import wrap_once


def install() -> None:
    from areal.trainer.rl_trainer import PPOTrainer
    from areal.trainer.sft_trainer import SFTTrainer

    for trainer in (PPOTrainer, SFTTrainer):
        wrap_once(trainer, "_create_dataloader", seeded, "seeds_sampler")


def seeded(create_dataloader):
    """`create_dataloader`, with its sampler shuffling by the trainer's `config.seed`."""

    def _create_dataloader(self, *args, **kwargs):
        loader = create_dataloader(self, *args, **kwargs)
        if isinstance(loader.sampler, DistributedSampler):
            loader.sampler.seed = self.config.seed
        return loader

    return _create_dataloader
