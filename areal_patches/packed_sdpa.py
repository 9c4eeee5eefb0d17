"""Make transformers' `sdpa` attention correct for AReaL's packed micro-batches.

Why this module exists: areal 1.0.4's FSDP engine packs several sequences into one
row of a micro-batch and tells the model where each one starts only through
`cu_seq_lens_q/k` (and position ids that restart at 0), while it passes
`attention_mask={"full_attention": None, ...}`. flash_attention_2's varlen kernel reads
`cu_seq_lens_q` and keeps the sequences apart. `sdpa` ignores it: with no mask it applies
one causal mask over the whole row, so every sequence also attends to the sequences packed
before it, and the log-probs and gradients of all but the first are silently wrong.

The fix keeps packing (which is where the throughput comes from) and attends causally inside
each packed sequence only: exactly what flash-attention's varlen kernel computes. On CUDA in
bf16/fp16 it calls that kernel as PyTorch ships it (`torch.nn.attention.varlen`), one call per
row; elsewhere (CPU, fp32) it runs sdpa once per sequence, which is correct but slow on a GPU
when hundreds of short sequences share a row. Installing
it replaces the "sdpa" entry of transformers' attention registry in this process; inputs
that are not packed (a real mask, a batch of several rows, a single sequence) go to the
original function unchanged.

The varlen call reads the sequence starts from the GPU as they are, so it never waits for the
GPU (a host sync in every layer kept the GPU idle between layers), and it attends with the
model's own key/value heads (grouped-query attention) instead of copies repeated per query
head. It trusts what AReaL guarantees and transformers' flash_attention_2 path trusts too:
`cu_seq_lens_q` ends at the row's length, because `areal.utils.data.pad_packed_tensor_dict`
pads a micro-batch by appending one more sequence (tests/test_packed_logp.py checks this).

Upstream: reported as AReaL issue #1442 (closed as stale, not fixed); unchanged on AReaL's main
as of cbff54d (2026-08-22) and in the v2.0.0 tag.
"""

from __future__ import annotations

import inspect

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

try:  # PyTorch >= 2.10 ships flash-attention's varlen kernel for CUDA
    from torch.nn.attention.varlen import varlen_attn
except ImportError:
    varlen_attn = None


def causal_kwargs() -> dict | None:
    """How this PyTorch's varlen_attn asks for a causal mask (2.10: is_causal; later: window)."""
    parameters = inspect.signature(varlen_attn).parameters if varlen_attn else {}
    if "is_causal" in parameters:
        return {"is_causal": True}
    if "window_size" in parameters:
        return {"window_size": (-1, 0)}
    return None


VARLEN_CAUSAL = causal_kwargs()


def sequence_bounds(cu_seq_lens: torch.Tensor, total_len: int) -> list[int]:
    """Start of each packed sequence plus the end; padding after the last one is its own span."""
    cuts = [int(c) for c in cu_seq_lens.tolist()]
    if cuts[-1] < total_len:
        cuts.append(total_len)
    return [c for i, c in enumerate(cuts) if i == 0 or c > cuts[i - 1]]


def sdpa_per_sequence(module, query, key, value, bounds: list[int], **kwargs) -> torch.Tensor:
    """Any device and dtype: one causal sdpa call per packed sequence."""
    outputs = [
        sdpa_attention_forward(
            module, query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], None, **kwargs
        )[0]
        for a, b in zip(bounds[:-1], bounds[1:])
    ]
    return torch.cat(outputs, dim=1)


def sdpa_varlen(query, key, value, cu_seq_lens: torch.Tensor, max_length: int) -> torch.Tensor:
    """CUDA, bf16/fp16: PyTorch's flash-attention varlen kernel, one call for the row.

    [1, heads, T, D] in, [1, T, heads, D] out; key and value keep their own (fewer) heads.
    """
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))
    cu = cu_seq_lens.to(torch.int32)
    out = varlen_attn(q, k, v, cu, cu, max_length, max_length, **VARLEN_CAUSAL)
    return out.unsqueeze(0)


def varlen_usable(module: torch.nn.Module, query: torch.Tensor, **kwargs) -> bool:
    """The kernel exists, fits the inputs, and uses the same 1/sqrt(d) scale as the model;
    the caller passed the longest sequence's length (AReaL does, as `max_length_q`)."""
    scaling = kwargs.get("scaling") or getattr(module, "scaling", None)
    return (
        VARLEN_CAUSAL is not None
        and query.is_cuda
        and query.dtype in (torch.float16, torch.bfloat16)
        and isinstance(kwargs.get("max_length_q"), int)
        and not kwargs.get("dropout")
        and (scaling is None or abs(scaling - query.shape[-1] ** -0.5) < 1e-6)
    )


def is_packed(query: torch.Tensor, attention_mask: torch.Tensor | None, cu_seq_lens: torch.Tensor | None) -> bool:
    """Several sequences share the single row, marked only by `cu_seq_lens` (AReaL's packing)."""
    return cu_seq_lens is not None and attention_mask is None and query.shape[0] == 1 and cu_seq_lens.numel() > 2


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
    if not is_packed(query, attention_mask, cu_seq_lens):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if varlen_usable(module, query, **kwargs):
        return sdpa_varlen(query, key, value, cu_seq_lens, kwargs["max_length_q"]), None
    bounds = sequence_bounds(cu_seq_lens, query.shape[2])
    return sdpa_per_sequence(module, query, key, value, bounds, **kwargs), None


def install() -> None:
    """Register the packing-aware function as this process's `sdpa` attention."""
    AttentionInterface.register("sdpa", packed_sdpa_attention_forward)

