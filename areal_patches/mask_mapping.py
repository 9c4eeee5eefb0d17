"""Let Llama models train on AReaL's packed micro-batches.

Upstream behaviour (areal 1.0.4, `FSDPEngine._prepare_mb_list`): a packed micro-batch reaches
the model with `attention_mask={"full_attention": None, "sliding_attention": None}`, a mask per
attention type, for every model but Qwen3-MoE, Qwen3-VL and Qwen3.5. Qwen2's decoder takes such
a mapping and hands each layer its entry; transformers' Llama decoder passes it on to
`create_causal_mask`, which fails on the first forward with
`AttributeError: 'dict' object has no attribute 'ndim'`. So `sft.py` and `train.py` stop at
their first step on any Llama model (SmolLM2 among them).

The fix: transformers' `create_causal_mask`, given such a mapping, returns its
`full_attention` entry, as Qwen2's decoder does. `None` there means what it means for Qwen2:
the attention reads the sequences' bounds from `cu_seq_lens_q` (areal_patches/packed_sdpa.py
for sdpa, the varlen kernel for flash-attention). Any other mask goes to the original
function, and a decoder that takes the mapping itself (Qwen2) never passes it on. The
function is replaced where transformers defines it, for the model modules imported later,
and in the modules that imported it already (each holds its own reference).

Effect: Llama (and any decoder that hands its mask to `create_causal_mask`) trains; Qwen2
and every mask that is not a mapping are untouched
(tests/test_smollm2.py checks a packed batch's log-probs against unpacked forwards). Off:
`areal_patches.apply(skip={"mask_mapping"})`.

Upstream: reported as AReaL issue #1557 (closed as stale, not fixed); unchanged on AReaL's main
as of cbff54d (2026-08-22) and in the v2.0.0 tag.
"""

from __future__ import annotations

from areal_patches.patching import wrap_once


def takes_a_mapping(create_causal_mask):
    """`create_causal_mask` that answers a per-attention-type mapping with its full-attention mask."""

    def wrapper(*args, **kwargs):
        mask = kwargs.get("attention_mask")
        if isinstance(mask, dict):
            return mask["full_attention"]
        return create_causal_mask(*args, **kwargs)

    return wrapper


def install() -> None:
    import sys

    from transformers import masking_utils

    original = masking_utils.create_causal_mask
    wrapped = wrap_once(masking_utils, "create_causal_mask", takes_a_mapping, "takes_a_mapping")
    for module in list(sys.modules.values()):  # __dict__: transformers' lazy modules import nothing
        if getattr(module, "__dict__", {}).get("create_causal_mask") is original:
            module.create_causal_mask = wrapped
