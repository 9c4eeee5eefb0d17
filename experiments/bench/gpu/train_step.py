"""GRPO training-step throughput on one GPU: AReaL's FSDPPPOActor as train.py runs it, and TRL.

    python3 -m experiments.bench.gpu.train_step [--shapes tiny small 0.5b 1.5b 3b] [--seqs 64] [--steps 2] [--json PATH]
                                    [--no-trl] [--rows N] [--profile DIR] [--device cpu] [--ranks 1 2 4]

Every model has random weights from a Qwen2.5-shaped Qwen2 config (nothing is downloaded),
saved once per shape and loaded by both frameworks. The batch is the shipped config's kind:
groups of 8 samples sharing a ~150-token prompt, 400-624 completion tokens each, one random
reward per sample. Generation is excluded everywhere; each row times, for the whole batch,
what happens between rollouts and the next rollout: log-probs of the current policy, then
the policy update (with its optimizer steps).

AReaL (one process per shape): FSDPPPOActor built from train_config.yaml with train.py's
process set-up (packed_sdpa.py; fast_step.py: compiled decoder layers, logits of scored
positions only, parameters gathered once per pass, and exact replacements for AReaL's
log-prob slicing, packing, gradient clipping and advantages), bf16 compute on fp32 master
weights, GRPO loss with the decoupled PPO objective, timing
compute_logp + compute_advantages + ppo_update. Rows, in this order (--rows N runs the first
N): the shipped config; the shipped config with every layer recomputed (train_config.yaml has
its last layers keep their activations, fast_step.keep_activations); the shipped config with
AReaL's default micro-batch split, first-fit decreasing, instead of the balanced Karmarkar-Karp
split; gradient checkpointing off (at the shipped and at half the micro-batch token budget);
the shipped config with AReaL's logits at every position
(fast_step computes them where they are scored); the shipped config with AReaL's FSDP
resharding, which gathers each layer's parameters for every forward and again for every
backward (fast_step gathers them once per pass); one PPO minibatch instead of four; then,
with the decoder layers no longer compiled, the three ways to attend within packed
micro-batches: packed_sdpa's varlen kernel (shipped), one sdpa call
per sequence, and every sequence padded to the longest in one masked sdpa call (the
"pad each sequence" fix of the sdpa packing trap). The knobs are changed on the same actor
between rows, so one process serves a shape. The uncompiled varlen row also checks that the
varlen kernel and one sdpa call per sequence give the same log-probs.

TRL (another process per shape): GRPOTrainer.train() on the same saved model, batch and GPU,
for TRL's defaults (gradient checkpointing on), one minibatch, checkpointing off, and with
TRL's own `use_liger_kernel` (a new trainer each). Liger is an extra for this bench only (TRL
is in requirements.txt): `pip install liger-kernel` (TRL 1.16.0, Liger 0.8.5 were used). Its
generation is replaced through TRL's own `rollout_func` hook, which returns the prebuilt
prompt and completion ids instantly; the rest is TRL's unchanged code: padding, old
log-probs, rewards from a reward function that returns the batch's rewards, group-
normalised advantages, loss, backward, clipping, AdamW steps. Set-up as TRL defaults it:
fp32 weights with bf16 autocast (AReaL's precision too), sdpa on right-padded rows, the
fused chunked LM head of TRL. Matching AReaL's 4 minibatches: generation batch = the whole
batch, per_device_train_batch_size = 1/4 of it, steps_per_generation = 4 (4 optimizer steps;
TRL then computes old log-probs, as AReaL's compute_logp does). Matching 1 minibatch:
gradient_accumulation_steps = 4: one optimizer step, and TRL skips the old log-probs (the
update starts on-policy, so the ratio is 1), while AReaL still computes them; for that row
the ratio table also compares with AReaL's update alone.

Reported per row: step time (best of --steps timed steps after warm-up steps, with CUDA
synchronised: one warm-up step, two for AReaL's compiled rows, whose first step compiles the
decoder layers and whose second recompiles them once, ~12 s at 1.5B), tokens/s (real
tokens: prompt + completion, no padding, the same count for both frameworks), peak GPU
memory (torch.cuda.max_memory_allocated), and two MFUs against the measured bf16 matmul rate:

- MFU: the model FLOPs the step needs, divided by its time. Per sequence of L tokens, C of
  them completion: one forward costs 2 * N_body * L + 2 * N_head * C + 2 * layers * hidden
  * L^2 (N_head = vocab * hidden is the LM head, tied to the embedding, whose lookup costs
  nothing; N_body the other parameters; only completion positions need logits; causal
  attention scores and values: half of 4 * L^2 * hidden per layer). The step needs one
  forward for the log-probs (when it computes them) and a forward + backward (3 forwards)
  for the update. Recomputation by gradient checkpointing, padding and prompt-position
  logits are work, not useful FLOPs, and are not counted.
- MFU (6N): 6 * parameters * tokens / time, the customary formula of the earlier tables
  (docs/results/throughput.md), kept so that those numbers stay comparable.

--profile DIR runs one more step of the shipped setting under torch.profiler and writes
DIR/profile_SHAPE.txt: GPU busy and idle time by phase of AReaL's step (experiments/bench/gpu/timeline.py),
then the costliest GPU operations.

--ranks runs the AReaL rows on each given number of FSDP ranks, one GPU each (torchrun, as
AReaL's launchers start the trainer), every rank with its own batch of --seqs sequences: weak
scaling, the per-GPU work of a larger trainer allocation. Step time, tokens/s and MFU are per
GPU, and the peak memory is the largest of the ranks'. The scaling table gives each count's
tokens/s per GPU against one rank's (weak-scaling efficiency). TRL runs on one GPU only.

Prints progress lines and Markdown tables to stdout; --json writes all rows (and every
timed step) to a file, rewritten after each process so a run cut short keeps its rows.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from devkit import ROOT
from devkit.launch.training import torchrun_command
from devkit.make_tiny_model import TINY, count_params

START = time.perf_counter()
SHAPES = {  # Qwen2.5 shapes (hidden, layers, heads, kv heads, intermediate, vocab)
    # devkit/make_tiny_model.py's preset tiny, with its tokenizer's 899 ids: the CPU check of the code paths
    "tiny": (*(TINY[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                                 "intermediate_size")), 899),
    "small": (512, 8, 8, 2, 2048, 899),
    "0.5b": (896, 24, 14, 2, 4864, 151936),
    "1.5b": (1536, 28, 12, 2, 8960, 151936),
    "3b": (2048, 36, 16, 2, 11008, 151936),  # train_config.yaml's model; its memory, on a GPU that holds it
}
GROUP = 8  # samples per prompt (gconfig.n_samples)
PROMPT_LEN = 150
DEVICE = "cuda"  # --device cpu: a development check of the code paths, not a measurement
VARLEN = "varlen (packed_sdpa)"  # shipped: flash-attention's varlen kernel over the packed row
PER_SEQUENCE = "sdpa per sequence"
PADDED = "sdpa, each sequence padded"


@dataclass(frozen=True)
class Setting:
    """The knobs one row varies. TRL rows use gradient_checkpointing, n_minibatches and liger."""

    gradient_checkpointing: bool
    max_tokens_per_mb: int
    n_minibatches: int
    layers_not_checkpointed: int = 0  # fast_step.keep_activations: the last N layers (AReaL rows)
    packing_algorithm: str = "ffd"  # how AReaL splits a batch into micro-batches (AReaL rows)
    attention: str = VARLEN
    compiled: bool = True  # fast_step's compiled decoder layers (AReaL rows)
    scored_logits: bool = True  # fast_step's LM head on scored positions only (AReaL rows)
    gathered_once: bool = True  # fast_step's parameters gathered once per pass (AReaL rows)
    liger: bool = False  # TRL's use_liger_kernel (TRL rows)


@dataclass
class Sample:
    prompt: list[int]
    completion: list[int]
    reward: float


def shipped_setting() -> Setting:
    import yaml

    actor = yaml.safe_load((ROOT / "train_config.yaml").read_text())["actor"]
    kept = actor.get("layers_not_checkpointed", 0)
    return Setting(actor["gradient_checkpointing"], actor["mb_spec"]["max_tokens_per_mb"], actor["ppo_n_minibatches"],
                   kept, actor["mb_spec"].get("packing_algorithm", "ffd"))  # fmt: skip


def areal_settings(shipped: Setting) -> list[Setting]:
    """Compiled rows first (compilation happens once), then the uncompiled attention options."""
    change = dataclasses.replace
    return [
        shipped,
        change(shipped, layers_not_checkpointed=0),
        change(shipped, packing_algorithm="ffd"),
        change(shipped, gradient_checkpointing=not shipped.gradient_checkpointing),
        change(shipped, gradient_checkpointing=False, max_tokens_per_mb=shipped.max_tokens_per_mb // 2),
        change(shipped, scored_logits=False),
        change(shipped, gathered_once=False),
        change(shipped, n_minibatches=1),
        *[change(shipped, compiled=False, attention=a) for a in (VARLEN, PER_SEQUENCE, PADDED)],
    ]


def trl_settings(shipped: Setting) -> list[Setting]:
    change = dataclasses.replace
    checkpointing = change(shipped, gradient_checkpointing=True, layers_not_checkpointed=0)  # TRL's default
    return [
        checkpointing,
        change(checkpointing, n_minibatches=1),
        change(checkpointing, gradient_checkpointing=False),
        change(checkpointing, liger=True),
    ]


# --- device helpers (no-ops on CPU) ---------------------------------------------------------


def sync() -> None:
    import torch

    if DEVICE == "cuda":
        torch.cuda.synchronize()


def reset_memory() -> None:
    import gc

    import torch

    gc.collect()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def world_size() -> int:
    """FSDP ranks of this child (torchrun's WORLD_SIZE)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    """This process's rank among them (torchrun's RANK)."""
    return int(os.environ.get("RANK", "0"))


def peak_memory_gib() -> float:
    """The largest peak of the ranks: the one that must fit its GPU. Every rank calls it."""
    import torch
    import torch.distributed as dist

    if DEVICE != "cuda":
        return 0.0
    peak = torch.tensor(float(torch.cuda.max_memory_allocated()), device="cuda")
    if dist.is_initialized() and world_size() > 1:
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    return round(peak.item() / 2**30, 1)


def matmul_tflops() -> float:
    import torch

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ a
    torch.cuda.synchronize()
    start, reps = time.perf_counter(), 20
    for _ in range(reps):
        a @ a
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    del a
    torch.cuda.empty_cache()  # leave the GPU's memory to the child processes
    return 2 * 8192**3 * reps / seconds / 1e12


# --- model, batch, FLOPs --------------------------------------------------------------------


def qwen2_config(shape: str):
    from transformers import Qwen2Config

    hidden, layers, heads, kv, inter, vocab = SHAPES[shape]
    return Qwen2Config(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv, intermediate_size=inter, vocab_size=vocab,
        max_position_embeddings=4096, tie_word_embeddings=True,
    )  # fmt: skip


def params_of_shape(shape: str) -> int:
    import torch
    from transformers import Qwen2ForCausalLM

    with torch.device("meta"):
        return count_params(Qwen2ForCausalLM(qwen2_config(shape)))


def ensure_model(shape: str) -> Path:
    """Random bf16 weights saved once per shape; both frameworks load this folder."""
    import torch
    from transformers import Qwen2ForCausalLM

    path = Path(f"/tmp/bench-{shape}")
    if not (path / "config.json").exists():
        torch.manual_seed(0)
        with torch.device(DEVICE):  # initialising 1.5B parameters on CPU takes long
            model = Qwen2ForCausalLM(qwen2_config(shape))
        model.to(torch.bfloat16).save_pretrained(path)
        del model
        if DEVICE == "cuda":
            torch.cuda.empty_cache()  # leave the GPU's memory to the child processes
    return path


def make_samples(n_seqs: int, vocab: int) -> list[Sample]:
    import torch

    gen = torch.Generator().manual_seed(0)
    samples = []
    for _ in range(0, n_seqs, GROUP):
        prompt = torch.randint(0, vocab, (PROMPT_LEN,), generator=gen).tolist()
        for _ in range(GROUP):
            n_out = int(torch.randint(400, 625, (1,), generator=gen))
            completion = torch.randint(0, vocab, (n_out,), generator=gen).tolist()
            samples.append(Sample(prompt, completion, float(torch.rand(1, generator=gen))))
    return samples


def forward_flops(shape: str, samples: list[Sample]) -> float:
    """Useful FLOPs of one forward over the batch (see the module docstring)."""
    hidden, layers, *_, vocab = SHAPES[shape]
    n_head = vocab * hidden
    n_body = params_of_shape(shape) - n_head
    total = 0.0
    for s in samples:
        length, completion = len(s.prompt) + len(s.completion), len(s.completion)
        total += 2 * n_body * length + 2 * n_head * completion + 2 * layers * hidden * length**2
    return total


def timing_fields(shape, samples, n_params, peak_tflops, times, forwards) -> dict:
    """Row fields from the timed steps; `forwards`: 4 with log-probs + update, 3 for the update only."""
    tokens = sum(len(s.prompt) + len(s.completion) for s in samples)
    step = min(times)
    return dict(
        tokens=tokens, step_s=round(step, 3), tokens_per_s=round(tokens / step),
        mfu=round(forwards * forward_flops(shape, samples) / step / (peak_tflops * 1e12), 4),
        mfu_6n=round(6 * n_params * tokens / step / (peak_tflops * 1e12), 4),
        peak_mem_gib=peak_memory_gib(), times=[round(t, 4) for t in times],
    )  # fmt: skip


def emit(row: dict) -> None:
    """The row, from the first rank only (every rank computes it)."""
    if rank() == 0:
        print("ROW " + json.dumps(row), flush=True)


def failure(e: Exception) -> str:
    """A row's error: its traceback goes to the log, a short form into the row."""
    traceback.print_exc()
    return f"{type(e).__name__}: {str(e)[:150]}".replace("|", "/").replace("\n", " ")


# --- AReaL ----------------------------------------------------------------------------------


def build_actor(shape: str, n_seqs: int, overrides: list[str] = (), skip: set[str] = frozenset()):
    """train.py's FSDPPPOActor for `shape` (train_config.yaml, then `overrides`), with the AReaL
    fixes but those in `skip`."""
    from areal.api import FinetuneSpec
    from areal.api.alloc_mode import ModelAllocation
    from areal.api.cli_args import load_expr_config
    from areal.engine import FSDPPPOActor
    import areal_patches
    from train import CountDownConfig

    areal_patches.apply(skip={"weight_push", *skip})  # as train.py's main() does, less the rollout client's fix
    backend = f"fsdp:d{world_size()}"
    config, _ = load_expr_config(
        ["--config", str(ROOT / "train_config.yaml"), f"actor.path={ensure_model(shape)}", f"actor.backend={backend}",
         "cluster.fileroot=/tmp/bench", "cluster.name_resolve.nfs_record_root=/tmp/bench/nr",
         "actor.layers_not_checkpointed=0"]  # each row sets its own (configure)
        + (["actor.dtype=float32"] if DEVICE == "cpu" else [])  # bf16 matmuls crawl on CPU
        + list(overrides),
        CountDownConfig,
    )  # fmt: skip
    actor = FSDPPPOActor(config.actor)
    actor.create_process_group(parallel_strategy=ModelAllocation.from_str(backend).parallel)
    actor.initialize(None, FinetuneSpec(total_train_epochs=1, dataset_size=n_seqs, train_batch_size=n_seqs))
    return actor


def areal_batch(samples: list[Sample]) -> list[dict]:
    """The trajectories as AReaL's workflow hands them over, concatenated per group."""
    import torch
    from areal.utils.data import concat_padded_tensors

    trajectories = []
    for s in samples:
        ids = torch.tensor(s.prompt + s.completion)
        length = len(ids)
        trajectories.append(dict(
            input_ids=ids[None], attention_mask=torch.ones(1, length, dtype=torch.bool),
            loss_mask=torch.tensor([[0] * len(s.prompt) + [1] * len(s.completion)], dtype=torch.int32),
            logprobs=torch.full((1, length), -2.0), versions=torch.zeros(1, length, dtype=torch.int32),
            rewards=torch.tensor([s.reward]),
        ))  # fmt: skip
    groups = [concat_padded_tensors(trajectories[i : i + GROUP]) for i in range(0, len(samples), GROUP)]
    return [{k: v.to(DEVICE) for k, v in g.items()} for g in groups]


def sdpa_padded(module, query, key, value, bounds: list[int]):
    """The "pad each sequence" alternative to packed_sdpa: the packed sequences of a row (as
    [start, end) bounds) become rows of their own, padded to the longest, for one sdpa call
    with a causal and padding mask; the padding is dropped again afterwards."""
    import torch

    lens = torch.tensor([b - a for a, b in zip(bounds[:-1], bounds[1:])], device=query.device)
    longest = int(lens.max())
    offsets = torch.arange(longest, device=query.device)
    index = (torch.tensor(bounds[:-1], device=query.device)[:, None] + offsets).clamp(max=query.shape[2] - 1)
    valid = offsets[None] < lens[:, None]  # [sequences, longest]
    q, k, v = (t[0][:, index].transpose(0, 1) for t in (query, key, value))  # [sequences, heads, longest, D]
    causal = torch.ones(longest, longest, dtype=torch.bool, device=query.device).tril()
    mask = causal[None, None] & valid[:, None, None, :]
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, scale=getattr(module, "scaling", None), enable_gqa=True
    )
    return out.transpose(1, 2)[valid].unsqueeze(0)  # [1, tokens, heads, D], packed order


def use_attention(attention: str) -> None:
    """Register packed_sdpa as train.py installs it, or one of the two alternatives."""
    from transformers import AttentionInterface

    from areal_patches import packed_sdpa

    def alternative(module, q, k, v, mask, **kw):
        cu = kw.get("cu_seq_lens_q")
        if not packed_sdpa.is_packed(q, mask, cu):
            return packed_sdpa.sdpa_attention_forward(module, q, k, v, mask, **kw)
        bounds = packed_sdpa.sequence_bounds(cu, q.shape[2])
        if attention == PADDED:
            return sdpa_padded(module, q, k, v, bounds), None
        return packed_sdpa.sdpa_per_sequence(module, q, k, v, bounds, **kw), None

    forward = packed_sdpa.packed_sdpa_attention_forward if attention == VARLEN else alternative
    AttentionInterface.register("sdpa", forward)


def configure(actor, setting: Setting) -> None:
    """Apply a row's knobs to the live actor: AReaL reads them at every call. Uncompiling
    removes fast_step's compiled forwards (the layers' own forward shows again)."""
    from areal.engine.fsdp_engine import FSDPEngine

    from areal_patches import fast_step

    FSDPEngine._prepare_mb_inputs = (
        fast_step.prepare_mb_inputs if setting.scored_logits else FSDPEngine._areal_prepare_mb_inputs
    )
    FSDPEngine.forward_backward_batch = (
        fast_step.forward_backward_batch if setting.gathered_once else FSDPEngine._areal_forward_backward_batch
    )
    actor.config.mb_spec = dataclasses.replace(
        actor.config.mb_spec, max_tokens_per_mb=setting.max_tokens_per_mb, packing_algorithm=setting.packing_algorithm
    )
    actor.config.ppo_n_minibatches = setting.n_minibatches
    if setting.gradient_checkpointing:
        actor.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        fast_step.keep_activations(actor.model, setting.layers_not_checkpointed)
    else:
        actor.model.gradient_checkpointing_disable()
    if not setting.compiled:
        for layer in actor.model.get_decoder().layers:
            layer.__dict__.pop("forward", None)
    use_attention(setting.attention)


def areal_step(actor, batch: list[dict]) -> tuple[float, float]:
    """Seconds for compute_logp, then for compute_advantages + ppo_update."""
    sync()
    start = time.perf_counter()
    for group, logp in zip(batch, actor.compute_logp(batch)):
        group["prox_logp"] = logp
    sync()
    middle = time.perf_counter()
    actor.ppo_update(actor.compute_advantages(batch))
    sync()
    return middle - start, time.perf_counter() - middle


def logp_max_diff(actor, batch: list[dict]) -> float:
    """Largest |log-prob| difference between packed_sdpa and one sdpa call per sequence."""
    import torch

    logps = []
    for attention in (VARLEN, PER_SEQUENCE):
        use_attention(attention)
        logps.append(torch.cat([x.flatten() for x in actor.compute_logp(batch)]))
    use_attention(VARLEN)
    return (logps[0] - logps[1]).abs().max().item()


def profile_step(step, model, out: Path) -> None:
    """One more step under torch.profiler. Writes the step's GPU time and GPU idle time by
    phase of AReaL's step (experiments/bench/gpu/timeline.py), then its 40 costliest GPU operations; that
    table ends with the total GPU time ("Self CUDA time total")."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from experiments.bench.gpu import timeline

    sync()
    with timeline.annotate_areal(model), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        with record_function("grpo step"):
            step()
            sync()
        wall = time.perf_counter() - start
    ops = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=40, max_name_column_width=90)
    trace = out.with_suffix(".trace.json")
    prof.export_chrome_trace(str(trace))
    phases = timeline.phase_table(trace, "grpo step", wall * 1e3)
    trace.unlink()
    out.write_text(f"wall {wall:.3f} s (profiled)\n\n{phases}\n\n{ops}\n")


def areal_rows(shape: str, n_seqs: int, peak_tflops: float, steps: int, profile_dir: Path | None,
               n_rows: int | None) -> None:
    """Runs inside its own process (the actor owns torch.distributed there); emits one row per setting."""
    actor = build_actor(shape, n_seqs)
    samples = make_samples(n_seqs, SHAPES[shape][5])
    batch = areal_batch(samples)
    n_params = params_of_shape(shape)
    shipped = shipped_setting()
    for setting in areal_settings(shipped)[:n_rows]:
        row = dict(framework="AReaL", shape=shape, params_m=round(n_params / 1e6), seqs=n_seqs, ranks=world_size(),
                   **dataclasses.asdict(setting))  # fmt: skip
        try:
            configure(actor, setting)
            if not setting.compiled and setting.attention == VARLEN:  # checked uncompiled: no recompilation
                row["logp_max_diff"] = logp_max_diff(actor, batch)
            reset_memory()
            warmup = 2 if setting.compiled else 1  # compiled: compilation, then a recompilation (~12 s)
            timed = [areal_step(actor, batch) for _ in range(warmup + steps)]
            warmups, timed = timed[:warmup], timed[warmup:]
            best_logp, best_update = min(t[0] for t in timed), min(t[1] for t in timed)
            row |= timing_fields(shape, samples, n_params, peak_tflops, [a + b for a, b in timed], forwards=4)
            row |= dict(logp_s=round(best_logp, 3), update_s=round(best_update, 3),
                        warmup_s=[round(sum(t), 1) for t in warmups],
                        update_tokens_per_s=round(row["tokens"] / best_update))  # fmt: skip
            if profile_dir and setting == shipped:  # every rank steps; each writes its own profile
                suffix = f"_rank{rank()}" if world_size() > 1 else ""
                profile_step(lambda: areal_step(actor, batch), actor.model, profile_dir / f"profile_{shape}{suffix}.txt")
        except Exception as e:  # noqa: BLE001 - one failing row (out of memory, say) must not lose the rest
            row["error"] = failure(e)
            actor.optimizer.zero_grad(set_to_none=True)
        emit(row)
    actor.destroy()


# --- TRL ------------------------------------------------------------------------------------


def trl_tokenizer():
    """A 3-token tokenizer: TRL needs one for padding ids and for decoding (of prebuilt ids)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def trl_trainer(model_path: Path, samples: list[Sample], setting: Setting, n_batches: int):
    """A GRPOTrainer whose rollouts are `samples`; its generation-side processing is timed."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    n_seqs = len(samples)
    # 4 micro-batches per batch, each a quarter like one of AReaL's 4 minibatches (~11k real tokens, one
    # micro-batch there); an optimizer step every 4 // n_minibatches of them
    micro_batch = n_seqs // 4
    accumulation = 4 // setting.n_minibatches
    args = GRPOConfig(
        output_dir="/tmp/bench-trl", report_to="none", save_strategy="no", logging_steps=10**6, disable_tqdm=True,
        seed=0, max_steps=n_batches * setting.n_minibatches, per_device_train_batch_size=micro_batch,
        gradient_accumulation_steps=accumulation, steps_per_generation=4, num_generations=GROUP,
        gradient_checkpointing=setting.gradient_checkpointing, gradient_checkpointing_kwargs={"use_reentrant": False},
        bf16=True, use_cpu=DEVICE == "cpu", model_init_kwargs={"attn_implementation": "sdpa"},
        learning_rate=1e-6, lr_scheduler_type="constant", weight_decay=0.01, max_grad_norm=1.0,
        beta=0.0, epsilon=0.2, temperature=1.0, max_completion_length=max(len(s.completion) for s in samples),
        use_liger_kernel=setting.liger,
    )  # fmt: skip

    def rollout(prompts: list, trainer) -> dict:
        assert len(prompts) == n_seqs, (len(prompts), n_seqs)
        return {"prompt_ids": [s.prompt for s in samples], "completion_ids": [s.completion for s in samples],
                "logprobs": None}  # fmt: skip

    def reward(completions: list, **kwargs) -> list[float]:
        return [s.reward for s in samples]

    class Timed(GRPOTrainer):
        """Records seconds per batch (all its optimizer steps) and in the rollout processing."""

        def __init__(self, *a, **kw):
            self.batch_times: list[float] = []
            self.prepare_times: list[float] = []
            self.old_logps = False  # whether TRL computed old log-probs for its batches
            super().__init__(*a, **kw)

        def _generate_and_score_completions(self, inputs):
            sync()
            start = time.perf_counter()
            output = super()._generate_and_score_completions(inputs)
            sync()
            self.prepare_times.append(time.perf_counter() - start)
            self.old_logps = "old_per_token_logps" in output
            return output

    class BatchClock(TrainerCallback):
        def __init__(self, trainer: Timed):
            self.trainer, self.start = trainer, 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step % setting.n_minibatches == 0:
                sync()
                self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % setting.n_minibatches == 0:
                sync()
                self.trainer.batch_times.append(time.perf_counter() - self.start)

    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"  # rollout_func is marked experimental
    trainer = Timed(
        model=str(model_path), reward_funcs=reward, args=args, processing_class=trl_tokenizer(),
        train_dataset=Dataset.from_dict({"prompt": ["countdown"] * (n_seqs // GROUP)}), rollout_func=rollout,
    )  # fmt: skip
    trainer.add_callback(BatchClock(trainer))
    return trainer


def trl_rows(shape: str, n_seqs: int, peak_tflops: float, steps: int, n_rows: int | None) -> None:
    """Runs inside its own process, one trainer after another; emits one row per setting."""
    import trl

    model_path = ensure_model(shape)
    samples = make_samples(n_seqs, SHAPES[shape][5])
    n_params = params_of_shape(shape)
    padded = n_seqs * (PROMPT_LEN + max(len(s.completion) for s in samples))
    for setting in trl_settings(shipped_setting())[:n_rows]:
        row = dict(framework=f"TRL {trl.__version__}", shape=shape, params_m=round(n_params / 1e6), seqs=n_seqs, ranks=1,
                   gradient_checkpointing=setting.gradient_checkpointing, max_tokens_per_mb=None,
                   n_minibatches=setting.n_minibatches, layers_not_checkpointed=0, packing_algorithm=None,
                   attention="sdpa, right-padded rows", compiled=False,
                   scored_logits=True, gathered_once=True, liger=setting.liger, padded_tokens=padded)  # fmt: skip
        trainer = None
        try:
            reset_memory()
            trainer = trl_trainer(model_path, samples, setting, n_batches=1 + steps)
            trainer.train()
            forwards = 4 if trainer.old_logps else 3
            row |= timing_fields(shape, samples, n_params, peak_tflops, trainer.batch_times[1:], forwards)
            row |= dict(logp_s=round(min(trainer.prepare_times[1:]), 3), old_logps=trainer.old_logps)
        except Exception as e:  # noqa: BLE001 - one failing row (out of memory, say) must not lose the rest
            row["error"] = failure(e)
        if trainer is not None:
            trainer.accelerator.free_memory()
        del trainer
        emit(row)


# --- driver ---------------------------------------------------------------------------------


def run_child(kind: str, shape: str, args: argparse.Namespace, peak: float, ranks: int = 1) -> list[dict]:
    """One process per (framework, shape), or for AReaL one per rank under torchrun; forwards
    the rows as they come, keeps the log tail."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cmd = ["-m", "experiments.bench.gpu.train_step", "--child", kind, shape, "--seqs", str(args.seqs), "--steps", str(args.steps),
           "--peak", str(peak), "--device", DEVICE]  # fmt: skip
    if kind == "areal":
        env["AREAL_SPMD_MODE"] = "1"
        cmd = torchrun_command(ranks, *cmd)
    else:
        cmd = [sys.executable, *cmd]
    if args.profile:
        cmd += ["--profile", str(args.profile)]
    if args.rows:
        cmd += ["--rows", str(args.rows)]
    name = f"{kind} {shape}" + (f" on {ranks} ranks" if kind == "areal" else "")
    progress(f"{name}: starting")
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    rows, log = [], []
    for line in proc.stdout:
        if line.startswith("ROW "):
            rows.append(json.loads(line[4:]))
            progress(f"{name}: {summary(rows[-1])}")
            continue
        log.append(line.rstrip())
    if proc.wait() != 0:
        progress(f"{name} exited with {proc.returncode}; its first error and last lines:\n" + "\n".join(failure_lines(log)))
    return rows


def failure_lines(log: list[str], tail: int = 30) -> list[str]:
    """A failed child's last `tail` lines, after its first traceback if that began before them.

    By position, not by text: torchrun's own traceback, in the last lines, begins with the same
    `Traceback (most recent call last):` as the rank's."""
    first_error = first_traceback(log)
    if not first_error or log.index(first_error[0]) >= len(log) - tail:
        return log[-tail:]
    return [*first_error, "...", *log[-tail:]]


EXCEPTION_LINE = re.compile(r"(\w+\.)*\w*(Error|Exception|Interrupt|Exit)\b")


def first_traceback(lines: list[str], limit: int = 60) -> list[str]:
    """The first traceback in a child's output, up to its exception line.

    Under torchrun the output's last lines are torchrun's own summary, so the rank's error is
    kept apart. Ranks that fail together write into one pipe: a line of another process (not
    indented, not an exception line, such as the agent's `E... failed` line) inside the
    traceback is skipped, not taken as its end.
    """
    start = next((i for i, line in enumerate(lines) if line.startswith("Traceback")), None)
    if start is None:
        return []
    found = [lines[start]]
    for line in lines[start + 1 :]:
        if len(found) == limit:
            break
        if line.startswith(" ") or line.startswith("Traceback"):
            found.append(line)
        elif EXCEPTION_LINE.match(line):
            found.append(line)
            break
    return found


def progress(message: str) -> None:
    print(f"[{time.perf_counter() - START:4.0f} s] {message}", flush=True)


def extras(row: dict) -> list[str]:
    """The row's speed options beyond the common knobs (TRL computes logits where they are
    scored, with its own logits_to_keep)."""
    kept = row["layers_not_checkpointed"] if row["gradient_checkpointing"] else 0
    options = (("compiled", row["compiled"]), ("Liger", row["liger"]),
               (f"last {kept} layers not recomputed", kept > 0),
               ("logits at every position", not row["scored_logits"]),
               ("parameters gathered for every forward and backward", not row["gathered_once"]))  # fmt: skip
    return [name for name, on in options if on]


def knobs(row: dict) -> str:
    return (f"ckpt={'on' if row['gradient_checkpointing'] else 'off'} mb_tokens={row['max_tokens_per_mb']} "
            f"packing={row['packing_algorithm']} "
            f"minibatches={row['n_minibatches']} {row['attention']}" + "".join(f", {x}" for x in extras(row)))  # fmt: skip


def summary(row: dict) -> str:
    if "error" in row:
        return f"{knobs(row)}: {row['error']}"
    return f"{knobs(row)}: {row['step_s']} s, {row['tokens_per_s']} tokens/s, {row['peak_mem_gib']} GiB"


def ratios(rows: list[dict], shipped: Setting) -> list[dict]:
    """AReaL tokens/s over TRL tokens/s. Each TRL row against AReaL with the same checkpointing
    and minibatch count, as shipped otherwise (compiled, scored logits, varlen attention, the
    shipped micro-batch token budget); TRL's defaults also against AReaL's shipped config."""

    def areal(gradient_checkpointing: bool, n_minibatches: int) -> dict | None:
        return next((
            r for r in rows
            if r["framework"] == "AReaL" and "error" not in r and r["shape"] == trl_row["shape"] and r["ranks"] == 1
            and r["compiled"] and r["scored_logits"] and r["gathered_once"] and r["attention"] == VARLEN
            and r["max_tokens_per_mb"] == shipped.max_tokens_per_mb
            and r["layers_not_checkpointed"] == shipped.layers_not_checkpointed
            and r["packing_algorithm"] == shipped.packing_algorithm
            and (r["gradient_checkpointing"], r["n_minibatches"]) == (gradient_checkpointing, n_minibatches)
        ), None)  # fmt: skip

    out = []
    for trl_row in (r for r in rows if r["framework"].startswith("TRL") and "error" not in r):
        trl_knobs = (trl_row["gradient_checkpointing"], trl_row["n_minibatches"])
        label = "shipped" if trl_knobs == (shipped.gradient_checkpointing, shipped.n_minibatches) else "same checkpointing"
        pairs = [(label, areal(*trl_knobs))]
        defaults = trl_row["gradient_checkpointing"] and not trl_row["liger"]
        if defaults and trl_row["n_minibatches"] == shipped.n_minibatches and not shipped.gradient_checkpointing:
            pairs.insert(0, ("shipped", areal(shipped.gradient_checkpointing, shipped.n_minibatches)))
        for label, areal_row in pairs:
            if areal_row is None:
                continue
            out.append(dict(
                shape=trl_row["shape"], areal=label, areal_gradient_checkpointing=areal_row["gradient_checkpointing"],
                gradient_checkpointing=trl_row["gradient_checkpointing"],
                n_minibatches=trl_row["n_minibatches"], trl_liger=trl_row["liger"],
                areal_tokens_per_s=areal_row["tokens_per_s"], trl_tokens_per_s=trl_row["tokens_per_s"],
                trl_old_logps=trl_row["old_logps"],
                ratio=round(areal_row["tokens_per_s"] / trl_row["tokens_per_s"], 2),
                update_only_ratio=None if trl_row["old_logps"]
                else round(areal_row["update_tokens_per_s"] / trl_row["tokens_per_s"], 2),
            ))  # fmt: skip
    return out


def scaling(rows: list[dict]) -> list[dict]:
    """Each AReaL row's tokens/s per GPU against the same shape and setting on one rank."""
    measured = [r for r in rows if r["framework"] == "AReaL" and "error" not in r]
    one_rank = {(r["shape"], knobs(r)): r for r in measured if r["ranks"] == 1}
    out = []
    for r in measured:
        base = one_rank.get((r["shape"], knobs(r)))
        out.append(dict(
            shape=r["shape"], setting=knobs(r), ranks=r["ranks"], step_s=r["step_s"], tokens_per_s_per_gpu=r["tokens_per_s"],
            efficiency=round(r["tokens_per_s"] / base["tokens_per_s"], 3) if base else None,
            mfu=r["mfu"], peak_mem_gib=r["peak_mem_gib"],
        ))  # fmt: skip
    return out


def print_scaling(scaling_rows: list[dict]) -> None:
    print("\n| shape | setting | FSDP ranks | step (s) | tokens/s per GPU | weak-scaling efficiency | MFU per GPU "
          "| peak mem per GPU (GiB) |\n|---|---|---|---|---|---|---|---|")  # fmt: skip
    for r in scaling_rows:
        efficiency = "-" if r["efficiency"] is None else f"{r['efficiency']:.1%}"
        print(f"| {r['shape']} | {r['setting']} | {r['ranks']} | {r['step_s']} | {r['tokens_per_s_per_gpu']} "
              f"| {efficiency} | {r['mfu']:.1%} | {r['peak_mem_gib']} |", flush=True)  # fmt: skip


def print_tables(rows: list[dict], ratio_rows: list[dict]) -> None:
    print("\n| framework | shape | grad ckpt | tokens/mb | minibatches | attention | options | tokens | "
          "step (s) | log-probs (s) | tokens/s | MFU | MFU (6N) | peak mem (GiB) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ckpt = "on" if r["gradient_checkpointing"] else "off"
        extra = ", ".join(extras(r)) or "-"
        split = f"{r['max_tokens_per_mb']} ({r['packing_algorithm']})" if r["max_tokens_per_mb"] else "-"
        head = (f"| {r['framework']} | {r['shape']} | {ckpt} | {split} | {r['n_minibatches']} "
                f"| {r['attention']} | {extra} |")  # fmt: skip
        if "error" in r:
            print(f"{head} {r['error']} |||||||")
            continue
        print(f"{head} {r['tokens']} | {r['step_s']} | {r['logp_s']} | {r['tokens_per_s']} | {r['mfu']:.1%} | "
              f"{r['mfu_6n']:.1%} | {r['peak_mem_gib']} |")  # fmt: skip
    print("\nlog-probs (s): AReaL's compute_logp; TRL's processing of the rollouts: padding, old log-probs (where"
          " the ratio table says so), rewards, advantages. Step times: the best of the timed steps.")  # fmt: skip
    diffs = {r["shape"]: r["logp_max_diff"] for r in rows if "logp_max_diff" in r}
    print("\nmax |log-prob| difference, varlen kernel vs sdpa per sequence: "
          + ", ".join(f"{shape} {d:.2e}" for shape, d in diffs.items()))  # fmt: skip
    print("\n| shape | AReaL | AReaL grad ckpt | TRL grad ckpt | minibatches | TRL | AReaL tokens/s | TRL tokens/s "
          "| AReaL / TRL | TRL computes old log-probs | AReaL update alone / TRL |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    on_off = {True: "on", False: "off"}
    for r in ratio_rows:
        print(f"| {r['shape']} | {r['areal']} | {on_off[r['areal_gradient_checkpointing']]} "
              f"| {on_off[r['gradient_checkpointing']]} | {r['n_minibatches']} | "
              f"{'with Liger' if r['trl_liger'] else 'default'} | {r['areal_tokens_per_s']} | {r['trl_tokens_per_s']} "
              f"| {r['ratio']} | {'yes' if r['trl_old_logps'] else 'no'} | {r['update_only_ratio'] or '-'} |",
              flush=True)  # fmt: skip

def main() -> None:
    global DEVICE
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["small", "0.5b", "1.5b"], choices=list(SHAPES))
    parser.add_argument("--seqs", type=int, default=64, help="sequences per batch (a multiple of 8)")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per row, after the warm-up steps")
    parser.add_argument("--no-trl", action="store_true", help="AReaL rows only")
    parser.add_argument("--rows", type=int, metavar="N",
                        help="the first N rows per framework (1: AReaL's shipped config, TRL's defaults)")  # fmt: skip
    parser.add_argument("--json", type=Path, help="write all rows here")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="profile one more step of AReaL's shipped config: DIR/profile_SHAPE.txt")  # fmt: skip
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                        help="cpu: a quick check that the code paths run (float32, no timing value)")  # fmt: skip
    parser.add_argument("--ranks", nargs="+", type=int, default=[1], metavar="N",
                        help="FSDP ranks (GPUs) for the AReaL rows, each with its own --seqs batch")  # fmt: skip
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--peak", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    DEVICE = args.device
    if args.child:
        kind, shape = args.child
        if kind == "areal":
            areal_rows(shape, args.seqs, args.peak, args.steps, args.profile, args.rows)
        else:
            trl_rows(shape, args.seqs, args.peak, args.steps, args.rows)
        return

    import torch

    peak = matmul_tflops() if DEVICE == "cuda" else 1.0
    gpu = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"
    print(f"GPU: {gpu}, measured bf16 matmul: {peak:.0f} TFLOP/s", flush=True)
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    shipped = shipped_setting()
    result = dict(gpu=gpu, gpus=torch.cuda.device_count() if DEVICE == "cuda" else 0, matmul_tflops=round(peak),
                  date=time.strftime("%Y-%m-%d"), seqs=args.seqs, shipped=dataclasses.asdict(shipped),
                  rows=[], ratios=[], scaling=[])  # fmt: skip
    children = [("areal", ranks) for ranks in args.ranks] + ([] if args.no_trl else [("trl", 1)])
    for shape in args.shapes:
        ensure_model(shape)  # here, before several ranks would each save it
        for kind, ranks in children:
            result["rows"] += run_child(kind, shape, args, peak, ranks)
            result["ratios"] = ratios(result["rows"], shipped)
            result["scaling"] = scaling(result["rows"])
            if args.json:
                args.json.write_text(json.dumps(result, indent=1))
    print_tables(result["rows"], result["ratios"])
    if args.ranks != [1]:
        print_scaling(result["scaling"])


if __name__ == "__main__":
    main()
