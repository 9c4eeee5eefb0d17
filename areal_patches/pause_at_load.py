"""Keep the servers generating while the trainer writes new weights; pause them for the load only.

Upstream behaviour (areal 1.0.4): a disk weight push, `FSDPEngine._update_weights_from_disk`,
first pauses generation on every server (rank 0), asks them to load the new folder (their
request waits for the trainer's "weights saved" record), then saves the Hugging Face folder
(every rank), writes the record, waits for the load and continues generation. So the servers
sit paused for the whole save, though they keep the old weights until they load the new ones.
For a small model that is a fraction of a second; for Qwen2.5-1.5B's size the save is most
of a push of several seconds a step (docs/results/launch-paths.md, "Several GPUs of one host"), time in
which no rollout advances.

Effect: the push runs as upstream, in its order, but for one thing: the pause and the load
request are put off until the save has ended. The servers finish or advance their in-flight
rollouts with the weights they hold meanwhile; every token is still tagged with the version
that produced it, and the load, the versions and the continue are upstream's. The save stays
on the trainer's clock (`timeperf/update_weights`); what changes is how long the servers are
paused, which their own logs show (docs/results/areal-fixes.md, "Generation paused for the load only").

Off: `areal_patches.apply(skip={"pause_at_load"})`.

Upstream: unchanged on AReaL's main as of cbff54d (2026-08-22) and in the v2.0.0 tag (the push
still pauses before the save); not reported.
"""

from __future__ import annotations

from concurrent.futures import Future

from areal_patches.patching import wrap_once


class PauseAtLoad:
    """The servers as upstream's push sees them: its first `pause_generation` and its load
    request are held back until `start_load`, which the end of the save calls. Everything
    else (`continue_generation`, ...) goes to the servers as it is."""

    def __init__(self, servers):
        self.servers = servers
        self.meta = None
        self.loaded: Future = Future()

    def pause_generation(self) -> None:
        """Upstream's pause before the save: held back (`start_load` pauses)."""

    def update_weights_from_disk(self, meta) -> Future:
        self.meta = meta
        return self.loaded

    def start_load(self) -> None:
        """Pause the servers and ask them to load; `loaded` resolves as their load does."""
        self.servers.pause_generation()
        load = self.servers.update_weights_from_disk(self.meta)
        load.add_done_callback(lambda done: _copy_outcome(done, self.loaded))

    def __getattr__(self, name: str):
        return getattr(self.servers, name)


def _copy_outcome(source: Future, target: Future) -> None:
    if source.cancelled():
        target.cancel()
    elif source.exception() is not None:
        target.set_exception(source.exception())
    else:
        target.set_result(source.result())


def install() -> None:
    import torch.distributed as dist
    from areal.engine.fsdp_engine import FSDPEngine

    def load_paused(original):
        def _update_weights_from_disk(self, meta) -> None:
            if dist.get_rank() != 0:  # only rank 0 talks to the servers
                return original(self, meta)
            servers, save = self.rollout_engine, self._save_model_to_hf
            held = PauseAtLoad(servers)

            def save_then_load(*args, **kwargs) -> None:
                save(*args, **kwargs)
                held.start_load()

            # Instance attributes shadow the engine's for this one call.
            self.rollout_engine, self._save_model_to_hf = held, save_then_load
            try:
                original(self, meta)
            finally:
                self.rollout_engine = servers
                del self._save_model_to_hf

        return _update_weights_from_disk

    wrap_once(FSDPEngine, "_update_weights_from_disk", load_paused, "pauses_at_load")
