"""Write a weight push's folder with the cast on the GPU and one copy to pinned host memory.

Upstream behaviour (areal 1.0.4): `FSDPEngine._save_model_to_hf`, which every disk weight push
and every Hugging Face save runs, gathers the full state dict into pageable host memory in
the optimizer's float32 (`get_model_state_dict(..., cpu_offload=True)`), casts it to the
compute dtype there, one tensor at a time on the CPU, then `save_pretrained`s it. For a model
of Qwen2.5-1.5B's size that is twice the bytes of the bf16 weights over PCIe into memory the
driver has to stage, and a cast of 1.8 billion numbers on the CPU, every step, while the
trainer waits (docs/results/throughput.md has what it costs).

Effect: each tensor is cast to the compute dtype on its GPU shard, gathered there, and copied
once into pinned host memory that later pushes reuse; `save_pretrained`, the config, the
tokenizer and the barrier are upstream's. The folder holds the same bytes
(tests/test_fast_save.py compares them). The pinned copy stays allocated in the trainer
process: the size of the model in its compute dtype, on rank 0.

Off: `areal_patches.apply(skip={"fast_save"})`.

Upstream: unchanged on AReaL's main as of cbff54d (2026-08-22) (`cpu_offload=True`, the cast on
the host); not reported.
"""

from __future__ import annotations

import os


def host_copies(engine, pinned: dict) -> dict:
    """The model's full state dict in the compute dtype, in host memory on rank 0 ({} elsewhere).

    Every rank gathers each tensor (a collective); rank 0 copies it into `pinned`, whose
    buffers are made on first use and reused while names, shapes and dtypes stay the same.
    Tied weights are one tensor where upstream's are: when no cast made copies of them, which
    `save_pretrained` reads as one weight saved once.
    """
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.tensor import DTensor

    rank0 = dist.get_rank() == 0
    sharded = get_model_state_dict(engine.model, options=StateDictOptions(full_state_dict=False))
    on_host, uncast = {}, {}
    for name, value in sharded.items():
        cast = engine._cast_to_compute_dtype(value)
        local = value.to_local() if isinstance(value, DTensor) else value
        storage = (local.untyped_storage().data_ptr(), local.storage_offset(), tuple(local.shape))
        if cast is value and storage in uncast:  # tied weights, left uncast: one tensor, as upstream's
            if rank0:
                on_host[name] = on_host[uncast[storage]]
            continue
        full = cast.full_tensor() if isinstance(cast, DTensor) else cast
        if cast is value:
            uncast[storage] = name
        if not rank0:
            continue
        buffer = pinned.get(name)
        if buffer is None or buffer.shape != full.shape or buffer.dtype != full.dtype:
            buffer = pinned[name] = torch.empty(full.shape, dtype=full.dtype, pin_memory=full.is_cuda)
        buffer.copy_(full, non_blocking=full.is_cuda)
        on_host[name] = buffer
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return on_host


def install() -> None:
    import torch.distributed as dist
    from areal.engine.fsdp_engine import FSDPEngine

    from areal_patches.patching import wrap_once

    def cast_on_gpu(original):
        def _save_model_to_hf(self, path, tokenizer, processor) -> None:
            if self.model is None:
                raise RuntimeError("Model not initialized")
            os.makedirs(path, exist_ok=True)
            pinned = self.__dict__.setdefault("_fast_save_buffers", {})
            state_dict = host_copies(self, pinned)
            if dist.get_rank() == 0:
                self.model.save_pretrained(path, state_dict=state_dict)
                self.model_config.save_pretrained(path)
                if tokenizer is not None and not self.config.use_lora:
                    tokenizer.save_pretrained(path)
                if processor is not None and not self.config.use_lora:
                    processor.save_pretrained(path)
            dist.barrier(group=self.cpu_group)

        return _save_model_to_hf

    wrap_once(FSDPEngine, "_save_model_to_hf", cast_on_gpu, "casts_on_gpu")
