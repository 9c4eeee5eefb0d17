"""The parts of experiments/bench/gpu/train_step.py whose numbers need no GPU to check: the GPU-time
attribution of its --profile table (experiments/bench/gpu/timeline.py), on a hand-made trace, and the
"pad each sequence" attention it times against packed_sdpa; its scaling table, and its rows
on two FSDP ranks, run on CPU."""

import json
import subprocess
import sys

import pytest
import torch

from experiments.bench.gpu import timeline, train_step


def kernel(start: float, end: float, launched: float | None, correlation: int, api: str = "cuda_runtime") -> list[dict]:
    """A GPU kernel and the CPU-side launch it came from (none if `launched` is None), as
    torch.profiler's Chrome trace has them: a cudaLaunchKernel, or Triton's cuLaunchKernel
    (api="cuda_driver")."""
    gpu = dict(cat="kernel", ph="X", name="k", ts=start, dur=end - start, args=dict(correlation=correlation))
    if launched is None:
        return [gpu]
    name = "cuLaunchKernel" if api == "cuda_driver" else "cudaLaunchKernel"
    return [gpu, dict(cat=api, ph="X", name=name, ts=launched, dur=1, args=dict(correlation=correlation))]


def phase(start: float, end: float, name: str) -> dict:
    return dict(cat="user_annotation", ph="X", name=name, ts=start, dur=end - start)


def test_nested_phases_flatten_to_the_innermost():
    ranges = [(0, 100, "outer"), (10, 40, "inner"), (50, 90, "inner2"), (200, 300, "b")]
    starts, labels = timeline.phase_segments(ranges)
    assert list(zip(starts, labels)) == [
        (0, "outer"), (10, "inner"), (40, "outer"), (50, "inner2"), (90, "outer"), (100, timeline.OTHER),
        (200, "b"), (300, timeline.OTHER),
    ]  # fmt: skip


def test_fsdp_and_compiled_ranges_split_the_phase_around_them():
    ranges = [(0, 100, "model forward"), (10, 20, "FSDP::pre_forward"), (20, 40, "compiled layer"),
              (200, 210, "FSDP::pre_forward")]  # fmt: skip
    starts, labels = timeline.phase_segments(ranges, frozenset({"FSDP::pre_forward", "compiled layer"}))
    assert list(zip(starts, labels)) == [
        (0, "model forward"), (10, "model forward / FSDP::pre_forward"), (20, "model forward / compiled layer"),
        (40, "model forward"), (100, timeline.OTHER), (200, f"{timeline.OTHER} / FSDP::pre_forward"),
        (210, timeline.OTHER),
    ]  # fmt: skip
    assert timeline.detail_name("FSDP::post_backward_reduce (model.layers.7)") == "FSDP::post_backward_reduce"
    assert timeline.detail_name("Torch-Compiled Region: 0/3") == "compiled layer"
    assert timeline.detail_name("aten::mm") is None


def test_busy_and_idle_time_go_to_the_phase_that_launched_each_kernel():
    events = [
        phase(0, 100, "compute_logp (other)"), phase(10, 40, "pack micro-batches"), phase(50, 90, "model forward"),
        phase(200, 300, "backward"), phase(235, 245, "FSDP::pre_backward (model.layers.0)"),
        phase(500, 600, "not a phase of the step"),
        *kernel(20, 30, launched=15, correlation=1),  # idle 0-20 while packing
        *kernel(60, 110, launched=55, correlation=2),  # idle 30-60 in the forward
        *kernel(100, 140, launched=95, correlation=3),  # overlaps the previous kernel: 30 of its 40 count
        *kernel(250, 270, launched=240, correlation=4),  # idle 140-250 before the backward's kernel
        *kernel(280, 290, launched=60, correlation=5, api="cuda_driver"),  # a Triton kernel of the forward
        *kernel(295, 300, launched=None, correlation=6),  # its launch fell outside the trace
        dict(cat="cuda_runtime", ph="X", name="cudaStreamSynchronize", ts=30, dur=5, args={}),
    ]  # fmt: skip
    table = timeline.time_by_phase(events, (0, 300))
    ms = {name: (round(row["busy_ms"] * 1e3, 6), round(row["idle_ms"] * 1e3, 6), row["syncs"])
          for name, row in table.items()}  # fmt: skip
    assert ms == {
        "pack micro-batches": (10, 20, 1),
        "model forward": (60, 40, 0),  # 270-280 idle, then the Triton kernel launched at 60
        "compute_logp (other)": (30, 0, 0),
        "backward / FSDP::pre_backward": (20, 110, 0),  # launched at 240, inside FSDP's hook
        timeline.UNLAUNCHED: (5, 5, 0),
    }
    total = sum(busy + idle for busy, idle, _ in ms.values())
    assert total == 300  # every microsecond of the step is charged once


def test_padded_attention_equals_one_sdpa_call_per_sequence():
    """Both alternatives to packed_sdpa's kernel compute the same causal attention within
    each packed sequence (fp32, CPU), with grouped key/value heads and trailing padding."""
    from areal_patches import packed_sdpa

    gen = torch.Generator().manual_seed(0)
    bounds = [0, 7, 19, 20, 33, 40]
    heads, kv_heads, dim = 6, 2, 8
    module = torch.nn.Module()
    module.scaling = dim**-0.5
    module.num_key_value_groups = heads // kv_heads
    query = torch.randn(1, heads, 40, dim, generator=gen)
    key, value = (torch.randn(1, kv_heads, 40, dim, generator=gen) for _ in range(2))
    padded = train_step.sdpa_padded(module, query, key, value, bounds)
    per_sequence = packed_sdpa.sdpa_per_sequence(module, query, key, value, bounds, scaling=module.scaling)
    assert padded.shape == per_sequence.shape == (1, 40, heads, dim)
    assert (padded - per_sequence).abs().max().item() < 1e-5


def bench_row(shape: str, ranks: int, tokens_per_s: int, **knobs) -> dict:
    setting = train_step.shipped_setting()
    return dict(framework="AReaL", shape=shape, ranks=ranks, step_s=1.0, tokens_per_s=tokens_per_s, mfu=0.4,
                peak_mem_gib=10.0, **{**train_step.dataclasses.asdict(setting), **knobs})  # fmt: skip


def test_scaling_compares_each_rank_count_with_one_rank_of_the_same_shape_and_setting():
    rows = [bench_row("1.5b", 1, 1000), bench_row("1.5b", 2, 950), bench_row("3b", 2, 400),
            bench_row("1.5b", 2, 500, n_minibatches=1), bench_row("1.5b", 4, 0) | dict(error="OOM")]  # fmt: skip
    table = train_step.scaling(rows)
    assert [(r["shape"], r["ranks"], r["efficiency"]) for r in table] == [
        ("1.5b", 1, 1.0), ("1.5b", 2, 0.95), ("3b", 2, None), ("1.5b", 2, None),
    ]  # no one-rank row of 3b, nor of one minibatch: no efficiency; the failed row is left out


@pytest.mark.e2e
def test_the_bench_runs_its_areal_row_on_two_fsdp_ranks(tmp_path):
    """The multi-GPU rows' code path on CPU (two gloo ranks under torchrun), at the tiny model's
    shape: the numbers mean nothing here, the row must come back whole from the first rank."""
    out = tmp_path / "experiments.bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.bench.gpu.train_step", "--device", "cpu", "--shapes", "tiny", "--seqs", "8",
         "--rows", "1", "--steps", "1", "--no-trl", "--ranks", "2", "--json", str(out)],
        cwd=train_step.ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    (row,) = result["rows"]
    assert "error" not in row, row["error"]
    assert row["ranks"] == 2 and row["seqs"] == 8
    samples = train_step.make_samples(8, train_step.SHAPES["tiny"][5])
    assert row["tokens"] == sum(len(s.prompt) + len(s.completion) for s in samples)  # one rank's batch
    assert [r["ranks"] for r in result["scaling"]] == [2]
    assert "| tiny |" in proc.stdout and "| 2 |" in proc.stdout  # the scaling table


def test_the_first_traceback_survives_lines_of_other_ranks_written_into_it():
    """Two ranks failing at once write into one pipe; the agent's line for the rank that exited
    first can land inside the other's traceback (a CI run lost the rank's error that way)."""
    rank_error = ["Traceback (most recent call last):", '  File "train_step.py", line 326, in build_actor',
                  "    from areal.api import FinetuneSpec", "ImportError: areal broken on purpose"]  # fmt: skip
    agent = "E1130 15:02:36.123 torch/distributed/elastic/multiprocessing/api.py:882] failed (exitcode: 1) local_rank: 0"
    log = ["W1130 Setting OMP_NUM_THREADS", *rank_error[:2], agent, *rank_error[2:], "Traceback (most recent call last):",
           "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"]  # fmt: skip
    assert train_step.first_traceback(log) == rank_error
    assert train_step.first_traceback(["no traceback here"]) == []
    assert len(train_step.first_traceback(["Traceback (most recent call last):"] + ["  File"] * 100)) == 60


def test_the_ranks_error_is_shown_when_torchruns_own_traceback_is_in_the_last_lines():
    """torchrun's traceback begins with the same line as the rank's: a CI run showed only the
    last lines, torchrun's, because that line was among them."""
    rank_error = ["Traceback (most recent call last):", '  File "train_step.py", line 332, in build_actor',
                  "ImportError: areal broken on purpose"]  # fmt: skip
    torchrun = ["Traceback (most recent call last):", '  File "run.py", line 1019, in run',
                "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:", "=" * 60]  # fmt: skip
    log = [*rank_error, *[f"W rank line {i}" for i in range(10)], *torchrun]
    shown = train_step.failure_lines(log, tail=6)
    assert shown[:4] == [*rank_error, "..."] and shown[4:] == log[-6:]
    assert train_step.failure_lines(rank_error, tail=6) == rank_error  # in the last lines: shown once
    assert train_step.failure_lines(["no traceback here"] * 40, tail=6) == ["no traceback here"] * 6


@pytest.mark.e2e
def test_a_failing_rank_shows_its_own_error_not_only_torchruns_summary(tmp_path):
    """Under torchrun the last lines of a failed child are torchrun's ChildFailedError; the
    rank's own exception must be on screen too. areal is replaced by a package that fails to
    import (on purpose), so both ranks fail at once."""
    (tmp_path / "areal").mkdir()
    (tmp_path / "areal" / "__init__.py").write_text('raise ImportError("areal broken on purpose")\n')
    proc = subprocess.run(
        [sys.executable, "-m", "experiments.bench.gpu.train_step", "--device", "cpu", "--shapes", "tiny", "--seqs", "8",
         "--rows", "1", "--steps", "1", "--no-trl", "--ranks", "2"],
        cwd=train_step.ROOT, capture_output=True, text=True, timeout=300,
        env={**train_step.os.environ, "PYTHONPATH": str(tmp_path)},
    )  # fmt: skip
    assert "tiny on 2 ranks exited with 1" in proc.stdout, proc.stdout[-3000:]
    assert "ImportError: areal broken on purpose" in proc.stdout
    assert "ChildFailedError" in proc.stdout  # torchrun's summary, after the rank's error
