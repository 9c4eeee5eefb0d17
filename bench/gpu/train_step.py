"""GRPO training-step throughput of the project's FSDPPPOActor set-up on one GPU.

    python3 bench/gpu/train_step.py [--shapes small 0.5b 1.5b] [--seqs 64]

For each model shape (random weights from a Qwen2 config; nothing downloaded), one process
builds AReaL's FSDPPPOActor as train_config.yaml configures it (bf16, sdpa + packed_sdpa,
gradient checkpointing, 16k-token micro-batches, 4 PPO minibatches) and times compute_logp
+ ppo_update on a batch like the shipped config's (8 samples per prompt, ~150 prompt and
~512 completion tokens), once with each packed-attention implementation of packed_sdpa.py:
one sdpa call per sequence, and PyTorch's varlen flash kernel. It first checks that both
give the same log-probs. MFU = 6 * parameters * tokens / time / measured bf16 matmul rate.
Prints one Markdown table row per (shape, attention) to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
SHAPES = {  # Qwen2.5 shapes (hidden, layers, heads, kv heads, intermediate, vocab)
    "small": (512, 8, 8, 2, 2048, 899),
    "0.5b": (896, 24, 14, 2, 4864, 151936),
    "1.5b": (1536, 28, 12, 2, 8960, 151936),
}


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
    return 2 * 8192**3 * reps / (time.perf_counter() - start) / 1e12


def save_model(shape: str, out: Path) -> int:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    hidden, layers, heads, kv, inter, vocab = SHAPES[shape]
    config = Qwen2Config(
        hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv, intermediate_size=inter, vocab_size=vocab,
        max_position_embeddings=4096, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def make_batch(n_seqs: int, vocab: int):
    import torch

    gen = torch.Generator().manual_seed(0)
    batch = []
    for i in range(0, n_seqs, 8):  # groups of 8 samples share a prompt
        prompt = torch.randint(0, vocab, (150,), generator=gen)
        group = []
        for _ in range(8):
            n_out = int(torch.randint(400, 625, (1,), generator=gen))
            ids = torch.cat([prompt, torch.randint(0, vocab, (n_out,), generator=gen)])
            length = len(ids)
            group.append(dict(
                input_ids=ids[None], attention_mask=torch.ones(1, length, dtype=torch.bool),
                loss_mask=torch.tensor([[0] * 150 + [1] * n_out], dtype=torch.int32),
                logprobs=torch.full((1, length), -2.0), versions=torch.zeros(1, length, dtype=torch.int32),
                rewards=torch.rand(1, generator=gen),
            ))  # fmt: skip
        batch.extend(group)
    return batch


def one_shape(shape: str, n_seqs: int, peak_tflops: float) -> list[dict]:
    """Runs inside its own process (the actor owns torch.distributed there)."""
    import torch
    from transformers import AttentionInterface

    sys.path.insert(0, str(ROOT))
    import packed_sdpa
    from areal.api import FinetuneSpec
    from areal.api.alloc_mode import ModelAllocation
    from areal.api.cli_args import GRPOConfig, load_expr_config
    from areal.engine import FSDPPPOActor
    from areal.utils.data import concat_padded_tensors

    path = Path(f"/tmp/bench-{shape}")
    n_params = save_model(shape, path)
    config, _ = load_expr_config(
        ["--config", str(ROOT / "train_config.yaml"), f"actor.path={path}", "actor.backend=fsdp:d1",
         "cluster.fileroot=/tmp/bench", "cluster.name_resolve.nfs_record_root=/tmp/bench/nr"],
        GRPOConfig,
    )  # fmt: skip
    actor = FSDPPPOActor(config.actor)
    actor.create_process_group(parallel_strategy=ModelAllocation.from_str("fsdp:d1").parallel)
    actor.initialize(None, FinetuneSpec(total_train_epochs=1, dataset_size=n_seqs, train_batch_size=n_seqs))
    vocab = SHAPES[shape][5]
    trajectories = make_batch(n_seqs, vocab)
    batch = [concat_padded_tensors(trajectories[i : i + 8]) for i in range(0, n_seqs, 8)]
    batch = [{k: v.cuda() for k, v in g.items()} for g in batch]
    tokens = sum(int(g["attention_mask"].sum()) for g in batch)
    implementations = {"per-sequence sdpa": packed_sdpa.sdpa_per_sequence, "varlen flash": packed_sdpa.sdpa_varlen}

    def use(impl):
        def forward(module, q, k, v, mask, **kw):
            cu = kw.get("cu_seq_lens_q")
            if cu is None or mask is not None or cu.numel() <= 2:
                return packed_sdpa.sdpa_attention_forward(module, q, k, v, mask, **kw)
            return impl(module, q, k, v, packed_sdpa.sequence_bounds(cu, q.shape[2]), **kw), None

        AttentionInterface.register("sdpa", forward)

    logps = {}
    for name, impl in implementations.items():
        use(impl)
        logps[name] = torch.cat([x.flatten() for x in actor.compute_logp(batch)])
    diff = (logps["per-sequence sdpa"] - logps["varlen flash"]).abs().max().item()

    rows = []
    for name, impl in implementations.items():
        use(impl)
        times = []
        for rep in range(3):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for g, logp in zip(batch, actor.compute_logp(batch)):
                g["prox_logp"] = logp
            actor.ppo_update(actor.compute_advantages(batch))
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        step = min(times[1:])  # rep 0 warms up
        # compute_logp is a forward (2N flops/token), ppo_update forward+backward with
        # gradient checkpointing (8N): 10N in all; MFU below counts the customary 6N.
        rows.append(dict(
            shape=shape, params_m=round(n_params / 1e6), attention=name, seqs=n_seqs, tokens=tokens,
            step_s=round(step, 3), tokens_per_s=round(tokens / step),
            mfu=round(6 * n_params * tokens / step / (peak_tflops * 1e12), 3),
            peak_mem_gb=round(torch.cuda.max_memory_allocated() / 2**30, 1), logp_max_diff=diff,
        ))  # fmt: skip
    actor.destroy()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["small", "0.5b", "1.5b"], choices=list(SHAPES))
    parser.add_argument("--seqs", type=int, default=64)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--peak", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print("ROWS " + json.dumps(one_shape(args.one, args.seqs, args.peak)), flush=True)
        return
    peak = matmul_tflops()
    import torch

    print(f"GPU: {torch.cuda.get_device_name()}, measured bf16 matmul: {peak:.0f} TFLOP/s\n")
    print("| shape | params (M) | attention | seqs | tokens | step (s) | tokens/s | MFU (6N) | peak mem (GiB) | max logp diff |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for shape in args.shapes:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "AREAL_SPMD_MODE": "1"}  # fmt: skip
        proc = subprocess.run(
            [sys.executable, __file__, "--one", shape, "--seqs", str(args.seqs), "--peak", str(peak)],
            env=env, capture_output=True, text=True, cwd=ROOT,
        )  # fmt: skip
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("ROWS ")]
        if not lines:
            print(f"| {shape} | failed: {(proc.stderr or proc.stdout)[-600:]!r} |")
            continue
        for r in json.loads(lines[0][5:]):
            print(f"| {r['shape']} | {r['params_m']} | {r['attention']} | {r['seqs']} | {r['tokens']} | "
                  f"{r['step_s']} | {r['tokens_per_s']} | {r['mfu']:.1%} | {r['peak_mem_gb']} | "
                  f"{r['logp_max_diff']:.2e} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
