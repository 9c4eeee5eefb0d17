"""Make transformers' `sdpa` attention correct for AReaL's packed micro-batches.

Why this module exists: areal 1.0.4's FSDP engine packs several sequences into one
row of a micro-batch and tells the model where each one starts only through
`cu_seq_lens_q/k` (and position ids that restart at 0), while it passes
`attention_mask={"full_attention": None, ...}`. flash_attention_2's varlen kernel reads
`cu_seq_lens_q` and keeps the sequences apart. `sdpa` ignores it: with no mask it applies
one causal mask over the whole row, so every sequence also attends to the sequences packed
before it, and the log-probs and gradients of all but the first are silently wrong.

The fix keeps packing (which is where the throughput comes from) and runs sdpa once per
packed sequence, causal inside each one: exactly what the varlen kernel computes. Installing
it replaces the "sdpa" entry of transformers' attention registry in this process; inputs
that are not packed (a real mask, a batch of several rows, a single sequence) go to the
original function unchanged.
"""

from __future__ import annotations

import sys

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward


def sequence_bounds(cu_seq_lens: torch.Tensor, total_len: int) -> list[tuple[int, int]]:
    """[start, end) of each packed sequence; padding after the last one is its own span."""
    cuts = [int(c) for c in cu_seq_lens.tolist()]
    if cuts[-1] < total_len:
        cuts.append(total_len)
    return [(a, b) for a, b in zip(cuts[:-1], cuts[1:]) if b > a]


def packed_sdpa_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """sdpa that respects `cu_seq_lens_q` when several sequences share one row."""
    cu_seq_lens = kwargs.get("cu_seq_lens_q")
    packed = (
        cu_seq_lens is not None
        and attention_mask is None
        and query.shape[0] == 1
        and cu_seq_lens.numel() > 2
    )
    if not packed:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    outputs = [
        sdpa_attention_forward(
            module, query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], None, **kwargs
        )[0]
        for a, b in sequence_bounds(cu_seq_lens, query.shape[2])
    ]
    return torch.cat(outputs, dim=1), None


def install() -> None:
    """Register the packing-aware function as this process's `sdpa` attention."""
    AttentionInterface.register("sdpa", packed_sdpa_attention_forward)


if __name__ == "__main__":
    # `python3 -m packed_sdpa ...` runs AReaL's RPC worker with the fix installed; the
    # single-controller schedulers start training workers with this command (see
    # `scheduling_spec.cmd` in train_config.yaml).
    from areal.infra.rpc.rpc_server import main

    install()
    sys.exit(main())
