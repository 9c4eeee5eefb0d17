"""devkit/processes.py's SIGTERM helper, in a process of its own: the exception it raises, and
a second SIGTERM that does not cut the clean-up short."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from devkit import ROOT

# Prints "ready", then waits in the block; its clean-up prints "cleaning", waits for a second
# SIGTERM's chance to land, then prints "cleaned".
SCRIPT = textwrap.dedent("""
    import sys, time
    from devkit.processes import sigterm_raises
    exception = KeyboardInterrupt if sys.argv[1] == "interrupt" else SystemExit(143)
    with sigterm_raises(exception):
        try:
            print("ready", flush=True)
            time.sleep(60)
        finally:
            print("cleaning", flush=True)
            time.sleep(1)
            print("cleaned", flush=True)
""")


@pytest.mark.parametrize("how, status", [("interrupt", -signal.SIGINT), ("exit", 143)])
def test_sigterm_raises_once_and_the_clean_up_runs_to_its_end(how, status):
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, how], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, cwd=ROOT)  # fmt: skip
    try:
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGTERM)
        assert proc.stdout.readline() == "cleaning\n"
        proc.send_signal(signal.SIGTERM)  # ignored: the clean-up goes on
        assert proc.stdout.read() == "cleaned\n"
        assert proc.wait(timeout=30) == status
    finally:
        proc.kill()
