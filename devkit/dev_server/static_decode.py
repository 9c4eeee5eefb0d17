"""Qwen2 and Llama decoding from a preallocated KV cache, replayed as CUDA graphs on a GPU.

Why: the dev server decodes a small model one token per step through transformers'
eager forward. On a GPU with the 25M learning-run model a step costs about the same
whatever the batch size (docs/results/throughput.md, attempts 4 and 5): hundreds of tiny kernel launches
and Python between them, not arithmetic. A CUDA graph replays the whole step's kernels
with one launch; for that every tensor must keep its shape and address, so the KV cache
is one preallocated buffer and a step's inputs are copied into fixed tensors.

The layers' own modules do the work (RMSNorm, projections, rotary embedding, MLP of the
transformers model); only the attention over the preallocated cache is written here. Qwen2
and Llama share that layout (Qwen2's q/k/v biases live inside its projections), so both are
served; an architecture that changes the attention itself (Qwen3's q/k norms, sliding
windows) is refused and decodes through transformers instead.
On CPU (or with ``graphs=False``) the same code runs eagerly, which is how the tests
compare it with transformers' own decoding.

Layout: each row of the cache holds one request. Its prompt, left-padded to the length
L of the prompts it was prefilled with, sits in slots [0, L); its decode step k writes
slot L + k. ``valid[row, slot]`` says which slots a row may attend to, and ``slot[row]``
where it writes next, so rows that joined at different times decode side by side (what
devkit/dev_server/continuous.py needs). Rows are padded up to a power of two, b, and one graph
is captured per (b, T) the server meets, T being the prompt + max_new_tokens rounded up
to 128, so attention reads only the part of the cache a batch can use. One slot past the
longest (``scratch``) takes the writes of rows that hold no request, and of the warm-up
passes when a graph is captured while other rows decode.
"""

from __future__ import annotations

import copy
import logging
import time
import weakref

import torch
import torch.nn.functional as F
from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb

logger = logging.getLogger("dev_server")

SLOT_ROUNDING = 128


SUPPORTED_MODEL_TYPES = ("qwen2", "llama")


def unsupported_reason(config) -> str | None:
    """Why this model cannot use the static decoder (None: it can)."""
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return f"model_type {model_type!r} is not one of {', '.join(SUPPORTED_MODEL_TYPES)}"
    if getattr(config, "use_sliding_window", False):
        return "sliding-window attention"
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or []):
        return "layers other than full attention"
    return None


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def batch_bucket(n: int, max_batch: int) -> int:
    """Rows a batch of n is padded to: the next power of two, at most max_batch."""
    return min(max_batch, 1 << (n - 1).bit_length())


class StaticDecoder:
    """Owns a copy of the model, the KV cache and the captured graphs.

    The copy follows whichever model the server hands to ``use`` (its weights are copied
    in when it changes), so graphs captured once stay valid across weight updates.
    """

    def __init__(self, model, max_batch: int, max_len: int, graphs: bool):
        self.model = copy.deepcopy(model)
        self.source = weakref.ref(model)
        self.max_batch, self.max_len = max_batch, max_len
        self.scratch = max_len  # the slot that rows holding no request write to
        self.graphs_enabled = graphs
        cfg = model.config
        self.layers = self.model.model.layers
        attn = self.layers[0].self_attn
        self.head_dim, self.scale = attn.head_dim, attn.scaling
        self.n_kv = cfg.num_key_value_heads
        self.n_groups = cfg.num_attention_heads // self.n_kv
        dev, dtype = next(self.model.parameters()).device, next(self.model.parameters()).dtype
        shape = (len(self.layers), max_batch, self.n_kv, max_len + 1, self.head_dim)
        self.k = torch.zeros(shape, device=dev, dtype=dtype)
        self.v = torch.zeros(shape, device=dev, dtype=dtype)
        self.valid = torch.zeros((max_batch, max_len + 1), device=dev, dtype=torch.bool)
        self.tok = torch.zeros(max_batch, device=dev, dtype=torch.long)
        self.pos = torch.zeros(max_batch, device=dev, dtype=torch.long)
        self.slot = torch.full((max_batch,), self.scratch, device=dev, dtype=torch.long)
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        logger.info("static decoder: KV cache for %d rows x %d slots, %.2f GiB, CUDA graphs %s",
                    max_batch, max_len, 2 * self.k.numel() * self.k.element_size() / 2**30,
                    "on" if graphs else "off")

    def fits(self, n_rows: int, total_len: int) -> bool:
        return n_rows <= self.max_batch and total_len <= self.max_len

    def slots_for(self, total_len: int) -> int:
        """T, the cache slots a batch whose rows need `total_len` slots attends over."""
        return min(self.max_len, round_up(total_len, SLOT_ROUNDING))

    def use(self, model) -> None:
        """Decode with `model`'s weights from now on."""
        if self.source() is not model:
            self.model.load_state_dict(model.state_dict())
            self.source = weakref.ref(model)

    def start(self, model, mask: torch.Tensor, max_new: int) -> "StaticBatch":
        """Begin a batch whose rows all start together (mask: B x L, 1 for prompt tokens)."""
        self.use(model)
        n_rows, n_prompt = mask.shape
        b = batch_bucket(n_rows, self.max_batch)
        t = self.slots_for(n_prompt + max_new)
        self.free(torch.arange(n_rows, b, device=mask.device))  # the bucket's padding rows
        return StaticBatch(self, mask, b, t)

    # -- the forward passes ----------------------------------------------------------------

    def prefill(self, rows: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor,
                keep_all: bool) -> torch.Tensor:
        """Write prompts (rows x L, left-padded; mask 1 for their tokens) into cache `rows`,
        slots [0, L); their logits for the last slot (every slot with keep_all), float32.
        Each row then decodes from slot L."""
        n = ids.shape[1]
        self.valid[rows] = False
        self.valid[rows, :n] = mask.bool()
        causal = torch.ones((n, n), dtype=torch.bool, device=ids.device).tril()
        allowed = causal[None] & self.valid[rows, None, :n]
        # A padding slot attends to itself, so no attention row is empty (an empty row
        # gives NaN, which would reach the cache through the next layers).
        allowed |= torch.eye(n, dtype=torch.bool, device=ids.device)
        slots = torch.arange(n, device=ids.device)

        def store(i: int, k: torch.Tensor, v: torch.Tensor):
            self.k[i][rows[:, None], :, slots] = k.transpose(1, 2)
            self.v[i][rows[:, None], :, slots] = v.transpose(1, 2)
            return k, v

        self.slot[rows] = n
        return self._forward(ids, pos, allowed[:, None], store, keep_all)

    def decode_step(self, b: int, t: int) -> torch.Tensor:
        """Logits (b x vocab) for one token per row of [:b] from the fixed input tensors
        `tok`, `pos` and `slot` (what a graph replays), each written at its row's slot."""
        where = self.slot[:b].view(b, 1, 1, 1).expand(b, self.n_kv, 1, self.head_dim)

        def store(i: int, k: torch.Tensor, v: torch.Tensor):
            self.k[i, :b].scatter_(2, where, k)
            self.v[i, :b].scatter_(2, where, v)
            return self.k[i, :b, :, :t], self.v[i, :b, :, :t]

        mask = self.valid[:b, None, None, :t]
        return self._forward(self.tok[:b, None], self.pos[:b, None], mask, store, False)[:, 0]

    def step(self, b: int, t: int) -> torch.Tensor:
        """Decode one token for rows [:b] (inputs already in `tok` and `pos`), then move each
        row's slot and position on; a graph replay when graphs are on."""
        self.valid[:b].scatter_(1, self.slot[:b, None], True)
        if self.graphs_enabled:
            graph, logits = self._graph(b, t)
            graph.replay()
        else:
            logits = self.decode_step(b, t)
        self.slot[:b].add_(1).clamp_(max=self.scratch)
        self.pos[:b] += 1
        return logits

    def free(self, rows: torch.Tensor) -> None:
        """Rows that hold no request: they attend to slot 0 only (so their logits stay
        finite) and write to the scratch slot."""
        self.valid[rows] = False
        self.valid[rows, 0] = True
        self.slot[rows] = self.scratch

    def _forward(self, ids, pos, attn_mask, store, keep_all: bool) -> torch.Tensor:
        inner = self.model.model
        x = inner.embed_tokens(ids)
        cos, sin = inner.rotary_emb(x, pos)
        for i, layer in enumerate(self.layers):
            x = x + self._attention(i, layer, layer.input_layernorm(x), cos, sin, attn_mask, store)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        x = inner.norm(x if keep_all else x[:, -1:])
        return self.model.lm_head(x).float()

    def _attention(self, i, layer, h, cos, sin, attn_mask, store):
        attn = layer.self_attn
        n, q_len, _ = h.shape
        q = attn.q_proj(h).view(n, q_len, -1, self.head_dim).transpose(1, 2)
        k = attn.k_proj(h).view(n, q_len, -1, self.head_dim).transpose(1, 2)
        v = attn.v_proj(h).view(n, q_len, -1, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        k, v = store(i, k, v)
        if q_len == 1:
            # Grouped-query attention without copying the cache: a kv head's query heads
            # become its "query positions", which all see the same keys.
            q = q.reshape(n, self.n_kv, self.n_groups, self.head_dim)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=self.scale)
        else:
            k = k.repeat_interleave(self.n_groups, dim=1)
            v = v.repeat_interleave(self.n_groups, dim=1)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=self.scale)
            out = out.transpose(1, 2)
        return attn.o_proj(out.reshape(n, q_len, -1))

    def _graph(self, b: int, t: int):
        """The graph of `decode_step(b, t)`, captured at first use. Its warm-up and capture
        passes write to the scratch slot, so rows decoding meanwhile keep their cache."""
        if (b, t) not in self.graphs:
            started = time.perf_counter()
            slots = self.slot[:b].clone()
            self.slot[:b] = self.scratch
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream), torch.inference_mode():
                for _ in range(2):
                    self.decode_step(b, t)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            # thread_local: the server may load new weights in another thread meanwhile
            with torch.cuda.graph(graph, capture_error_mode="thread_local"), torch.inference_mode():
                logits = self.decode_step(b, t)
            self.slot[:b] = slots
            self.graphs[b, t] = (graph, logits)
            logger.info("captured a decode graph for %d rows x %d slots in %.2fs",
                        b, t, time.perf_counter() - started)
        return self.graphs[b, t]


class StaticBatch:
    """One batch whose rows start together: ``prefill`` once, then ``step`` per token."""

    def __init__(self, dec: StaticDecoder, mask: torch.Tensor, b: int, t: int):
        self.dec, self.mask, self.b, self.t = dec, mask, b, t
        self.rows = mask.shape[0]

    def prefill(self, ids: torch.Tensor, pos: torch.Tensor, keep_all: bool) -> torch.Tensor:
        """Logits for the last prompt slot (all slots with keep_all): rows x (1 | L) x vocab."""
        rows = torch.arange(self.rows, device=ids.device)
        return self.dec.prefill(rows, ids, self.mask, pos, keep_all)

    def step(self, tok: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Logits (rows x vocab) after feeding one token per row at positions `pos`."""
        dec = self.dec
        dec.tok[: self.rows] = tok
        dec.pos[: self.rows] = pos
        return dec.step(self.b, self.t)[: self.rows]
