"""The learning experiment of docs/results/learning.md, one phase per command.

    python3 -m experiments.learning_run sft  --work runs/learn --out OUT    # data, model, warm start
    python3 -m experiments.learning_run grpo --work runs/learn --out OUT    # eval, GRPO, eval

Phase `sft` builds 3-4 number puzzles (countdown.py), a ~25M-parameter Qwen2-architecture
model from random weights with the project's tokenizer (devkit/make_tiny_model.py --preset
small), and warm-starts it with supervised fine-tuning on the reference solutions (sft.py,
AReaL's SFTTrainer). The final checkpoint is copied to WORK/warm_start, with
warm_start.json recording how it was made; with --init and --sft-data it fine-tunes that
model on that file instead (rejection-sampling fine-tuning on the model's own correct answers,
from evaluate.py --solved-out). Phase `grpo` serves a warm-started model
(`--init`, default WORK/warm_start) with the dev server (which stands in for SGLang,
unavailable on the GPU machine), measures held-out pass@1 with evaluate.py (while the
trainer starts), trains it with train.py exactly as the SPMD launcher would (FSDPPPOActor,
disk weight pushes to the server) until --grpo-seconds (default 520) or --grpo-steps runs
out, and measures pass@1 again on the same server, now holding the trained weights.
The data is regenerated when missing (same seed, same files), so the two phases can run
on different machines. Results, logs and the learning curve are copied to OUT. With
--save-every, the trained model is kept in WORK/final_model, and a next call goes on from
it with --init.

`--device cpu --preset tiny` with small sizes rehearses the whole path on a laptop
(tests/test_learning_run.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

import countdown
from devkit import ROOT
from devkit.dev_server.client import http_json, serve
from devkit.launch import config_errors, preflight, training
from devkit.processes import sigterm_raises

START = time.time()


def run(cmd: list[str], log: Path | None = None, env: dict | None = None) -> None:
    """Run a step; with `log`, its output goes there and its tail is shown if it fails."""
    print(f"[learn {time.time() - START:.0f} s] {' '.join(cmd)[:200]}", flush=True)
    if log is None:
        subprocess.run(cmd, cwd=ROOT, check=True, env=env)
        return
    with log.open("w") as out:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)
    if proc.returncode != 0:
        print(log.read_text()[-5000:], flush=True)
        raise subprocess.CalledProcessError(proc.returncode, cmd)


def make_data(args: argparse.Namespace) -> Path:
    data = args.work / "data"
    if not (data / countdown.TRAIN_FILE).exists() or not (data / countdown.TEST_FILE).exists():
        run([sys.executable, "countdown.py", "--out-dir", str(data), "--train-size", str(args.train_size),
             "--test-size", str(args.test_size), "--seed", "0"])  # fmt: skip
    if args.train_numbers and not train_file(args).exists():
        rows = countdown.load_puzzles(str(data / countdown.TRAIN_FILE))
        countdown.write_jsonl([(train_file(args), [row for row in rows if len(row["nums"]) == args.train_numbers])])
    return data


def train_file(args: argparse.Namespace) -> Path:
    """The puzzles a phase trains on: the train split, or with --train-numbers N only its puzzles
    of N numbers. Why: a warm start that solves most 3-number puzzles gives GRPO groups that all
    score alike there, which dynamic sampling drops; the held-out set stays the whole test split."""
    if not args.train_numbers:
        return args.work / "data" / countdown.TRAIN_FILE
    return args.work / "data" / f"train_{args.train_numbers}nums.jsonl"


def sft_phase(args: argparse.Namespace) -> None:
    make_data(args)
    model, fileroot = (args.init or args.work / "model").resolve(), args.work / "sft"
    if args.init is None:
        run([sys.executable, "-m", "devkit.make_tiny_model", "--out", str(model), "--preset", args.preset])
    train_dataset = (args.sft_data or train_file(args)).resolve()
    overrides = [
        f"actor.path={model}", f"train_dataset.path={train_dataset}",
        f"total_train_epochs={args.sft_epochs}", f"examples_per_row={args.sft_pack}",
        f"train_dataset.batch_size={args.sft_batch // args.sft_pack}",
        f"actor.dtype={args.dtype}", f"actor.optimizer.lr={args.sft_lr}",
        f"retry_probability={args.sft_retry}", f"column_work={str(args.sft_columns).lower()}",
        f"numbers_left={str(args.sft_left).lower()}", f"signs={str(args.sft_signs).lower()}",
        *args.sft_set,
    ]  # fmt: skip
    start = time.time()
    print(f"[learn {start - START:.0f} s] sft.py, log {args.work / 'sft.log'}", flush=True)
    saved = training.run_sft(fileroot, overrides, args.work / "sft.log")
    seconds = time.time() - start
    warm_start = args.work / "warm_start"
    shutil.rmtree(warm_start, ignore_errors=True)
    shutil.copytree(saved, warm_start)
    with serve(str(warm_start), timeout=600, **server_options(args)) as addr:
        report = evaluate(addr, warm_start, args, args.work / "eval_warm_start")
    record = {
        "sft_seconds": round(seconds), "device": device_name(args.device),
        "pass@1": pass_at_1(report), "exact_steps": report["overall"]["exact_step_rate"],
        "settings": settings(args),
    }  # fmt: skip
    (warm_start / "warm_start.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"[learn] warm-started model: {warm_start} ({seconds:.0f} s of SFT)")


def grpo_overrides(args: argparse.Namespace, model: Path, run_dir: Path) -> list[str]:
    """train_config.yaml shrunk to one GPU shared by the actor and the dev server.

    Tuned for learning per call (docs/results/learning.md, attempts 4 and 5): groups whose samples
    all score the same are skipped (train.py's skip_uniform_groups; off with
    --no-skip-uniform-groups, needed when the model solves nothing), the proximal log-probs are
    interpolated (no extra forward pass), two steps' rollouts may be in flight (shorter
    steps in attempt 4, with transformers' decoding in the dev server), training
    samples stop at --train-max-new-tokens (the reference solutions need < 120 tokens; a
    rare runaway sample otherwise holds its whole batch for 256 decode steps), and a
    micro-batch holds a whole minibatch of this small model.
    """
    data = args.work / "data"
    epochs, warmup = grpo_schedule(args)
    return [
        "experiment_name=countdown-learn", "trial_name=run",
        f"cluster.fileroot={run_dir}", f"cluster.name_resolve.nfs_record_root={run_dir}/name_resolve",
        "cluster.n_gpus_per_node=1", "allocation_mode=sglang:d1p1t1+fsdp:d1p1t1",
        "rollout.backend=sglang:d1p1t1", "actor.backend=fsdp:d1p1t1",
        f"actor.path={model}", f"actor.dtype={args.dtype}", "actor.gradient_checkpointing=false",
        "actor.mb_spec.max_tokens_per_mb=131072", f"actor.optimizer.lr={args.grpo_lr}",
        "actor.ppo_n_minibatches=2", f"actor.optimizer.warmup_steps_proportion={warmup}",
        "actor.prox_logp_method=loglinear",
        f"gconfig.n_samples={args.n_samples}", f"gconfig.max_new_tokens={args.train_max_new_tokens}",
        "eval_gconfig.greedy=true", f"eval_gconfig.max_new_tokens={args.max_new_tokens}",
        f"rollout.max_concurrent_rollouts={2 * args.batch * args.n_samples}",
        f"train_dataset.path={train_file(args)}", f"train_dataset.batch_size={args.batch}",
        f"valid_dataset.path={data / countdown.TEST_FILE}", f"valid_dataset.batch_size={args.test_size}",
        "train_dataset.pin_memory=false", "valid_dataset.pin_memory=false",
        f"total_train_epochs={epochs}", f"total_train_steps={args.grpo_steps}",
        *eval_schedule(args),
        f"saver.freq_steps={args.save_every or 'null'}", "saver.freq_epochs=null", "recover.mode=disabled",
        f"skip_uniform_groups={str(args.skip_uniform_groups).lower()}",
        *args.set,
    ]  # fmt: skip


def eval_schedule(args: argparse.Namespace) -> list[str]:
    """The trainer's held-out evaluation: every --eval-every steps, or every --eval-seconds."""
    if not args.eval_seconds:
        return [f"evaluator.freq_steps={args.eval_every}"]
    return ["evaluator.freq_steps=null", "evaluator.freq_epochs=null", f"evaluator.freq_secs={args.eval_seconds}"]


def grpo_schedule(args: argparse.Namespace) -> tuple[int, float]:
    """The epochs that hold --grpo-steps, and the warm-up proportion that makes --grpo-warmup steps.

    AReaL stops after total_train_epochs passes over the train file even when
    total_train_steps is larger, and sizes the lr schedule by those epochs (epochs x train
    puzzles // batch steps), not by total_train_steps. It truncates proportion x steps to
    an int, so the proportion asks for half a step more than wanted (1 / 49 x 49 is 0.99999).
    The puzzles are counted from the train file itself: make_data keeps an existing one,
    whatever its size.
    """
    with train_file(args).open() as f:
        steps_per_epoch = sum(1 for _ in f) // args.batch
    epochs = math.ceil(args.grpo_steps / steps_per_epoch)
    return epochs, (args.grpo_warmup + 0.5) / (epochs * steps_per_epoch)


def server_options(args: argparse.Namespace) -> dict:
    """The dev server's settings; `DEV_SERVER_ARGS` adds flags, as in runs that start it in SGLang's place."""
    return dict(device=args.device, dtype=args.dtype, max_batch=1024, seed=trainer_seed(args),
                log_file=args.work / "server.log",
                extra_args=["--decoder", args.decoder, "--batching", args.server_batching,
                            *shlex.split(os.environ.get("DEV_SERVER_ARGS", ""))])


def train_setting(overrides: list[str], key: str) -> object:
    """The value train.py runs with for a dotted `key`: the last of `overrides` that sets it,
    else train_config.yaml's. An override is read as AReaL's OmegaConf reads it, where PyYAML
    alone would read 1e-05 as a string."""
    text = preflight.override_value(overrides, key)
    if text is None:
        node = yaml.safe_load((ROOT / "train_config.yaml").read_text())
        for part in key.split("."):
            node = node[part]
        return node
    value = yaml.safe_load(text)
    try:
        return float(value) if isinstance(value, str) else value
    except ValueError:
        return value


def trainer_seed(args: argparse.Namespace) -> int:
    """The `seed` train.py runs with. The dev server samples with it too, as AReaL's launchers
    start SGLang with `random_seed: ${seed}`: two seeds then differ in their samples as well as
    in their data order."""
    seed = train_setting(args.set, "seed")
    if type(seed) is not int or seed < 0:
        raise ValueError(f"--set seed={preflight.override_value(args.set, 'seed')}: the seed must be "
                         "a whole number of 0 or more, e.g. --set seed=2")
    return seed


def evaluate(addr: str, tokenizer: Path, args: argparse.Namespace, out_dir: Path) -> dict:
    run([sys.executable, "evaluate.py", "--server", addr, "--tokenizer", str(tokenizer),
         "--data", str(args.work / "data" / countdown.TEST_FILE), "--max-new-tokens", str(args.max_new_tokens),
         "--concurrency", "512", "--out-dir", str(out_dir)])  # fmt: skip
    return json.loads((out_dir / "eval.json").read_text())


def evaluate_initial_weights(addr: str, model: Path, args: argparse.Namespace) -> dict:
    """evaluate.py's report on the served model, refused if the trainer pushed weights meanwhile."""
    report = evaluate(addr, model, args, args.work / "eval_before")
    version = http_json(addr, "/get_weight_version")["weight_version"]
    if version != "0":
        raise RuntimeError(f"the trainer pushed weights (version {version}) before the first "
                           "evaluation finished: its numbers would mix two models")
    return report


def pass_at_1(report: dict) -> dict[str, float]:
    by_count = {f"{n} numbers": m["pass@1"] for n, m in report["by_num_count"].items()}
    return {"all": report["overall"]["pass@1"], **by_count}


def warm_start_model(args: argparse.Namespace) -> Path:
    """The model GRPO starts from (--init, else WORK/warm_start); SystemExit saying what to do when it is missing."""
    model = (args.init or args.work / "warm_start").resolve()
    if not (model / "config.json").exists():
        raise SystemExit(f"no warm-started model at {model}: run the sft phase first, or pass --init")
    return model


def grpo_phase(args: argparse.Namespace, stop: threading.Event | None = None) -> None:
    """Evaluate, train, evaluate; `stop`, set by another thread, ends training early."""
    model = warm_start_model(args)
    make_data(args)
    run_dir = args.work / "grpo"
    shutil.rmtree(run_dir, ignore_errors=True)
    with serve(str(model), timeout=600, **server_options(args)) as addr, ThreadPoolExecutor(1) as pool:
        # The first evaluation runs while the trainer starts up (imports, model, data), on
        # the server's initial weights: checked below.
        evaluation = pool.submit(evaluate_initial_weights, addr, model, args)
        start = time.time()
        limit = f", stopped after {args.grpo_seconds:.0f} s" if args.grpo_seconds else ""
        print(f"[learn {start - START:.0f} s] train.py, {args.grpo_steps} GRPO steps{limit}", flush=True)
        stopped = training.launch_trainer(run_dir, grpo_overrides(args, model, run_dir), addr,
                                      args.work / "train.log", time_limit=args.grpo_seconds, stop=stop)
        grpo_seconds = time.time() - start
        # Kept before the last evaluation: a call whose `timeout` ends during it still leaves
        # the model for the next call's --init.
        saved_step = keep_final_model(run_dir, args.work / "final_model") if args.save_every else None
        before = evaluation.result()
        # The trainer, stopped or done, may have left the server paused, or busy with the
        # rollouts it started ahead: none of them is wanted now.
        http_json(addr, "/abort_request", {"abort_all": True})
        http_json(addr, "/continue_generation", {})
        served = http_json(addr, "/get_weight_version")["weight_version"]
        after = evaluate(addr, model, args, args.work / "eval_after")
    run([sys.executable, "plot.py", str(run_dir / "logs" / "tensorboard"), "--out", str(args.work / "curves.png")])
    warm_start = warm_start_record(model)
    results = {
        "model": model_summary(model),
        "device": device_name(args.device),
        "sft_seconds": warm_start.get("sft_seconds"),
        "grpo_steps": steps_done(args.work / "train.log"),
        "grpo_seconds": round(grpo_seconds),
        "stopped_by_time_limit": stopped,
        "weight_version_evaluated": served,
        "final_model_step": saved_step,
        "pass@1_before": pass_at_1(before),
        "pass@1_after": pass_at_1(after),
        "settings": {
            "sft": warm_start.get("settings"),
            "grpo": settings(args),
        },
    }
    (args.work / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(json.dumps(results, indent=2, default=str))


def keep_final_model(run_dir: Path, dest: Path) -> int | None:
    """Copy the trainer's last whole save to `dest`, the --init of a next call; its step
    (None, and no `dest`, when the run ended before its first save). A time limit can stop the
    trainer inside a save; the save before that one is then the model.

    AReaL's Saver saves after every saver.freq_steps-th step, so the last save is the final
    step only when --grpo-steps is a multiple of --save-every (and no time limit cut it short).
    """
    shutil.rmtree(dest, ignore_errors=True)
    try:
        saved = training.latest_checkpoint(run_dir, "countdown-learn")
    except FileNotFoundError as missing:
        print(f"[learn] no model to go on from: {missing}", flush=True)
        return None
    shutil.copytree(saved, dest)
    step = training.saved_global_step(saved) + 1
    print(f"[learn {time.time() - START:.0f} s] kept step {step}'s model in {dest}", flush=True)
    return step


def steps_done(train_log: Path) -> int:
    """The last "Train step N/M done" of the trainer's log (0 if none)."""
    steps = re.findall(r"Train step (\d+)/\d+ done", train_log.read_text(errors="replace"))
    return int(steps[-1]) if steps else 0


def model_summary(model: Path) -> str:
    """The served model's shape, read from its config: the grpo phase's --preset is unused
    (the model is --init's), so it cannot say which preset was trained."""
    config = json.loads((model / "config.json").read_text())
    return (f"{config['architectures'][0]}, {config['num_hidden_layers']} layers of {config['hidden_size']} "
            f"(MLP {config['intermediate_size']})")


def warm_start_record(model: Path) -> dict:
    """How the warm start was made (written by the sft phase; absent for other models)."""
    path = model / "warm_start.json"
    return json.loads(path.read_text()) if path.exists() else {}


def settings(args: argparse.Namespace) -> dict:
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}


def device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"


def sigterm_exits() -> contextlib.AbstractContextManager[None]:
    """`timeout` on the GPU machine sends SIGTERM: exit 143 through the `finally` blocks, which
    stop the trainer and the server cleanly and still copy what the run has written so far."""
    return sigterm_raises(SystemExit(128 + signal.SIGTERM))


def copy_outputs(work: Path, out: Path) -> None:
    """The run's results, curves and logs, copied to --out as a few flat files."""
    out.mkdir(parents=True, exist_ok=True)
    for name in ["results.json", "curves.png", "curves.csv", "sft.log", "train.log", "server.log"]:
        if (work / name).exists():
            shutil.copy(work / name, out / name)
    for phase in ["eval_warm_start", "eval_before", "eval_after"]:
        if (work / phase / "eval.md").exists():
            shutil.copy(work / phase / "eval.md", out / f"{phase}.md")


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line; experiments/time_to_accuracy.py builds its rows' settings with it too."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("phase", choices=["sft", "grpo"])
    parser.add_argument("--work", type=Path, default=ROOT / "runs" / "learn")
    parser.add_argument("--out", type=Path, help="copy results and logs here too")
    parser.add_argument("--init", type=Path,
                        help="grpo: warm-started model (default: WORK/warm_start); sft: start from this model, "
                        "not from a new one")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--decoder", choices=["auto", "hf", "static"], default="auto",
                        help="the dev server's decoder (auto: CUDA graphs on a GPU; see devkit/dev_server/)")
    parser.add_argument("--server-batching", choices=["continuous", "static"], default="continuous",
                        help="the dev server's batching with its static decoder (static: each batch runs "
                        "to its end before the next starts)")
    parser.add_argument("--train-size", type=int, default=250_000)
    parser.add_argument("--test-size", type=int, default=1000)
    parser.add_argument("--train-numbers", type=int, choices=[3, 4],
                        help="train only on the train split's puzzles with this many numbers (held-out set unchanged)")
    parser.add_argument("--sft-data", type=Path,
                        help="sft: train on this JSONL, not the train split; with --init and evaluate.py "
                        "--solved-out's file, rejection-sampling fine-tuning of that model")
    parser.add_argument("--sft-epochs", type=int, default=1)
    parser.add_argument("--sft-batch", type=int, default=512, help="examples per SFT step")
    parser.add_argument("--sft-pack", type=int, default=4, help="examples per SFT row (sft.py)")
    parser.add_argument("--sft-lr", type=float, default=1e-3)
    parser.add_argument("--sft-retry", type=float, default=0.0,
                        help="sft: chance of one more failed attempt before a reference solution "
                        "(sft.py's retry_probability; the retry format of docs/results/goal-65.md)")
    parser.add_argument("--sft-columns", action="store_true",
                        help="sft: + and - steps show their column arithmetic (sft.py's column_work)")
    parser.add_argument("--sft-left", action="store_true",
                        help="sft: every step is followed by the numbers left to use (sft.py's numbers_left)")
    parser.add_argument("--sft-signs", action="store_true",
                        help="sft: the reasoning finds a + and - solution by arithmetic (sft.py's signs)")
    parser.add_argument("--sft-set", action="append", default=[], metavar="KEY=VALUE",
                        help="sft: extra sft.py override, e.g. actor.mb_spec.max_tokens_per_mb=262144 (repeatable)")
    parser.add_argument("--grpo-steps", type=int, default=1000, help="grpo: at most this many steps")
    parser.add_argument("--grpo-seconds", type=float, default=520,
                        help="grpo: stop training after this long, then evaluate the weights the "
                        "server holds (results.json records their version); 0: no limit")
    parser.add_argument("--grpo-lr", type=float, default=1e-5)
    parser.add_argument("--grpo-warmup", type=int, default=3, help="lr warm-up steps")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="grpo: extra train.py override, e.g. actor.adv_norm=null (repeatable)")
    parser.add_argument("--batch", type=int, default=64, help="puzzles per GRPO step")
    parser.add_argument("--n-samples", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=256, help="evaluation (evaluate.py and in training)")
    parser.add_argument("--train-max-new-tokens", type=int, default=192, help="grpo: training samples")
    parser.add_argument("--eval-every", type=int, default=20)
    parser.add_argument("--save-every", type=int, default=0,
                        help="grpo: save the model every N steps (AReaL's saver) and copy the last one "
                        "to WORK/final_model, to go on from in a next call with --init; 0: no saves")
    parser.add_argument("--eval-seconds", type=int, default=0,
                        help="grpo: evaluate every N seconds instead of every --eval-every steps "
                        "(AReaL's evaluator.freq_secs: at the first step that ends N s after the last)")
    parser.add_argument("--skip-uniform-groups", action=argparse.BooleanOptionalAction, default=True,
                        help="grpo: train.py's skip_uniform_groups (DAPO's dynamic sampling)")
    args = parser.parse_args(argv)
    if args.sft_batch % args.sft_pack:
        parser.error(f"--sft-batch {args.sft_batch} must be a multiple of --sft-pack {args.sft_pack}")
    try:
        trainer_seed(args)
    except ValueError as bad_seed:
        parser.error(str(bad_seed))
    for option, overrides, config, config_class in (
        ("--set", args.set, "train_config.yaml", "train:CountDownConfig"),
        ("--sft-set", args.sft_set, "configs/sft_warm_start.yaml", "sft:WarmStartConfig"),
    ):
        if problem := config_errors.config_override_problem(overrides, str(ROOT / config), config_class):
            parser.error(f"{option}: {problem}")
    args.work = args.work.resolve()
    return args


def main() -> None:
    args = parse_args(sys.argv[1:])
    args.work.mkdir(parents=True, exist_ok=True)
    with sigterm_exits():
        try:
            sft_phase(args) if args.phase == "sft" else grpo_phase(args)
        finally:
            if args.out:
                copy_outputs(args.work, args.out)


if __name__ == "__main__":
    main()
