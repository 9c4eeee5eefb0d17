"""How long the dev server sat paused for each weight push, how long it then waited for work, and
what it generated, from its log.

    python3 -m experiments.bench.pause_windows LABEL=SERVER_LOG [LABEL=SERVER_LOG ...]

A disk weight push pauses generation on the server, has it load the new folder, and
continues (areal_patches/pause_at_load.py says when). The dev server logs each of those and
every finished batch with its timestamp, so its log alone tells how long each push kept
generation paused, how long the server then sat idle before its next batch (interrupted
rollouts wait for the trainer's resume: areal_patches/resume_poll.py), what share of the run it
was busy and for how long it sat idle between batches (gaps over 0.3 s: no request had reached
it), how many tokens it generated and in batches of how many rows, and how long its own
load of each push took. A log is the dev server's
own (`experiments/learning_run.py`'s `server.log`) or a run's `rollout.log` (lines may carry a
`[rollout] ` prefix). A single controller's rollout log also holds the worker's lines, so the
table counts its completion posts that timed out, the mark of the push stall that
areal_patches/callback_pool.py fixes, and AReaL's client's line for each load: how long it
waited for the servers, and how long after the trainer's "weights saved" record it saw it.
Beside learning_run's `server.log` the trainer's `train.log` holds those lines, and is read
too. Prints one Markdown row per log.
"""

from __future__ import annotations

import argparse
import re
import statistics
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from experiments.bench import labelled

STAMP = r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) dev_server\[\d+\] INFO "
PAUSED = re.compile(STAMP + r"generation paused")
CONTINUED = re.compile(STAMP + r"generation continued")
BATCH = re.compile(STAMP + r"batch n=(\d+)(?: rows_max=(\d+))? .*?new_tokens=(\d+) .*? ([\d.]+)s [\d.]+ tok/s finish=(\S+)")
LOADED = re.compile(STAMP + r"loaded weights from \S+ in ([\d.]+)s")
ANY = re.compile(STAMP)
# AReaL's inference client, once the servers have loaded a push: from its load request to their
# answer, and ("Respond time") from the trainer's "weights saved" record to the client seeing it.
LOAD_DONE = re.compile(r"Loading weights from disk done in ([\d.]+)s\. Respond time: ([\d.]+)s")
IDLE_GAP_S = 0.3  # an idle stretch between two batches longer than this counts as a gap
CALLBACK_TIMED_OUT = re.compile(r"Callback to \S+ failed: .*Read timed out")


@dataclass
class ServerLog:
    pauses: list[float]  # seconds from each "paused" to the next "continued"
    loads: list[float]  # the server's own seconds for each load of pushed weights
    load_waits: list[float]  # AReaL's client, each push: from its load request to the servers' answer
    record_waits: list[float]  # ... and from the trainer's "weights saved" record to seeing it
    idle_after: list[float]  # seconds from each such "continued" to the start of the next batch
    busy_seconds: float  # the batches' own seconds, summed
    idle_gaps: list[tuple[datetime, datetime]]  # from a batch's end to the next one's start, where over IDLE_GAP_S
    output_tokens: int
    batch_rows: list[int]  # each batch's rows (a continuous one: the most it held at once)
    aborted: int  # requests cut short by a pause or an abort (AReaL resubmits them)
    seconds: float  # from the first timestamped line to the last
    callbacks_timed_out: int  # a worker's "Callback to ... failed: ... Read timed out" lines


def when(stamp: str) -> datetime:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f")


def read_server_log(text: str) -> ServerLog:
    """The pause windows and the generation of one dev server log, and what AReaL's client
    logged in the same text (a single controller's rollout log, or the trainer's log appended):
    its timed-out posts and its waits for each load. A batch is logged when it ends, with its
    seconds: it started that long before its line."""
    pauses, loads, idle_after, rows, tokens, aborted, busy, stamps, timed_out = [], [], [], [], 0, 0, 0.0, [], 0
    load_waits, record_waits, idle_gaps = [], [], []
    paused_at = continued_at = last_end = None
    for line in text.splitlines():
        timed_out += bool(CALLBACK_TIMED_OUT.search(line))
        if done := LOAD_DONE.search(line):
            load_waits.append(float(done.group(1)))
            record_waits.append(float(done.group(2)))
        if not (any_match := ANY.search(line)):
            continue
        stamps.append(when(any_match.group(1)))
        if m := PAUSED.search(line):
            paused_at = paused_at or when(m.group(1))
        elif (m := CONTINUED.search(line)) and paused_at is not None:
            continued_at = when(m.group(1))
            pauses.append((continued_at - paused_at).total_seconds())
            paused_at = None
        elif m := LOADED.search(line):
            loads.append(float(m.group(2)))
        elif m := BATCH.search(line):
            rows.append(int(m.group(3) or m.group(2)))
            tokens += int(m.group(4))
            busy += float(m.group(5))
            end = when(m.group(1))
            start = end - timedelta(seconds=float(m.group(5)))
            if last_end is not None and (start - last_end).total_seconds() > IDLE_GAP_S:
                idle_gaps.append((last_end, start))
            last_end = end
            aborted += sum(int(n) for kind, n in (part.split(":") for part in m.group(6).split(",")) if kind == "abort")
            if continued_at is not None:
                idle_after.append(max((start - continued_at).total_seconds(), 0.0))
                continued_at = None
    seconds = (stamps[-1] - stamps[0]).total_seconds() if stamps else 0.0
    return ServerLog(pauses, loads, load_waits, record_waits, idle_after, busy, idle_gaps, tokens, rows, aborted, seconds,
                     timed_out)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def summary(log: ServerLog) -> dict:
    """A log's figures by name (what the table prints, and what a time-to-accuracy row keeps)."""
    gaps = [(end - start).total_seconds() for start, end in log.idle_gaps]
    return {
        "pushes": len(log.pauses),
        "paused_per_push_median_s": round(median(log.pauses), 3),
        "paused_per_push_max_s": round(max(log.pauses, default=0.0), 3),
        "paused_in_all_s": round(sum(log.pauses), 1),
        "load_median_s": round(median(log.loads), 3),
        "client_load_wait_median_s": round(median(log.load_waits), 3),
        "record_seen_after_median_s": round(median(log.record_waits), 3),
        "idle_after_continue_median_s": round(median(log.idle_after), 3),
        "busy_share": round(log.busy_seconds / log.seconds, 4) if log.seconds else 0.0,
        "idle_gaps": len(gaps),
        "idle_gap_median_s": round(median(gaps), 3),
        "idle_in_gaps_s": round(sum(gaps), 1),
        "span_s": round(log.seconds, 1),
        "output_tokens": log.output_tokens,
        "tokens_per_s": round(log.output_tokens / log.seconds) if log.seconds else 0,
        "batches": len(log.batch_rows),
        "rows_per_batch_median": median(log.batch_rows),
        "requests_aborted": log.aborted,
        "callbacks_timed_out": log.callbacks_timed_out,
    }


def table(logs: dict[str, ServerLog]) -> str:
    rows = [
        "| run | pushes | paused per push, median (s) | max (s) | paused in all (s) | the server's load, median (s) | the client's wait for a load, median (s) | record seen after, median (s) | idle after a continue, median (s) | busy share of span | idle gaps over 0.3 s | their median (s) | idle in them (s) | log span (s) | output tokens | tokens/s of span | batches | rows a batch, median | requests aborted | callbacks timed out |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for label, log in logs.items():
        f = summary(log)
        rows.append(f"| {label} | {f['pushes']} | {f['paused_per_push_median_s']:.3f} | {f['paused_per_push_max_s']:.3f} "
                    f"| {f['paused_in_all_s']:.1f} | {f['load_median_s']:.3f} | {f['client_load_wait_median_s']:.3f} "
                    f"| {f['record_seen_after_median_s']:.3f} | {f['idle_after_continue_median_s']:.3f} "
                    f"| {f['busy_share']:.0%} | {f['idle_gaps']} | {f['idle_gap_median_s']:.3f} | {f['idle_in_gaps_s']:.1f} "
                    f"| {f['span_s']:.0f} | {f['output_tokens']:,} | {f['tokens_per_s']:,} "
                    f"| {f['batches']} | {f['rows_per_batch_median']:g} | {f['requests_aborted']:,} | {f['callbacks_timed_out']} |")  # fmt: skip
    return "\n".join(rows)


def run_logs(server_log: Path, since: int = 0) -> str:
    """A server log's text from byte `since` on, followed by the trainer's log beside it
    (experiments/learning_run.py writes `train.log` next to `server.log`), whose lines name each
    push's waits. The dev server appends to its log, so a run in a folder used before reads its
    own lines from the size the log had when it began."""
    with server_log.open("rb") as log:
        log.seek(since)
        text = log.read().decode(errors="replace")
    trainer_log = server_log.with_name("train.log")
    if trainer_log.is_file() and trainer_log != server_log:
        text += "\n" + trainer_log.read_text(errors="replace")
    return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="+", metavar="LABEL=SERVER_LOG", type=labelled("a dev server log that exists"))
    args = parser.parse_args(argv)
    print(table({label: read_server_log(run_logs(path)) for label, path in args.logs}))


if __name__ == "__main__":
    main()
