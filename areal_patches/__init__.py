"""Fixes to areal 1.0.4, each in its own module, applied explicitly by `apply()`.
Any fix is switched off by name: `apply(skip={"fast_save"})`, or `AREAL_PATCHES_SKIP=fast_save`
(comma-separated) in the environment of the process that applies them (an SPMD launcher's
trainer inherits it; AReaL starts single-controller workers with its own variables and
`scheduling_spec.env_vars` only).

Bug fixes: what AReaL does wrong on this example's paths.

| module | upstream behaviour | effect | off |
|---|---|---|---|
| `packed_sdpa` | transformers' `sdpa` ignores `cu_seq_lens`, so packed sequences attend to each other | correct log-probs and gradients with `attn_impl: sdpa` | `apply(skip={"packed_sdpa"})`, or `attn_impl: flash_attention_2` |
| `mask_mapping` | packed micro-batches reach the model with a mask per attention type, which transformers' Llama decoder cannot read: Llama models fail at their first training step | Llama trains, its packed attention as Qwen2's | `apply(skip={"mask_mapping"})` |
| `server_start` | a server that dies at start is waited for `setup_timeout` (300 s) | the wait ends when the server process does, naming it | `apply(skip={"server_start"})` |
| `clean_exit` | single controller: a failed start leaves workers to a finalizer that hangs; SIGTERM skips clean-up | every exit stops the run's processes, without hanging; a clean-up that a SIGTERM leaves stuck ends after a grace period | `apply(skip={"clean_exit"})` |
| `progress_total` | `Train step N/M` counts M over whole epochs, though `total_train_steps` ends the run first | M is the run's real total | `apply(skip={"progress_total"})` |
| `data_seed` | the trainers' data samplers shuffle with seed 0 whatever the config's `seed` | `seed` decides the data order (`seed: 0` is AReaL's) | `apply(skip={"data_seed"})` |
| `rollout_stats` | SPMD launchers: a step's `rollout/*` scalars are replaced by the few episodes that finish between two exports | each scalar averages every episode it covers | `apply(skip={"rollout_stats"})` |
| `slurm_container` | `scheduler.type=slurm` starts every worker with `singularity exec`, whatever `scheduling_spec.container_type` says; without Singularity the controller waits 300 s, then fails | each job uses its spec's `container_type` and `mount` (`none`: the command as it is) | `apply(skip={"slurm_container"})` |
| `slurm_job_exit` | `scheduler.type=slurm`: a worker job whose worker fails ends COMPLETED (its status is `tee`'s), so the controller waits 300 s, then says `WorkerTimeoutError` | the job ends FAILED and the wait ends within seconds, with the role's log tail | `apply(skip={"slurm_job_exit"})` |
| `port_draw` | ports are drawn from `random` after the trainer seeded it with `seed`: two runs with one seed on one machine take the same ports, and one talks to the other's workers until it hangs | ports drawn by a generator the OS seeds; `seed` still decides everything else | `apply(skip={"port_draw"})` |
| `task_callback` | single controller: a rollout's completion callback that comes after its wait was cancelled (a run shutting down) sets a result on a cancelled future, and the event loop logs `InvalidStateError: invalid state` after "Training completes" | the callback skips a future that is no longer pending | `apply(skip={"task_callback"})` |
| `rollout_shutdown` | single controller: `RolloutController.destroy` stops its callback server before its workers, so a rollout finishing meanwhile makes the worker log `ERROR: Callback to .../rollout_complete failed` (reset, refused or 500) | the server stops after the workers are deleted and answers a late callback 200, resolving nothing | `apply(skip={"rollout_shutdown"})` |
| `wandb_offline` | `stats_logger.wandb.mode=offline` still calls `wandb.login()`, which fails without an API key (`UsageError`) before the first step | offline runs need no account or network; their folder is for `wandb sync` later | `apply(skip={"wandb_offline"})` |

Speed-ups: the same results, sooner.

| module | upstream behaviour | effect | off |
|---|---|---|---|
| `weight_push` | the rollout client polls for new weights once a second, plus a random 0-100 ms, during a disk push | the push stops idling a second per step; the record is seen within 20 ms | `apply(skip={"weight_push"})` |
| `pause_at_load` | a disk push pauses generation before the trainer saves the new weights, so the servers sit idle through the save | the servers pause only for the load; they go on with their rollouts while the folder is written | `apply(skip={"pause_at_load"})` |
| `submit_ahead` | rollouts reach the dispatcher only while the trainer waits in `prepare_batch`, at most a batch a round; where generation is fast the first round fills the batch and nothing runs while the trainer trains | when a batch is taken, the dispatcher's queue is topped up to AReaL's limit, and it starts them as the staleness bound allows: the servers generate the next steps' rollouts during the update and push | `apply(skip={"submit_ahead"})` |
| `fast_save` | each push (and Hugging Face save) gathers the weights into pageable host memory in float32 and casts them on the CPU | cast on the GPU, one copy into reused pinned memory; the same files | `apply(skip={"fast_save"})` |
| `fast_step` | host syncs, unfused kernels and repeated gathers in the FSDP training step | faster GPU steps, same results | `apply(skip={"fast_step"})`; `TORCHDYNAMO_DISABLE=1` for compilation only |
| `resume_poll` | rollouts a weight push interrupted are resent on a 0.5 s poll once the trainer resumes the dispatcher, at the end of its step; the dispatcher's runner, paused while rollouts run, looks for the resume every 0.5 s, so the next step's first rollouts start 0-0.5 s late | resent within 20 ms of the push's end (the servers loaded, the client's version set); no new rollout starts before the resume, and new ones start within 20 ms of it | `apply(skip={"resume_poll"})` |
| `callback_pool` | single controller: a rollout worker posts its completion callbacks from the 4-thread pool its weight load runs in, to a single-threaded server that a push keeps busy until that load ends; rollouts finishing during a push stall it until their posts time out (30 s), each logged as a failed callback | the posts have a pool of their own; the load never waits behind them | `apply(skip={"callback_pool"})` |
| `fewer_syncs` | GRPO's group reward normalisation reads two counts back from the GPU per group (a Python loop over the groups); each micro-batch's staleness statistics read ten values one by one | one group pass without a read; one read per micro-batch; the same numbers | `apply(skip={"fewer_syncs"})` |
| `local_batch` | the SPMD trainer passes each rollout batch through an all-gather and a broadcast, a collective or two per tensor and a read per trajectory, even on one rank | on one rank (one data-parallel and one context-and-model-parallel rank) the batch is kept as upstream's code would return it, without a collective | `apply(skip={"local_batch"})` |

Applied elsewhere:

| module | upstream behaviour | effect | off |
|---|---|---|---|
| `server_watchdog` | single controller: a server that dies mid-run makes the run retry forever | the run stops within a grace period with one line naming the server | `server_health_grace=0` |
| `cpu_platform` | CPU-only machines: the local launcher's job commands start with `=0` | the launchers run on CPU | not applied by `apply()`: devkit/dev_server/sglang_seam applies it in CPU runs |
| `ray_workers` | `scheduler.type=ray`: the workers are AReaL's Ray actors, which never run `scheduling_spec.cmd`, so none of the fixes reach them | every Ray worker installs them at start (Ray's setup hook) | not applied by `apply()`: `train.py` and `sft.py` call `ray_workers.install(config.scheduler.type)`; leave the call out |

Each module's docstring says why and what was measured (docs/results/areal-fixes.md has the numbers),
and ends with its upstream status on AReaL's main (docs/areal-bugs.md has them all).
Nothing is patched on import: `train.py` and `sft.py` call `apply()` from `main()`, and the
single-controller workers run `python3 -m areal_patches.worker` (train_config.yaml's
`actor.scheduling_spec.cmd`), which applies them before AReaL's RPC server starts; on Ray,
`ray_workers.setup_worker` does the same.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection
from types import ModuleType

WRITTEN_FOR = "1.0.4"  # the areal release these fixes were written against and measured on

logger = logging.getLogger(__name__)


def fixes() -> dict[str, list[ModuleType]]:
    """The fixes by kind, in the order `apply()` applies them."""
    from areal_patches import (callback_pool, clean_exit, data_seed, fast_save, fast_step, fewer_syncs, local_batch,
                               mask_mapping, packed_sdpa, pause_at_load, port_draw, progress_total, resume_poll,
                               rollout_shutdown, rollout_stats, server_start, slurm_container, slurm_job_exit,
                               submit_ahead, task_callback, wandb_offline, weight_push)

    return {
        "bug fixes": [packed_sdpa, mask_mapping, server_start, clean_exit, progress_total, data_seed, rollout_stats,
                      slurm_container, slurm_job_exit, port_draw, task_callback, rollout_shutdown, wandb_offline],
        "speed-ups": [weight_push, pause_at_load, resume_poll, submit_ahead, fast_save, fast_step, callback_pool,
                      fewer_syncs, local_batch],
    }


def short_name(fix: ModuleType) -> str:
    return fix.__name__.rpartition(".")[2]


SKIP_VARIABLE = "AREAL_PATCHES_SKIP"  # e.g. AREAL_PATCHES_SKIP=fast_save,fast_step: upstream's code, for an A/B


def apply(skip: Collection[str] = ()) -> None:
    """Apply every fix in this process but those named in `skip` (e.g. {"fast_step"}) or in the
    comma-separated environment variable AREAL_PATCHES_SKIP; each fix is idempotent.
    `server_watchdog` is not a patch but a thread: train.py
    starts it once the trainer exists."""
    from areal import __version__

    skip = set(skip) | {name.strip() for name in os.environ.get(SKIP_VARIABLE, "").split(",") if name.strip()}

    if __version__ != WRITTEN_FOR:
        logger.warning(f"areal_patches: written for areal {WRITTEN_FOR}, applied to areal {__version__}: "
                       "check each fix's upstream status in docs/areal-bugs.md")
    groups = fixes()
    every = {short_name(fix) for group in groups.values() for fix in group}
    unknown = skip - every
    if unknown:
        raise ValueError(f"areal_patches.apply: no fix named {', '.join(sorted(unknown))} "
                         f"(in skip or {SKIP_VARIABLE}); the fixes are {', '.join(sorted(every))}")
    for group in groups.values():
        for fix in group:
            if short_name(fix) not in skip:
                fix.install()
