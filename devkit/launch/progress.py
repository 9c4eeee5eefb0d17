"""What a training run shows while it runs, and the guard that stops a run that makes no
progress.

AReaL's StatsLogger logs `Train step N/M done.` after each step, then that step's stats as
a table (`rollout/reward`; `eval-rollout/success` when the held-out set was evaluated).
`StepWatch.line` reads the run's output: it shows one line per step (or `lines` lines in
all) with the step, the stats it was asked for and the time left at the pace so far, one
line early on with the whole run's expected time, and hands every other line to
`echo_progress`. `StepWatch.guard` stops the run when no step has finished for
`stall_limit` seconds (the run's start counts as one, with `first_step_limit` in its place
if one is given) or, if one is given, when `time_limit` seconds have passed: it prints the
cause first, and shows nothing of the run after it (what the stopped processes print about
their stop goes to the run's log only).
"""

from __future__ import annotations

import math
import re
import threading
import time
from dataclasses import dataclass, field

from devkit.launch.training import echo_progress
from devkit.processes import plain

TRAIN_STEP = re.compile(r"Train step (\d+)/(\d+) done")
# One name/value pair of AReaL's stats table (tabulate's fancy_grid): "│ rollout/reward │ 4.1e-01 │".
STAT = re.compile(r"│\s*([^\s│]+)\s*│\s*([-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|nan|inf))\s*(?=│)")
TABLE_LINE, TABLE_END = re.compile(r"[│╒╞├╘]"), "╘"


def table_stats(line: str) -> dict[str, float]:
    """The name/value pairs of one line of AReaL's stats table."""
    return {name: float(value) for name, value in STAT.findall(line)}


def duration(seconds: float) -> str:
    """`45 s`, `7 min`, `1 h 05 min`."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def seconds_left(finished: dict[int, float], total: int) -> float | None:
    """The time the steps after the last finished one take at the pace since the first
    (whose time includes the start-up); None before two steps have finished."""
    if len(finished) < 2:
        return None
    first, last = min(finished), max(finished)
    return (finished[last] - finished[first]) / (last - first) * (total - last)


def stop_cause(now: float, started: float, last_step: float | None, stall_limit: float | None,
               time_limit: float | None, first_step_limit: float | None = None) -> str | None:
    """Why the run should stop at `now` (seconds, like `started` and `last_step`), or None.
    Before the first step the wait is `first_step_limit`'s where one is given."""
    if time_limit and now - started >= time_limit:
        return f"time limit ({time_limit:.0f} s)"
    if last_step is None and first_step_limit is not None:
        stall_limit = first_step_limit
    if stall_limit and now - (last_step or started) >= stall_limit:
        return f"no step finished in {stall_limit:.0f} s"
    return None


def shown_step(step: int, total: int, lines: int | None) -> bool:
    """Whether step `step` of `total` gets a line when a run shows `lines` in all (None: all)."""
    return lines is None or step in (1, total) or step % math.ceil(total / lines) == 0


@dataclass
class StepWatch:
    """The progress lines and the stall guard of one run (see the module docstring)."""

    name: str  # the lines' prefix: "grpo", "sft"
    shown: dict[str, tuple[str, str]] = field(default_factory=dict)  # {label: (stat, format)}
    lines: int | None = None
    stall_limit: float | None = None
    time_limit: float | None = None
    first_step_limit: float | None = None  # the wait for the first step, if not stall_limit
    estimate_after: int = 3  # steps: then the line with the whole run's expected time
    started: float = field(default_factory=lambda: time.monotonic())
    finished: dict[int, float] = field(default_factory=dict)  # {step: when its line came}
    total: int = 0
    cause: str | None = None  # why the guard stopped the run
    _pending: int | None = None  # the step whose stats table is being read
    _stats: dict[str, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def last_step(self) -> int:
        return max(self.finished, default=0)

    def line(self, text: str) -> None:
        """One line of the run's output (the `echo` of devkit.launch.training.run_trainer)."""
        with self._lock:
            if self.cause:
                return
            bare = plain(text)
            if step := TRAIN_STEP.search(bare):
                self._show_pending()
                self._pending, self._stats = int(step[1]), {}
                self.total = int(step[2])
                self.finished[self._pending] = time.monotonic()
            elif self._pending is not None and TABLE_LINE.search(bare):
                self._stats.update(table_stats(bare))
                if TABLE_END in bare:
                    self._show_pending()
            else:
                echo_progress(text)

    def finish(self) -> None:
        """The last step's line, if its table did not end before the run did."""
        with self._lock:
            if not self.cause:
                self._show_pending()

    def _show_pending(self) -> None:
        step, self._pending = self._pending, None
        if step is None:
            return
        stats = [f"{label} {self._stats[stat]:{form}}" for label, (stat, form) in self.shown.items()
                 if stat in self._stats]  # fmt: skip
        left = seconds_left(self.finished, self.total)
        if left is not None and step < self.total:
            stats.append(f"about {duration(left)} left")
        if shown_step(step, self.total, self.lines):
            print(f"[{self.name}] Train step {step}/{self.total} done" + (": " + ", ".join(stats) if stats else ""),
                  flush=True)  # fmt: skip
        if len(self.finished) == self.estimate_after and left is not None and step < self.total:
            elapsed = self.finished[step] - self.started
            first = min(self.finished)
            pace = (self.finished[step] - self.finished[first]) / (step - first)
            print(f"[{self.name}] expected on this machine: about {duration(elapsed + left)} for all {self.total} "
                  f"steps ({duration(self.finished[first] - self.started)} to the first, start-up included, "
                  f"then {pace:.1f} s a step)", flush=True)  # fmt: skip

    def guard(self, stop: threading.Event, poll: float = 1.0) -> None:
        """Until `stop` is set (the run's, which run_trainer sets when the run ends): set it,
        cause printed first, once the run must stop (stop_cause). Run it in a thread."""
        while not stop.wait(poll):
            last = self.finished[self.last_step] if self.finished else None
            if cause := stop_cause(time.monotonic(), self.started, last, self.stall_limit, self.time_limit,
                                    self.first_step_limit):
                with self._lock:
                    self.cause = cause
                    stop.set()
                    steps = f"after step {self.last_step} of {self.total}" if self.finished else "before its first step"
                    print(f"[demo] stopped: {cause}, {steps}; stopping the run (what its processes print about "
                          "the stop goes to the log only)", flush=True)  # fmt: skip
                return
