"""SGLang's wire format as the dev server speaks it: a /generate payload parsed into a
`GenRequest` (its `SamplingParams` checked), and an engine result turned into the response
body with its `meta_info`."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's default

_NUMERIC_PARAMS = {
    "max_new_tokens": int, "temperature": float, "top_p": float, "top_k": int,
    "min_p": float, "frequency_penalty": float, "presence_penalty": float,
}


class BadRequest(ValueError):
    """A request the server rejects with HTTP 400."""


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
    def from_json(cls, d: dict | None) -> SamplingParams:
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
        p._check()
        return p

    def _check(self) -> None:
        if self.max_new_tokens < 0:
            raise BadRequest(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise BadRequest(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise BadRequest(f"top_p must be in (0, 1], got {self.top_p}")
        if self.temperature > 0 and self.temperature < 1e-5:
            self.temperature = 0.0  # SGLang treats tiny temperatures as greedy too


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


def parse_generate(data: dict, engine, loop) -> GenRequest:
    """The request a /generate body asks for (raises BadRequest); `engine` supplies the
    tokenizer for a `text` prompt and the vocabulary and context sizes the prompt must fit."""
    if data.get("stream"):
        raise BadRequest("stream=true is not supported by the dev server")
    input_ids = _input_ids(data, engine)
    params = SamplingParams.from_json(data.get("sampling_params"))
    params.max_new_tokens = min(params.max_new_tokens, engine.context_len - len(input_ids))
    lsl = data.get("logprob_start_len")
    return GenRequest(
        rid=str(data.get("rid") or uuid.uuid4().hex),
        input_ids=input_ids,
        params=params,
        return_logprob=bool(data.get("return_logprob", False)),
        logprob_start_len=-1 if lsl is None else int(lsl),
        loop=loop,
        future=loop.create_future(),
    )


def _input_ids(data: dict, engine) -> list[int]:
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
    return input_ids


def abort_result(output_ids: list[int], logprobs: list[float], message: str) -> dict:
    """An engine result for a request that stopped without finishing."""
    return {"output_ids": output_ids, "logprobs": logprobs,
            "finish_reason": {"type": "abort", "message": message,
                              "status_code": None, "err_type": None}}


def finish_reason(last_tok: int, n: int, max_new: int, matched_str: str | None) -> dict:
    if matched_str is not None:
        return {"type": "stop", "matched": matched_str}
    if n >= max_new:  # SGLang checks the length first
        return {"type": "length", "length": max_new}
    return {"type": "stop", "matched": last_tok}


def response(req: GenRequest, res: dict, text: str, version: str) -> dict:
    """The /generate answer for one engine result (`text`: its decoded output)."""
    out_ids = res["output_ids"]
    meta: dict[str, Any] = {
        "id": req.rid,
        "finish_reason": res["finish_reason"],
        "prompt_tokens": len(req.input_ids),
        "completion_tokens": len(out_ids),
        "cached_tokens": 0,
        "weight_version": version,
        "e2e_latency": time.perf_counter() - req.arrival,
    }
    if req.return_logprob:
        meta["output_token_logprobs"] = [
            [float(lp), int(t), None] for lp, t in zip(res["logprobs"], out_ids)
        ]
        if res.get("input_logprobs") is not None:
            meta["input_token_logprobs"] = res["input_logprobs"]
    return {"text": text, "output_ids": list(out_ids), "meta_info": meta}
