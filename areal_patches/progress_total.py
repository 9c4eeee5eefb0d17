"""The run's real total in AReaL's progress line, `Train step N/M done`.

Upstream behaviour (areal 1.0.4): `StatsLogger.commit` counts to M = total_train_epochs x
steps per epoch (`FinetuneSpec.total_train_steps`), although `PPOTrainer.train` stops at
`total_train_steps` when that comes first. train_config.yaml's run of 200 steps over 100k
puzzles at 128 per step logs `Train step 1/781`, and the run ends at `200/781`.

Effect: M is the step the run ends at, the smaller of the two. Only the stats logger's copy
of the spec changes; the learning-rate schedule, saver, evaluator and recover handler keep
AReaL's.

Off: `areal_patches.apply(skip={"progress_total"})`.

Upstream: unchanged on AReaL's main as of cbff54d (2026-08-22) and in the v2.0.0 tag; not
reported.
"""

from __future__ import annotations

import dataclasses

from areal.api.io_struct import FinetuneSpec

from areal_patches.patching import wrap_once


@dataclasses.dataclass
class RunSpec(FinetuneSpec):
    """A FinetuneSpec whose `total_train_steps` is the step the run stops at."""

    run_steps: int = 0

    @property
    def total_train_steps(self) -> int:
        return self.run_steps


def run_spec(spec: FinetuneSpec, total_train_steps: int | None) -> FinetuneSpec:
    """`spec`, counting to `total_train_steps` where that ends the run before the epochs do."""
    if total_train_steps is None or total_train_steps >= spec.total_train_steps:
        return spec
    return RunSpec(**dataclasses.asdict(spec), run_steps=total_train_steps)


def install() -> None:
    from areal.utils.stats_logger import StatsLogger

    def counting_run_total(original):
        def __init__(self, config, ft_spec: FinetuneSpec) -> None:
            original(self, config, ft_spec)
            self.ft_spec = run_spec(ft_spec, getattr(config, "total_train_steps", None))

        return __init__

    wrap_once(StatsLogger, "__init__", counting_run_total, "counts_run_total")
