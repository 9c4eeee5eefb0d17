"""Development inference server speaking the part of SGLang's HTTP protocol that AReaL uses.

    python3 -m tools.dev_server --model PATH [--host 127.0.0.1] [--port 30000]
        [--device cpu|cuda] [--dtype float32|bfloat16] [--max-batch 64] [--seed 0]
        [--decoder auto|hf|static] [--static-max-len 1024]

This is a development server for CPU demos and tests (and small single-GPU experiments),
NOT a replacement for SGLang: one process, one device, a plain Hugging Face
``transformers`` model, static batches (no continuous batching, no paged attention, no
prefix cache, no tensor parallelism, no LoRA, no NCCL weight sync). It
exists so that AReaL's production client, ``areal.engine.RemoteSGLangEngine``, runs
unchanged against a model on a machine without SGLang. It needs only torch,
transformers and aiohttp (aiohttp rather than FastAPI/uvicorn: AReaL's client needs
aiohttp anyway, and the GPU image has it but not FastAPI).

Speed: on CPU it uses one torch thread unless ``--threads`` says otherwise (tiny models
get slower with more threads, and much slower when the cores are shared); ~2,600
tokens/s for 32 requests x 128 new tokens with the tiny preset on one core. On a GPU,
Qwen2 models decode through tools/static_decode.py (a preallocated KV cache, each decode
step replayed as one CUDA graph); other models, and ``--decoder hf``, through transformers'
own forward, which is bound by Python and kernel launches. On an H100 with the 25M
``small`` preset in bfloat16 (bench/gpu/decode.py): 1.1-3.8 ms per step for 1-1024
requests against 10-14 ms, and the same greedy completions.

Endpoints (the ones ``RemoteSGLangEngine`` calls, plus a few SGLang probes):
  GET  /health, /health_generate, /get_model_info, /get_server_info,
       /get_weight_version, /v1/models
  POST /generate                      one request per call (``input_ids`` or ``text``)
  POST /pause_generation, /continue_generation
  POST /update_weights_from_disk      {"model_path", "abort_all_requests"?, "weight_version"?}
  POST /abort_request                 {"rid"?, "abort_all"?}
  POST /flush_cache, /release_memory_occupation, /resume_memory_occupation  (no-ops)
  POST /update_weights_from_distributed, /init_weights_update_group,
       /load_lora_adapter, /unload_lora_adapter  -> 400 "not supported"

Protocol decisions (the AReaL client in areal/infra/remote_inf_engine.py is the authority):

* Batching: a worker thread takes the oldest queued request and every other queued
  request with the same sampling key (temperature, top_p, top_k, min_p, frequency and
  presence penalty), up to ``--max-batch``; max_new_tokens, stop ids and stop strings
  may differ inside a batch. Before starting a batch the worker waits up to
  ``--batch-wait-ms`` (ending early once no request arrived for 20 ms) so that a burst
  of concurrent requests shares one batch. Prompts are left-padded; position ids come from the
  attention mask, so padding does not change results beyond float noise (greedy
  output equals an unbatched ``model.generate`` greedy decode). The batch runs until
  every row has finished; requests arriving meanwhile wait for the next batch.
* Log-probs (``meta_info.output_token_logprobs``, ``[[logprob, token_id, None], ...]``):
  ``log_softmax(logits / temperature)`` of the sampled token for temperature > 0 and
  ``log_softmax(logits)`` for greedy (temperature 0). This is what AReaL's actor computes
  (``gather_logprobs(logits, labels, temperature=actor.temperature)``), so set the
  actor temperature equal to the rollout temperature. They are taken before top-k /
  top-p / min-p filtering and before frequency / presence penalties (the actor knows
  none of those), so they are the unfiltered distribution's log-probs.
* Stopping: a row stops when it produces a token in ``stop_token_ids`` or an EOS id
  (generation_config + tokenizer), or when a ``stop`` string appears in its decoded text.
  As in SGLang, the stop token IS included in ``output_ids`` / ``output_token_logprobs``
  (AReaL appends it to the sequence and trains on it), and ``ignore_eos`` disables all
  token-id stops (SGLang does the same), not just EOS. ``finish_reason`` is
  ``{"type": "stop", "matched": <id or str>}``, ``{"type": "length", "length": n}`` or
  ``{"type": "abort", "message": ...}``.
* Pause: ``/pause_generation`` (SGLang's default mode "abort") aborts the in-flight batch
  at the next decode step and returns once it has stopped: each unfinished row answers
  with the tokens generated so far and finish_reason ``abort``. AReaL's ``agenerate``
  resubmits such requests with ``input_ids + output`` and the remaining token budget,
  and the resubmission (like every request that arrives or is queued while paused) is
  HELD, not rejected, until ``/continue_generation``. ``{"mode": "in_place"}`` (or any
  mode other than "abort") lets the in-flight batch finish instead.
* ``/update_weights_from_disk`` loads the new model completely (off the worker thread),
  then swaps it in between batches. With ``abort_all_requests`` (AReaL always sends
  true) the in-flight batch is aborted as for a pause; without it the batch finishes on
  the old weights. Either way the call answers only when no batch is running on the old
  weights any more: 200 ``{"success": true, "message", "num_paused_requests"}``. A bad
  path or an incompatible model answers 400 ``{"success": false, "message"}`` (the
  client's ``raise_for_status`` turns that into an error) and the old weights stay.
  ``weight_version`` counts successful loads (or takes the ``weight_version`` given in
  the payload) and is reported in every response's ``meta_info``.
* Sampling is reproducible for a fixed ``--seed`` and a fixed request order when
  requests are served one at a time; concurrent batches depend on arrival timing.
* Shutdown: SIGTERM / SIGINT abort the running batch, answer queued requests with
  ``abort`` and exit with status 0. ``--step-delay-ms`` (a testing aid) slows every decode
  step so that tests can pause or abort a request mid-flight.

Python helpers for scripts and tests (they do not import torch)::

    from tools import dev_server
    with dev_server.serve("models/tiny-qwen2") as addr:      # "127.0.0.1:PORT"
        out = dev_server.http_json(addr, "/generate", {"input_ids": [1, 2, 3]})

    serve(model_path, port=None, **DevServer kwargs)  -> context manager yielding "host:port"
    DevServer(model_path, port=None, host="127.0.0.1", device="cpu", dtype="float32",
              max_batch=64, seed=0, timeout=120.0, log_file=None, extra_args=(),
              python=None, env=None)      .start() .stop() .command() .addr .pid .log_file, a context manager
    http_json(addr, endpoint, payload=None, method=None, timeout=60) -> body (HTTPStatusError
              unless 200);  http_request(...) -> (status, body);  find_free_port(host)

``serve()`` / ``DevServer`` start the server as a subprocess in its own session with
stdout+stderr going to a log file, wait until ``/health`` answers, and kill the whole
process group on exit (context manager and atexit). The server also exits by itself
when its parent process dies (``--parent-pid``, set by the helpers).
"""

import argparse
import asyncio
import atexit
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger("dev_server")

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default
UNSUPPORTED_ENDPOINTS = (
    "/update_weights_from_distributed",
    "/update_weights_from_tensor",
    "/init_weights_update_group",
    "/load_lora_adapter",
    "/unload_lora_adapter",
)


# =============================================================================
# request parsing


FINGERPRINT_TOKENS = 16  # length of the fixed sequence Engine.fingerprint scores


class BadRequest(ValueError):
    """A request the server rejects with HTTP 400."""


_NUMERIC_PARAMS = {
    "max_new_tokens": int, "temperature": float, "top_p": float, "top_k": int,
    "min_p": float, "frequency_penalty": float, "presence_penalty": float,
}


@dataclass
class SamplingParams:
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    no_stop_trim: bool = False

    @property
    def batch_key(self) -> tuple:
        """Requests with equal keys may share a batch."""
        return (
            self.temperature,
            self.top_p,
            self.top_k,
            self.min_p,
            self.frequency_penalty,
            self.presence_penalty,
        )

    @classmethod
    def from_json(cls, d: dict | None) -> "SamplingParams":
        d = dict(d or {})
        p = cls()
        try:
            for name, cast in _NUMERIC_PARAMS.items():
                if d.get(name) is not None:
                    setattr(p, name, cast(d[name]))
            if d.get("stop_token_ids"):
                p.stop_token_ids = tuple(int(x) for x in d["stop_token_ids"])
            stop = d.get("stop")
            if stop:
                p.stop = (stop,) if isinstance(stop, str) else tuple(str(s) for s in stop)
            p.ignore_eos = bool(d.get("ignore_eos") or False)
            if d.get("skip_special_tokens") is not None:
                p.skip_special_tokens = bool(d["skip_special_tokens"])
            p.no_stop_trim = bool(d.get("no_stop_trim") or False)
            rep = d.get("repetition_penalty")
        except (TypeError, ValueError) as e:
            raise BadRequest(f"bad sampling_params: {e}") from None
        if rep is not None and float(rep) != 1.0:
            raise BadRequest("repetition_penalty is not supported by the dev server")
        if p.max_new_tokens < 0:
            raise BadRequest(f"max_new_tokens must be >= 0, got {p.max_new_tokens}")
        if p.temperature < 0:
            raise BadRequest(f"temperature must be >= 0, got {p.temperature}")
        if not 0.0 < p.top_p <= 1.0:
            raise BadRequest(f"top_p must be in (0, 1], got {p.top_p}")
        if p.temperature > 0 and p.temperature < 1e-5:
            p.temperature = 0.0  # SGLang treats tiny temperatures as greedy too
        return p


@dataclass
class GenRequest:
    rid: str
    input_ids: list[int]
    params: SamplingParams
    return_logprob: bool
    logprob_start_len: int  # -1: no input log-probs
    loop: Any  # asyncio loop of the HTTP handler
    future: Any  # asyncio.Future resolved with the response dict
    arrival: float = field(default_factory=time.perf_counter)

    def resolve(self, value: Any = None, error: BaseException | None = None) -> None:
        def _set() -> None:
            if self.future.done():
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(value)

        try:
            self.loop.call_soon_threadsafe(_set)
        except RuntimeError:  # loop already closed (shutdown)
            pass


# =============================================================================
# model + batched generation


class Engine:
    """A transformers causal LM and a batched, KV-cached sampler."""

    def __init__(self, model_path: str, device: str, dtype: str, seed: int,
                 step_delay_s: float = 0.0, decoder: str = "hf", max_batch: int = 64,
                 static_max_len: int = 1024):
        import torch
        from transformers import AutoTokenizer

        self.torch = torch
        self.device = torch.device(device)
        self.dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16,
                      "float16": torch.float16}[dtype]
        self.model_path = str(model_path)
        self.step_delay_s = step_delay_s
        if self.device.type == "cuda":
            # cuDNN's SDPA builds an execution plan for every new (batch, kv length) shape,
            # and a KV-cached decode makes a new shape every step: measured on an H100 with
            # the 31M model, 70-80 ms/step with it vs 9-11 ms/step with flash/mem-efficient.
            torch.backends.cuda.enable_cudnn_sdp(False)
        torch.manual_seed(seed)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self.model = self.load_model(model_path)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        except Exception as e:  # a weights-only folder still serves input_ids
            logger.warning("no tokenizer in %s (%s): 'text' fields will be empty", model_path, e)
            self.tokenizer = None
        cfg = self.model.config
        self.vocab_size = int(cfg.vocab_size)
        self.context_len = int(getattr(cfg, "max_position_embeddings", 1 << 30))
        self.pad_id = self._first_id(cfg.pad_token_id, self.model.generation_config.pad_token_id,
                                     getattr(self.tokenizer, "pad_token_id", None),
                                     cfg.eos_token_id, 0)
        eos: set[int] = set()
        for src in (cfg.eos_token_id, self.model.generation_config.eos_token_id,
                    getattr(self.tokenizer, "eos_token_id", None)):
            if src is None:
                continue
            eos.update([src] if isinstance(src, int) else list(src))
        self.eos_ids = tuple(sorted(eos))
        self.static = self._static_decoder(decoder, max_batch, static_max_len)

    def _static_decoder(self, decoder: str, max_batch: int, max_len: int):
        """tools/static_decode.py's decoder, or None for transformers' own decoding.

        "auto" takes it on a GPU when the model is supported; "static" insists (on CPU it
        runs without CUDA graphs: that is how the tests check it against transformers).
        """
        if decoder == "hf" or (decoder == "auto" and self.device.type != "cuda"):
            return None
        from tools import static_decode

        reason = static_decode.unsupported_reason(self.model.config)
        if reason is not None:
            if decoder == "static":
                raise ValueError(f"--decoder static cannot serve this model: {reason}")
            logger.info("static decoder off: %s", reason)
            return None
        return static_decode.StaticDecoder(self.model, max_batch, max_len,
                                           graphs=self.device.type == "cuda")

    def check_compatible(self, model) -> None:
        """Raise ValueError unless `model` can replace the served one."""
        if int(model.config.vocab_size) != self.vocab_size:
            raise ValueError(f"vocab size {model.config.vocab_size} differs from the "
                             f"served model's {self.vocab_size}")
        if self.static is not None:
            mine = {k: v.shape for k, v in self.static.model.state_dict().items()}
            theirs = {k: v.shape for k, v in model.state_dict().items()}
            if mine != theirs:
                raise ValueError("its parameters differ in names or shapes from the served model's")

    @staticmethod
    def _first_id(*cands):
        for c in cands:
            if isinstance(c, (list, tuple)):
                c = c[0] if c else None
            if c is not None:
                return int(c)
        return 0

    def load_model(self, path: str):
        """Load a complete model (raises on any problem; nothing is swapped here)."""
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(path, dtype=self.dtype)
        model.to(self.device)
        model.eval()
        model.requires_grad_(False)
        return model

    def fingerprint(self, model) -> float:
        """Mean log-prob the model gives a fixed token sequence: logged at every load, so a
        run's log shows that each weight push changed what the server computes."""
        import torch

        ids = torch.arange(FINGERPRINT_TOKENS, device=self.device)[None] % model.config.vocab_size
        with torch.no_grad():
            logits = model(ids).logits[0, :-1].float()
        return torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).mean().item()

    # -- generation -------------------------------------------------------------

    def generate_batch(self, model, reqs: list[GenRequest], should_abort) -> list[dict]:
        """Run one static batch to completion (or abort); returns one result per request.

        A result is ``{"output_ids", "logprobs", "finish_reason", "input_logprobs"}``.
        """
        torch = self.torch
        with torch.inference_mode():
            return self._generate_batch(model, reqs, should_abort)

    def _generate_batch(self, model, reqs, should_abort):
        torch = self.torch
        dev = self.device
        B = len(reqs)
        params = reqs[0].params  # batch-wide sampling settings (same batch_key)
        temperature = params.temperature
        lens = [len(r.input_ids) for r in reqs]
        L = max(lens)
        ids = torch.full((B, L), self.pad_id, dtype=torch.long)
        mask = torch.zeros((B, L), dtype=torch.long)
        for i, r in enumerate(reqs):
            ids[i, L - lens[i]:] = torch.tensor(r.input_ids, dtype=torch.long)
            mask[i, L - lens[i]:] = 1
        ids, mask = ids.to(dev), mask.to(dev)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)

        # per-row limits and stop sets
        max_new = [r.params.max_new_tokens for r in reqs]
        stop_sets = []
        for r in reqs:
            s = set() if r.params.ignore_eos else set(r.params.stop_token_ids) | set(self.eos_ids)
            stop_sets.append(s)
        S = max(1, max(len(s) for s in stop_sets))
        stop_mat = torch.full((B, S), -1, dtype=torch.long)
        for i, s in enumerate(stop_sets):
            if s:
                stop_mat[i, : len(s)] = torch.tensor(sorted(s), dtype=torch.long)
        stop_mat = stop_mat.to(dev)
        max_new_t = torch.tensor(max_new, device=dev)
        str_rows = [i for i, r in enumerate(reqs) if r.params.stop]

        if should_abort():
            return [self._abort_result([], [], "Abort before prefill") for _ in reqs]

        want_input_lp = [r.return_logprob and r.logprob_start_len >= 0 for r in reqs]
        forward = self._batch_forward(model, mask, max(max_new))
        logits = forward.prefill(ids, pos, keep_all=any(want_input_lp))
        input_logprobs: list[list | None] = [None] * B
        if any(want_input_lp):
            all_logits = logits.float()
            for i, r in enumerate(reqs):
                if want_input_lp[i]:
                    input_logprobs[i] = self._input_logprobs(all_logits[i, L - lens[i]:], r)
        logits = logits[:, -1, :].float()
        next_pos = pos[:, -1] + 1

        counts = None
        if params.frequency_penalty != 0.0 or params.presence_penalty != 0.0:
            counts = torch.zeros((B, logits.shape[-1]), dtype=torch.float32, device=dev)

        # Bookkeeping stays on the device; the host syncs once per step ("all finished?")
        # plus, only for rows with stop strings, to read their tokens.
        out_toks: list[torch.Tensor] = []
        out_logps: list[torch.Tensor] = []
        finished = torch.zeros(B, dtype=torch.bool, device=dev)
        n_out = torch.zeros(B, dtype=torch.long, device=dev)  # output length once finished
        str_matched: dict[int, str] = {}
        str_text: dict[int, list[int]] = {i: [] for i in str_rows}
        step = 0
        aborted = False
        while True:
            # -- choose the next token for every row
            if temperature == 0.0:
                lp_all = torch.log_softmax(logits, dim=-1)
                scores = logits
                if counts is not None:
                    scores = self._penalize(scores, counts, params)
                tok = scores.argmax(dim=-1)
            else:
                scaled = logits / temperature
                lp_all = torch.log_softmax(scaled, dim=-1)
                scores = scaled
                if counts is not None:
                    scores = self._penalize(scores, counts, params)
                tok = self._sample(scores, params)
            lp = lp_all.gather(-1, tok[:, None]).squeeze(-1)
            out_toks.append(tok)
            out_logps.append(lp)
            if counts is not None:
                counts.scatter_add_(1, tok[:, None], torch.ones_like(lp[:, None]))
            step += 1

            # -- which rows finish with this token (token stop or length first, as SGLang)
            newly = ~finished & ((tok[:, None] == stop_mat).any(-1) | (max_new_t <= step))
            finished |= newly
            n_out = torch.where(newly, step, n_out)
            if str_rows:
                self._check_stop_strings(reqs, str_rows, tok, finished, n_out, step,
                                         str_text, str_matched)
            if bool(finished.all()):
                break
            if self.step_delay_s:
                time.sleep(self.step_delay_s)
            if should_abort():
                aborted = True
                break
            logits = forward.step(tok, next_pos)
            next_pos = next_pos + 1

        toks = torch.stack(out_toks, dim=1).tolist()
        lps = torch.stack(out_logps, dim=1).tolist()
        done, n_out = finished.tolist(), n_out.tolist()
        final = []
        for i in range(B):
            if not done[i]:
                assert aborted
                final.append(self._abort_result(toks[i], lps[i], "Aborted by the server"))
            else:
                n = n_out[i]
                final.append({"output_ids": toks[i][:n], "logprobs": lps[i][:n],
                              "finish_reason": self._finish_reason(toks[i][n - 1], n, max_new[i],
                                                                   str_matched.get(i))})
            final[-1]["input_logprobs"] = input_logprobs[i]
        return final

    def _batch_forward(self, model, mask, max_new: int):
        """The static decoder when it is on and the batch fits, else transformers' cache."""
        if self.static is not None and self.static.fits(mask.shape[0], mask.shape[1] + max_new):
            return self.static.start(model, mask, max_new)
        return HFBatch(model, mask)

    @staticmethod
    def _finish_reason(last_tok: int, n: int, max_new: int, matched_str: str | None) -> dict:
        if matched_str is not None:
            return {"type": "stop", "matched": matched_str}
        if n >= max_new:  # SGLang checks the length first
            return {"type": "length", "length": max_new}
        return {"type": "stop", "matched": last_tok}

    def _check_stop_strings(self, reqs, rows, tok, finished, n_out, step, text, matched) -> None:
        """Finish rows whose decoded text now holds one of their stop strings."""
        toks = tok[rows].tolist()
        done = finished[rows].tolist()
        for i, t, d in zip(rows, toks, done):
            if d:
                continue
            text[i].append(t)
            found = self._match_stop_str(reqs[i], text[i])
            if found is not None:
                matched[i] = found
                finished[i] = True
                n_out[i] = step

    @staticmethod
    def _abort_result(o_ids, o_lps, message):
        return {"output_ids": o_ids, "logprobs": o_lps,
                "finish_reason": {"type": "abort", "message": message,
                                  "status_code": None, "err_type": None}}

    def _input_logprobs(self, logits_row, req: GenRequest) -> list:
        """[[logprob | None, token_id, None], ...] for prompt positions from logprob_start_len."""
        torch = self.torch
        t = req.params.temperature
        lp = torch.log_softmax(logits_row / t if t > 0 else logits_row, dim=-1)
        ids = req.input_ids
        tgt = torch.tensor(ids[1:], device=lp.device)
        vals = lp[:-1].gather(-1, tgt[:, None]).squeeze(-1).tolist() if len(ids) > 1 else []
        full = [[None, ids[0], None]] + [[v, tok, None] for v, tok in zip(vals, ids[1:])]
        return full[req.logprob_start_len:]

    def _penalize(self, scores, counts, params):
        if params.frequency_penalty:
            scores = scores - params.frequency_penalty * counts
        if params.presence_penalty:
            scores = scores - params.presence_penalty * (counts > 0).float()
        return scores

    def _sample(self, scores, params):
        torch = self.torch
        V = scores.shape[-1]
        if 0 < params.top_k < V:
            kth = torch.topk(scores, params.top_k, dim=-1).values[:, -1:]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        if params.top_p < 1.0:
            sp, si = probs.sort(dim=-1, descending=True)
            cum = sp.cumsum(-1)
            drop = (cum - sp) > params.top_p  # keep the smallest prefix reaching top_p
            sp = sp.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter_(-1, si, sp)
        if params.min_p > 0.0:
            pmax = probs.max(dim=-1, keepdim=True).values
            probs = probs.masked_fill(probs < params.min_p * pmax, 0.0)
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)

    def _match_stop_str(self, req: GenRequest, out_ids: list[int]) -> str | None:
        if self.tokenizer is None:
            return None
        text = self.tokenizer.decode(out_ids[-64:], skip_special_tokens=False)
        for s in req.params.stop:
            if s and s in text:
                return s
        return None

    def decode_text(self, req: GenRequest, out_ids: list[int], finish_reason: dict) -> str:
        if self.tokenizer is None:
            return ""
        ids = list(out_ids)
        matched = finish_reason.get("matched")
        trim = finish_reason.get("type") == "stop" and not req.params.no_stop_trim
        if trim and isinstance(matched, int) and ids and ids[-1] == matched:
            ids = ids[:-1]
        text = self.tokenizer.decode(ids, skip_special_tokens=req.params.skip_special_tokens)
        if trim and isinstance(matched, str) and matched in text:
            text = text[: text.index(matched)]
        return text


class HFBatch:
    """One batch's forward passes through transformers' own KV cache (any model, any device)."""

    def __init__(self, model, mask):
        import torch
        from transformers import DynamicCache

        self.cat = torch.cat
        self.model, self.mask = model, mask
        self.cache = DynamicCache(config=model.config)

    def prefill(self, ids, pos, keep_all: bool):
        """Logits for the last prompt position (all positions with keep_all)."""
        out = self.model(input_ids=ids, attention_mask=self.mask, position_ids=pos,
                         past_key_values=self.cache, use_cache=True,
                         logits_to_keep=0 if keep_all else 1)
        return out.logits

    def step(self, tok, pos):
        """Logits (rows x vocab, float32) after feeding one token per row."""
        ones = self.mask.new_ones((self.mask.shape[0], 1))
        self.mask = self.cat([self.mask, ones], dim=1)
        out = self.model(input_ids=tok[:, None], attention_mask=self.mask, position_ids=pos[:, None],
                         past_key_values=self.cache, use_cache=True)
        return out.logits[:, -1, :].float()


# =============================================================================
# scheduler: queue, worker thread, pause / abort / weight swap


class Scheduler:
    def __init__(self, engine: Engine, max_batch: int, batch_wait_s: float = 0.1,
                 batch_settle_s: float = 0.02):
        self.engine = engine
        self.model = engine.model
        self.max_batch = max_batch
        self.batch_wait_s = batch_wait_s
        self.batch_settle_s = batch_settle_s
        self.cond = threading.Condition()
        self.queue: deque[GenRequest] = deque()
        self.paused = False
        self.stopping = False
        self.running: list[GenRequest] | None = None
        self.running_model = None
        self.abort_epoch = 0
        self.weight_version = "0"
        self.n_loads = 0
        self.stats = {"requests": 0, "batches": 0, "aborted": 0, "output_tokens": 0}
        self.thread = threading.Thread(target=self._loop, name="generation-worker", daemon=True)

    def start(self) -> None:
        self.thread.start()

    # -- called from HTTP handlers (threads) ---------------------------------------

    def submit(self, req: GenRequest) -> None:
        with self.cond:
            if self.stopping:
                raise RuntimeError("server is shutting down")
            self.queue.append(req)
            self.cond.notify_all()

    def pause(self, abort: bool = True) -> int:
        """Hold new work; abort (or let finish) the running batch; wait until it stopped."""
        with self.cond:
            self.paused = True
            n = len(self.running or [])
            if self.running and abort:
                self.abort_epoch += 1
            while self.running is not None:
                self.cond.wait()
            return n

    def resume(self) -> None:
        with self.cond:
            self.paused = False
            self.cond.notify_all()

    def abort(self, rid: str | None = None, abort_all: bool = False) -> int:
        """Abort the running batch (if it holds rid or abort_all) and matching queued requests."""
        hit = []
        with self.cond:
            keep = deque()
            for r in self.queue:
                (hit if abort_all or r.rid == rid else keep).append(r)
            self.queue = keep
            if self.running and (abort_all or any(r.rid == rid for r in self.running)):
                self.abort_epoch += 1
                n_running = len(self.running)
            else:
                n_running = 0
            self.cond.notify_all()
        self.stats["aborted"] += len(hit)
        for r in hit:
            r.resolve(self.make_response(r, Engine._abort_result([], [], "Abort before prefill")))
        return len(hit) + n_running

    def swap_model(self, model, abort_running: bool, version: str | None) -> int:
        """Install a loaded model; answer only when no batch runs on the old one."""
        with self.cond:
            old = self.model
            self.model = self.engine.model = model  # drop every reference to the old one
            self.n_loads += 1
            self.weight_version = str(version) if version is not None else str(self.n_loads)
            n = len(self.running or [])
            if self.running and abort_running:
                self.abort_epoch += 1
            while self.running is not None and self.running_model is old:
                self.cond.wait()
            self.cond.notify_all()
        return n

    def shutdown(self) -> None:
        with self.cond:
            self.stopping = True
            self.abort_epoch += 1
            pending = list(self.queue)
            self.queue.clear()
            self.cond.notify_all()
        for r in pending:
            r.resolve(self.make_response(r, Engine._abort_result([], [], "Abort before prefill")))

    # -- worker -------------------------------------------------------------------------

    def _take_batch(self) -> list[GenRequest]:
        first = self.queue.popleft()
        key = first.params.batch_key
        batch, rest = [first], deque()
        while self.queue:
            r = self.queue.popleft()
            if len(batch) < self.max_batch and r.params.batch_key == key:
                batch.append(r)
            else:
                rest.append(r)
        self.queue = rest
        return batch

    def _loop(self) -> None:
        while True:
            with self.cond:
                while not self.stopping and (self.paused or not self.queue):
                    self.cond.wait()
                if self.stopping:
                    return
                # let a burst of concurrent requests arrive before forming the batch
                deadline = time.monotonic() + self.batch_wait_s
                seen = len(self.queue)
                while len(self.queue) < self.max_batch and time.monotonic() < deadline:
                    self.cond.wait(timeout=self.batch_settle_s)
                    if len(self.queue) == seen or self.paused or self.stopping:
                        break
                    seen = len(self.queue)
                if self.paused or self.stopping or not self.queue:
                    continue
                batch = self._take_batch()
                self.running = batch
                self.running_model = model = self.model
                epoch = self.abort_epoch
                version = self.weight_version
            try:
                self._run(batch, model, epoch, version)
            finally:
                with self.cond:
                    self.running = None
                    self.running_model = None
                    self.cond.notify_all()

    def _run(self, batch, model, epoch, version) -> None:
        t0 = time.perf_counter()
        immediate = [r for r in batch if r.params.max_new_tokens == 0]
        work = [r for r in batch if r.params.max_new_tokens > 0]
        for r in immediate:
            r.resolve(self.make_response(r, {"output_ids": [], "logprobs": [],
                                             "finish_reason": {"type": "length", "length": 0},
                                             "input_logprobs": None}, version))
        if not work:
            return
        try:
            results = self.engine.generate_batch(
                model, work, should_abort=lambda: self.abort_epoch != epoch or self.stopping)
        except Exception as e:  # report to every caller, keep serving
            logger.exception("batch of %d failed", len(work))
            for r in work:
                r.resolve(error=e)
            return
        for r, res in zip(work, results):
            r.resolve(self.make_response(r, res, version))
        self.stats["batches"] += 1
        self.stats["requests"] += len(work)
        self.stats["output_tokens"] += sum(len(res["output_ids"]) for res in results)
        self.stats["aborted"] += sum(res["finish_reason"]["type"] == "abort" for res in results)
        dt = time.perf_counter() - t0
        n_tok = sum(len(res["output_ids"]) for res in results)
        kinds: dict[str, int] = {}
        for res in results:
            kinds[res["finish_reason"]["type"]] = kinds.get(res["finish_reason"]["type"], 0) + 1
        logger.info(
            "batch n=%d prompt_max=%d new_tokens=%d steps=%d %.2fs %.0f tok/s finish=%s v=%s queued=%d",
            len(work), max(len(r.input_ids) for r in work), n_tok,
            max(len(res["output_ids"]) for res in results), dt, n_tok / max(dt, 1e-9),
            ",".join(f"{k}:{v}" for k, v in sorted(kinds.items())), version, len(self.queue),
        )

    def make_response(self, req: GenRequest, res: dict, version: str | None = None) -> dict:
        out_ids = res["output_ids"]
        fr = res["finish_reason"]
        meta: dict[str, Any] = {
            "id": req.rid,
            "finish_reason": fr,
            "prompt_tokens": len(req.input_ids),
            "completion_tokens": len(out_ids),
            "cached_tokens": 0,
            "weight_version": version if version is not None else self.weight_version,
            "e2e_latency": time.perf_counter() - req.arrival,
        }
        if req.return_logprob:
            meta["output_token_logprobs"] = [
                [float(lp), int(t), None] for lp, t in zip(res["logprobs"], out_ids)
            ]
            if res.get("input_logprobs") is not None:
                meta["input_token_logprobs"] = res["input_logprobs"]
        return {
            "text": self.engine.decode_text(req, out_ids, fr),
            "output_ids": list(out_ids),
            "meta_info": meta,
        }


# =============================================================================
# HTTP app (aiohttp: present wherever AReaL's client runs, so the server needs no
# extra packages beyond torch + transformers)


def create_app(engine: Engine, scheduler: Scheduler):
    import asyncio
    import uuid

    from aiohttp import web

    weight_lock = asyncio.Lock()
    routes = web.RouteTableDef()

    def reply(data: Any, status: int = 200):
        return web.json_response(data, status=status)

    def error(status: int, message: str, **extra):
        return reply({"error": {"message": message}, "message": message, **extra}, status)

    async def body(request) -> dict:
        raw = await request.read()
        if not raw:
            return {}
        try:
            data = json.loads(raw)
        except ValueError as e:
            raise BadRequest(f"request body is not JSON: {e}") from None
        if not isinstance(data, dict):
            raise BadRequest("request body must be a JSON object")
        return data

    @web.middleware
    async def bad_requests(request, handler):
        try:
            return await handler(request)
        except BadRequest as e:
            return error(400, str(e))

    @routes.get("/health")
    async def health(request):
        if not scheduler.thread.is_alive():
            return error(503, "generation worker is not running")
        return reply({})

    @routes.get("/health_generate")
    async def health_generate(request):
        return await health(request)

    @routes.get("/get_model_info")
    async def model_info(request):
        return reply({"model_path": engine.model_path, "tokenizer_path": engine.model_path,
                      "is_generation": True, "weight_version": scheduler.weight_version})

    @routes.get("/get_server_info")
    async def server_info(request):
        return reply({
            "pid": os.getpid(), "model_path": engine.model_path, "device": str(engine.device),
            "dtype": str(engine.dtype).replace("torch.", ""), "max_batch": scheduler.max_batch,
            "weight_version": scheduler.weight_version, "paused": scheduler.paused,
            "queued": len(scheduler.queue), "running": len(scheduler.running or []),
            "context_length": engine.context_len, "version": "dev_server",
            **{f"num_{k}": v for k, v in scheduler.stats.items()},
        })

    @routes.get("/get_weight_version")
    async def weight_version(request):
        return reply({"weight_version": scheduler.weight_version})

    @routes.get("/v1/models")
    async def models(request):
        return reply({"object": "list", "data": [{"id": engine.model_path, "object": "model",
                                                  "owned_by": "dev_server"}]})

    @routes.post("/generate")
    async def generate(request):
        data = await body(request)
        if data.get("stream"):
            raise BadRequest("stream=true is not supported by the dev server")
        input_ids = data.get("input_ids")
        if input_ids is None and data.get("text") is not None:
            if engine.tokenizer is None or not isinstance(data["text"], str):
                raise BadRequest("'text' needs a tokenizer in the model folder and must be a string")
            input_ids = engine.tokenizer.encode(data["text"], add_special_tokens=False)
        if not isinstance(input_ids, list) or not input_ids:
            raise BadRequest("'input_ids' must be a non-empty list of token ids")
        if any(isinstance(x, list) for x in input_ids):
            raise BadRequest("batched input_ids (a list of lists) are not supported; "
                             "send one request per prompt")
        try:
            input_ids = [int(x) for x in input_ids]
        except (TypeError, ValueError):
            raise BadRequest("'input_ids' must be integers") from None
        if min(input_ids) < 0 or max(input_ids) >= engine.vocab_size:
            raise BadRequest(f"token id out of range [0, {engine.vocab_size})")
        if len(input_ids) >= engine.context_len:
            raise BadRequest(f"prompt of {len(input_ids)} tokens does not fit the context "
                             f"length {engine.context_len}")
        params = SamplingParams.from_json(data.get("sampling_params"))
        params.max_new_tokens = min(params.max_new_tokens, engine.context_len - len(input_ids))
        lsl = data.get("logprob_start_len")
        loop = asyncio.get_running_loop()
        req = GenRequest(
            rid=str(data.get("rid") or uuid.uuid4().hex),
            input_ids=input_ids,
            params=params,
            return_logprob=bool(data.get("return_logprob", False)),
            logprob_start_len=-1 if lsl is None else int(lsl),
            loop=loop,
            future=loop.create_future(),
        )
        try:
            scheduler.submit(req)
        except RuntimeError as e:
            return error(503, str(e))
        try:
            return reply(await req.future)
        except Exception as e:  # the batch failed
            return error(500, f"generation failed: {e!r}")

    @routes.post("/pause_generation")
    async def pause_generation(request):
        data = await body(request)
        mode = data.get("mode", "abort")
        n = await asyncio.to_thread(scheduler.pause, mode == "abort")
        logger.info("generation paused (mode=%s, %d running requests %s, %d queued held)", mode, n,
                    "aborted" if mode == "abort" else "finished", len(scheduler.queue))
        return reply({"success": True, "message": f"paused ({mode}); {n} running requests affected"})

    @routes.post("/continue_generation")
    async def continue_generation(request):
        await body(request)
        scheduler.resume()
        logger.info("generation continued (%d queued)", len(scheduler.queue))
        return reply({"success": True, "message": "generation continued"})

    @routes.post("/abort_request")
    async def abort_request(request):
        data = await body(request)
        n = scheduler.abort(rid=data.get("rid"), abort_all=bool(data.get("abort_all")))
        return reply({"success": True, "message": f"aborted {n} requests"})

    @routes.post("/update_weights_from_disk")
    async def update_weights_from_disk(request):
        data = await body(request)
        path = data.get("model_path")
        if not isinstance(path, str) or not path:
            return error(400, "'model_path' is required", success=False)
        async with weight_lock:
            t0 = time.perf_counter()
            try:
                if not os.path.isdir(path):
                    raise FileNotFoundError(f"no such model folder: {path}")
                model = await asyncio.to_thread(engine.load_model, path)
                engine.check_compatible(model)
            except Exception as e:
                logger.warning("update_weights_from_disk(%s) failed: %s", path, e)
                return error(400, f"failed to load weights from {path}: {e}", success=False)
            fingerprint = await asyncio.to_thread(engine.fingerprint, model)
            n = await asyncio.to_thread(
                scheduler.swap_model, model, bool(data.get("abort_all_requests", False)),
                data.get("weight_version"))
            logger.info("loaded weights from %s in %.2fs (weight_version=%s, %d running "
                        "requests affected, fingerprint=%.6f)", path, time.perf_counter() - t0,
                        scheduler.weight_version, n, fingerprint)
            return reply({"success": True, "message": f"loaded weights from {path}",
                          "num_paused_requests": n, "weight_version": scheduler.weight_version})

    @routes.post("/flush_cache")
    async def flush_cache(request):
        return reply({"success": True, "message": "no cache to flush"})

    @routes.post("/release_memory_occupation")
    async def release_memory(request):
        return reply({"success": True, "message": "no-op in the dev server"})

    @routes.post("/resume_memory_occupation")
    async def resume_memory(request):
        return reply({"success": True, "message": "no-op in the dev server"})

    def unsupported(ep: str):
        async def handler(request):
            return error(400, f"{ep} is not supported by the dev server "
                              "(use disk weight updates, no LoRA)", success=False)
        return handler

    app = web.Application(middlewares=[bad_requests], client_max_size=1 << 30)
    app.add_routes(routes)
    for ep in UNSUPPORTED_ENDPOINTS:
        app.router.add_post(ep, unsupported(ep))
    return app


async def _serve_http(app, host: str, port: int, scheduler: Scheduler, stop_event) -> None:
    from aiohttp import web

    try:
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=5.0)
    except TypeError:  # aiohttp < 3.9 takes shutdown_timeout on the site
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, backlog=4096, reuse_address=True)
        await site.start()
        logger.info("serving on http://%s:%d", host, port)
        await stop_event.wait()
        logger.info("shutting down")
        # abort the running batch and fail queued requests: open handlers return at once
        await asyncio.to_thread(scheduler.shutdown)
    finally:
        await runner.cleanup()


# =============================================================================
# server process


def _watch_parent(parent_pid: int, on_orphan) -> None:
    """Exit when the process that started us is gone (covers SIGKILL of the parent)."""

    def run() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent_pid:
                logger.warning("parent process %d is gone; shutting down", parent_pid)
                on_orphan()
                time.sleep(10)
                os._exit(1)

    threading.Thread(target=run, name="parent-watch", daemon=True).start()


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python3 -m tools.dev_server",
        description="Development server speaking SGLang's HTTP protocol (subset used by AReaL).",
    )
    p.add_argument("--model", required=True, help="Hugging Face model folder")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: cuda if available)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    p.add_argument("--max-batch", type=int, default=64, help="most requests per static batch")
    p.add_argument("--batch-wait-ms", type=float, default=100.0,
                   help="longest wait for more requests before starting a batch (the wait "
                   "ends earlier once no new request arrived for 20 ms)")
    p.add_argument("--decoder", choices=["auto", "hf", "static"], default="auto",
                   help="hf: transformers' forward and KV cache, every step launched from "
                   "Python; static: tools/static_decode.py (Qwen2 only; preallocated KV cache, "
                   "CUDA graphs on a GPU); auto (default): static on a GPU when the model "
                   "allows it, else hf")
    p.add_argument("--static-max-len", type=int, default=1024,
                   help="static decoder: longest prompt + max_new_tokens it holds (longer "
                   "batches fall back to hf); its KV cache is sized max-batch x this")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default on CPU: 1; more help only larger models "
                   "on idle cores, oversubscribed cores are very slow)")
    p.add_argument("--step-delay-ms", type=float, default=0.0,
                   help="sleep this long after every decode step (a testing aid: makes "
                   "requests long enough to pause or abort them mid-flight)")
    p.add_argument("--parent-pid", type=int, default=None,
                   help="exit when this process (our parent) dies; set by serve()")
    p.add_argument("--log-level", default="INFO")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_arg_parser().parse_args(argv)
    # The server's own logger, not the root one: run in SGLang's place, the process has
    # imported AReaL's packages first, and the root logger this one reports to is not
    # logging.root any more.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s dev_server %(levelname)s %(message)s"))
    logger.handlers, logger.propagate = [handler], False
    logger.setLevel(args.log_level.upper())
    if not os.path.isdir(args.model):  # fail fast, before the slow imports
        logger.error("no such model folder: %s", args.model)
        return 2
    stop_event = asyncio.Event()
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop_event.set)
    if args.parent_pid is not None:
        if os.getppid() != args.parent_pid:
            logger.error("parent %d already gone", args.parent_pid)
            return 1
        _watch_parent(args.parent_pid, lambda: loop.call_soon_threadsafe(stop_event.set))

    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.threads or device == "cpu":
        torch.set_num_threads(args.threads or 1)
    t0 = time.perf_counter()
    engine = Engine(args.model, device=device, dtype=args.dtype, seed=args.seed,
                    step_delay_s=args.step_delay_ms / 1000, decoder=args.decoder,
                    max_batch=args.max_batch, static_max_len=args.static_max_len)
    n_params = sum(p.numel() for p in engine.model.parameters())
    logger.info("loaded %s (%.2f M params) on %s/%s in %.1fs (fingerprint=%.6f)", args.model,
                n_params / 1e6, device, args.dtype, time.perf_counter() - t0,
                engine.fingerprint(engine.model))
    scheduler = Scheduler(engine, max_batch=args.max_batch, batch_wait_s=args.batch_wait_ms / 1000)
    scheduler.start()
    app = create_app(engine, scheduler)
    try:
        loop.run_until_complete(_serve_http(app, args.host, args.port, scheduler, stop_event))
    except OSError as e:  # e.g. the port is taken
        logger.error("cannot serve on %s:%d: %s", args.host, args.port, e)
        scheduler.shutdown()
        return 1
    finally:
        loop.close()
    logger.info("stopped")
    return 0


# =============================================================================
# client-side helpers (no torch import)


def find_free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class HTTPStatusError(RuntimeError):
    """A non-200 answer from http_json(); ``status`` and ``body`` hold the details."""

    def __init__(self, url: str, status: int, body: Any):
        super().__init__(f"{url} answered HTTP {status}: {body}")
        self.status, self.body = status, body


def http_request(addr: str, endpoint: str, payload: dict | None = None,
                 method: str | None = None, timeout: float = 60.0) -> tuple[int, Any]:
    """Tiny stdlib JSON HTTP call: ``(status, decoded body)`` for any status.

    GET without a payload, POST with one (unless ``method`` says otherwise). Raises
    OSError (URLError, ConnectionRefusedError, timeout) when nothing answers.
    """
    method = method or ("GET" if payload is None else "POST")
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(f"http://{addr}{endpoint}", data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(), e.code
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


def http_json(addr: str, endpoint: str, payload: dict | None = None,
              method: str | None = None, timeout: float = 60.0) -> Any:
    """Like http_request() but returns just the body, raising HTTPStatusError unless 200."""
    status, body = http_request(addr, endpoint, payload, method, timeout)
    if status != 200:
        raise HTTPStatusError(f"http://{addr}{endpoint}", status, body)
    return body


_LIVE: set["DevServer"] = set()


def _stop_all_at_exit() -> None:
    for s in list(_LIVE):
        s.stop()


atexit.register(_stop_all_at_exit)


class DevServer:
    """A dev_server subprocess. Use as a context manager, or call start() / stop().

    The server runs in its own session (process group) and is killed with its whole
    group by stop(), at interpreter exit, and, through ``--parent-pid``, by itself when
    this process dies without cleaning up. Its stdout+stderr go to ``log_file`` or, by
    default, to a temporary ``dev_server-PORT-*.log`` that is deleted when the context
    manager exits normally and kept (and named in the error) when something failed.
    """

    def __init__(self, model_path: str | os.PathLike, port: int | None = None,
                 host: str = "127.0.0.1", device: str | None = "cpu", dtype: str = "float32",
                 max_batch: int = 64, seed: int = 0, timeout: float = 120.0,
                 log_file: str | os.PathLike | None = None, extra_args: list[str] | tuple = (),
                 python: str | None = None, env: dict | None = None):
        # absolute, so the server does not depend on our working directory
        self.model_path = os.path.abspath(model_path) if os.path.exists(model_path) else str(model_path)
        self.host = host
        self.requested_port = port
        self.port: int | None = None
        self.device, self.dtype, self.max_batch, self.seed = device, dtype, max_batch, seed
        self.timeout = timeout
        self.log_file = Path(log_file).absolute() if log_file else None
        self.extra_args = list(extra_args)
        self.python = python or sys.executable
        self.env = env
        self.proc: subprocess.Popen | None = None
        self._auto_log = False

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def command(self) -> list[str]:
        """The command that starts the server. Override it to run another server that speaks
        SGLang's protocol (evaluate.py runs SGLang itself) under the same process handling:
        its own process group, the /health wait, the kill on exit."""
        cmd = [self.python, "-m", "tools.dev_server", "--model", self.model_path,
               "--host", self.host, "--port", str(self.port), "--dtype", self.dtype,
               "--max-batch", str(self.max_batch), "--seed", str(self.seed),
               "--parent-pid", str(os.getpid())]
        if self.device:
            cmd += ["--device", self.device]
        return cmd + self.extra_args

    def start(self) -> "DevServer":
        attempts = 1 if self.requested_port else 3  # a free port can be taken meanwhile
        auto_log = self._auto_log = self.log_file is None
        for attempt in range(attempts):
            self.port = self.requested_port or find_free_port(self.host)
            if auto_log:
                fd, name = tempfile.mkstemp(prefix=f"dev_server-{self.port}-", suffix=".log")
                os.close(fd)
                self.log_file = Path(name)
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
            env = dict(os.environ if self.env is None else self.env)
            root = str(Path(__file__).resolve().parent.parent)  # so `-m tools.dev_server` works
            env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
            with open(self.log_file, "ab") as log:
                self.proc = subprocess.Popen(
                    self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True, env=env,
                )
            _LIVE.add(self)
            try:
                self._wait_healthy()
                return self
            except _PortTaken:
                self.stop()
                if attempt == attempts - 1:
                    raise RuntimeError(f"dev server could not bind {self.addr}; log: {self.log_file}") from None
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def _log_tail(self, n: int = 30) -> str:
        try:
            lines = Path(self.log_file).read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                tail = self._log_tail()
                if "address already in use" in tail.lower() and not self.requested_port:
                    raise _PortTaken()
                raise RuntimeError(
                    f"dev server for {self.model_path} at {self.addr} exited with code {rc} "
                    f"before becoming healthy; log: {self.log_file}\n{tail}")
            try:
                status, _ = http_request(self.addr, "/health", timeout=2)
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(
            f"dev server at {self.addr} not healthy after {self.timeout:.0f}s; "
            f"log: {self.log_file}\n{self._log_tail()}")

    def stop(self, timeout: float = 10.0, keep_log: bool = True) -> None:
        """SIGTERM the process group, SIGKILL it if still alive after `timeout` s.

        ``keep_log=False`` deletes the log file if it was a temporary one made by start().
        """
        self._stop_process(timeout)
        if not keep_log and self._auto_log and self.log_file is not None:
            with contextlib.suppress(OSError):
                os.unlink(self.log_file)

    def _stop_process(self, timeout: float) -> None:
        proc, self.proc = self.proc, None
        _LIVE.discard(self)
        if proc is None:
            return
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)  # the server leads its own session/group
            except (ProcessLookupError, PermissionError):
                pass
            try:
                proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
            # the leader is gone; make sure nothing else of the group survives
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            break

    def __enter__(self) -> "DevServer":
        return self.start() if self.proc is None else self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.stop(keep_log=exc_type is not None)  # a temporary log is kept only on errors


class _PortTaken(Exception):
    pass


@contextlib.contextmanager
def serve(model_path: str | os.PathLike, port: int | None = None, **kwargs):
    """Start a dev server, yield its address ``"host:port"``, stop it for sure on exit.

    ``kwargs`` go to ``DevServer`` (host, device, dtype, max_batch, seed, timeout,
    log_file, extra_args). Raises TimeoutError / RuntimeError naming the address and
    the log file if the server does not become healthy.
    """
    server = DevServer(model_path, port=port, **kwargs)
    server.start()
    ok = False
    try:
        yield server.addr
        ok = True
    finally:
        server.stop(keep_log=not ok)  # a temporary log is kept only on errors


if __name__ == "__main__":
    sys.exit(main())
