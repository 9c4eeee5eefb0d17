"""profile_threads reads py-spy's raw output: samples by process and thread, and below a frame."""

import pytest

from experiments.bench import profile_threads

RAW = """\
process 1:"python3 -m experiments.time_to_accuracy";process 7:"python3 -u train.py";thread (7): MainThread;main (train.py:180);PPOTrainer.train (rl_trainer.py:611);FSDPEngine.prepare_batch (fsdp_engine.py:602);all_gather (c10d.py:4079) 30
process 1:"python3 -m experiments.time_to_accuracy";process 7:"python3 -u train.py";thread (7): MainThread;main (train.py:180);PPOTrainer.train (rl_trainer.py:611);FSDPEngine.prepare_batch (fsdp_engine.py:602);broadcast (c10d.py:2968) 10
process 1:"python3 -m experiments.time_to_accuracy";process 7:"python3 -u train.py";thread (7): MainThread;main (train.py:180);PPOTrainer.train (rl_trainer.py:611);ppo_update (actor.py:254) 25
process 1:"python3 -m experiments.time_to_accuracy";process 7:"python3 -u train.py";thread (7): MainThread;main (train.py:180);PPOTrainer.train (rl_trainer.py:611) 5
process 1:"python3 -m experiments.time_to_accuracy";process 7:"python3 -u train.py";thread (9): Thread-1 (_run_thread);arun_episode (train.py:70);PPOTrainer.train (fake.py:1) 8
process 1:"python3 -m experiments.time_to_accuracy";process 8:"python3 -m devkit.dev_server";thread (8): generation-worker;_loop (scheduler.py:140) 40
process 1:"python3 -m experiments.time_to_accuracy";thread (1) 2
not a stack line
"""


@pytest.fixture
def stacks(tmp_path):
    path = tmp_path / "profile.txt"
    path.write_text(RAW)
    return profile_threads.read_profile(path)


def test_each_stack_is_its_sampled_process_thread_and_frames(stacks):
    assert len(stacks) == 7
    first = stacks[0]
    assert first.process == '7:"python3 -u train.py"' and first.thread == "MainThread" and first.samples == 30
    assert first.frames[0] == "main (train.py:180)" and first.frames[-1] == "all_gather (c10d.py:4079)"
    assert stacks[-1].thread == "" and stacks[-1].frames == ()


def test_samples_by_process_and_thread(stacks):
    counts = profile_threads.by_thread(stacks)
    assert counts[('7:"python3 -u train.py"', "MainThread")] == 70
    assert counts[('7:"python3 -u train.py"', "Thread-1 (_run_thread)")] == 8
    assert counts[('8:"python3 -m devkit.dev_server"', "generation-worker")] == 40
    assert sum(counts.values()) == 120


def test_below_a_frame_in_one_thread(stacks):
    counts = profile_threads.below(stacks, "PPOTrainer.train", process="train.py", thread="MainThread")
    assert counts == {"FSDPEngine.prepare_batch (fsdp_engine.py:602)": 40, "ppo_update (actor.py:254)": 25,
                      "(in the frame itself)": 5}
    deeper = profile_threads.below(stacks, "prepare_batch", thread="MainThread", depth=2)
    assert deeper == {"all_gather (c10d.py:4079)": 30, "broadcast (c10d.py:2968)": 10}
    everywhere = profile_threads.below(stacks, "PPOTrainer.train")
    assert sum(everywhere.values()) == 78  # the rollout thread's frame of that name counts without --thread


def test_the_command_prints_seconds_at_the_rate(tmp_path, capsys):
    path = tmp_path / "profile.txt"
    path.write_text(RAW)
    profile_threads.main([str(path), "--rate", "10", "--process", "train.py", "--thread", "MainThread",
                          "--below", "PPOTrainer.train"])
    out = capsys.readouterr().out
    assert "| all | 70 | 7.0 |" in out and "| FSDPEngine.prepare_batch (fsdp_engine.py:602) | 40 | 4.0 |" in out


def test_a_file_without_stacks_is_one_clear_error(tmp_path, capsys):
    path = tmp_path / "profile.svg"
    path.write_text("<svg></svg>\n")
    with pytest.raises(SystemExit):
        profile_threads.main([str(path)])
    assert "no py-spy raw lines (record with -f raw)" in capsys.readouterr().err


def test_a_missing_file_is_one_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        profile_threads.main([str(tmp_path / "profile.txt")])
    assert "profile.txt: no such file (py-spy record -f raw -o writes it)" in capsys.readouterr().err
