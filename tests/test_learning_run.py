"""experiments/learning_run.py rehearsed on CPU with the tiny preset: both phases run for real
(AReaL's SFTTrainer, then train.py against the dev server), at toy sizes, so that the GPU
experiment of docs/results/learning.md does not fail on a path that was never run."""

import argparse
import importlib.util
import json
import re
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest
from safetensors.torch import load_file

import countdown
from conftest import alive, command_line
from devkit import ROOT
from sft_formats.completions import reference_completion, signs_completion, solution_steps

TOY = ["--device", "cpu", "--dtype", "float32", "--preset", "tiny", "--train-size", "300", "--test-size", "16",
       "--no-skip-uniform-groups"]  # the toy model solves nothing: no group would ever be kept


def learning_run(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "experiments.learning_run", *args, *TOY]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_sft_then_grpo_on_cpu(tmp_path):
    work = tmp_path / "work"
    sft = learning_run("sft", "--work", str(work), "--sft-epochs", "1", "--sft-batch", "64", "--sft-pack", "4",
                       "--sft-set", "actor.mb_spec.max_tokens_per_mb=4096")  # fmt: skip
    assert sft.returncode == 0, sft.stdout[-3000:] + sft.stderr[-3000:]
    warm_start = work / "warm_start"
    record = json.loads((warm_start / "warm_start.json").read_text())
    assert record["settings"]["sft_epochs"] == 1 and record["sft_seconds"] > 0
    assert set(record["pass@1"]) == {"all", "3 numbers", "4 numbers"}
    assert record["exact_steps"] is None or 0.0 <= record["exact_steps"] <= 1.0
    # --sft-set reaches sft.py: its micro-batches hold at most the 4096 tokens asked for (~14.6k without),
    # and configs/sft_warm_start.yaml's deterministic kernels are on (on CPU the same weights either way)
    sft_log = (work / "sft.log").read_text()
    micro_batches = [json.loads(m) for m in re.findall(r"Microbatch #tokens \(rank 0\): (\[[\d, ]+\])", sft_log)]
    assert micro_batches and all(len(mb) > 1 and max(mb) <= 4096 for mb in micro_batches)
    assert "[sft] deterministic kernels: torch.use_deterministic_algorithms(True), CUBLAS_WORKSPACE_CONFIG=:4096:8" in sft_log
    scratch = load_file(work / "model" / "model.safetensors")
    tuned = load_file(warm_start / "model.safetensors")
    assert any(not scratch[name].equal(tuned[name]) for name in scratch)  # SFT changed the weights

    # The grpo phase starts from the copied checkpoint alone, as on a second machine.
    shutil.rmtree(work / "data")
    grpo = learning_run(
        "grpo", "--work", str(work), "--out", str(tmp_path / "out"), "--grpo-steps", "2",
        "--grpo-seconds", "0", "--batch", "4", "--n-samples", "2", "--max-new-tokens", "24", "--train-max-new-tokens", "24",
        "--eval-every", "1", "--save-every", "2",
    )  # fmt: skip
    assert grpo.returncode == 0, grpo.stdout[-3000:] + grpo.stderr[-3000:]
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["grpo_steps"] == 2 and results["sft_seconds"] == record["sft_seconds"]
    assert results["final_model_step"] == 2  # the last step's weights, ready for the next call's --init
    # kept before the last evaluation, so a `timeout` that ends the call during it loses no model
    assert grpo.stdout.index("kept step 2's model") < grpo.stdout.rindex("evaluate.py")
    assert results["model"] == "Qwen2ForCausalLM, 2 layers of 256 (MLP 512)"  # from the served model's config
    trained = load_file(work / "final_model" / "model.safetensors")
    assert {name: t.dtype for name, t in trained.items()} == {name: t.dtype for name, t in tuned.items()}
    assert any(not tuned[name].equal(trained[name]) for name in tuned)  # GRPO changed the weights
    assert results["pass@1_before"] == record["pass@1"]  # greedy: same model, same server answers
    for phase in ("pass@1_before", "pass@1_after"):
        assert set(results[phase]) == {"all", "3 numbers", "4 numbers"}
        assert all(0.0 <= value <= 1.0 for value in results[phase].values())
    for name in ("curves.png", "curves.csv", "eval_before.md", "eval_after.md", "train.log"):
        assert (tmp_path / "out" / name).stat().st_size > 0, name
    assert "rollout/reward" in (tmp_path / "out" / "curves.csv").read_text()

    # A time limit stops the trainer mid-run; the weights the server then holds are evaluated.
    # The toy train file is a 75-step epoch: --grpo-steps 1000 runs it again and again. The limit
    # counts the trainer's start-up (15 s and more on 2 busy cores) too.
    timed = learning_run(
        "grpo", "--work", str(work), "--out", str(tmp_path / "timed"), "--grpo-steps", "1000",
        "--grpo-seconds", "40", "--batch", "4", "--n-samples", "2", "--max-new-tokens", "24",
        "--train-max-new-tokens", "24", "--eval-every", "1000", "--save-every", "1000",
    )  # fmt: skip
    assert timed.returncode == 0, timed.stdout[-3000:] + timed.stderr[-3000:]
    results = json.loads((tmp_path / "timed" / "results.json").read_text())
    assert results["stopped_by_time_limit"] and 0 < results["grpo_steps"] < 1000  # stopped while training
    # Stopped before its first save: the results are kept, and the earlier call's model is not
    # left behind as if it were this one's.
    assert results["final_model_step"] is None and not (work / "final_model").exists()
    assert "no model to go on from" in timed.stdout and "the run ended before its first save" in timed.stdout
    assert 20 <= results["grpo_seconds"] < 50
    pushed = int(results["weight_version_evaluated"])  # a push may land between log lines
    assert results["grpo_steps"] <= pushed <= results["grpo_steps"] + 1
    assert set(results["pass@1_after"]) == {"all", "3 numbers", "4 numbers"}


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_sft_from_a_model_on_its_own_solved_puzzles(tiny_model_dir, tmp_path):
    """--init and --sft-data: the sft phase fine-tunes the given model on evaluate.py
    --solved-out's rows (here written by hand: the toy model solves nothing), each completion
    one example, instead of building a model and training on the reference solutions."""
    rows = countdown.generate_puzzles(64, seed=8)
    solved = [{**row, "completions": [reference_completion(row), f"<think>again</think>\n<answer>"
                                      f"{row['solution']}</answer>"]} for row in rows]  # fmt: skip
    countdown.write_jsonl([(tmp_path / "solved.jsonl", solved)])
    work = tmp_path / "work"
    result = learning_run("sft", "--work", str(work), "--init", str(tiny_model_dir), "--sft-data",
                          str(tmp_path / "solved.jsonl"), "--sft-epochs", "1", "--sft-batch", "32", "--sft-pack", "4")  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert not (work / "model").exists()  # no new model: it started from --init
    before = load_file(tiny_model_dir / "model.safetensors")
    after = load_file(work / "warm_start" / "model.safetensors")
    assert any(not before[name].equal(after[name]) for name in before)
    # 128 examples (two per puzzle) in batches of 32 are 4 steps; the 64 reference solutions alone would be 2
    assert "Epoch 1/1 Step 4/4 Train step 4/4 done." in (work / "sft.log").read_text()


def test_sft_examples_train_on_each_of_a_rows_own_completions(tiny_model_dir):
    import sft
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = countdown.generate_puzzles(3, seed=9)
    rows[1]["completions"] = ["<think>one</think>", "<think>two</think>"]
    prompts = countdown.batch_prompt_token_ids(tokenizer, [row["messages"] for row in rows])
    examples = sft.sft_examples(tokenizer, rows)
    texts = [tokenizer.decode(e["input_ids"][len(p) : -1]) for e, p in zip(examples, [prompts[0], *prompts[1:2] * 2, prompts[2]])]
    assert texts == [reference_completion(rows[0]), *rows[1]["completions"], reference_completion(rows[2])]
    assert all(e["input_ids"][-1] == tokenizer.eos_token_id for e in examples)


@pytest.mark.e2e
@pytest.mark.timeout(300)
def test_sigterm_stops_the_trainer_and_still_copies_its_log(tmp_path):
    """`timeout` ends a GPU call with SIGTERM: the run exits 143 through its clean-up, no
    trainer process is left, and the log written so far reaches --out. The log is on disk
    line by line while the trainer runs."""
    work, out = tmp_path / "work", tmp_path / "out"
    cmd = [sys.executable, "-m", "experiments.learning_run", "sft", "--work", str(work), "--out", str(out), *TOY]
    run = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = work / "sft.log"
    deadline = time.monotonic() + 240
    while not (log.exists() and "[sft]" in log.read_text()):  # sft.py's first line, once it has started
        assert run.poll() is None and time.monotonic() < deadline, "sft.py never started"
        time.sleep(0.5)
    trainer = psutil.Process(run.pid).children(recursive=True)
    assert any("sft.py" in command_line(p) for p in trainer)
    run.send_signal(signal.SIGTERM)
    assert run.wait(timeout=120) == 143
    assert not [p for p in trainer if alive(p.pid)]
    assert (out / "sft.log").read_text() == log.read_text()


def test_grpo_without_warm_start_says_what_to_do(tmp_path):
    result = learning_run("grpo", "--work", str(tmp_path))
    assert result.returncode != 0
    assert "run the sft phase first, or pass --init" in result.stderr


def test_sft_rows_pack_whole_examples_in_order():
    import sft

    examples = [{"input_ids": [i] * (i + 1), "loss_mask": [0] * i + [1]} for i in range(5)]
    rows = sft.pack_examples(examples, per_row=2)
    assert len(rows) == 3 and len(rows[-1]["input_ids"]) == 5  # 2 + 2 + the last one alone
    assert [t for row in rows for t in row["input_ids"]] == [t for e in examples for t in e["input_ids"]]
    assert [t for row in rows for t in row["loss_mask"]] == [t for e in examples for t in e["loss_mask"]]
    assert all(len(row["input_ids"]) == len(row["loss_mask"]) for row in rows)


def test_sft_examples_show_failed_attempts_with_the_retry_probability(tiny_model_dir):
    import sft
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = countdown.generate_puzzles(200, seed=5)
    plain = sft.sft_examples(tokenizer, rows)
    retry = sft.sft_examples(tokenizer, rows, retry_probability=0.5, seed=1)
    assert retry == sft.sft_examples(tokenizer, rows, retry_probability=0.5, seed=1)  # seeded
    prompts = countdown.batch_prompt_token_ids(tokenizer, [row["messages"] for row in rows])
    shown = []
    for row, example, plain_example, prompt in zip(rows, retry, plain, prompts):
        ids, mask = example["input_ids"], example["loss_mask"]
        assert ids[: len(prompt)] == prompt and mask == [0] * len(prompt) + [1] * (len(ids) - len(prompt))
        completion = tokenizer.decode(ids[len(prompt) : -1])
        assert ids[-1] == tokenizer.eos_token_id and reference_completion(row) == without_failures(completion)
        shown.append(completion.count("That makes"))
        assert (shown[-1] == 0) == (example == plain_example)
    # One more failure with probability 0.5, at most sft.MAX_FAILED_ATTEMPTS: 1/2, 1/4, 1/4.
    assert set(shown) == {0, 1, 2} and 0.35 < shown.count(0) / len(rows) < 0.65


def test_sft_examples_show_column_work_when_asked(tiny_model_dir):
    import sft
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = countdown.generate_puzzles(50, seed=6)
    prompts = countdown.batch_prompt_token_ids(tokenizer, [row["messages"] for row in rows])
    columns = sft.sft_examples(tokenizer, rows, columns=True)
    shown = 0
    for row, example, prompt in zip(rows, columns, prompts):
        completion = tokenizer.decode(example["input_ids"][len(prompt) : -1])
        assert completion == reference_completion(row, columns=True)
        assert sum(example["loss_mask"]) == len(example["input_ids"]) - len(prompt)  # the work is learned
        shown += completion != reference_completion(row)
    assert shown > 40  # all but the solutions made of * and / alone


def test_sft_examples_show_the_numbers_left_when_asked(tiny_model_dir):
    import sft
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = countdown.generate_puzzles(50, seed=6)
    prompts = countdown.batch_prompt_token_ids(tokenizer, [row["messages"] for row in rows])
    examples = sft.sft_examples(tokenizer, rows, columns=True, numbers_left=True)
    for row, example, prompt in zip(rows, examples, prompts):
        completion = tokenizer.decode(example["input_ids"][len(prompt) : -1])
        assert completion == reference_completion(row, columns=True, numbers_left=True)
        assert completion.count("\nLeft: ") == len(solution_steps(row["solution"])) - 1


def test_sft_examples_find_the_signs_when_asked(tiny_model_dir):
    import sft
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = countdown.generate_puzzles(50, seed=6)
    prompts = countdown.batch_prompt_token_ids(tokenizer, [row["messages"] for row in rows])
    examples = sft.sft_examples(tokenizer, rows, signs=True)
    for row, example, prompt in zip(rows, examples, prompts):
        ids, mask = example["input_ids"], example["loss_mask"]
        assert ids[: len(prompt)] == prompt and mask == [0] * len(prompt) + [1] * (len(ids) - len(prompt))
        assert ids[-1] == tokenizer.eos_token_id
        assert tokenizer.decode(ids[len(prompt) : -1]) == signs_completion(row)


def without_failures(completion: str) -> str:
    """The completion less each failed attempt: the step lines a "That makes V, not T." line rejects."""
    kept, pending = [], []
    for line in completion.split("\n"):
        if re.fullmatch(r"\d+ [-+*/] \d+ = \d+", line):
            pending.append(line)
        elif line.startswith("That makes"):
            pending = []
        else:
            kept += [*pending, line]
            pending = []
    return "\n".join(kept + pending)


def load_learning_run():
    spec = importlib.util.spec_from_file_location("learning_run", ROOT / "experiments" / "learning_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("grpo_steps, epochs", [(40, 1), (49, 1), (50, 2), (1000, 21)])
def test_grpo_schedule_runs_the_steps_asked_with_the_warmup_asked(tmp_path, grpo_steps, epochs):
    """AReaL stops after total_train_epochs and warms up int(proportion x its schedule's steps)."""
    from areal.api.io_struct import FinetuneSpec

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train_e.jsonl").write_text("{}\n" * 197)  # 49 steps of 4, one puzzle left over
    args = argparse.Namespace(work=tmp_path, batch=4, grpo_steps=grpo_steps, grpo_warmup=0, train_numbers=None)
    for warmup in range(20):
        args.grpo_warmup = warmup
        got_epochs, proportion = load_learning_run().grpo_schedule(args)
        schedule = FinetuneSpec(total_train_epochs=got_epochs, dataset_size=197, train_batch_size=4)
        assert got_epochs == epochs and schedule.total_train_steps >= grpo_steps
        assert int(proportion * schedule.total_train_steps) == warmup


def test_train_numbers_trains_on_that_size_only_and_keeps_the_held_out_set(tmp_path):
    module = load_learning_run()
    args = module.parse_args(["grpo", "--work", str(tmp_path), "--train-size", "400", "--test-size", "40",
                              "--batch", "8", "--grpo-steps", "30", "--train-numbers", "4"])  # fmt: skip
    data = module.make_data(args)
    split = countdown.load_puzzles(str(data / countdown.TRAIN_FILE))
    kept = countdown.load_puzzles(str(module.train_file(args)))
    assert kept == [row for row in split if len(row["nums"]) == 4]
    assert 0 < len(kept) < len(split)  # the split holds 3-number puzzles too
    overrides = module.grpo_overrides(args, tmp_path / "model", tmp_path / "run")
    assert f"train_dataset.path={module.train_file(args)}" in overrides
    assert f"valid_dataset.path={data / countdown.TEST_FILE}" in overrides
    epochs, _ = module.grpo_schedule(args)
    assert epochs == -(-30 // (len(kept) // 8)) > -(-30 // (len(split) // 8))  # counted from the puzzles trained on


def test_the_dev_server_samples_with_the_trainers_seed(tmp_path):
    module = load_learning_run()
    import yaml

    shipped = yaml.safe_load((ROOT / "train_config.yaml").read_text())["seed"]
    args = module.parse_args(["grpo", "--work", str(tmp_path)])
    assert module.server_options(args)["seed"] == shipped
    args = module.parse_args(["grpo", "--work", str(tmp_path), "--set", "seed=7", "--set", "actor.optimizer.lr=1e-5",
                              "--set", "seed=9"])  # fmt: skip
    assert module.server_options(args)["seed"] == 9  # the last one, as the trainer's config loader reads them
    bad = learning_run("grpo", "--work", str(tmp_path), "--set", "seed=two")
    assert bad.returncode == 2 and "--set seed=two: the seed must be a whole number" in bad.stderr.splitlines()[-1]
    assert not (tmp_path / "data").exists()  # refused before anything was made
    negative = learning_run("grpo", "--work", str(tmp_path), "--set", "seed=-1")
    assert negative.returncode == 2 and "--set seed=-1: the seed must be a whole number of 0 or more" in negative.stderr


def test_train_setting_reads_the_last_override_else_train_config(tmp_path):
    module = load_learning_run()
    import yaml

    shipped = yaml.safe_load((ROOT / "train_config.yaml").read_text())
    overrides = ["actor.optimizer.lr=1e-5", "gconfig.n_samples=4", "+actor.optimizer.lr=3e-05"]
    assert module.train_setting(overrides, "actor.optimizer.lr") == 3e-5  # a number, as OmegaConf reads it
    assert module.train_setting(overrides, "gconfig.n_samples") == 4
    assert module.train_setting(overrides, "gconfig.temperature") == shipped["gconfig"]["temperature"]
    assert module.train_setting([], "seed") == shipped["seed"]


def test_dev_server_args_in_the_environment_reach_the_dev_server(tmp_path, monkeypatch):
    module = load_learning_run()
    args = module.parse_args(["grpo", "--work", str(tmp_path)])
    monkeypatch.delenv("DEV_SERVER_ARGS", raising=False)
    assert module.server_options(args)["extra_args"] == ["--decoder", "auto", "--batching", "continuous"]
    monkeypatch.setenv("DEV_SERVER_ARGS", "--batch-wait-ms 50")
    assert module.server_options(args)["extra_args"][-2:] == ["--batch-wait-ms", "50"]
