"""The batching scheduler: a queue of requests, one worker thread running batches on the
engine, and what pauses, aborts and weight swaps do to the queue and the running batch.

With the static decoder, batches are continuous by default (devkit/dev_server/continuous.py):
requests join the running batch and are answered as they finish. ``continuous=False`` (the
server's ``--batching static``) runs each batch to its end first, as the transformers
decoder always does."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

from devkit.dev_server import continuous, protocol
from devkit.dev_server.protocol import GenRequest

logger = logging.getLogger("dev_server")


class Scheduler:
    def __init__(self, engine, max_batch: int, batch_wait_s: float = 0.1,
                 batch_settle_s: float = 0.02, continuous: bool = True):
        self.engine = engine
        self.continuous = continuous
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
            self._answer(r, protocol.abort_result([], [], "Abort before prefill"))
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
            self._answer(r, protocol.abort_result([], [], "Abort before prefill"))

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

    def _let_burst_arrive(self) -> None:
        """Wait (holding self.cond) until a burst of concurrent requests is queued."""
        deadline = time.monotonic() + self.batch_wait_s
        seen = len(self.queue)
        while len(self.queue) < self.max_batch and time.monotonic() < deadline:
            self.cond.wait(timeout=self.batch_settle_s)
            if len(self.queue) == seen or self.paused or self.stopping:
                break
            seen = len(self.queue)

    def _loop(self) -> None:
        while True:
            with self.cond:
                while not self.stopping and (self.paused or not self.queue):
                    self.cond.wait()
                if self.stopping:
                    return
                self._let_burst_arrive()
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
            self._answer(r, {"output_ids": [], "logprobs": [], "finish_reason": {"type": "length", "length": 0},
                             "input_logprobs": None}, version)
        if not work:
            return
        if self.continuous and continuous.can_serve(self.engine, work):
            self._run_continuous(work, model, epoch, version)
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
            self._answer(r, res, version)
        self._count_batch(work, results, time.perf_counter() - t0, version)

    def _run_continuous(self, work: list[GenRequest], model, epoch: int, version: str) -> None:
        t0 = time.perf_counter()

        def take(room: int, fits) -> list[GenRequest]:
            with self.cond:
                if self.paused or self.stopping or self.abort_epoch != epoch or self.model is not model:
                    return []
                taken = []
                while self.queue and len(taken) < room and fits(self.queue[0]):
                    taken.append(self.queue.popleft())
                self.running.extend(taken)
                return taken

        def answer(req: GenRequest, res: dict) -> None:
            with self.cond:
                self.running.remove(req)
            self._answer(req, res, version)

        run = continuous.ContinuousBatch(self.engine, model, take, answer,
                                         should_abort=lambda: self.abort_epoch != epoch or self.stopping)
        try:
            summary = run.run(work)
        except Exception as e:  # report to every caller still waiting, keep serving
            logger.exception("continuous batch failed")
            for r in run.open_requests():
                r.resolve(error=e)
            return
        self._count(summary.requests, summary.prompt_max, summary.output_tokens, summary.steps,
                    summary.finish, time.perf_counter() - t0, version, rows_max=summary.rows_max)

    def _count_batch(self, work: list[GenRequest], results: list[dict], seconds: float, version: str) -> None:
        kinds: dict[str, int] = {}
        for res in results:
            kinds[res["finish_reason"]["type"]] = kinds.get(res["finish_reason"]["type"], 0) + 1
        self._count(len(work), max(len(r.input_ids) for r in work),
                    sum(len(res["output_ids"]) for res in results),
                    max(len(res["output_ids"]) for res in results), kinds, seconds, version)

    def _count(self, n: int, prompt_max: int, n_tok: int, steps: int, kinds: dict[str, int],
               seconds: float, version: str, rows_max: int | None = None) -> None:
        """Add a finished batch to the stats and log it (a continuous one with the most rows
        it held at once)."""
        self.stats["batches"] += 1
        self.stats["requests"] += n
        self.stats["output_tokens"] += n_tok
        self.stats["aborted"] += kinds.get("abort", 0)
        logger.info(
            "batch n=%d%s prompt_max=%d new_tokens=%d steps=%d %.2fs %.0f tok/s finish=%s v=%s queued=%d",
            n, "" if rows_max is None else f" rows_max={rows_max}", prompt_max, n_tok, steps, seconds,
            n_tok / max(seconds, 1e-9), ",".join(f"{k}:{v}" for k, v in sorted(kinds.items())), version,
            len(self.queue),
        )

    def _answer(self, req: GenRequest, res: dict, version: str | None = None) -> None:
        """Resolve a request with the response for an engine result, served by `version`
        (default: the current weights)."""
        text = self.engine.decode_text(req, res["output_ids"], res["finish_reason"])
        req.resolve(protocol.response(req, res, text, version if version is not None else self.weight_version))
