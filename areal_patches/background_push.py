"""Finish each disk weight push in the background while the trainer goes on with its next step.

Upstream behaviour (areal 1.0.4): `FSDPEngine._update_weights_from_disk` keeps the trainer
waiting until the servers serve the new weights: it writes the Hugging Face folder, writes
the "weights saved" record, waits for every server's load and continues generation. With
`fast_save` and `pause_at_load` the copy of the weights out of the GPU is a small part of that;
the rest (`save_pretrained` writing the folder, the servers' load) is disk and HTTP time in
which the GPU that trains sits idle (docs/results/throughput.md has the figures).

Effect, under the SPMD launchers (local, Ray, Slurm), where the trainer holds the rollout
client itself:
- On the trainer's clock (`timeperf/update_weights`): the wait for the previous push, if it has
  not ended, and the copy of the weights into pinned host memory (`fast_save.host_copies`, on
  every rank, whether or not `fast_save` is on).
- In a thread of rank 0, while the next step trains: the folder written from that copy, the
  record, then the servers paused for the load only (as with `pause_at_load`) and continued.
- The rollout client's new version (the trainer's `set_version` right after the push) is set
  once the servers have loaded the weights, not before, so every token stays tagged with the
  version that made it; AReaL's staleness bound counts from that version, as upstream's does.
  On the other ranks (each data-parallel head has a client) a thread sets it when rank 0's
  name_resolve record says the servers have loaded.
- An evaluation, the next push and the trainer's `close` wait for the push in flight; an
  error in it is raised there, naming the version.
The copy is a second set of pinned buffers (the model's size in its compute dtype, rank 0),
apart from `fast_save`'s, which a checkpoint's save reuses while a push may still be written.

Under the single controller the trainer's engine reaches the servers through the controller
(`RolloutCallback`), which sets the versions itself; there the push runs as upstream's (with
the other fixes), and this module says so in one log line.

Off: `areal_patches.apply(skip={"background_push"})`.

Upstream: unchanged on AReaL's main as of cbff54d (2026-08-22) (a disk push still ends within
`update_weights`); not reported.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime

from areal_patches.patching import wrap_once


def areal_logger():
    """AReaL's logger, which its trainer shows at INFO (this package's own shows warnings only)."""
    from areal.utils import logging

    return logging.getLogger("background_push")


class Push:
    """One weight version on its way to the servers, and the client versions it holds back."""

    def __init__(self, version: int):
        self.version = version
        self.lock = threading.Lock()
        self.loaded = False
        self.held: list[tuple[object, Callable]] = []
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None

    def hold(self, engine: object, set_version: Callable, version: int) -> bool:
        """Keep `set_version(engine, version)` for when the servers have loaded this push;
        False (the caller sets it now) for another version or once they have."""
        with self.lock:
            if self.loaded or version != self.version:
                return False
            self.held.append((engine, set_version))
            return True

    def release(self) -> None:
        """The servers hold this version: set it on every client that asked for it."""
        with self.lock:
            self.loaded = True
            held, self.held = self.held, []
        for engine, set_version in held:
            set_version(engine, self.version)


class InFlight:
    """The push the trainer's process has in flight, if any (one trainer engine a process)."""

    def __init__(self):
        self.push: Push | None = None

    def start(self, push: Push, work: Callable[[], None]) -> None:
        def run() -> None:
            try:
                work()
            except BaseException as error:  # noqa: BLE001 - raised again where the trainer waits
                push.error = error

        push.thread = threading.Thread(target=run, name=f"weight-push-v{push.version}", daemon=True)
        self.push = push
        push.thread.start()

    def wait(self) -> None:
        """Until the push in flight has ended; its error, if it failed."""
        push, self.push = self.push, None
        if push is None:
            return
        push.thread.join()
        if push.error is not None:
            raise RuntimeError(f"background_push: the push of weight version {push.version} failed: "
                               f"{push.error!r}") from push.error

    def hold(self, engine: object, set_version: Callable, version: int) -> bool:
        push = self.push
        return push is not None and push.hold(engine, set_version, version)


IN_FLIGHT = InFlight()


def finish(engine, meta, state_dict: dict, record_version: int, push: Push, announce: str) -> None:
    """Rank 0, in the background: the folder from the host copy, the record, the servers' load;
    then `announce` says to the other ranks whether the servers hold the new version."""
    from areal.utils import name_resolve, names

    start = time.perf_counter()
    outcome = "failed"
    try:
        engine.model.save_pretrained(meta.path, state_dict=state_dict)
        engine.model_config.save_pretrained(meta.path)
        if engine.tokenizer is not None and not engine.config.use_lora:
            engine.tokenizer.save_pretrained(meta.path)
        if engine.processor is not None and not engine.config.use_lora:
            engine.processor.save_pretrained(meta.path)
        saved = time.perf_counter()
        # replace: a run recovered from a checkpoint pushes a version again
        name = names.update_weights_from_disk(engine.config.experiment_name, engine.config.trial_name, record_version)
        name_resolve.add(name, str(datetime.now().timestamp()), keepalive_ttl=120, replace=True)
        servers = engine.rollout_engine
        servers.pause_generation()
        servers.update_weights_from_disk(meta).result()
        outcome = "loaded"
    finally:
        name_resolve.add(announce, outcome, keepalive_ttl=120, replace=True)
    push.release()
    servers.continue_generation()
    areal_logger().info(f"weight version {push.version} written in {saved - start:.2f} s, "
                f"loaded by the servers {time.perf_counter() - saved:.2f} s later")


def follow(announce: str, push: Push) -> None:
    """Every other rank, in the background: its client's version once rank 0 announces the load."""
    from areal.utils import name_resolve

    outcome = name_resolve.wait(announce, timeout=None)
    if outcome != "loaded":
        raise RuntimeError("rank 0's push failed (its log says why)")
    push.release()


def in_background(original):
    def _update_weights_from_disk(self, meta) -> None:
        import torch.distributed as dist
        from areal.utils import names
        from areal.utils.environ import is_single_controller

        from areal_patches.fast_save import host_copies

        if is_single_controller():
            if not self.__dict__.get("_background_push_said"):
                self._background_push_said = True
                areal_logger().info("single controller: each weight push ends before the next step "
                            "(the controller sets the rollout versions itself)")
            return original(self, meta)
        IN_FLIGHT.wait()
        record_version = self.get_version()  # the record's name: the version the client waits on
        buffers = self.__dict__.setdefault("_background_push_buffers", {})
        state_dict = host_copies(self, buffers)  # every rank: a collective
        push = Push(meta.version if meta.version is not None else record_version + 1)
        record = names.update_weights_from_disk(self.config.experiment_name, self.config.trial_name, record_version)
        announce = f"{record}/background_push_loaded"
        if dist.get_rank() == 0:
            IN_FLIGHT.start(push, lambda: finish(self, meta, state_dict, record_version, push, announce))
        else:  # every data-parallel head has a rollout client whose version waits for the load
            IN_FLIGHT.start(push, lambda: follow(announce, push))
        dist.barrier(group=self.cpu_group)

    return _update_weights_from_disk


def held_until_loaded(original):
    def set_version(self, version):
        if IN_FLIGHT.hold(self, original, version):
            return None
        return original(self, version)

    return set_version


def waits_first(original):
    def _evaluate_fn(self, *args, **kwargs):
        IN_FLIGHT.wait()
        return original(self, *args, **kwargs)

    return _evaluate_fn


def closes_after_the_push(original):
    """The trainer's processes are stopped whether or not the last push failed; its error after."""

    def close(self) -> None:
        try:
            IN_FLIGHT.wait()
        except RuntimeError as error:
            original(self)
            raise error
        original(self)

    return close


def install() -> None:
    from areal.engine.fsdp_engine import FSDPEngine
    from areal.infra.remote_inf_engine import RemoteInfEngine
    from areal.trainer.rl_trainer import PPOTrainer

    wrap_once(FSDPEngine, "_update_weights_from_disk", in_background, "pushes_in_background")
    wrap_once(RemoteInfEngine, "set_version", held_until_loaded, "holds_version_until_loaded")
    wrap_once(PPOTrainer, "_evaluate_fn", waits_first, "waits_for_push")
    wrap_once(PPOTrainer, "close", closes_after_the_push, "waits_for_push")
