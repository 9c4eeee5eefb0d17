"""Post a rollout worker's completion callbacks from a thread pool of their own.

Upstream behaviour (areal 1.0.4), single controller: a rollout worker reports each finished
rollout with a POST to the controller's callback server (`BatchTaskDispatcher._send_callback`
in areal/infra/workflow_executor.py, 30 s timeout), run in the process's default 4-thread pool
(`get_executor()`). The worker's weight load for a disk push runs in that same pool
(`RemoteInfEngine.update_weights_from_disk`). The controller's callback server is
single-threaded (`make_server(..., threaded=False)`), and during a push it is busy serving the
trainer's "update weights" callback, which returns only when the workers have loaded. Rollouts
that finish meanwhile fill the pool with posts that wait for that server, the load queues
behind them, and nothing moves until the posts time out: the push stalls for their timeouts,
and the worker logs each as `ERROR: Callback to .../rollout_complete failed: ... Read timed
out`, though the server still answers those posts once it is free, so no completion is lost
(seen with a 1.5B-shaped model on a GPU: docs/results/areal-fixes.md, "Generation paused for the load
only").

Effect: the posts run in a pool of their own (`get_executor("rollout_callbacks")`: AReaL's own
per-scope pools, which its docstring recommends against such deadlocks), so a load never
queues behind them; a post that waits for the busy server is answered once the push ends.

Off: `areal_patches.apply(skip={"callback_pool"})`.

Upstream: unchanged on AReaL's main as of cbff54d (2026-08-22) and in the v2.0.0 tag (posts and
loads share `get_executor()`; the callback server is single-threaded); not reported.
"""

from __future__ import annotations

import functools

SCOPE = "rollout_callbacks"


def install() -> None:
    from areal.infra import workflow_executor
    from areal.infra.utils.concurrent import get_executor

    # `_send_callback` is the module's only use of the name.
    workflow_executor.get_executor = functools.partial(get_executor, SCOPE)
