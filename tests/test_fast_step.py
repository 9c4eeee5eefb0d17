"""fast_step.py changes how fast AReaL's training step runs, never what it computes."""

import functools
import importlib.util

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from areal_patches import fast_step


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


@pytest.mark.parametrize("override, expected", [(None, 8), ("actor.layers_not_checkpointed=0", 0)])
def test_layers_not_checkpointed_is_a_field_of_the_actors_config(override, expected):
    """train.py's actor config carries it to the trainer (its workers rebuild the class)."""
    import train
    from areal.api.cli_args import load_expr_config

    argv = ["--config", str(Path(train.__file__).parent / "train_config.yaml"), *([override] if override else [])]
    config, _ = load_expr_config(argv, train.CountDownConfig)
    assert config.actor.layers_not_checkpointed == expected


@pytest.mark.parametrize("n_layers, expected", [(0, [True] * 4), (1, [True] * 3 + [False]),
                                                (3, [True] + [False] * 3), (9, [False] * 4)])  # fmt: skip
def test_keep_activations_turns_checkpointing_off_for_the_last_layers(n_layers, expected):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=64)  # fmt: skip
    model = Qwen2ForCausalLM(config)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    fast_step.keep_activations(model, n_layers)
    assert [layer.gradient_checkpointing for layer in model.model.layers] == expected


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


ACTOR_SCRIPT = r"""
import copy, json, sys
root, model_path = sys.argv[1], sys.argv[2]
import torch
from areal.api import FinetuneSpec
from areal.api.alloc_mode import ModelAllocation
from areal.api.cli_args import load_expr_config
from areal.engine import FSDPPPOActor
from areal.engine.fsdp_engine import FSDPEngine
from areal.utils import stats_tracker
import areal_patches, train
areal_patches.apply(skip={"weight_push"})

def build_actor(*overrides):  # the project's FSDPPPOActor on the tiny model, one rank
    config, _ = load_expr_config([
        "--config", f"{root}/train_config.yaml", f"actor.path={model_path}", "actor.backend=fsdp:d1",
        "actor.optimizer.warmup_steps_proportion=0", "gconfig.n_samples=3", "actor.layers_not_checkpointed=0", *overrides,
    ], train.CountDownConfig)
    actor = FSDPPPOActor(config.actor)
    actor.create_process_group(parallel_strategy=ModelAllocation.from_str("fsdp:d1").parallel)
    actor.initialize(None, FinetuneSpec(total_train_epochs=1, dataset_size=100, train_batch_size=1))
    return actor

class Response:  # the fields of AReaL's ModelResponse that train.trajectory reads
    def __init__(self, gen, n_prompt, n_out):
        self.input_tokens = torch.randint(5, 800, (n_prompt,), generator=gen).tolist()
        self.output_tokens = torch.randint(5, 800, (n_out,), generator=gen).tolist()
        self.input_len, self.output_len = n_prompt, n_out
        self.output_logprobs = (-torch.rand(n_out, generator=gen)).tolist()
        self.output_versions = [0] * n_out

def batch():
    gen = torch.Generator().manual_seed(0)
    shapes = [(9, 20), (9, 4), (9, 31), (14, 12), (14, 25), (14, 1)]
    return [train.trajectory(Response(gen, p, n), float(i % 2)) for i, (p, n) in enumerate(shapes)]

# The shipped bf16 parameters on fp32 master weights and gradient checkpointing; a learning
# rate large enough to move every log-prob; 2 minibatches (2 optimizer steps) of several
# 48-token micro-batches each.
def training_actor(*overrides):
    return build_actor("actor.optimizer.lr=1e-2", "actor.ppo_n_minibatches=2", "actor.mb_spec.max_tokens_per_mb=48",
                       *overrides)

# Two GRPO steps (compute_logp, then ppo_update), each call run through `counted`, which
# returns the call's output and what it counted; then the weights.
def two_steps(actor, counted):
    def step():
        items = batch()
        logp, logp_counts = counted(lambda: actor.compute_logp(items))
        for item, lp in zip(items, logp):
            item["prox_logp"] = lp
        _, update_counts = counted(lambda: actor.ppo_update(actor.compute_advantages(items)))
        return logp, logp_counts, update_counts
    first = step()
    second = step()  # its log-probs come after the first step's optimizer steps
    return first, second, [p.detach().to_local().float().clone() for p in actor.model.parameters()]

def training_state(actor):
    return ([p.detach().to_local().clone() for p in actor.model.parameters()],
            copy.deepcopy(actor.optimizer.state_dict()), copy.deepcopy(actor.lr_scheduler.state_dict()))

def restore(actor, state):
    with torch.no_grad():
        for p, value in zip(actor.model.parameters(), state[0]):
            p.to_local().copy_(value)
    actor.optimizer.load_state_dict(state[1])
    actor.lr_scheduler.load_state_dict(state[2])

def max_diff(a, b):
    return max((x.float() - y.float()).abs().max().item() for x, y in zip(a, b))
"""


SCORED_LOGITS_SCRIPT = ACTOR_SCRIPT + r"""
# lr 0: the weights stay put, so both runs start from the same ones; 2 minibatches and
# 96-token micro-batches: several micro-batches per pass, each padded.
actor = build_actor("actor.dtype=float32", "actor.gradient_checkpointing=false", "actor.optimizer.lr=0",
                    "actor.ppo_n_minibatches=2", "actor.mb_spec.max_tokens_per_mb=96")

def run():
    items = batch()
    logps = actor.compute_logp(items)
    for item, logp in zip(items, logps):
        item["prox_logp"] = logp
    actor.ppo_update(actor.compute_advantages(items))
    grads = [p.grad.to_local().clone() for p in actor.model.parameters()]
    return logps, grads, stats_tracker.export()

scored, areal = run(), None
FSDPEngine._prepare_mb_inputs = FSDPEngine._areal_prepare_mb_inputs  # no logits_to_keep: AReaL's path
areal = run()
actor.destroy()

needed = [(logp.reshape(-1), int(item["loss_mask"].sum())) for logp, item in zip(areal[0], batch())]
logp_diff = max((a[-n - 1:-1] - s.reshape(-1)[-n - 1:-1]).abs().max().item()
                for (a, n), s in zip(needed, scored[0]))
prompts = [(a[:-n - 1].abs().max().item(), s.reshape(-1)[:-n - 1].abs().max().item())
           for (a, n), s in zip(needed, scored[0])]
grad_diff = max((a - s).abs().max().item() for a, s in zip(areal[1], scored[1]))
grad_size = max(a.abs().max().item() for a in areal[1])
keys = sorted(set(areal[2]) | set(scored[2]))
stat_diff = {k: abs(areal[2][k] - scored[2][k]) for k in keys if k in areal[2] and k in scored[2]}
print("RESULT", json.dumps(dict(logp_diff=logp_diff, prompts=prompts, grad_diff=grad_diff,
      grad_size=grad_size, stat_diff=stat_diff, only_one=[k for k in keys if k not in stat_diff])))
"""


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_logits_of_scored_positions_give_areals_logprobs_gradients_and_statistics(tiny_model_dir, single_rank):
    """compute_logp and ppo_update with the LM head on scored positions only, then AReaL's
    path (logits everywhere) in the same process on the same weights: the log-probs that
    anything reads, every gradient and every logged statistic agree; only the vocabulary
    min/max statistics change (they now average over loss-masked positions)."""
    result = single_rank(SCORED_LOGITS_SCRIPT, tiny_model_dir)
    assert result["logp_diff"] < 1e-5
    assert result["grad_size"] > 1e-4 and result["grad_diff"] < 1e-6 * result["grad_size"] + 1e-9
    # the fast path was taken: it left the prompt positions at zero, AReaL's has log-probs there
    assert all(areal > 0 and scored == 0 for areal, scored in result["prompts"])
    changed = {k for k, v in result["stat_diff"].items() if v > 1e-5 * max(1.0, abs(v))}
    assert changed <= {k for k in result["stat_diff"] if "vocab_m" in k}, changed
    assert any("entropy" in k for k in result["stat_diff"]) and not result["only_one"]


GATHER_ONCE_SCRIPT = ACTOR_SCRIPT + r"""
from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

actor = training_actor()
groups = [m._get_fsdp_state()._fsdp_param_group for m in actor.model.modules() if hasattr(m, "_get_fsdp_state")]
groups = [g for g in groups if g is not None]

counts = dict(gathers=0, micro_batches=0)
wait_for_unshard, prepare = FSDPParamGroup.wait_for_unshard, FSDPEngine._prepare_mb_inputs
def counted_wait(self):  # the gathered parameters are built here, when an unshard is pending
    counts["gathers"] += self._all_gather_result is not None
    return wait_for_unshard(self)
def counted_prepare(self, mb_item):
    counts["micro_batches"] += 1
    return prepare(self, mb_item)
FSDPParamGroup.wait_for_unshard, FSDPEngine._prepare_mb_inputs = counted_wait, counted_prepare

def counted(fn):
    counts.update(gathers=0, micro_batches=0)
    out = fn()
    return out, dict(counts, left_unsharded=sum(g.is_unsharded for g in groups))

start = training_state(actor)
gathered_once = two_steps(actor, counted)
restore(actor, start)
FSDPEngine.forward_backward_batch = FSDPEngine._areal_forward_backward_batch
areal = two_steps(actor, counted)
actor.destroy()

print("RESULT", json.dumps(dict(
    groups=len(groups),
    counts={name: [r[0][1], r[0][2], r[1][1], r[1][2]] for name, r in (("once", gathered_once), ("areal", areal))},
    logp_diff=max(max_diff(gathered_once[i][0], areal[i][0]) for i in (0, 1)),
    param_diff=max_diff(gathered_once[2], areal[2]),
    logp_moved=max_diff(areal[0][0], areal[1][0]),
)))
"""


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_parameters_gathered_once_per_pass_give_areals_logprobs_and_weights(tiny_model_dir, single_rank):
    """Two GRPO steps (compute_logp, then ppo_update with two optimizer steps) with each
    layer's parameters kept from forward to backward and across compute_logp's micro-batches,
    then AReaL's resharding from the same weights and optimizer state, in one process: the
    same log-probs, before and after the optimizer steps, and the same weights; fewer
    gatherings; and nothing left gathered when a call returns, as AReaL leaves the model."""
    result = single_rank(GATHER_ONCE_SCRIPT, tiny_model_dir)
    assert result["logp_moved"] > 1e-2  # the optimizer steps changed what the model computes
    assert result["logp_diff"] == 0.0 and result["param_diff"] == 0.0
    groups = result["groups"]
    for logp, update in zip(result["counts"]["once"][::2], result["counts"]["once"][1::2]):
        assert logp["micro_batches"] > 2 and update["micro_batches"] > 2
        assert logp["gathers"] == groups  # once for all of compute_logp's micro-batches
        assert update["gathers"] == groups * update["micro_batches"]  # forward and backward share one
        assert logp["left_unsharded"] == update["left_unsharded"] == 0
    for logp, update in zip(result["counts"]["areal"][::2], result["counts"]["areal"][1::2]):
        assert logp["gathers"] == groups * logp["micro_batches"]
        assert update["gathers"] == 2 * groups * update["micro_batches"]


KEEP_ACTIVATIONS_SCRIPT = ACTOR_SCRIPT + r"""
# The tiny model has 2 layers: with actor.layers_not_checkpointed=1 the second keeps its
# activations.
actor = training_actor("actor.layers_not_checkpointed=1")
layers = actor.model.get_decoder().layers
at_creation = [layer.gradient_checkpointing for layer in layers]
calls = [0] * len(layers)  # forwards per layer: a recomputation runs the layer's forward again
for i, layer in enumerate(layers):
    layer.register_forward_pre_hook(lambda module, args, kwargs, i=i: calls.__setitem__(i, calls[i] + 1),
                                    with_kwargs=True)

def counted(fn):
    calls[:] = [0] * len(layers)
    out = fn()
    return out, list(calls)

start = training_state(actor)
kept = two_steps(actor, counted)
restore(actor, start)
actor.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})  # AReaL's
recomputed = two_steps(actor, counted)
actor.destroy()

print("RESULT", json.dumps(dict(
    at_creation=at_creation,
    calls={name: [r[0][1], r[0][2]] for name, r in (("kept", kept), ("recomputed", recomputed))},
    logp_diff=max(max_diff(kept[i][0], recomputed[i][0]) for i in (0, 1)),
    param_diff=max_diff(kept[2], recomputed[2]),
    logp_moved=max_diff(recomputed[0][0], recomputed[1][0]),
)))
"""


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_layers_keeping_activations_skip_recomputation_and_give_the_same_training(tiny_model_dir, single_rank):
    """The trainer with actor.layers_not_checkpointed=1: its last layer runs one
    forward per micro-batch in ppo_update where a checkpointed layer runs two, and two GRPO
    steps give the same log-probs (before and after the optimizer steps) and the same
    weights as with every layer recomputed, from the same weights and optimizer state."""
    result = single_rank(KEEP_ACTIVATIONS_SCRIPT, tiny_model_dir)
    assert result["at_creation"] == [True, False]
    logp_calls, update_calls = result["calls"]["kept"]
    assert logp_calls[0] == logp_calls[1] > 2  # compute_logp: no backward, nothing recomputed
    assert update_calls[0] == 2 * update_calls[1] and update_calls[1] > 2
    assert result["calls"]["recomputed"] == [logp_calls, [update_calls[0]] * 2]
    assert result["logp_moved"] > 1e-2
    assert result["logp_diff"] == 0.0 and result["param_diff"] == 0.0
