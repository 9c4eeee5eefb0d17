"""The decoding engine: a transformers causal LM and a batched, KV-cached sampler.

`Engine.generate_batch` runs one static batch of requests to completion (or abort) and
returns one result per request, ``{"output_ids", "logprobs", "finish_reason",
"input_logprobs"}``. Forward passes go through `devkit/dev_server/static_decode.py` (Qwen2 and Llama on a
GPU) or transformers' own KV cache (`HFBatch`); sampling, log-probs and stop rules are
here (see the package docstring for what they mean).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

from devkit.dev_server import protocol
from devkit.dev_server.protocol import GenRequest, SamplingParams

logger = logging.getLogger("dev_server")

FINGERPRINT_TOKENS = 16  # length of the fixed sequence Engine.fingerprint scores
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class StopRules:
    """When each row of a batch stops: token ids and length on the device, and the rows
    that also watch their decoded text for stop strings."""

    max_new: list[int]
    max_new_t: torch.Tensor
    stop_mat: torch.Tensor  # rows x stop ids, padded with -1
    str_rows: list[int]


@dataclass
class Decoding:
    """What a batch has produced so far. The bookkeeping stays on the device: the host syncs
    once per step ("all finished?") plus, only for rows with stop strings, to read their
    tokens."""

    finished: torch.Tensor
    n_out: torch.Tensor  # each row's output length once finished
    str_text: dict[int, list[int]]
    tokens: list[torch.Tensor] = field(default_factory=list)
    logprobs: list[torch.Tensor] = field(default_factory=list)
    str_matched: dict[int, str] = field(default_factory=dict)
    step: int = 0
    aborted: bool = False


class Engine:
    """A transformers causal LM and a batched, KV-cached sampler."""

    def __init__(self, model_path: str, device: str, dtype: str, seed: int,
                 step_delay_s: float = 0.0, decoder: str = "hf", max_batch: int = 64,
                 static_max_len: int = 1024):
        self.device = torch.device(device)
        self.dtype = DTYPES[dtype]
        self.model_path = str(model_path)
        self.step_delay_s = step_delay_s
        if self.device.type == "cuda":
            # cuDNN's SDPA builds an execution plan for every new (batch, kv length) shape,
            # and a KV-cached decode makes a new shape every step, so every step paid for
            # a plan: several times slower than the flash or memory-efficient kernels.
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
        self.eos_ids = self._eos_ids()
        self.static = self._static_decoder(decoder, max_batch, static_max_len)

    def _eos_ids(self) -> tuple[int, ...]:
        """Every EOS id the model config, its generation config and the tokenizer name."""
        eos: set[int] = set()
        for src in (self.model.config.eos_token_id, self.model.generation_config.eos_token_id,
                    getattr(self.tokenizer, "eos_token_id", None)):
            if src is None:
                continue
            eos.update([src] if isinstance(src, int) else list(src))
        return tuple(sorted(eos))

    def _static_decoder(self, decoder: str, max_batch: int, max_len: int):
        """devkit/dev_server/static_decode.py's decoder, or None for transformers' own decoding.

        "auto" takes it on a GPU when the model is supported; "static" insists (on CPU it
        runs without CUDA graphs: that is how the tests check it against transformers).
        """
        if decoder == "hf" or (decoder == "auto" and self.device.type != "cuda"):
            return None
        from devkit.dev_server import static_decode

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
        model = AutoModelForCausalLM.from_pretrained(path, dtype=self.dtype)
        model.to(self.device)
        model.eval()
        model.requires_grad_(False)
        return model

    def fingerprint(self, model) -> float:
        """Mean log-prob the model gives a fixed token sequence: logged at every load, so a
        run's log shows that each weight push changed what the server computes."""
        ids = torch.arange(FINGERPRINT_TOKENS, device=self.device)[None] % model.config.vocab_size
        with torch.no_grad():
            logits = model(ids).logits[0, :-1].float()
        return torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).mean().item()

    # -- generation -------------------------------------------------------------

    def generate_batch(self, model, reqs: list[GenRequest], should_abort) -> list[dict]:
        """Run one static batch to completion (or abort); returns one result per request.

        A result is ``{"output_ids", "logprobs", "finish_reason", "input_logprobs"}``.
        """
        with torch.inference_mode():
            return self._generate_batch(model, reqs, should_abort)

    def _generate_batch(self, model, reqs, should_abort):
        ids, mask, pos, lens = self.pack_prompts(reqs)
        rules = self.stop_rules(reqs)
        if should_abort():
            return [protocol.abort_result([], [], "Abort before prefill") for _ in reqs]
        forward = self._batch_forward(model, mask, max(rules.max_new))
        logits, input_logprobs = self.prefill(forward.prefill, reqs, ids, pos, lens)
        state = self._decode(forward, reqs, rules, logits, pos[:, -1] + 1, should_abort)
        return self._results(state, rules, input_logprobs)

    def pack_prompts(self, reqs):
        """The prompts left-padded into one tensor, their attention mask and position ids
        (from the mask, so padding changes nothing), on the device; and their lengths."""
        lens = [len(r.input_ids) for r in reqs]
        B, L = len(reqs), max(lens)
        ids = torch.full((B, L), self.pad_id, dtype=torch.long)
        mask = torch.zeros((B, L), dtype=torch.long)
        for i, r in enumerate(reqs):
            ids[i, L - lens[i]:] = torch.tensor(r.input_ids, dtype=torch.long)
            mask[i, L - lens[i]:] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0), lens

    def stop_rules(self, reqs) -> StopRules:
        stop_sets = [set() if r.params.ignore_eos else set(r.params.stop_token_ids) | set(self.eos_ids)
                     for r in reqs]
        stop_mat = torch.full((len(reqs), max(1, max(len(s) for s in stop_sets))), -1, dtype=torch.long)
        for i, s in enumerate(stop_sets):
            if s:
                stop_mat[i, : len(s)] = torch.tensor(sorted(s), dtype=torch.long)
        max_new = [r.params.max_new_tokens for r in reqs]
        return StopRules(max_new=max_new, max_new_t=torch.tensor(max_new, device=self.device),
                         stop_mat=stop_mat.to(self.device),
                         str_rows=[i for i, r in enumerate(reqs) if r.params.stop])

    def _batch_forward(self, model, mask, max_new: int):
        """The static decoder when it is on and the batch fits, else transformers' cache."""
        if self.static is not None and self.static.fits(mask.shape[0], mask.shape[1] + max_new):
            return self.static.start(model, mask, max_new)
        return HFBatch(model, mask)

    def prefill(self, forward_prompts, reqs, ids, pos, lens):
        """Logits (rows x vocab, float32) for each row's first new token, and the prompt
        log-probs of the requests that ask for them (None for the others).
        `forward_prompts(ids, pos, keep_all)` runs the packed prompts through the model."""
        want = [r.return_logprob and r.logprob_start_len >= 0 for r in reqs]
        logits = forward_prompts(ids, pos, keep_all=any(want))
        input_logprobs: list[list | None] = [None] * len(reqs)
        if any(want):
            all_logits = logits.float()
            L = ids.shape[1]
            for i, r in enumerate(reqs):
                if want[i]:
                    input_logprobs[i] = self.input_logprobs(all_logits[i, L - lens[i]:], r)
        return logits[:, -1, :].float(), input_logprobs

    def _decode(self, forward, reqs, rules: StopRules, logits, next_pos, should_abort) -> Decoding:
        """Token after token until every row has finished or the batch is aborted."""
        params = reqs[0].params  # batch-wide sampling settings (same batch_key)
        B = len(reqs)
        counts = None
        if params.frequency_penalty != 0.0 or params.presence_penalty != 0.0:
            counts = torch.zeros((B, logits.shape[-1]), dtype=torch.float32, device=self.device)
        state = Decoding(finished=torch.zeros(B, dtype=torch.bool, device=self.device),
                         n_out=torch.zeros(B, dtype=torch.long, device=self.device),
                         str_text={i: [] for i in rules.str_rows})
        while True:
            tok, lp = self.choose(logits, counts, params)
            state.tokens.append(tok)
            state.logprobs.append(lp)
            if counts is not None:
                counts.scatter_add_(1, tok[:, None], torch.ones_like(lp[:, None]))
            state.step += 1
            self._mark_finished(reqs, rules, tok, state)
            if bool(state.finished.all()):
                return state
            if self.step_delay_s:
                time.sleep(self.step_delay_s)
            if should_abort():
                state.aborted = True
                return state
            logits = forward.step(tok, next_pos)
            next_pos = next_pos + 1

    def choose(self, logits, counts, params: SamplingParams):
        """Every row's next token and its log-prob, taken before filtering and penalties."""
        if params.temperature == 0.0:
            lp_all = torch.log_softmax(logits, dim=-1)
            scores = logits
        else:
            scores = logits / params.temperature
            lp_all = torch.log_softmax(scores, dim=-1)
        if counts is not None:
            scores = self._penalize(scores, counts, params)
        tok = scores.argmax(dim=-1) if params.temperature == 0.0 else self._sample(scores, params)
        return tok, lp_all.gather(-1, tok[:, None]).squeeze(-1)

    def _mark_finished(self, reqs, rules: StopRules, tok, state: Decoding) -> None:
        """Finish the rows that this token ends: a stop token or the length (checked first,
        as SGLang does), then a stop string."""
        hit = (tok[:, None] == rules.stop_mat).any(-1) | (rules.max_new_t <= state.step)
        newly = ~state.finished & hit
        state.finished |= newly
        state.n_out = torch.where(newly, state.step, state.n_out)
        if rules.str_rows:
            self._check_stop_strings(reqs, rules.str_rows, tok, state)

    def _check_stop_strings(self, reqs, rows, tok, state: Decoding) -> None:
        """Finish rows whose decoded text now holds one of their stop strings."""
        toks = tok[rows].tolist()
        done = state.finished[rows].tolist()
        for i, t, d in zip(rows, toks, done):
            if d:
                continue
            state.str_text[i].append(t)
            found = self.match_stop_str(reqs[i], state.str_text[i])
            if found is not None:
                state.str_matched[i] = found
                state.finished[i] = True
                state.n_out[i] = state.step

    @staticmethod
    def _results(state: Decoding, rules: StopRules, input_logprobs: list) -> list[dict]:
        toks = torch.stack(state.tokens, dim=1).tolist()
        lps = torch.stack(state.logprobs, dim=1).tolist()
        done, n_out = state.finished.tolist(), state.n_out.tolist()
        final = []
        for i in range(len(toks)):
            if not done[i]:
                assert state.aborted
                result = protocol.abort_result(toks[i], lps[i], "Aborted by the server")
            else:
                n = n_out[i]
                reason = protocol.finish_reason(toks[i][n - 1], n, rules.max_new[i], state.str_matched.get(i))
                result = {"output_ids": toks[i][:n], "logprobs": lps[i][:n], "finish_reason": reason}
            final.append({**result, "input_logprobs": input_logprobs[i]})
        return final

    def input_logprobs(self, logits_row, req: GenRequest) -> list:
        """[[logprob | None, token_id, None], ...] for prompt positions from logprob_start_len."""
        t = req.params.temperature
        lp = torch.log_softmax(logits_row / t if t > 0 else logits_row, dim=-1)
        ids = req.input_ids
        tgt = torch.tensor(ids[1:], device=lp.device)
        vals = lp[:-1].gather(-1, tgt[:, None]).squeeze(-1).tolist() if len(ids) > 1 else []
        full = [[None, ids[0], None]] + [[v, tok, None] for v, tok in zip(vals, ids[1:])]
        return full[req.logprob_start_len:]

    @staticmethod
    def _penalize(scores, counts, params: SamplingParams):
        if params.frequency_penalty:
            scores = scores - params.frequency_penalty * counts
        if params.presence_penalty:
            scores = scores - params.presence_penalty * (counts > 0).float()
        return scores

    def _sample(self, scores, params: SamplingParams):
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

    def match_stop_str(self, req: GenRequest, out_ids: list[int]) -> str | None:
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
        self.mask = torch.cat([self.mask, ones], dim=1)
        out = self.model(input_ids=tok[:, None], attention_mask=self.mask, position_ids=pos[:, None],
                         past_key_values=self.cache, use_cache=True)
        return out.logits[:, -1, :].float()
