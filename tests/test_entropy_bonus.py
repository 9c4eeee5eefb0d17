"""areal_patches/entropy_bonus: an entropy term in the GRPO loss, through AReaL's own
`PPOActor._ppo_update`."""

from __future__ import annotations

import pytest
import torch

from areal_patches import entropy_bonus
from tests.test_pass_at_k import REWARDS, actor_config, compute_advantages, synthetic_batch


def test_the_bonus_is_the_mean_entropy_of_the_scored_tokens():
    entropy = torch.tensor([[9.0, 0.5, 1.5, 9.0], [9.0, 2.0, 9.0, 9.0]], requires_grad=True)
    mask = torch.tensor([[0, 1, 1, 0], [0, 1, 0, 0]])
    loss = entropy_bonus.entropy_bonus_loss(
        lambda logprobs, entropy, data: torch.tensor(3.0), 0.3, None, entropy, {"loss_mask": mask}
    )
    loss.backward()
    torch.testing.assert_close(loss, torch.tensor(3.0 - 0.3 * (0.5 + 1.5 + 2.0) / 3))
    torch.testing.assert_close(entropy.grad, -0.3 / 3 * mask.float())


@pytest.mark.e2e
def test_a_step_on_the_bonus_widens_a_peaked_distribution():
    from areal.utils.functional import gather_logprobs_entropy

    logits = torch.tensor([[6.0, 0.0, 0.0, 0.0]] * 3, requires_grad=True)
    labels = torch.zeros(3, dtype=torch.long)
    before = gather_logprobs_entropy(logits, labels)[1].detach()
    logprobs, entropy = gather_logprobs_entropy(logits, labels)
    no_policy_loss = lambda logprobs, entropy, data: logprobs.sum() * 0.0  # noqa: E731
    entropy_bonus.entropy_bonus_loss(no_policy_loss, 1.0, logprobs, entropy, {"loss_mask": torch.ones(3)}).backward()
    with torch.no_grad():
        logits -= 10.0 * logits.grad
    assert (gather_logprobs_entropy(logits, labels)[1] > 1.1 * before).all()


class LossRecordingEngine:
    """Stands in for the FSDP engine, whose forward pass is not what is tested: it hands the
    loss function AReaL builds the batch's old log-probs (ratio 1) and fixed entropies, and
    keeps the loss and its gradient with respect to the entropies."""

    def __init__(self):
        self.losses, self.entropy_grads = [], []

    def train(self):
        pass

    def get_version(self) -> int:
        return 0

    def train_batch(self, mb, loss_fn, loss_weight_fn) -> dict:
        entropy = torch.linspace(0.1, 0.9, mb["loss_mask"].numel()).view_as(mb["logprobs"]).requires_grad_()
        loss = loss_fn(mb["logprobs"].clone().requires_grad_(), entropy, mb)
        loss.backward()
        self.losses.append(loss.detach())
        self.entropy_grads.append(entropy.grad)
        return {}


def losses_of_one_update(overrides: list[str]) -> LossRecordingEngine:
    from areal.trainer.ppo.actor import PPOActor

    engine = LossRecordingEngine()
    actor = PPOActor(actor_config([*overrides, "actor.ppo_n_minibatches=1"]), engine=engine)
    data = synthetic_batch(REWARDS)
    data["prox_logp"] = torch.zeros_like(data["logprobs"])  # what compute_logp would give
    actor._ppo_update(compute_advantages("areal")(actor, data))
    return engine


def test_the_patched_update_adds_the_bonus_to_areals_loss():
    from areal.trainer.ppo import actor as actor_module

    entropy_bonus.install()
    areal_loss_fn = actor_module.grpo_loss_fn
    without = losses_of_one_update([])
    with_bonus = losses_of_one_update(["actor.entropy_coef=0.25"])

    mb = torch.tensor([[0, 1, 1, 1, 0]] * len(REWARDS)).bool()  # the rolled loss mask
    entropy = torch.linspace(0.1, 0.9, mb.numel()).view_as(mb)
    torch.testing.assert_close(with_bonus.losses[0], without.losses[0] - 0.25 * entropy[mb].mean())
    assert without.entropy_grads[0] is None or not without.entropy_grads[0].any()
    torch.testing.assert_close(with_bonus.entropy_grads[0], -0.25 / mb.sum() * mb.float())
    assert actor_module.grpo_loss_fn is areal_loss_fn


def test_a_negative_coefficient_is_refused():
    with pytest.raises(ValueError, match=r"actor.entropy_coef=-0.1: use 0 .* or a positive"):
        actor_config(["actor.entropy_coef=-0.1"])
