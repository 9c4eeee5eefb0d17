"""experiments/bench/rollout_dispatch: AReaL's real dispatcher, RemoteSGLangEngine and
train.CountDownWorkflow against the dev server (standing in for SGLang), with the trainer's
update and push replaced by a sleep; which groups dynamic sampling drops is a fixed draw."""

import subprocess
import sys
import threading
import time

import pytest
import torch

from devkit import ROOT
from experiments.bench import hold_the_interpreter
from experiments.bench.rollout_dispatch import kept, timing_rounds


def group(prompt: list[int], completion: list[int], padding: int = 0) -> dict:
    """Two episodes, right-padded as AReaL concatenates a group: padding has loss mask 0 too."""
    ids = torch.tensor([prompt + completion + [0] * padding] * 2)
    mask = torch.tensor([[0] * len(prompt) + [1] * len(completion) + [0] * padding] * 2)
    return {"input_ids": ids, "loss_mask": mask}


def test_the_draw_depends_on_the_prompt_alone_and_keeps_about_the_share_asked():
    prompts = [[7, i, i * 3 % 101, 5] for i in range(2000)]
    draws = [kept(0.6, group(p, [1, 2, 3])) for p in prompts]
    assert draws == [kept(0.6, group(p, [9, 9], padding=i % 5)) for i, p in enumerate(prompts)]  # what the model wrote and the padding play no part
    assert 0.55 < sum(draws) / len(draws) < 0.65
    assert not any(kept(0.0, group(p, [1])) for p in prompts[:50]) and all(kept(1.0, group(p, [1])) for p in prompts[:50])


def test_each_round_is_timed_and_a_round_that_ran_out_is_marked_and_still_raises():
    class Dispatcher:
        def wait_results(self, count, timeout=None, raise_timeout=True):
            if count > 1:
                raise TimeoutError("too few")
            return [None]

    dispatcher, rounds = Dispatcher(), []
    timing_rounds(dispatcher, rounds)
    assert dispatcher.wait_results(1, timeout=1) == [None]
    with pytest.raises(TimeoutError):
        dispatcher.wait_results(2, timeout=1)
    assert [ran_out for _, ran_out in rounds] == [False, True] and all(seconds >= 0 for seconds, _ in rounds)


def test_a_busy_trainer_runs_python_for_its_seconds_while_other_threads_still_get_turns():
    ticks, stop = [], threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.001)

    other = threading.Thread(target=tick)
    other.start()
    started = time.perf_counter()
    hold_the_interpreter(0.3)
    elapsed = time.perf_counter() - started
    stop.set()
    other.join()
    assert 0.3 <= elapsed < 1.0
    assert ticks  # the lock is given up at the switch interval, not held for the whole call


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_the_bench_fills_every_batch_and_reads_the_servers_log(tiny_model_dir, tmp_path):
    run = subprocess.run([sys.executable, "-m", "experiments.bench.rollout_dispatch", "--model", str(tiny_model_dir),
                          "--steps", "3", "--groups", "3", "--group-size", "2", "--max-new", "8", "--accept", "0.5",
                          "--train-seconds", "0.1", "--work", str(tmp_path), "--label", "toy"],
                         cwd=ROOT, capture_output=True, text=True, timeout=280)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert [line.split(":")[0] for line in run.stdout.splitlines() if line.startswith("step ")] == [
        "step 1/3", "step 2/3", "step 3/3"]
    row = next(line for line in run.stdout.splitlines() if line.startswith("| toy "))
    cells = row.strip("| ").split(" | ")
    assert cells[1] == "2" and float(cells[2]) > 0 and float(cells[4]) >= 1  # steps 2-3 timed, a round at least
    assert float(cells[7]) >= 3 * 2  # at least a batch of episodes started each step
    assert (tmp_path / "server.log").is_file() and (tmp_path / "result.json").is_file()


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_a_dead_server_ends_the_bench_with_one_line(tiny_model_dir, tmp_path):
    import psutil

    err_path = tmp_path / "stderr.txt"  # a file, not a pipe: the client's retry warnings would fill one
    with err_path.open("w") as err:
        bench = subprocess.Popen([sys.executable, "-m", "experiments.bench.rollout_dispatch", "--model",
                                  str(tiny_model_dir), "--steps", "1000", "--groups", "3", "--group-size", "2",
                                  "--max-new", "8", "--train-seconds", "0.1", "--work", str(tmp_path / "work")],
                                 cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True)  # fmt: skip
        try:
            for line in bench.stdout:  # AReaL logs to stdout too
                if line.startswith("step 1/1000"):  # the server has answered
                    break
            servers = [p for p in psutil.Process(bench.pid).children(recursive=True)
                       if "devkit.dev_server" in " ".join(p.cmdline())]
            assert len(servers) == 1
            servers[0].kill()
            bench.stdout.read()
            bench.wait(timeout=120)  # the grace is 30 s
        finally:
            bench.kill()
    last = err_path.read_text().rstrip().splitlines()[-1]
    assert bench.returncode == 1
    assert last.startswith("rollout_dispatch: the dev server at ") and str(tmp_path / "work" / "server.log") in last
