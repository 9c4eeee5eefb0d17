"""An entropy bonus in the GRPO loss (opt-in: `actor.entropy_coef` > 0).

Upstream behaviour (areal 1.0.4): `grpo_loss_fn` receives each scored token's entropy but
detaches it and only logs it (`ppo_actor/update/entropy`); AReaL has no entropy term. Here
GRPO narrows the policy: the logged entropy falls through both training calls, and the
rarely sampled * and / answers are lost (docs/results/goal-65.md, "what GRPO does to pass@k").

Effect, with `actor.entropy_coef: c`: the loss of each micro-batch becomes AReaL's loss less
c times the mean entropy of its loss-masked tokens, the same token mean as the policy loss,
so the gradient also pushes each next-token distribution to stay wide (the entropy bonus of
PPO, Schulman et al. 2017). The measured effect: docs/results/goal-65.md ("An entropy bonus").

Off: `actor.entropy_coef: 0` (train_config.yaml ships it) leaves AReaL's loss untouched;
`areal_patches.install(entropy_bonus=False)` removes the option.

Upstream: AReaL has no entropy term on AReaL's main as of cbff54d (2026-08-22) and in the v2.0.0
tag; open PR #1680 proposes one (`actor.entropy_coeff`).
"""

from __future__ import annotations

import contextlib
import functools

import torch


def entropy_bonus_loss(loss_fn, entropy_coef: float, logprobs: torch.Tensor, entropy: torch.Tensor,
                       input_data: dict, **kwargs) -> torch.Tensor:
    """`loss_fn`'s loss less `entropy_coef` times the mean entropy over the loss mask."""
    loss = loss_fn(logprobs, entropy, input_data, **kwargs)
    mask = input_data["loss_mask"].bool()
    mean_entropy = torch.where(mask, entropy, 0).sum() / mask.count_nonzero().clamp(min=1)
    return loss - entropy_coef * mean_entropy


def install() -> None:
    from areal.trainer.ppo.actor import PPOActor

    if getattr(PPOActor._ppo_update, "knows_entropy_coef", False):
        return
    PPOActor._ppo_update = with_entropy_bonus(PPOActor._ppo_update)


def with_entropy_bonus(ppo_update):
    """`PPOActor._ppo_update`, whose loss gets the entropy bonus where the config asks for one.

    AReaL builds the loss inside `_ppo_update` from the module's `grpo_loss_fn`, so the bonus
    wraps that name for the duration of the update only."""

    @functools.wraps(ppo_update)
    def _ppo_update(self, data):
        coef = getattr(self.config, "entropy_coef", 0.0)
        if not coef:
            return ppo_update(self, data)
        with loss_with_bonus(coef):
            return ppo_update(self, data)

    _ppo_update.knows_entropy_coef = True
    return _ppo_update


@contextlib.contextmanager
def loss_with_bonus(entropy_coef: float):
    from areal.trainer.ppo import actor

    grpo_loss_fn = actor.grpo_loss_fn
    actor.grpo_loss_fn = functools.partial(entropy_bonus_loss, grpo_loss_fn, entropy_coef)
    try:
        yield
    finally:
        actor.grpo_loss_fn = grpo_loss_fn
