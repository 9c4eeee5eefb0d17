"""Make areal 1.0.4's FSDP training step faster on GPUs, without changing what it computes.

Why this module exists: experiments/bench/gpu/train_step.py --profile charges every kernel of a GRPO step
of the FSDPPPOActor, and every gap in which the GPU waited, to the part of AReaL's step that
launched it. Seven costs there were not the model's own work (docs/results/throughput.md):

- **Unfused element-wise work.** Transformers' Qwen2 runs RMSNorm (in float32), SwiGLU, the
  rotary embedding and the residual additions as chains of small kernels, each reading and
  writing the whole activation tensor: the largest of these costs in GPU time, plus the
  host time of launching them. Each decoder layer's forward is compiled by torch.compile
  (dynamic shapes: after one recompilation in the second step, none as micro-batch lengths
  change), which fuses those chains; the first step pays for the compilation. It beat
  Liger's fused kernels.
- **Log-prob slices.** AReaL computes log-probs in 1024-position slices of the logits, and
  each slice's backward fills and adds a zero tensor the size of all the logits.
- **Packing micro-batches** read two numbers back from the GPU per sequence and tensor
  (thousands of host syncs per step); one sync does.
- **Gradient clipping** without Apex or Transformer Engine reads each parameter's gradient
  norm back to the host, several syncs for every parameter; multi-tensor kernels do not.
- **Advantages.** AReaL's estimate loops in Python over every position of the padded batch,
  a dozen tiny kernels each; for GRPO it is a reverse cumulative sum.
- **Logits nobody reads.** AReaL's engine computes logits, log-probs and entropy at prompt
  positions too; only the positions next to loss-masked tokens are computed now (faster
  steps, less memory).
- **Parameters gathered again and again.** FSDP2, as AReaL sets it up, frees each layer's
  gathered parameters after its forward, so they are gathered again for its backward and
  for every micro-batch of compute_logp. Each pass now keeps them until it ends, holding
  2 bytes per parameter more while it runs.

What each change measured, against AReaL's step: docs/results/throughput.md and the notebook's
section 2 ("What changed, and what each change measured", and the sessions' sections above
it). The replacements give AReaL's results bit for bit, but for the last digits of the
gradient norm, of the advantages when the reward has a KL penalty (kl_ctl > 0), and the
vocabulary min/max statistics, which now average over the loss-masked positions
(tests/test_fast_step.py).

One more change trades memory for time. With gradient checkpointing on, every layer's
forward runs again in the backward; the last N layers (`actor.layers_not_checkpointed` in
train_config.yaml, 0 turns it off) keep their activations instead, for a faster step
at the cost of each such layer's activation memory (docs/results/throughput.md, "Sixth session").

`install()` applies all eight in this process, through `areal_patches.apply()`: train.py's
`main()` in the SPMD trainer process, `python3 -m areal_patches.worker` in AReaL's RPC workers.
Compilation only happens for models on CUDA (the CPU demo and tests run uncompiled);
`TORCHDYNAMO_DISABLE=1` turns it off.

Upstream: breaks on areal's v2.0.0 tag and main. Since bbc10f0 (PR #1454)
`PPOActor.compute_advantages` calls `_compute_advantages(data, meta)`, and the replacement here
takes no `meta`, so the first step raises TypeError. On main, two replaced engine methods also
changed (`_prepare_mb_inputs` drops `turn_ids` since 74c6334, PR #1600; the log-prob calls pass
`actor.logprobs_chunk_size` since ea306c9, PR #1555), which the replacements would silently
undo. Port this module before moving to a newer areal. The costs it removes are still in AReaL's
step on main as of cbff54d (2026-08-22) (GAE is still a loop over positions); not reported.
"""

from __future__ import annotations

import torch

from areal_patches.patching import wrap_once

def pack_tensor_dict(data: dict) -> dict:
    """`areal.utils.data.pack_tensor_dict` with one host sync in all: [B, S, ...] tensors
    become [sum of lengths, ...], each row's first `attention_mask.sum()` entries in row
    order; `attention_mask` becomes `cu_seqlens` and `max_seqlen`; the rest passes through.
    """
    mask = data["attention_mask"]
    batch, width = mask.shape
    lens = mask.sum(1, dtype=torch.int32)
    host_lens = lens.tolist()
    index = torch.cat([torch.arange(row * width, row * width + n) for row, n in enumerate(host_lens)])
    index = index.to(mask.device)
    packed = {}
    for key, value in data.items():
        if key == "attention_mask":
            packed["cu_seqlens"] = torch.nn.functional.pad(lens.cumsum(0, dtype=torch.int32), (1, 0))
            packed["max_seqlen"] = max(host_lens)
        elif torch.is_tensor(value) and value.ndim >= 2 and value.shape[:2] == (batch, width):
            packed[key] = value.flatten(0, 1).index_select(0, index)
        else:
            packed[key] = value
    return packed


def chunked_apply(fn, logits: torch.Tensor, labels: torch.Tensor, chunk_size: int = 1024):
    """`areal.utils.functional.vocab_parallel._chunked_apply`, slicing with `torch.split`.

    AReaL applies its log-prob function to 1024-position slices of the logits. Taken with
    `logits[i:j]`, each slice's backward fills a zero tensor the size of all the logits and
    adds it to the gradient: ten 3 GB fills and additions for a 10,000-token micro-batch.
    `torch.split` gives the same slices, and its backward concatenates their gradients once.
    """
    results = [fn(x, y) for x, y in zip(logits.split(chunk_size), labels.split(chunk_size))]
    if isinstance(results[0], tuple):
        return tuple(torch.cat(outputs) for outputs in zip(*results))
    return torch.cat(results)


def multi_tensor_l2norm(chunk_size, noop_flag, tensor_lists, per_tensor, *args):
    """AReaL's `local_multi_tensor_l2_norm` (its fallback without Apex or Transformer Engine)
    reads every gradient's norm back to the host, one host sync per parameter; this is one
    multi-tensor kernel, as in torch.nn.utils.clip_grad_norm_."""
    norms = torch._foreach_norm(tensor_lists[0])
    return torch.linalg.vector_norm(torch.stack(norms)).reshape(1), None


def multi_tensor_scale(chunk_size, noop_flag, tensor_lists, scale):
    """AReaL's `local_multi_tensor_scale` launches two kernels per gradient; one multi-tensor
    kernel when scaling in place (as AReaL's gradient clipping does)."""
    sources, targets = tensor_lists
    if all(s is t for s, t in zip(sources, targets)):
        torch._foreach_mul_(targets, scale)
    else:
        torch._foreach_copy_(targets, torch._foreach_mul(sources, scale))


def reverse_cumsum(x: torch.Tensor) -> torch.Tensor:
    """Along the last dimension: entry t is x[..., t] + x[..., t + 1] + ... + x[..., -1]."""
    return x.flip(-1).cumsum(-1).flip(-1)


def compute_advantages(self, data: dict) -> dict:
    """`PPOActor._compute_advantages` with GRPO's advantages computed in a few kernels.

    AReaL estimates advantages with a Python loop over every position of the padded batch,
    about 12 tiny kernels each: ~10,000 launches for 774-position rows, during which the GPU
    waits. Without a critic (no "values") and with discount x gae_lambda = 1, as GRPO runs,
    that loop adds up the token rewards of the loss-masked positions from each position to
    the end of the row: a reverse cumulative sum. Every other line is AReaL's computation in
    AReaL's order (the same tensors, the same in-place updates of `data`); other settings run
    AReaL's own function.
    """
    if "values" in data or self.discount * self.gae_lambda != 1:
        return self._areal_compute_advantages(data)
    if self.config.overlong_reward_penalty:
        from areal.utils.functional import reward_overlong_penalty

        data = reward_overlong_penalty(
            data,
            overlong_tokens=self.config.overlong_tokens,
            overlong_penalty_factor=self.config.overlong_penalty_factor,
            max_response_length=self.config.max_new_tokens,
        )
    reward_score = (data["rewards"] + self.reward_bias) * self.reward_scaling
    reward_score = torch.clip(reward_score, max=self.reward_clip, min=-self.reward_clip)
    if self.reward_norm:
        reward_score = self.reward_norm(reward_score)

    loss_mask = torch.roll(data["loss_mask"].float(), shifts=-1, dims=-1)
    if not self.config.use_decoupled_loss and self.config.recompute_logprob:
        if data["prox_logp"] is None:
            raise ValueError("prox_logp is None but recompute_logprob=True: compute_logp() was skipped.")
        old_logp = data["logprobs"] = data["prox_logp"]
    else:
        old_logp = torch.roll(data["logprobs"], shifts=-1, dims=-1)
        if not self.config.use_decoupled_loss:
            data["prox_logp"] = old_logp
    ref_logp = data.get("ref_logp")
    if ref_logp is None:
        ref_logp = torch.zeros_like(old_logp)
    ref_logp *= loss_mask
    old_logp *= loss_mask

    attn_mask = data["attention_mask"]
    rows = torch.arange(attn_mask.shape[0], device=attn_mask.device)
    seqlens = attn_mask.sum(-1).long()
    no_eos = seqlens == attn_mask.shape[1]
    rewards = -self.kl_ctl * self.kl_estimator(old_logp, ref_logp)
    kl_rewards = rewards.clone()
    rewards[rows, seqlens - 1] = 0
    last = torch.clip(seqlens - 2, min=0)
    rewards[rows, last] += torch.where(no_eos, 0, reward_score) if self.mask_no_eos_with_zero else reward_score

    values = torch.zeros_like(rewards)
    advantages = torch.nn.functional.pad(reverse_cumsum(rewards[:, :-1] * loss_mask[:, :-1]), (0, 1))
    data["returns"] = advantages + values
    if self.adv_norm is not None:
        advantages = self.adv_norm(advantages, loss_mask)
    data["advantages"] = advantages
    data["kl_rewards"] = kl_rewards
    data["tot_rewards"] = rewards
    data["loss_mask"] = loss_mask
    data["logprobs"] = old_logp
    return data


def scored_positions(loss_mask: torch.Tensor) -> torch.Tensor:
    """The positions of a packed micro-batch whose logits anything reads: those next to a
    loss-masked token, on either side.

    Position t scores token t + 1. When compute_logp runs, `loss_mask` marks the completion
    tokens, so the logits needed are one position earlier; by ppo_update, AReaL has rolled
    the mask onto those positions. Keeping both readings serves either phase, for one extra
    position per sequence.
    """
    mask = loss_mask.reshape(-1).bool()
    return torch.nonzero(mask | mask.roll(-1)).squeeze(1)


def spread(values: torch.Tensor, positions: torch.Tensor, length: int) -> torch.Tensor:
    """`values` at `positions` of a zero tensor of `length` (differentiable in `values`)."""
    return values.new_zeros(length).scatter(0, positions, values)


def scored_labels(inputs: dict, positions: torch.Tensor) -> torch.Tensor:
    """The token each scored position predicts, as AReaL's rolled `input_ids`."""
    return torch.roll(inputs["input_ids"], shifts=-1, dims=-1).reshape(-1)[positions]


def prepare_mb_inputs(self, mb_item):
    """`FSDPEngine._prepare_mb_inputs`, asking the model for the logits of the scored
    positions only (transformers' `logits_to_keep`).

    AReaL's engine computes logits, log-probs and entropy at every position of a micro-batch,
    prompts included, though only completion positions are scored: with ~150-token prompts
    and ~500-token completions, a fifth of the LM head's matmuls, float32 softmax passes and
    logit memory go to positions nobody reads. Only for the plain case: a language model
    without tree training, sequence or tensor parallelism.
    """
    inputs, ctx = self._areal_prepare_mb_inputs(mb_item)
    plain = not (
        self.config.is_critic
        or self.enable_tree_training
        or self.parallel_helper.sp_size > 1
        or self.parallel_helper.tp_size > 1
    )
    if plain and "loss_mask" in inputs:
        inputs["logits_to_keep"] = scored_positions(inputs["loss_mask"])
    return inputs, ctx


def compute_logprobs_and_loss(
    self, logits, ctx, loss_fn, loss_weight_fn, total_loss_weight, loss_multiplier=1.0
) -> torch.Tensor:
    """`FSDPEngine._compute_logprobs_and_loss` for logits of the scored positions only.

    Log-probs and entropy are spread back over the micro-batch (zeros where nothing is
    scored), so the loss function sees AReaL's tensors at every loss-masked position. The
    logged `vocab_min_logits`/`vocab_max_logits` now average over the loss-masked positions
    (AReaL's over all tokens, which needs every position's logits).
    """
    from areal.utils import stats_tracker
    from areal.utils.functional import gather_logprobs_entropy

    positions = ctx.model_inputs.get("logits_to_keep")
    if positions is None:
        return self._areal_compute_logprobs_and_loss(
            logits, ctx, loss_fn, loss_weight_fn, total_loss_weight, loss_multiplier
        )
    local_weight = loss_weight_fn(ctx.mb_input)
    if local_weight == 0:
        return logits.mean() * 0.0
    length = ctx.model_inputs["input_ids"].shape[-1] - ctx.pad_length
    logprobs, entropy = gather_logprobs_entropy(
        logits, scored_labels(ctx.model_inputs, positions), temperature=self.config.temperature
    )
    loss = loss_fn(spread(logprobs, positions, length), spread(entropy, positions, length), ctx.mb_input)
    stats_tracker.stat(
        vocab_min_logits=spread(logits.detach().min(-1).values.float(), positions, length),
        vocab_max_logits=spread(logits.detach().max(-1).values.float(), positions, length),
        denominator="n_valid_tokens",
    )
    return loss * (local_weight / total_loss_weight * loss_multiplier)


def compute_forward_result(self, logits, ctx) -> torch.Tensor:
    """`FSDPEngine._compute_forward_result` (compute_logp's log-probs) for logits of the
    scored positions only, spread back over the micro-batch (zeros where nothing is scored)."""
    from areal.utils.functional import gather_logprobs

    positions = ctx.model_inputs.get("logits_to_keep")
    if positions is None:
        return self._areal_compute_forward_result(logits, ctx)
    length = ctx.model_inputs["input_ids"].shape[-1] - ctx.pad_length
    logprobs = gather_logprobs(
        logits, scored_labels(ctx.model_inputs, positions), temperature=self.config.temperature
    )
    return spread(logprobs, positions, length)


def forward_backward_batch(self, mb_list, process_output_fn, forward_only: bool = False) -> None:
    """`FSDPEngine.forward_backward_batch`, gathering each layer's parameters once per
    micro-batch when training and once per call when only running forward.

    AReaL shards the model with FSDP2's `reshard_after_forward=True`: a layer's gathered
    bf16 parameters are freed as soon as its forward is done, so they are gathered again for
    its backward and for the forward of every further micro-batch. On one GPU a gathering
    casts and copies every parameter, two kernels each on the compute stream; on several it
    is an all-gather. The weights cannot change within this call (the optimizer steps after
    it), so the gathered parameters are kept until the backward frees them, or until the end
    of the call, where everything is resharded as AReaL leaves it. The cost is memory: the
    gathered bf16 parameters of all layers (2 bytes per parameter) live through a pass
    instead of one layer's at a time.
    """
    from torch.distributed.fsdp import FSDPModule

    self.model.set_reshard_after_forward(False)
    try:
        self._areal_forward_backward_batch(mb_list, process_output_fn, forward_only)
    finally:
        self.model.set_reshard_after_forward(True)
        for module in self.model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()


def keep_activations(model: torch.nn.Module, n_layers: int) -> None:
    """Gradient checkpointing off for the last `n_layers` decoder layers (all, if more).

    Checkpointing every layer recomputes the whole forward pass in the backward, one forward
    in five of a GRPO step (log-probs, then forward and backward of the update). A layer
    that keeps its activations skips its recomputation and holds them until its backward
    (the memory per layer: docs/results/throughput.md, "Sixth session"). Call after AReaL has enabled
    checkpointing; the others stay checkpointed.
    """
    layers = model.get_decoder().layers
    for layer in layers[max(len(layers) - n_layers, 0) :]:
        layer.gradient_checkpointing = False


def compile_decoder_layers(model: torch.nn.Module) -> None:
    """Each decoder layer's forward compiled by torch.compile, for any sequence length."""
    for layer in model.get_decoder().layers:
        layer.forward = torch.compile(layer.forward, dynamic=True)


def install() -> None:
    """All of the above in this process; decoder layers are compiled for every model AReaL's
    FSDP engine creates on CUDA. Idempotent."""
    from areal.engine import fsdp_engine
    from areal.engine.fsdp_utils import grad, multi_tensor_apply
    from areal.trainer.ppo.actor import PPOActor
    from areal.utils.functional import vocab_parallel

    fsdp_engine.pack_tensor_dict = pack_tensor_dict
    vocab_parallel._chunked_apply = chunked_apply
    if not hasattr(PPOActor, "_areal_compute_advantages"):
        PPOActor._areal_compute_advantages = PPOActor._compute_advantages
        PPOActor._compute_advantages = compute_advantages
    engine = fsdp_engine.FSDPEngine
    if not hasattr(engine, "_areal_prepare_mb_inputs"):
        engine._areal_prepare_mb_inputs = engine._prepare_mb_inputs
        engine._areal_compute_logprobs_and_loss = engine._compute_logprobs_and_loss
        engine._areal_compute_forward_result = engine._compute_forward_result
        engine._prepare_mb_inputs = prepare_mb_inputs
        engine._compute_logprobs_and_loss = compute_logprobs_and_loss
        engine._compute_forward_result = compute_forward_result
    if not hasattr(engine, "_areal_forward_backward_batch"):
        engine._areal_forward_backward_batch = engine.forward_backward_batch
        engine.forward_backward_batch = forward_backward_batch
    if grad.l2_norm_impl is multi_tensor_apply.local_multi_tensor_l2_norm:
        grad.l2_norm_impl = multi_tensor_l2norm
        grad.multi_tensor_scale_impl = multi_tensor_scale
    wrap_once(fsdp_engine.FSDPEngine, "_create_device_model", compiled_after, "compiles_layers")


def compiled_after(create):
    """`FSDPEngine._create_device_model`, then the activations kept and the layers compiled."""

    def create_and_compile(self) -> None:
        create(self)
        # train.py's actor config has the field; other configs keep AReaL's behaviour
        kept = getattr(self.config, "layers_not_checkpointed", 0)
        if self.config.gradient_checkpointing and kept:
            keep_activations(self.model, kept)
        if self.device.type == "cuda":
            compile_decoder_layers(self.model)

    return create_and_compile
