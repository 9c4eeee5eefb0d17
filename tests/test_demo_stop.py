"""The demo's stop path, run for real on CPU (`python3 -m devkit.demo --quick`, AReaL's single
controller): a run whose steps stop finishing is stopped by the stall guard and shows what it
reached; a run stopped before its first step has nothing to show.

The stall is forced by suspending the rollout server (SIGSTOP): the dev server, in SGLang's
place, then answers nothing, as a hung server does. `server_health_grace=0` turns off
train.py's own watchdog, which would otherwise stop the run first.
"""

from __future__ import annotations

import csv
import json
import re

import psutil
import pytest
from test_launchers import left_behind, live_processes, wait_for_line

from devkit import demo

pytestmark = [pytest.mark.launchers, pytest.mark.timeout(900)]

# Longer than a step of the quick run on a busy 2-core machine; the start-up and first step
# (75 s measured there) get a wait of their own, so that the stall itself is waited out for
# STALL_LIMIT seconds only.
STALL_LIMIT, FIRST_STEP_LIMIT = 30, 400


def test_a_stalled_run_stops_with_its_cause_first_and_shows_what_it_reached(start_demo, tmp_path):
    before = live_processes()
    run_dir = tmp_path / "run"
    proc = start_demo(run_dir, "--steps", "50", "--stall-limit", str(STALL_LIMIT),
                      "--first-step-limit", str(FIRST_STEP_LIMIT), "server_health_grace=0")  # fmt: skip
    wait_for_line(proc, f"Train step {demo.SAVE_EVERY}/50 done", timeout=600)
    server = next(p for p, cmd in live_processes().items() if "sglang.launch_server" in cmd and str(run_dir) in cmd)
    psutil.Process(server).suspend()
    rest, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, rest[-3000:]
    lines = rest.splitlines()
    stop = next(i for i, line in enumerate(lines) if line.startswith("[demo] stopped: "))
    assert lines[stop].startswith(f"[demo] stopped: no step finished in {STALL_LIMIT} s, after step "), lines[stop]
    # Nothing of the run after the stop (its processes' errors about it), nothing failed before it.
    assert not [line for line in lines[stop:] if line.startswith("[train]")], rest[-3000:]
    assert not [line for line in lines[:stop] if "Traceback" in line or "Error" in line], rest[-3000:]

    summary = next(line for line in lines if line.startswith("[demo] stopped ("))
    match = re.search(r"after \d+ s: (\d+) of 50 steps, .* eval pass@1 \S+ \(the step-(\d+) save\)", summary)
    assert summary.startswith(f"[demo] stopped (no step finished in {STALL_LIMIT} s)") and match, summary
    steps, saved = map(int, match.groups())
    assert steps >= demo.SAVE_EVERY and saved == steps // demo.SAVE_EVERY * demo.SAVE_EVERY, summary
    evaluation = json.loads((run_dir / "eval_last_save" / "eval.json").read_text())
    assert f"globalstep{saved - 1}" in evaluation["config"]["model"], evaluation["config"]
    with open(run_dir / "curves.csv", newline="") as f:
        assert [int(row["step"]) for row in csv.DictReader(f)] == list(range(1, steps + 1))
    assert (run_dir / "curves.png").stat().st_size > 0
    assert "the demo stopped this run (no step finished" in (run_dir / "train.log").read_text()
    assert lines[-1].startswith("[demo] evaluate the trained model: python3 evaluate.py --model ")
    assert left_behind(run_dir, before) == []


def test_a_run_stopped_before_its_first_step_has_nothing_to_show_and_keeps_the_previous_run(start_demo, tmp_path):
    before = live_processes()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    previous = run_dir / "curves.png"
    previous.write_bytes(b"the previous run's picture")
    proc = start_demo(run_dir, "--steps", "50", "--stall-limit", "5")
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, output[-3000:]
    lines = output.splitlines()
    assert "[demo] stopped: no step finished in 5 s, before its first step; stopping the run" in output
    assert lines[-1].startswith("[demo] failed: the training stopped before its first step (no step finished "
                                "in 5 s): nothing to show"), lines[-1]
    assert previous.read_bytes() == b"the previous run's picture"
    assert left_behind(run_dir, before) == []
