"""experiments/bench/rollout_timeline: the dev server's idle gaps, each with the trainer's phase
at its middle and what AReaL's rollout client logged in it (its rollout tracing lines), read from
a run folder's server.log and train.log in the formats the dev server and AReaL 1.0.4 write."""

from experiments.bench.rollout_timeline import main, read_run, request_lags, summary

SERVER_LOG = """\
2026-12-05 06:00:01,000 dev_server[7] INFO batch n=8 rows_max=8 prompt_max=9 new_tokens=80 steps=10 1.00s 80 tok/s finish=stop:8 v=0 queued=0
2026-12-05 06:00:03,000 dev_server[7] INFO batch n=8 rows_max=8 prompt_max=9 new_tokens=80 steps=10 0.50s 160 tok/s finish=stop:8 v=1 queued=0
2026-12-05 06:00:03,100 dev_server[7] INFO batch n=2 rows_max=2 prompt_max=9 new_tokens=8 steps=4 0.05s 160 tok/s finish=stop:2 v=1 queued=0
2026-12-05 06:00:05,000 dev_server[7] INFO batch n=8 rows_max=8 prompt_max=9 new_tokens=80 steps=10 0.20s 400 tok/s finish=stop:8 v=1 queued=0
"""
TRAIN_LOG = """\
(AReaL) 20261205-06:00:00.500 [RemoteInfEngine Rank 0] INFO: Enqueue rollout. enqueued: 3, running: 5, accepted: 0, rejected: 0.
(AReaL) 20261205-06:00:00.900 IOStruct INFO: Memory-Usage compute advantages: memory allocated (GB): 0.45
(AReaL) 20261205-06:00:01.500 [RemoteInfEngine Rank 0] INFO: Submit rollout. enqueued: 2, running: 6, accepted: 1, rejected: 0.
(AReaL) 20261205-06:00:02.800 StatsLogger INFO: Epoch 1/1 Step 1/9 Train step 1/9 done.
(AReaL) 20261205-06:00:03.400 [RemoteInfEngine Rank 0] INFO: Enqueue rollout. enqueued: 1, running: 0, accepted: 8, rejected: 2.
(AReaL) 20261205-06:00:03.410 [RemoteInfEngine Rank 0] INFO: AsyncTaskRunner: Submitted task 9. Running: 1
"""


def test_each_gap_gets_the_trainers_phase_and_what_the_client_did_in_it():
    gaps = read_run(SERVER_LOG, TRAIN_LOG)
    # 1.0 -> 2.5 s while the trainer trained (its advantages at 0.9 s); 3.1 -> 4.8 s while it
    # waited for rollouts (its step done at 2.8 s), each at the gap's middle; the 0.05 s between 3.0 and 3.05 is no gap
    assert [(g.waiting, round((g.end - g.start).total_seconds(), 3)) for g in gaps] == [(False, 1.5), (True, 1.7)]
    # the dispatcher's last counts before each gap's middle (1.75 s, 3.95 s)
    assert (gaps[0].pending, gaps[0].running, gaps[0].first_enqueue) == (2, 6, None)
    assert (gaps[1].pending, gaps[1].running) == (1, 0)
    assert round((gaps[1].first_enqueue - gaps[1].start).total_seconds(), 3) == 0.3
    assert round((gaps[1].first_start - gaps[1].first_enqueue).total_seconds(), 3) == 0.01
    f = summary(gaps)
    assert (f["gaps"], f["idle_s"], f["training_gaps"], f["waiting_gaps"], f["waiting_gaps_nothing_enqueued"]) == (2, 3.2, 1, 1, 0)


def test_one_row_a_run_and_a_run_without_tracing_gets_the_phases_only(tmp_path, capsys):
    (tmp_path / "server.log").write_text(SERVER_LOG)
    (tmp_path / "train.log").write_text(TRAIN_LOG)
    main([f"t={tmp_path}"])
    assert capsys.readouterr().out.splitlines()[-1] == "| t | 2 | 3.2 | 1 | 1.5 | 1 | 1.7 | 0 | 0.300 | 0.010 | 1.390 | 1.5 | 3 | 1 |"
    (tmp_path / "server.log").unlink()  # a CPU demo's run folder: one log holds both
    (tmp_path / "train.log").write_text(SERVER_LOG + TRAIN_LOG)
    main([f"t={tmp_path}"])
    assert capsys.readouterr().out.splitlines()[-1].startswith("| t | 2 | 3.2 | 1 | 1.5 | 1 | 1.7 |")
    untraced = "\n".join(line for line in TRAIN_LOG.splitlines() if "rollout." not in line and "Submitted" not in line)
    (tmp_path / "train.log").write_text(SERVER_LOG + untraced + "\n")
    main([f"t={tmp_path}"])
    out = capsys.readouterr()
    assert out.out.splitlines()[-1] == "| t | 2 | 3.2 | 1 | 1.5 | 1 | 1.7 | - | - | - | - | - | - | - |"
    assert "enable_rollout_tracing=true" in out.err


def test_the_lag_from_a_steps_first_rollout_to_its_first_request_at_the_server(tmp_path, capsys):
    """From the dev server's --log-level DEBUG lines: one lag a step that has a rollout started
    and a request arrived before the next step ended."""
    debug = (
        "2026-12-05 06:00:03,650 dev_server[7] DEBUG request a1 arrived: 9 prompt tokens, at most 10 new\n"
        "2026-12-05 06:00:03,700 dev_server[7] DEBUG request a2 arrived: 9 prompt tokens, at most 10 new\n"
        "2026-12-05 06:00:06,000 dev_server[7] DEBUG request a3 arrived: 9 prompt tokens, at most 10 new\n"
    )
    train = TRAIN_LOG + "(AReaL) 20261205-06:00:05.500 StatsLogger INFO: Epoch 1/1 Step 2/9 Train step 2/9 done.\n"
    assert request_lags(SERVER_LOG + debug, train) == [0.24]  # started 3.41 s, arrived 3.65 s; step 2 has no next step
    assert request_lags(SERVER_LOG, train) == []  # no DEBUG lines: nothing to line up
    (tmp_path / "server.log").write_text(SERVER_LOG + debug)
    (tmp_path / "train.log").write_text(train)
    main([f"t={tmp_path}"])
    assert capsys.readouterr().out.splitlines()[-1] == "| t | 1 | 0.240 | 0.240 |"
