"""Where a py-spy profile's samples went: by process and thread, and below one frame.

    py-spy record -r 50 --threads --subprocesses --nonblocking -f raw -o PROFILE -- python3 -m ...
    python3 -m experiments.bench.profile_threads PROFILE [--rate 50]
    python3 -m experiments.bench.profile_threads PROFILE --process train.py --thread MainThread \
        --below PPOTrainer.train [--depth 1]

py-spy's raw format is one line per distinct stack, `process ...;thread (id): name;frame;...;frame
COUNT`, the outermost frame first, and with `--subprocesses` every process from the one started
up to the one sampled. The first form prints the samples and seconds (samples / --rate) of each
process (the last one named on its lines, its command cut to 80 characters) and thread; the
second those of the frames called directly (or --depth calls down) from the first frame that
contains --below, in the process and thread whose names contain --process and --thread. A
stack counts once below a frame however often the frame recurs in it. py-spy samples a thread
only while it runs, so a thread waiting for a lock or a result has no samples: seconds here are
time spent running Python (or native code under it), not time spent waiting.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

LINE = re.compile(r"^(.*) (\d+)$")
THREAD_ID = re.compile(r"^thread \(\d+\):? ?")


@dataclass(frozen=True)
class Stack:
    process: str  # the sampled process: the last `process ...` part of the line
    thread: str  # the thread's name, its id left out ("" when py-spy gave none)
    frames: tuple[str, ...]  # outermost first
    samples: int


def read_stack(line: str) -> Stack | None:
    """One line of py-spy's raw output, or None for a line that is not one."""
    m = LINE.match(line.rstrip("\n"))
    if not m:
        return None
    parts = m.group(1).split(";")
    processes = [p for p in parts if p.startswith("process ")]
    threads = [p for p in parts if p.startswith("thread ")]
    frames = tuple(p for p in parts if not p.startswith(("process ", "thread ")))
    if not processes:
        return None
    thread = THREAD_ID.sub("", threads[0]) if threads else ""
    return Stack(processes[-1][len("process "):], thread, frames, int(m.group(2)))


def read_profile(path: Path) -> list[Stack]:
    with path.open(errors="replace") as f:
        return [s for s in map(read_stack, f) if s is not None]


def by_thread(stacks: list[Stack]) -> Counter:
    """Samples per (process, thread)."""
    counts: Counter = Counter()
    for s in stacks:
        counts[(s.process, s.thread)] += s.samples
    return counts


def below(stacks: list[Stack], frame: str, process: str = "", thread: str = "", depth: int = 1) -> Counter:
    """Samples per call path of `depth` frames under the first frame containing `frame`, in the
    matching process and thread; "(in the frame itself)" for samples taken in that frame."""
    counts: Counter = Counter()
    for s in stacks:
        if process not in s.process or thread not in s.thread:
            continue
        at = next((i for i, f in enumerate(s.frames) if frame in f), None)
        if at is None:
            continue
        path = s.frames[at + 1:at + 1 + depth]
        counts[" > ".join(path) if path else "(in the frame itself)"] += s.samples
    return counts


def table(counts: Counter, rate: float, head: str, top: int) -> str:
    rows = [f"| {head} | samples | seconds |", "|---|---|---|"]
    total = sum(counts.values())
    rows.append(f"| all | {total} | {total / rate:.1f} |")
    for key, n in counts.most_common(top):
        rows.append(f"| {key} | {n} | {n / rate:.1f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profile", type=Path, help="py-spy record -f raw output")
    parser.add_argument("--rate", type=float, default=50.0, help="the samples a second it was recorded at (-r)")
    parser.add_argument("--below", help="a frame, e.g. PPOTrainer.train: what ran below it")
    parser.add_argument("--process", default="", help="with --below: part of the process's command")
    parser.add_argument("--thread", default="", help="with --below: part of the thread's name")
    parser.add_argument("--depth", type=int, default=1, help="with --below: frames of each call path shown")
    parser.add_argument("--top", type=int, default=20, help="rows shown")
    args = parser.parse_args(argv)
    if not args.profile.is_file():
        parser.error(f"{args.profile}: no such file (py-spy record -f raw -o writes it)")
    stacks = read_profile(args.profile)
    if not stacks:
        parser.error(f"{args.profile}: no py-spy raw lines (record with -f raw)")
    if args.below:
        print(table(below(stacks, args.below, args.process, args.thread, args.depth), args.rate,
                    f"below {args.below}", args.top))
    else:
        counts = Counter({f"{proc[:80]} / {thread or '-'}": n for (proc, thread), n in by_thread(stacks).items()})
        print(table(counts, args.rate, "process / thread", args.top))


if __name__ == "__main__":
    main()
