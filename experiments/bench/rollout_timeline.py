"""What the trainer and its rollout client were doing while the dev server sat idle, from a run's logs.

    python3 -m experiments.bench.rollout_timeline LABEL=RUN_FOLDER [LABEL=RUN_FOLDER ...]

RUN_FOLDER is a run's work folder (`experiments/learning_run.py`'s or
`experiments/time_to_accuracy.py`'s `--work`: the dev server's `server.log` beside the
trainer's `train.log`) or a CPU demo's `--run-dir` (one `train.log` holds both), best made with
`--set rollout.enable_rollout_tracing=true`; a run without it gets the gaps and the trainer's
phases, and "-" where the client's doings would be. With it
AReaL's dispatcher logs every rollout it enqueues (only `prepare_batch` does, while the trainer
waits in it), submits (once the staleness bound and the pause allow) and its task runner starts,
each with the dispatcher's counts. The server's idle gaps are pause_windows' (over 0.3 s between
two batches: it had nothing to run). For each gap this finds the trainer's phase at its middle
(waiting for rollouts: from the end of a step to the next step's advantages; otherwise training
or pushing) and what the client did before the gap ended. Prints one Markdown row per run:
- gaps while the trainer trained or pushed, and while it waited for rollouts;
- of the latter, how many saw no rollout enqueued before they ended, and for the others the
  median seconds from the gap's start to the first enqueue, from there to the first start, and
  from that start to the gap's end (the server's next batch);
- the dispatcher's counts at the gaps' middles (medians; its lines come a few milliseconds
  after the server's): rollouts enqueued and not yet submitted, and running; and in how many
  gaps rollouts were enqueued and none running:
  the dispatcher held them (AReaL's staleness bound, `rollout.max_head_offpolicyness`, or the
  trainer's pause for a push), since an enqueued rollout starts within milliseconds otherwise.
Where the dev server ran with `--log-level DEBUG` (`DEV_SERVER_ARGS="--log-level DEBUG"`), a
second table gives the median and the largest, over the steps, of the seconds from the first
rollout the runner started after a step to the first request that reached the server: the time
a rollout spends in the client before the server sees it.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from experiments.bench import labelled
from experiments.bench.pause_windows import median, read_server_log, when

AREAL_STAMP = r"\(AReaL\) (\d{8}-\d\d:\d\d:\d\d\.\d{3}) "
COUNTS = re.compile(AREAL_STAMP + r".*?(Enqueue|Submit|Finish and accept|Finish but reject) rollout\. enqueued: (\d+), running: (\d+), "
                                  r"accepted: (\d+), rejected: (\d+)")
STARTED = re.compile(AREAL_STAMP + r".*AsyncTaskRunner: Submitted task")
STEP_DONE = re.compile(AREAL_STAMP + r".*Train step \d+/\d+ done")
ADVANTAGES = re.compile(AREAL_STAMP + r".*Memory-Usage compute advantages")
ARRIVED = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) dev_server\[\d+\] DEBUG request \S+ arrived")


def areal_time(stamp: str) -> datetime:
    return datetime.strptime(stamp, "%Y%m%d-%H:%M:%S.%f")


@dataclass
class Gap:
    start: datetime
    end: datetime
    waiting: bool  # the trainer was waiting for rollouts at the gap's middle
    first_enqueue: datetime | None  # the first rollout enqueued in the gap
    first_start: datetime | None  # the first rollout the task runner started after that, in the gap
    pending: int  # the dispatcher's counts at the gap's middle: enqueued, not yet submitted
    running: int


def read_run(server_log: str, train_log: str) -> list[Gap]:
    """Each idle gap of the server with the trainer's phase and the client's doings in it."""
    counts, enqueued, started, marks = [], [], [], []
    for line in train_log.splitlines():
        if m := COUNTS.search(line):
            t = areal_time(m.group(1))
            counts.append((t, int(m.group(3)), int(m.group(4))))
            if m.group(2) == "Enqueue":
                enqueued.append(t)
        elif m := STARTED.search(line):
            started.append(areal_time(m.group(1)))
        elif m := STEP_DONE.search(line):
            marks.append((areal_time(m.group(1)), True))  # from here the trainer waits for rollouts
        elif m := ADVANTAGES.search(line):
            marks.append((areal_time(m.group(1)), False))
    gaps = []
    for start, end in read_server_log(server_log).idle_gaps:
        middle = start + (end - start) / 2
        before = [waiting for t, waiting in marks if t <= middle]
        state = [(pending, running) for t, pending, running in counts if t <= middle]
        first_enqueue = next((t for t in enqueued if start <= t < end), None)
        first_start = next((t for t in started if first_enqueue is not None and first_enqueue <= t < end), None)
        pending, running = state[-1] if state else (0, 0)
        gaps.append(Gap(start, end, before[-1] if before else True, first_enqueue, first_start, pending, running))
    return gaps


def request_lags(server_log: str, train_log: str) -> list[float]:
    """For each step but the last: seconds from the first rollout the runner started after the
    step ended to the first request that reached the server after that (the dev server's
    `--log-level DEBUG` lines), when both came before the next step ended."""
    arrivals = [when(m.group(1)) for m in ARRIVED.finditer(server_log)]
    started = [areal_time(m.group(1)) for m in STARTED.finditer(train_log)]
    ends = [areal_time(m.group(1)) for m in STEP_DONE.finditer(train_log)]
    lags = []
    for end, next_end in zip(ends, ends[1:]):
        start = next((t for t in started if end <= t < next_end), None)
        arrival = next((t for t in arrivals if start is not None and start <= t < next_end), None)
        if arrival is not None:
            lags.append((arrival - start).total_seconds())
    return lags


def summary(gaps: list[Gap]) -> dict:
    waiting = [g for g in gaps if g.waiting]
    fed = [g for g in waiting if g.first_enqueue is not None]
    started = [g for g in fed if g.first_start is not None]

    def seconds(gs: list[Gap]) -> float:
        return sum((g.end - g.start).total_seconds() for g in gs)

    return {
        "gaps": len(gaps), "idle_s": round(seconds(gaps), 1),
        "training_gaps": len(gaps) - len(waiting), "training_idle_s": round(seconds(gaps) - seconds(waiting), 1),
        "waiting_gaps": len(waiting), "waiting_idle_s": round(seconds(waiting), 1),
        "waiting_gaps_nothing_enqueued": len(waiting) - len(fed),
        "to_first_enqueue_median_s": round(median([(g.first_enqueue - g.start).total_seconds() for g in fed]), 3),
        "enqueue_to_start_median_s": round(median([(g.first_start - g.first_enqueue).total_seconds() for g in started]), 3),
        "start_to_gap_end_median_s": round(median([(g.end - g.first_start).total_seconds() for g in started]), 3),
        "pending_in_gap_median": median([g.pending for g in gaps]),
        "running_in_gap_median": median([g.running for g in gaps]),
        "held_gaps": sum(g.pending > 0 and g.running == 0 for g in gaps),
    }  # fmt: skip


def table(runs: dict[str, tuple[list[Gap], bool]]) -> str:
    """One row a run; `runs` maps a label to its gaps and whether the run was traced."""
    rows = ["| run | idle gaps | idle (s) | while training or pushing: gaps | s | while waiting for rollouts: gaps | s "
            "| of those, none enqueued before the gap ended | gap start to first enqueue, median (s) "
            "| first enqueue to first start, median (s) | first start to the gap's end, median (s) | in a gap, median: enqueued not submitted | running | gaps with rollouts enqueued, none running |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for label, (gaps, traced) in runs.items():
        f = summary(gaps)
        client = (f"| {f['waiting_gaps_nothing_enqueued']} | {f['to_first_enqueue_median_s']:.3f} "
                  f"| {f['enqueue_to_start_median_s']:.3f} | {f['start_to_gap_end_median_s']:.3f} "
                  f"| {f['pending_in_gap_median']:g} | {f['running_in_gap_median']:g} | {f['held_gaps']} |"
                  if traced else "| - | - | - | - | - | - | - |")  # fmt: skip
        rows.append(f"| {label} | {f['gaps']} | {f['idle_s']:.1f} | {f['training_gaps']} | {f['training_idle_s']:.1f} "
                    f"| {f['waiting_gaps']} | {f['waiting_idle_s']:.1f} {client}")  # fmt: skip
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="LABEL=RUN_FOLDER",
                        type=labelled("a run's folder with its train.log", inside="train.log"))
    args = parser.parse_args(argv)
    runs, lags = {}, {}
    for label, folder in args.runs:
        server_log, train_log = folder / "server.log", folder / "train.log"
        trainer = train_log.read_text(errors="replace")
        traced = bool(COUNTS.search(trainer))
        if not traced:
            print(f"{train_log}: no rollout tracing lines (rollout.enable_rollout_tracing=true): "
                  "the client's columns are left empty", file=sys.stderr)
        server = server_log.read_text(errors="replace") if server_log.is_file() else trainer
        runs[label] = read_run(server, trainer), traced
        lags[label] = request_lags(server, trainer)
    print(table(runs))
    if any(lags.values()):
        print("\n| run | steps | a step's first rollout started to its first request at the server, median (s) | max (s) |")
        print("|---|---|---|---|")
        for label, values in lags.items():
            if values:
                print(f"| {label} | {len(values)} | {median(values):.3f} | {max(values):.3f} |")


if __name__ == "__main__":
    main()
