"""Fixes to areal 1.0.4, each in its own module, installed explicitly by `install()`, and
two opt-in options, `pass_at_k` and `entropy_bonus`, that change nothing unless the config asks
for them.

| module | upstream behaviour | effect | off |
|---|---|---|---|
| `packed_sdpa` | transformers' `sdpa` ignores `cu_seq_lens`, so packed sequences attend to each other | correct log-probs and gradients with `attn_impl: sdpa` | `install(packed_sdpa=False)`, or `attn_impl: flash_attention_2` |
| `mask_mapping` | packed micro-batches reach the model with a mask per attention type, which transformers' Llama decoder cannot read: Llama models fail at their first training step | Llama trains, its packed attention as Qwen2's | `install(mask_mapping=False)` |
| `weight_push` | the rollout client polls for new weights once a second during a disk push | the push stops idling a second per step | `install(weight_push=False)` |
| `pause_at_load` | a disk push pauses generation before the trainer saves the new weights, so the servers sit idle through the save | the servers pause only for the load; they go on with their rollouts while the folder is written | `install(pause_at_load=False)` |
| `fast_step` | host syncs, unfused kernels and repeated gathers in the FSDP training step | faster GPU steps, same results | `install(fast_step=False)`; `TORCHDYNAMO_DISABLE=1` for compilation only |
| `server_start` | a server that dies at start is waited for `setup_timeout` (300 s) | the wait ends when the server process does, naming it | `install(server_start=False)` |
| `clean_exit` | single controller: a failed start leaves workers to a finalizer that hangs; SIGTERM skips clean-up | every exit stops the run's processes, without hanging; a clean-up that a SIGTERM leaves stuck ends after a grace period | `install(clean_exit=False)` |
| `progress_total` | `Train step N/M` counts M over whole epochs, though `total_train_steps` ends the run first | M is the run's real total | `install(progress_total=False)` |
| `data_seed` | the trainers' data samplers shuffle with seed 0 whatever the config's `seed` | `seed` decides the data order (`seed: 0` is AReaL's) | `install(data_seed=False)` |
| `rollout_stats` | SPMD launchers: a step's `rollout/*` scalars are replaced by the few episodes that finish between two exports | each scalar averages every episode it covers | `install(rollout_stats=False)` |
| `pass_at_k` | GRPO normalises each group's rewards by mean and std: pass@1 rises, pass@k narrows | `actor.pass_at_k: k` > 1 gives each completion its pass@k advantage (Chen et al. 2025) | `actor.pass_at_k: 1` (shipped); `install(pass_at_k=False)` |
| `entropy_bonus` | the loss detaches each token's entropy and only logs it: GRPO narrows the policy | `actor.entropy_coef: c` > 0 subtracts c times the mean token entropy from the loss | `actor.entropy_coef: 0` (shipped); `install(entropy_bonus=False)` |
| `slurm_container` | `scheduler.type=slurm` starts every worker with `singularity exec`, whatever `scheduling_spec.container_type` says; without Singularity the controller waits 300 s, then fails | each job uses its spec's `container_type` and `mount` (`none`: the command as it is) | `install(slurm_container=False)` |
| `slurm_job_exit` | `scheduler.type=slurm`: a worker job whose worker fails ends COMPLETED (its status is `tee`'s), so the controller waits 300 s, then says `WorkerTimeoutError` | the job ends FAILED and the wait ends within seconds, with the role's log tail | `install(slurm_job_exit=False)` |
| `port_draw` | ports are drawn from `random` after the trainer seeded it with `seed`: two runs with one seed on one machine take the same ports, and one talks to the other's workers until it hangs | ports drawn by a generator the OS seeds; `seed` still decides everything else | `install(port_draw=False)` |
| `task_callback` | single controller: a rollout's completion callback that comes after its wait was cancelled (a run shutting down) sets a result on a cancelled future, and the event loop logs `InvalidStateError: invalid state` after "Training completes" | the callback skips a future that is no longer pending | `install(task_callback=False)` |
| `rollout_shutdown` | single controller: `RolloutController.destroy` stops its callback server before its workers, so a rollout finishing meanwhile makes the worker log `ERROR: Callback to .../rollout_complete failed` (reset, refused or 500) | the server stops after the workers are deleted and answers a late callback 200, resolving nothing | `install(rollout_shutdown=False)` |
| `callback_pool` | single controller: a rollout worker posts its completion callbacks from the 4-thread pool its weight load runs in, to a single-threaded server that a push keeps busy until that load ends; rollouts finishing during a push stall it until their posts time out (30 s), each logged as a failed callback | the posts have a pool of their own; the load never waits behind them | `install(callback_pool=False)` |
| `wandb_offline` | `stats_logger.wandb.mode=offline` still calls `wandb.login()`, which fails without an API key (`UsageError`) before the first step | offline runs need no account or network; their folder is for `wandb sync` later | `install(wandb_offline=False)` |
| `server_watchdog` | single controller: a server that dies mid-run makes the run retry forever | the run stops within a grace period with one line naming the server | `server_health_grace=0` |
| `cpu_platform` | CPU-only machines: the local launcher's job commands start with `=0` | the launchers run on CPU | not installed by `install()`: devkit/dev_server/sglang_seam applies it in CPU runs |
| `ray_workers` | `scheduler.type=ray`: the workers are AReaL's Ray actors, which never run `scheduling_spec.cmd`, so none of the fixes reach them | every Ray worker installs them at start (Ray's setup hook) | not installed by `install()`: `train.py` and `sft.py` call `ray_workers.install(config.scheduler.type)`; leave the call out |

Each module's docstring says why and what was measured (docs/results/areal-fixes.md has the numbers).
Nothing is patched on import: `train.py` and `sft.py` call `install()` from `main()`, and the
single-controller workers run `python3 -m areal_patches.worker` (train_config.yaml's
`actor.scheduling_spec.cmd`), which installs them before AReaL's RPC server starts; on Ray,
`ray_workers.setup_worker` does the same.
"""

from __future__ import annotations


def install(
    packed_sdpa: bool = True,
    weight_push: bool = True,
    pause_at_load: bool = True,
    fast_step: bool = True,
    server_start: bool = True,
    clean_exit: bool = True,
    progress_total: bool = True,
    data_seed: bool = True,
    rollout_stats: bool = True,
    pass_at_k: bool = True,
    entropy_bonus: bool = True,
    slurm_container: bool = True,
    slurm_job_exit: bool = True,
    port_draw: bool = True,
    task_callback: bool = True,
    rollout_shutdown: bool = True,
    callback_pool: bool = True,
    mask_mapping: bool = True,
    wandb_offline: bool = True,
) -> None:
    """Apply the chosen fixes in this process (each is idempotent). `server_watchdog` is not a
    patch but a thread: train.py starts it once the trainer exists."""
    from areal_patches import callback_pool as callback_pool_module
    from areal_patches import clean_exit as clean_exit_module
    from areal_patches import data_seed as data_seed_module
    from areal_patches import entropy_bonus as entropy_bonus_module
    from areal_patches import fast_step as fast_step_module
    from areal_patches import mask_mapping as mask_mapping_module
    from areal_patches import packed_sdpa as packed_sdpa_module
    from areal_patches import pass_at_k as pass_at_k_module
    from areal_patches import pause_at_load as pause_at_load_module
    from areal_patches import port_draw as port_draw_module
    from areal_patches import progress_total as progress_total_module
    from areal_patches import rollout_shutdown as rollout_shutdown_module
    from areal_patches import rollout_stats as rollout_stats_module
    from areal_patches import server_start as server_start_module
    from areal_patches import slurm_container as slurm_container_module
    from areal_patches import slurm_job_exit as slurm_job_exit_module
    from areal_patches import task_callback as task_callback_module
    from areal_patches import wandb_offline as wandb_offline_module
    from areal_patches import weight_push as weight_push_module

    if packed_sdpa:
        packed_sdpa_module.install()
    if mask_mapping:
        mask_mapping_module.install()
    if weight_push:
        weight_push_module.install()
    if pause_at_load:
        pause_at_load_module.install()
    if fast_step:
        fast_step_module.install()
    if server_start:
        server_start_module.install()
    if clean_exit:
        clean_exit_module.install()
    if progress_total:
        progress_total_module.install()
    if data_seed:
        data_seed_module.install()
    if rollout_stats:
        rollout_stats_module.install()
    if pass_at_k:
        pass_at_k_module.install()
    if entropy_bonus:
        entropy_bonus_module.install()
    if slurm_container:
        slurm_container_module.install()
    if slurm_job_exit:
        slurm_job_exit_module.install()
    if port_draw:
        port_draw_module.install()
    if task_callback:
        task_callback_module.install()
    if rollout_shutdown:
        rollout_shutdown_module.install()
    if callback_pool:
        callback_pool_module.install()
    if wandb_offline:
        wandb_offline_module.install()
