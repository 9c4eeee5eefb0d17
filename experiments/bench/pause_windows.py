"""How long the dev server sat paused for each weight push, how long it then waited for work, and
what it generated, from its log.

    python3 -m experiments.bench.pause_windows LABEL=SERVER_LOG [LABEL=SERVER_LOG ...]

A disk weight push pauses generation on the server, has it load the new folder, and
continues (areal_patches/pause_at_load.py says when). The dev server logs each of those and
every finished batch with its timestamp, so its log alone tells how long each push kept
generation paused, how long the server then sat idle before its next batch (interrupted
rollouts wait for the trainer's resume: areal_patches/resume_poll.py), what share of the run it
was busy, and how many tokens it generated. A log is the dev server's
own (`experiments/learning_run.py`'s `server.log`) or a run's `rollout.log` (lines may carry a
`[rollout] ` prefix). A single controller's rollout log also holds the worker's lines, so the
table counts its completion posts that timed out, the mark of the push stall that
areal_patches/callback_pool.py fixes. Prints one Markdown row per log.
"""

from __future__ import annotations

import argparse
import re
import statistics
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

STAMP = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) dev_server\[\d+\] INFO "
PAUSED = re.compile(STAMP + r"generation paused")
CONTINUED = re.compile(STAMP + r"generation continued")
BATCH = re.compile(STAMP + r"batch .*?new_tokens=(\d+) .*? ([\d.]+)s [\d.]+ tok/s finish=(\S+)")
ANY = re.compile(STAMP)
CALLBACK_TIMED_OUT = re.compile(r"Callback to \S+ failed: .*Read timed out")


@dataclass
class ServerLog:
    pauses: list[float]  # seconds from each "paused" to the next "continued"
    idle_after: list[float]  # seconds from each such "continued" to the start of the next batch
    busy_seconds: float  # the batches' own seconds, summed
    output_tokens: int
    aborted: int  # requests cut short by a pause or an abort (AReaL resubmits them)
    seconds: float  # from the first timestamped line to the last
    callbacks_timed_out: int  # a worker's "Callback to ... failed: ... Read timed out" lines


def when(stamp: str) -> datetime:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f")


def read_server_log(text: str) -> ServerLog:
    """The pause windows and the generation of one dev server log, and the timed-out posts
    of the rollout worker whose lines share it. A batch is logged when it ends, with its
    seconds: it started that long before its line."""
    pauses, idle_after, tokens, aborted, busy, stamps, timed_out = [], [], 0, 0, 0.0, [], 0
    paused_at = continued_at = None
    for line in text.splitlines():
        timed_out += bool(CALLBACK_TIMED_OUT.search(line))
        if not (any_match := ANY.search(line)):
            continue
        stamps.append(when(any_match.group(1)))
        if m := PAUSED.search(line):
            paused_at = paused_at or when(m.group(1))
        elif (m := CONTINUED.search(line)) and paused_at is not None:
            continued_at = when(m.group(1))
            pauses.append((continued_at - paused_at).total_seconds())
            paused_at = None
        elif m := BATCH.search(line):
            tokens += int(m.group(2))
            busy += float(m.group(3))
            aborted += sum(int(n) for kind, n in (part.split(":") for part in m.group(4).split(",")) if kind == "abort")
            if continued_at is not None:
                started = (when(m.group(1)) - continued_at).total_seconds() - float(m.group(3))
                idle_after.append(max(started, 0.0))
                continued_at = None
    seconds = (stamps[-1] - stamps[0]).total_seconds() if stamps else 0.0
    return ServerLog(pauses, idle_after, busy, tokens, aborted, seconds, timed_out)


def table(logs: dict[str, ServerLog]) -> str:
    rows = [
        "| run | pushes | paused per push, median (s) | max (s) | paused in all (s) | idle after a continue, median (s) | busy share of span | log span (s) | output tokens | tokens/s of span | requests aborted | callbacks timed out |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for label, log in logs.items():
        median = statistics.median(log.pauses) if log.pauses else 0.0
        peak = max(log.pauses, default=0.0)
        rate = log.output_tokens / log.seconds if log.seconds else 0.0
        idle = statistics.median(log.idle_after) if log.idle_after else 0.0
        busy = log.busy_seconds / log.seconds if log.seconds else 0.0
        rows.append(f"| {label} | {len(log.pauses)} | {median:.3f} | {peak:.3f} | {sum(log.pauses):.1f} | {idle:.3f} | {busy:.0%} | "
                    f"{log.seconds:.0f} | {log.output_tokens:,} | {rate:,.0f} | {log.aborted:,} | {log.callbacks_timed_out} |")  # fmt: skip
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="+", metavar="LABEL=SERVER_LOG")
    args = parser.parse_args(argv)
    logs = {}
    for item in args.logs:
        label, sep, path = item.partition("=")
        if not sep or not Path(path).is_file():
            parser.error(f"{item!r}: give LABEL=PATH, PATH a dev server log that exists")
        logs[label] = read_server_log(Path(path).read_text(errors="replace"))
    print(table(logs))


if __name__ == "__main__":
    main()
