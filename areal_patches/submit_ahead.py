"""Give the rollout dispatcher the next steps' rollouts when a batch is taken, so the servers
generate them while the trainer trains, as far ahead as the staleness bound allows.

Upstream behaviour (areal 1.0.4): rollouts reach the dispatcher only from
`BatchTaskDispatcher.active_submit_and_wait`, which `prepare_batch` runs while the trainer waits
for its batch: each round it queues at most one batch of puzzles, then waits up to 1 s for
results, and it returns as soon as the batch is full. Where generation is fast, the first
round fills the batch within the second, nothing more was queued, and while the trainer trains
and pushes the servers have nothing to do: with `max_head_offpolicyness=2` the run is as
synchronous as with 0 (docs/results/time-to-accuracy.md, "Rollouts ahead of the trainer").
Dynamic sampling's refills queue a little more, which runs into the step and is cut by the push.

Effect: when `active_submit_and_wait` returns a batch, the dispatcher's queue is topped up to
AReaL's own limit on queued rollouts (`StalenessManager.get_pending_limit()`, (offpolicyness
+ 1) batches) and no further than its runner's queue has room for, as each of upstream's rounds
may; the dispatcher starts them as upstream does, when the staleness bound lets it
(`accepted + running <= (offpolicyness + version + 1) x batch`) and the trainer has not paused
it. So no rollout is staler than the bound allows, and tokens keep the version that made them.
Puzzles leave the data loader up to (offpolicyness + 1) batches before they are trained on, as
upstream's rounds may let them already; their order is unchanged. With
`max_head_offpolicyness=0` the bound lets nothing start before the next step, as upstream.

Applied only where `active_submit_and_wait`'s source still holds upstream's one-batch cap and the
dispatcher its queue of inputs (`_pending_inputs`, `_input_cv`); otherwise one line says so and
nothing changes.

Off: `areal_patches.apply(skip={"submit_ahead"})`.

Upstream: unchanged on AReaL's main as of cbff54d (2026-08-22) (`active_submit_and_wait`
still queues at most one batch a round); not reported.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator

from areal_patches import logger  # the package's: AReaL replaces the logging root when it makes a logger
from areal_patches.patching import wrap_once

UPSTREAM_CAP = "for _ in range(min(batch_size, capacity)):"


def room_for_more(dispatcher, batch_size: int) -> int:
    """How many more rollouts one of upstream's rounds could queue now, but for its one-batch cap:
    up to the staleness manager's limit on queued rollouts, leaving the runner's queue a batch of room."""
    with dispatcher._input_cv:
        queued = len(dispatcher._pending_inputs)
    below_limit = dispatcher.staleness_manager.get_pending_limit() - queued
    runner = dispatcher.runner
    return min(below_limit, runner.max_queue_size - (runner.get_input_queue_size() + batch_size))


def top_up(dispatcher, inputs: Iterator, batch_size: int) -> None:
    """Queue rollouts from `inputs` until the dispatcher has no room for more."""
    for _ in range(max(0, room_for_more(dispatcher, batch_size))):
        try:
            dispatcher.submit_task_input(next(inputs))
        except StopIteration:  # a finite generator: upstream's next round says so
            return


def submitting_ahead(original):
    def active_submit_and_wait(self, input_generator, batch_size, dynamic_bs=False):
        results = original(self, input_generator, batch_size, dynamic_bs)
        top_up(self, input_generator, batch_size)
        return results

    return active_submit_and_wait


def holds_the_one_batch_cap(dispatcher_source: str, method_source: str) -> bool:
    """Whether upstream's round still queues at most one batch, from the queue this tops up."""
    return UPSTREAM_CAP in method_source and all(re.search(rf"self\.{name}\b[^=\n]*= ", dispatcher_source)
                                                 for name in ("_pending_inputs", "_input_cv"))


def install() -> None:
    from areal.infra.workflow_executor import BatchTaskDispatcher

    method = getattr(BatchTaskDispatcher.active_submit_and_wait, "__wrapped__", BatchTaskDispatcher.active_submit_and_wait)
    if not holds_the_one_batch_cap(inspect.getsource(BatchTaskDispatcher), inspect.getsource(method)):
        logger.warning("submit_ahead: AReaL's BatchTaskDispatcher no longer queues one batch a round as 1.0.4 did; "
                       "not applied (check its upstream status in docs/areal-bugs.md)")
        return
    wrap_once(BatchTaskDispatcher, "active_submit_and_wait", submitting_ahead, "submits_ahead")
