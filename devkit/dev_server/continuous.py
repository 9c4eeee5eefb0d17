"""Continuous batching on the static decoder: requests join a running batch as they arrive
and are answered as soon as they finish, as SGLang's scheduler does.

Why: a static batch runs until its longest completion ends. A request that arrives meanwhile
waits for all of it, and requests that trickle in (a trainer's rollouts do, one group at a
time, and again when a weight push has interrupted them) run later as small batches that
cost a GPU nearly as much per decode step as full ones. Here every decode step serves each
request in the cache: an arriving request takes a free row once its prompt is prefilled, a
finished one gives its row back and is answered at once.

A run shares one set of sampling settings (the scheduler admits requests of one batch key)
and T, the cache slots its rows attend over, set by the requests it starts with. It ends
when no row holds a request and none may join: the queue is empty, paused, or its oldest
request has other settings or needs more than T slots (it then starts the next run), or
new weights wait to be swapped in.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from devkit.dev_server import protocol
from devkit.dev_server.protocol import GenRequest
from devkit.dev_server.static_decode import batch_bucket


@dataclass
class Row:
    """What the host keeps of a request in the cache."""

    req: GenRequest
    input_logprobs: list | None
    text_ids: list[int] | None  # its tokens so far, kept only when it has stop strings


@dataclass
class RunSummary:
    """A run's figures, for the server's log and stats."""

    requests: int = 0
    rows_max: int = 0
    prompt_max: int = 0
    output_tokens: int = 0
    steps: int = 0
    finish: dict[str, int] | None = None


def slots_needed(reqs: list[GenRequest]) -> int:
    """Cache slots a row needs when `reqs` are prefilled together: the longest prompt (all are
    left-padded to it) and the largest token budget."""
    return max(len(r.input_ids) for r in reqs) + max(r.params.max_new_tokens for r in reqs)


def can_serve(engine, reqs: list[GenRequest]) -> bool:
    """Whether a run can start with `reqs` (the engine decodes with the static decoder and
    they fit its cache)."""
    return engine.static is not None and engine.static.fits(len(reqs), slots_needed(reqs))


class ContinuousBatch:
    """One run: ``run(first)`` decodes until no request is left in the cache.

    `take(room, fits)` returns up to `room` queued requests, oldest first, stopping at the
    first one `fits` refuses (or none, when no request may join now); `answer(req, result)`
    answers one; `should_abort()` ends the run, answering every request in it with what it
    has generated and finish reason ``abort``.
    """

    def __init__(self, engine, model, take: Callable, answer: Callable, should_abort: Callable[[], bool]):
        self.engine, self.dec = engine, engine.static
        self.dec.use(model)
        self.take, self.answer, self.should_abort = take, answer, should_abort
        n, dev = self.dec.max_batch, engine.device
        self.n_gen = torch.zeros(n, dtype=torch.long, device=dev)
        self.max_new = torch.zeros(n, dtype=torch.long, device=dev)
        self.stop_ids = torch.full((n, 1), -1, dtype=torch.long, device=dev)
        self.rows: dict[int, Row] = {}
        self.active_rows: list[int] = []
        self.active = torch.empty(0, dtype=torch.long, device=dev)
        self.summary = RunSummary(finish={})

    @torch.inference_mode()
    def run(self, first: list[GenRequest]) -> RunSummary:
        params = first[0].params
        self.params, self.key = params, params.batch_key
        self.t = self.dec.slots_for(slots_needed(first))
        dev = self.engine.device
        self.out_tok = torch.zeros((self.dec.max_batch, self.t), dtype=torch.long, device=dev)
        self.out_lp = torch.zeros((self.dec.max_batch, self.t), dtype=torch.float32, device=dev)
        self.counts = None  # tokens seen per row, for frequency and presence penalties
        if params.frequency_penalty != 0.0 or params.presence_penalty != 0.0:
            self.counts = torch.zeros((self.dec.max_batch, self.engine.vocab_size), device=dev)
        self.dec.free(torch.arange(self.dec.max_batch, device=dev))
        self._admit(first)
        while True:
            room = self.dec.max_batch - len(self.rows)
            more = self.take(room, self._admission()) if room else []
            if more:
                self._admit(more)
            if not self.rows:
                return self.summary
            if self.should_abort():
                self._abort()
                return self.summary
            self._step()

    def open_requests(self) -> list[GenRequest]:
        """The requests in the cache (those to answer with an error if the run fails)."""
        return [row.req for row in self.rows.values()]

    # -- the steps of a run ---------------------------------------------------------------

    def _admission(self) -> Callable[[GenRequest], bool]:
        """A check for the requests taken in one admission, in order: each must share the
        run's settings, and the group, left-padded to its longest prompt, must fit in T."""
        longest_prompt = longest_new = 0

        def fits(req: GenRequest) -> bool:
            nonlocal longest_prompt, longest_new
            prompt = max(longest_prompt, len(req.input_ids))
            new = max(longest_new, req.params.max_new_tokens)
            if req.params.batch_key != self.key or req.params.max_new_tokens <= 0 or prompt + new > self.t:
                return False
            longest_prompt, longest_new = prompt, new
            return True

        return fits

    def _admit(self, reqs: list[GenRequest]) -> None:
        """Prefill `reqs` into free rows and take their first tokens."""
        free = [r for r in range(self.dec.max_batch) if r not in self.rows][: len(reqs)]
        rows = torch.tensor(free, device=self.engine.device)
        ids, mask, pos, lens = self.engine.pack_prompts(reqs)
        logits, input_logprobs = self.engine.prefill(
            lambda i, p, keep_all: self.dec.prefill(rows, i, mask, p, keep_all), reqs, ids, pos, lens)
        rules = self.engine.stop_rules(reqs)
        self._set_stop_ids(rows, rules.stop_mat)
        self.max_new[rows] = rules.max_new_t
        self.n_gen[rows] = 0
        self.dec.pos[rows] = pos[:, -1] + 1
        if self.counts is not None:
            self.counts[rows] = 0
        for row, req, lps in zip(free, reqs, input_logprobs):
            self.rows[row] = Row(req, lps, [] if req.params.stop else None)
        self._set_active()
        self.summary.requests += len(reqs)
        self.summary.rows_max = max(self.summary.rows_max, len(self.rows))
        self.summary.prompt_max = max(self.summary.prompt_max, *lens)
        self._take_tokens(rows, free, logits)

    def _step(self) -> None:
        """One decode step for every row in the cache."""
        b = batch_bucket(max(self.rows) + 1, self.dec.max_batch)
        logits = self.dec.step(b, self.t)
        self.summary.steps += 1
        self._take_tokens(self.active, self.active_rows, logits[self.active])
        if self.engine.step_delay_s:
            time.sleep(self.engine.step_delay_s)

    def _take_tokens(self, rows: torch.Tensor, row_ids: list[int], logits: torch.Tensor) -> None:
        """Sample each row's next token from its logits, keep it, and answer the rows it finishes."""
        counts = self.counts[rows] if self.counts is not None else None
        tok, lp = self.engine.choose(logits, counts, self.params)
        at = self.n_gen[rows]
        self.out_tok[rows, at] = tok
        self.out_lp[rows, at] = lp
        self.n_gen[rows] = at + 1
        self.dec.tok[rows] = tok
        if self.counts is not None:
            self.counts.index_put_((rows, tok), torch.ones_like(lp), accumulate=True)
        hit = (tok[:, None] == self.stop_ids[rows]).any(-1) | (at + 1 >= self.max_new[rows])
        done = dict.fromkeys(rows[hit].tolist(), None)  # the step's one host sync
        self._match_stop_strings(row_ids, tok, done)
        if done:
            self._finish(done)

    def _match_stop_strings(self, row_ids: list[int], tok: torch.Tensor, done: dict) -> None:
        """Add to `done` the rows whose text now holds one of their stop strings (row ->
        the string)."""
        watched = [i for i, r in enumerate(row_ids) if self.rows[r].text_ids is not None and r not in done]
        if not watched:
            return
        for i, t in zip(watched, tok[watched].tolist()):
            row = self.rows[row_ids[i]]
            row.text_ids.append(t)
            found = self.engine.match_stop_str(row.req, row.text_ids)
            if found is not None:
                done[row_ids[i]] = found

    def _finish(self, done: dict[int, str | None], aborted: bool = False) -> None:
        """Answer the requests of rows `done` (row -> the stop string it matched, if any)
        and free the rows."""
        row_ids = list(done)
        rows = torch.tensor(row_ids, device=self.engine.device)
        n_out = self.n_gen[rows].tolist()
        toks, lps = self.out_tok[rows].tolist(), self.out_lp[rows].tolist()
        for row_id, n, tok, lp in zip(row_ids, n_out, toks, lps):
            row = self.rows.pop(row_id)
            if aborted:
                result = protocol.abort_result(tok[:n], lp[:n], "Aborted by the server")
            else:
                reason = protocol.finish_reason(tok[n - 1], n, row.req.params.max_new_tokens, done[row_id])
                result = {"output_ids": tok[:n], "logprobs": lp[:n], "finish_reason": reason}
            self.answer(row.req, {**result, "input_logprobs": row.input_logprobs})
            kind = result["finish_reason"]["type"]
            self.summary.finish[kind] = self.summary.finish.get(kind, 0) + 1
            self.summary.output_tokens += n
        self.dec.free(rows)
        self._set_active()

    def _abort(self) -> None:
        self._finish(dict.fromkeys(self.rows), aborted=True)

    def _set_active(self) -> None:
        self.active_rows = sorted(self.rows)
        self.active = torch.tensor(self.active_rows, dtype=torch.long, device=self.engine.device)

    def _set_stop_ids(self, rows: torch.Tensor, stop_mat: torch.Tensor) -> None:
        """Each row's stop token ids (padded with -1), widening the table when needed."""
        width = max(self.stop_ids.shape[1], stop_mat.shape[1])
        if width > self.stop_ids.shape[1]:
            wider = torch.full((self.dec.max_batch, width), -1, dtype=torch.long, device=self.stop_ids.device)
            wider[:, : self.stop_ids.shape[1]] = self.stop_ids
            self.stop_ids = wider
        self.stop_ids[rows] = -1
        self.stop_ids[rows, : stop_mat.shape[1]] = stop_mat
