"""fast_step.py changes how fast AReaL's training step runs, never what it computes."""

import functools
import importlib.util

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fast_step


@st.composite
def padded_batches(draw):
    """A right-padded batch as AReaL's workflows hand it over, plus tensors that are not [B, S]."""
    batch, width = draw(st.integers(1, 8)), draw(st.integers(1, 40))
    lens = torch.tensor(draw(st.lists(st.integers(1, width), min_size=batch, max_size=batch)))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    return dict(
        input_ids=torch.randint(0, 1000, (batch, width), generator=gen),
        attention_mask=torch.arange(width)[None] < lens[:, None],
        logprobs=torch.randn(batch, width, generator=gen),
        loss_mask=torch.randint(0, 2, (batch, width), generator=gen, dtype=torch.int32),
        position_3d=torch.randn(batch, width, 3, generator=gen),
        rewards=torch.randn(batch, generator=gen),
        note="passed through",
    )


@settings(max_examples=200, deadline=None)
@given(padded_batches())
def test_one_sync_packing_matches_areal(batch):
    from areal.utils.data import pack_tensor_dict

    want, got = pack_tensor_dict(dict(batch)), fast_step.pack_tensor_dict(dict(batch))
    assert list(got) == list(want)
    for key, value in want.items():
        if torch.is_tensor(value):
            assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
        else:
            assert got[key] == value, key


def unpatched(module):
    """A fresh copy of an AReaL module, as installed: fast_step.install() (which importing
    train.py runs) replaces functions in the loaded one."""
    spec = importlib.util.spec_from_file_location(f"{module.__name__}_as_shipped", module.__file__)
    fresh = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fresh)
    return fresh


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_log_prob_slices_give_areals_values_and_gradients_bit_for_bit(dtype):
    """AReaL's own slice function and temperature; 2,500 positions make three slices."""
    from areal.utils.functional import vocab_parallel

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2500, 300, generator=gen).to(dtype)
    labels = torch.randint(0, 300, (2500,), generator=gen)
    weights = torch.randn(2, 2500, generator=gen)

    def run(chunked_apply):
        x = logits.clone().requires_grad_()
        fn = functools.partial(vocab_parallel._gather_logprobs_entropy, temperature=0.7)
        logp, entropy = chunked_apply(fn, x, labels, 1024)
        (logp * weights[0] + entropy * weights[1]).sum().backward()
        return logp, entropy, x.grad

    for want, got in zip(run(unpatched(vocab_parallel)._chunked_apply), run(fast_step.chunked_apply)):
        assert torch.equal(want, got)


def test_multi_tensor_norm_and_scale_match_areals_fallbacks():
    from areal.engine.fsdp_utils import multi_tensor_apply

    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(n, generator=gen) for n in (1, 7, 300, 4096)]
    want, _ = multi_tensor_apply.local_multi_tensor_l2_norm(0, None, [grads], False)
    got, _ = fast_step.multi_tensor_l2norm(0, None, [grads], False)
    assert torch.allclose(want, got, rtol=1e-6)
    scaled_areal, in_place = [g.clone() for g in grads], [g.clone() for g in grads]
    copied = [torch.empty_like(g) for g in grads]
    multi_tensor_apply.local_multi_tensor_scale(0, None, [scaled_areal, scaled_areal], 0.3)
    fast_step.multi_tensor_scale(0, None, [in_place, in_place], 0.3)
    fast_step.multi_tensor_scale(0, None, [grads, copied], 0.3)
    for a, b, c in zip(scaled_areal, in_place, copied):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_install_replaces_areals_functions_and_wraps_model_creation_once():
    from areal.engine import fsdp_engine
    from areal.engine.fsdp_utils import grad
    from areal.utils.functional import vocab_parallel

    fast_step.install()
    wrapped = fsdp_engine.FSDPEngine._create_device_model
    fast_step.install()
    assert fsdp_engine.pack_tensor_dict is fast_step.pack_tensor_dict
    assert vocab_parallel._chunked_apply is fast_step.chunked_apply
    assert grad.l2_norm_impl is fast_step.multi_tensor_l2norm  # no Apex or Transformer Engine here
    assert fsdp_engine.FSDPEngine._create_device_model is wrapped
    assert wrapped.compiles_layers


@pytest.mark.timeout(600)
def test_compiled_layers_compute_what_the_model_computes(tiny_model_dir):
    """torch.compile on CPU (inductor's C++ backend, about a minute): the same logits as the
    uncompiled model, for two sequence lengths (the second must not need a new shape)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randint(5, 800, (1, n), generator=gen) for n in (37, 91)]
    with torch.no_grad():
        eager = [model(ids).logits for ids in inputs]
        fast_step.compile_decoder_layers(model)
        assert all("forward" in layer.__dict__ for layer in model.model.layers)
        compiled = [model(ids).logits for ids in inputs]
    for a, b in zip(eager, compiled):
        assert (a - b).abs().max().item() < 1e-4


def advantage_batch(gen: torch.Generator, batch: int, width: int) -> dict:
    """A padded GRPO batch as compute_logp leaves it: prompt, completion (loss mask, with a few
    holes), padding; some rows fill the width (no EOS), some have no completion."""
    lens = torch.randint(2, width + 1, (batch,), generator=gen)
    lens[0] = width
    prompt = torch.randint(1, 4, (batch,), generator=gen).minimum(lens - 1)
    prompt[-1] = lens[-1]
    pos = torch.arange(width)[None]
    attention = pos < lens[:, None]
    holes = torch.rand(batch, width, generator=gen) < 0.1
    return dict(
        input_ids=torch.randint(0, 1000, (batch, width), generator=gen),
        attention_mask=attention,
        loss_mask=(attention & (pos >= prompt[:, None]) & ~holes).int(),
        logprobs=-torch.rand(batch, width, generator=gen) * 5,
        prox_logp=-torch.rand(batch, width, generator=gen) * 5,
        rewards=torch.randint(0, 2, (batch,), generator=gen).float(),
    )


ADVANTAGE_CONFIGS = [  # (PPOActorConfig fields, exact): the shipped GRPO setting first
    (dict(use_decoupled_loss=True, recompute_logprob=True), True),
    (dict(use_decoupled_loss=False, recompute_logprob=True), True),
    (dict(use_decoupled_loss=False, recompute_logprob=False), True),
    (dict(mask_no_eos_with_zero=True, reward_bias=-0.5, reward_scaling=2.0, reward_clip=0.7), True),
    (dict(adv_norm=None, reward_norm=None), True),
    (dict(overlong_reward_penalty=True, overlong_tokens=4, overlong_penalty_factor=0.5, max_new_tokens=12), True),
    (dict(kl_ctl=0.1), False),  # a reward at every position: summed in another order
    (dict(gae_lambda=0.95), True),  # AReaL's own loop
]


@pytest.mark.parametrize("fields, exact", ADVANTAGE_CONFIGS)
def test_vectorised_advantages_give_areals_batch(fields, exact):
    """Every tensor AReaL's `_compute_advantages` returns, and the in-place updates of its
    input, for batches with prompts, padding and rows without EOS; bit for bit where each row
    has one reward (kl_ctl = 0, as GRPO ships)."""
    from areal.api.cli_args import NormConfig, PPOActorConfig
    from areal.trainer.ppo.actor import PPOActor

    fast_step.install()  # keeps AReaL's function for the settings it does not vectorise
    fields = dict(
        dict(
            kl_ctl=0.0,
            reward_norm=NormConfig(mean_level="group", std_level="group", group_size=4),
            adv_norm=NormConfig(mean_level="batch", std_level="batch"),
        ),
        **fields,
    )
    actor = PPOActor(PPOActorConfig(experiment_name="x", trial_name="y", path="-", **fields), engine=None)
    areal = unpatched(importlib.import_module("areal.trainer.ppo.actor")).PPOActor._compute_advantages
    gen = torch.Generator().manual_seed(0)
    for batch, width in [(8, 20), (16, 57), (4, 3)]:
        data = advantage_batch(gen, batch, width)
        want = areal(actor, {k: v.clone() for k, v in data.items()})
        got = fast_step.compute_advantages(actor, {k: v.clone() for k, v in data.items()})
        assert list(got) == list(want)
        for key, value in want.items():
            if exact:
                assert torch.equal(got[key], value), key
            else:
                torch.testing.assert_close(got[key], value, rtol=1e-5, atol=1e-6, msg=key)
