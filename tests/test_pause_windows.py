"""experiments/bench/pause_windows: the pause of each weight push, the server's idle after it, and the tokens generated, read from a dev
server log in the format its scheduler and handlers write (static and continuous batches; a run's
rollout.log may prefix them),
and the completion posts that timed out, from the rollout worker's lines in the same log."""

import pytest

from experiments.bench.pause_windows import main, read_server_log, run_logs

LOG = """\
2026-12-01 20:50:00,000 dev_server[7] INFO serving on http://127.0.0.1:7
2026-12-01 20:50:02,500 dev_server[7] INFO batch n=4 prompt_max=9 new_tokens=100 steps=25 0.30s 333 tok/s finish=length:3,stop:1 v=0 queued=0
[rollout] 2026-12-01 20:50:09,785 dev_server[7] INFO generation paused (mode=abort, 2 running requests aborted, 0 queued held)
2026-12-01 20:50:09,900 dev_server[7] INFO batch n=2 prompt_max=9 new_tokens=10 steps=5 0.05s 200 tok/s finish=abort:2 v=0 queued=0
2026-12-01 20:50:10,413 dev_server[7] INFO loaded weights from /w/v1 in 0.62s (weight_version=1, 0 running requests affected, fingerprint=-1.0)
[rollout] 2026-12-01 20:50:10,564 dev_server[7] INFO generation continued (0 queued)
2026-12-01 20:50:11,064 dev_server[7] INFO batch n=2 rows_max=2 prompt_max=9 new_tokens=20 steps=10 0.20s 100 tok/s finish=stop:2 v=1 queued=0
2026-12-01 20:50:20,000 dev_server[7] INFO generation continued (0 queued)
2026-12-01 20:50:44,660 dev_server[7] INFO generation paused (mode=abort, 0 running requests aborted, 0 queued held)
2026-12-01 20:51:46,235 dev_server[7] INFO generation continued (0 queued)
a line from another process
(AReaL) 20261201-20:50:10.600 [RemoteInfEngine Rank 0] INFO: Loading weights from disk done in 0.70s. Respond time: 0.09s.
[rollout] (AReaL) 20261201-20:51:14.661 [BatchTaskDispatcher] ERROR: Callback to http://10.0.0.1:5/callback/rollout_complete failed: HTTPConnectionPool(host='10.0.0.1', port=5): Read timed out. (read timeout=30.0)
(AReaL) 20261201-20:51:50.000 [BatchTaskDispatcher] ERROR: Callback to http://10.0.0.1:5/callback/rollout_complete failed: ('Connection aborted.', ConnectionResetError(104, 'Connection reset by peer'))
"""


def test_each_pause_is_measured_to_its_continue_and_generation_is_counted():
    log = read_server_log(LOG)
    assert log.pauses == pytest.approx([0.779, 61.575])
    assert log.loads == pytest.approx([0.62])
    assert log.batch_rows == [4, 2, 2]  # a continuous batch counts the most rows it held
    assert (log.load_waits, log.record_waits) == ([0.7], [0.09])  # AReaL's client's line  # a continue with no pause before it counts nothing
    assert log.idle_after == pytest.approx([0.3])  # continued at 10.564, the next batch ran 10.864-11.064
    assert log.busy_seconds == pytest.approx(0.55)
    gaps = [(end - start).total_seconds() for start, end in log.idle_gaps]
    assert gaps == pytest.approx([7.35, 0.964])  # 2.5 -> 9.85 and 9.9 -> 10.864: nothing to run
    assert (log.output_tokens, log.aborted) == (130, 2)
    assert log.seconds == pytest.approx(106.235)
    assert log.callbacks_timed_out == 1  # the stall's mark; a reset at the end of a run is not


def test_the_table_has_a_row_per_log_and_a_missing_file_is_refused(tmp_path, capsys):
    (tmp_path / "server.log").write_text(LOG)
    main([f"fix={tmp_path / 'server.log'}"])
    row = capsys.readouterr().out.splitlines()[-1]
    assert row == "| fix | 2 | 31.177 | 61.575 | 62.4 | 0.620 | 0.700 | 0.090 | 0.300 | 1% | 2 | 4.157 | 8.3 | 106 | 130 | 1 | 3 | 2 | 2 | 1 |"
    with pytest.raises(SystemExit) as refused:
        main([f"fix={tmp_path / 'missing.log'}"])
    assert refused.value.code == 2
    assert "missing.log" in capsys.readouterr().err


def test_the_trainer_log_beside_a_server_log_gives_the_clients_waits(tmp_path, capsys):
    client_line = next(line for line in LOG.splitlines() if "Loading weights from disk done" in line)
    (tmp_path / "server.log").write_text(LOG.replace(client_line + "\n", ""))
    main([f"alone={tmp_path / 'server.log'}"])
    (tmp_path / "train.log").write_text(f"(AReaL) a trainer line\n{client_line}\n")
    main([f"beside={tmp_path / 'server.log'}"])
    alone, beside = (line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith(("| alone", "| beside")))
    assert alone[6:8] == ["0.000", "0.000"] and beside[6:8] == ["0.700", "0.090"]
    assert alone[1:6] == beside[1:6] and alone[8:] == beside[8:]


def test_a_run_reads_its_own_lines_of_a_log_that_earlier_runs_appended_to(tmp_path):
    earlier = "2026-12-01 20:40:00,000 dev_server[6] INFO generation paused (mode=abort, 0 running requests aborted, 0 queued held)\n" \
              "2026-12-01 20:40:09,000 dev_server[6] INFO generation continued (0 queued)\n"  # fmt: skip
    log = tmp_path / "server.log"
    log.write_text(earlier + LOG)
    assert read_server_log(run_logs(log)).pauses == pytest.approx([9.0, 0.779, 61.575])
    assert read_server_log(run_logs(log, since=len(earlier.encode()))).pauses == pytest.approx([0.779, 61.575])
