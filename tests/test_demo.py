"""The CPU demo (`make demo`) as a user runs it: outputs, summary, and clean interruption."""

import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(600)


def processes_mentioning(path: Path) -> str:
    return subprocess.run(["pgrep", "-af", str(path)], capture_output=True, text=True).stdout.strip()


def test_demo_trains_plots_and_summarises(start_demo, tmp_path):
    run_dir = tmp_path / "demo"
    proc = start_demo(run_dir, "--steps", "2")
    output, _ = proc.communicate(timeout=580)
    assert proc.returncode == 0, output[-3000:]
    assert "Train step 2/2 done" in output  # the run's real total
    summary, evaluate = output.strip().splitlines()[-2:]
    assert summary.startswith("[demo] done in") and "2 steps" in summary and "eval pass@1" in summary
    model = Path(re.search(r"evaluate.py --model (\S+) --data", evaluate)[1])
    assert (model / "config.json").exists() and list(model.glob("*.safetensors"))
    assert (run_dir / "curves.png").read_bytes().startswith(b"\x89PNG")
    assert "rollout/reward" in (run_dir / "curves.csv").read_text().splitlines()[0]
    assert list(run_dir.glob("checkpoints/*/*/*/default/recover_checkpoint/*"))
    assert "\x1b[" not in (run_dir / "train.log").read_text()  # AReaL's colours stay off the file
    assert processes_mentioning(run_dir) == ""


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_interrupted_demo_leaves_no_process_behind_and_keeps_the_previous_run(start_demo, tmp_path, stop):
    """Ctrl-C, or SIGTERM as `kill` and `timeout` send it: the trainer runs in a session of its
    own, so only the demo's clean-up can stop it."""
    run_dir = tmp_path / "demo"
    run_dir.mkdir()
    previous = run_dir / "curves.png"
    previous.write_bytes(b"the previous run's picture")
    proc = start_demo(run_dir, "--steps", "50")
    deadline = time.time() + 500
    for line in proc.stdout:
        if "Train step 1/" in line or time.time() > deadline:
            break
    assert processes_mentioning(run_dir), "trainer and server should be running now"
    proc.send_signal(stop)
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, rest[-2000:]
    assert "interrupted; all processes stopped" in rest
    time.sleep(2)
    assert processes_mentioning(run_dir) == ""
    assert previous.read_bytes() == b"the previous run's picture"
