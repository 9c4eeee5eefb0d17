"""Row C of experiments/time_to_accuracy.py: TRL's GRPOTrainer, generating with its own model.generate.

Same warm start, train and test files, reward (reward_score.compute_score on the decoded
completion), prompt and knobs as rows A, B and D. The prompt: TRL applies the model's chat
template to the same messages with the generation prompt, as countdown.prompt_token_ids does;
`check_prompts` refuses to train if the ids differ. The knobs: every setting TRL shares with
AReaL is read from train_config.yaml and experiments/learning_run.py's overrides (`areal_knobs`,
`trl_config`); where TRL lacks one or works differently it keeps its recommended default,
and `differences` says what differs.

`HeldOutClock`, a TrainerCallback, measures held-out pass@1: greedy, batched model.generate
on the test puzzles with the evaluation's max new tokens, scored and summarised as evaluate.py
does (overall and by number count), before training, every `eval_seconds` of training and at
the end; it stops training after `seconds`. Its clock starts with the first step, which begins
with the first rollout, and runs on through evaluations, as AReaL's in-training evaluations
run on rows A, B and D's clocks.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import trl
from datasets import Dataset
from transformers import AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

import countdown
import evaluate
from reward_score import compute_score
from experiments import learning_run

# The AReaL settings row C takes over (train_config.yaml, then learning_run's overrides).
KNOBS = [
    "seed", "train_dataset.batch_size", "gconfig.n_samples", "gconfig.max_new_tokens", "gconfig.temperature",
    "eval_gconfig.greedy", "eval_gconfig.max_new_tokens", "actor.ppo_n_minibatches", "actor.optimizer.lr",
    "actor.optimizer.lr_scheduler_type", "actor.optimizer.weight_decay", "actor.optimizer.beta1",
    "actor.optimizer.beta2", "actor.optimizer.eps", "actor.optimizer.gradient_clipping", "actor.eps_clip",
    "actor.kl_ctl", "actor.disable_dropout", "actor.gradient_checkpointing", "actor.dtype", "actor.attn_impl",
    "actor.adv_norm", "actor.prox_logp_method", "rollout.max_head_offpolicyness", "skip_uniform_groups",
]  # fmt: skip


def areal_knobs(lr_args: argparse.Namespace, model: Path) -> dict:
    """{dotted key: value} of KNOBS as rows A, B and D's train.py gets them."""
    overrides = learning_run.grpo_overrides(lr_args, model, lr_args.work / "grpo")
    return {key: learning_run.train_setting(overrides, key) for key in KNOBS}


def trl_config(lr_args: argparse.Namespace, knobs: dict, out_dir: Path, micro_batches: int = 1) -> GRPOConfig:
    """GRPOConfig with AReaL's settings where they map.

    A step is one batch of puzzles x samples, generated at once and split into AReaL's
    minibatches, one optimizer step each (steps_per_generation): TRL then computes the
    batch's old log-probs, as AReaL's decoupled loss has behaviour log-probs. Weights are
    kept in float32 under bf16 autocast, as AReaL keeps float32 master weights under FSDP's
    bf16 compute. Loss aggregation, reward scaling and generation batching stay TRL's
    defaults (`differences`).

    `micro_batches` splits each minibatch for the forward and backward passes (TRL's gradient
    accumulation), as AReaL's `actor.mb_spec` does: the same optimizer steps on a GPU whose
    memory cannot hold a minibatch's logits at once.
    """
    if knobs["actor.optimizer.lr_scheduler_type"] != "constant":
        raise ValueError(f"no TRL schedule mapped for {knobs['actor.optimizer.lr_scheduler_type']!r}")
    minibatches = int(knobs["actor.ppo_n_minibatches"])
    completions = int(knobs["train_dataset.batch_size"]) * int(knobs["gconfig.n_samples"])
    if micro_batches < 1 or completions % (minibatches * micro_batches):
        raise ValueError(f"--trl-micro-batches {micro_batches}: each of the {minibatches} minibatches of a batch's "
                         f"{completions} completions must split evenly; pick a divisor of {completions // minibatches}")
    return GRPOConfig(
        output_dir=str(out_dir), report_to="none", save_strategy="no", disable_tqdm=True,
        logging_steps=5 * minibatches, seed=int(knobs["seed"]), max_steps=lr_args.grpo_steps * minibatches,
        use_cpu=lr_args.device == "cpu", bf16=knobs["actor.dtype"] == "bfloat16",
        model_init_kwargs={"dtype": "float32", "attn_implementation": knobs["actor.attn_impl"]},
        per_device_train_batch_size=completions // (minibatches * micro_batches),
        gradient_accumulation_steps=micro_batches, steps_per_generation=minibatches * micro_batches,
        num_generations=int(knobs["gconfig.n_samples"]),
        max_completion_length=int(knobs["gconfig.max_new_tokens"]), temperature=float(knobs["gconfig.temperature"]),
        learning_rate=float(knobs["actor.optimizer.lr"]), lr_scheduler_type="constant_with_warmup",
        warmup_steps=lr_args.grpo_warmup * minibatches, weight_decay=float(knobs["actor.optimizer.weight_decay"]),
        adam_beta1=float(knobs["actor.optimizer.beta1"]), adam_beta2=float(knobs["actor.optimizer.beta2"]),
        adam_epsilon=float(knobs["actor.optimizer.eps"]),
        max_grad_norm=float(knobs["actor.optimizer.gradient_clipping"]),
        epsilon=float(knobs["actor.eps_clip"]), beta=float(knobs["actor.kl_ctl"]),
        disable_dropout=bool(knobs["actor.disable_dropout"]),
        gradient_checkpointing=bool(knobs["actor.gradient_checkpointing"]),
    )  # fmt: skip


def differences(knobs: dict, config: GRPOConfig) -> dict[str, str]:
    """What row C does differently from rows A, B and D, where the settings cannot be made equal."""
    return {
        "schedule": "TRL generates a batch, then trains on it, in one process (synchronous); rows A and D let "
                    f"rollouts run {knobs['rollout.max_head_offpolicyness']} versions ahead, B none",
        "generation": f"model.generate on the trained model itself (float32 weights, bf16 autocast: {config.bf16}), "
                      f"the batch's {config.generation_batch_size} completions as one padded batch; rows A and B: "
                      "the dev server's transformers decoding of bf16 weights on the requests waiting, D: its "
                      "CUDA-graph decoder",
        "weight push": "none: generation uses the trained weights; rows A, B and D push them to the dev server "
                       "from disk after every step",
        "dynamic sampling": "none in TRL's GRPOTrainer: groups whose completions all score the same stay in the "
                            "batch (zero advantage, but counted in the loss normalisation); rows A, B and D: "
                            f"skip_uniform_groups={knobs['skip_uniform_groups']}",
        "advantages": f"TRL scale_rewards={config.scale_rewards!r} (its default): (reward - group mean) / group std; "
                      "AReaL: the same, then normalised again over the batch "
                      f"(actor.adv_norm={knobs['actor.adv_norm']})",
        "loss aggregation": f"TRL loss_type={config.loss_type!r} (its default): token losses summed over the "
                            "optimizer step's completions, divided by their token count; AReaL: the same token "
                            "mean over each minibatch",
        "importance ratio": "TRL: old log-probs from a forward pass before the batch's first optimizer step; "
                            "AReaL: the decoupled loss, behaviour log-probs from the server, proximal ones "
                            f"{knobs['actor.prox_logp_method']}, tokens with a ratio above 5 masked",
        "KL": f"TRL beta={config.beta} (its default is 0 too), AReaL kl_ctl={knobs['actor.kl_ctl']}: no KL term, "
              "no reference model",
        "warm-up": f"{config.warmup_steps} optimizer steps: the same number of batches as AReaL, which steps its "
                   "schedule once per batch",
        "held-out evaluation": "HeldOutClock: greedy model.generate, float32 weights under the training's "
                               "autocast; rows A, B and D: AReaL's evaluation rollouts and evaluate.py on the dev "
                               "server (bf16 weights), also greedy",
        "evaluation times": "TRL: every eval_seconds counted from the first rollout; AReaL counts from the "
                            "trainer's construction, a few seconds before its first rollout",
    }  # fmt: skip


def train_dataset(path: Path) -> Dataset:
    """The train puzzles as TRL reads them: the chat messages as `prompt`, the rest for the reward."""
    rows = countdown.load_puzzles(path)
    return Dataset.from_list([{"prompt": r["messages"], "nums": r["nums"], "target": r["target"]} for r in rows])


def countdown_reward(completions: list[list[dict]], nums: list[list[int]], target: list[int], **_) -> list[float]:
    """reward_score.compute_score of each decoded completion (TRL decodes with skip_special_tokens, as train.py)."""
    return [compute_score(c[-1]["content"], {"nums": n, "target": t}) for c, n, t in zip(completions, nums, target)]


def optimizer_steps_per_batch(config: GRPOConfig) -> int:
    return config.steps_per_generation // config.gradient_accumulation_steps


def make_trainer(model: Path, config: GRPOConfig, data: Path, tokenizer, callbacks: list) -> TimedGRPOTrainer:
    return TimedGRPOTrainer(model=str(model), reward_funcs=countdown_reward, args=config,
                            train_dataset=train_dataset(data / countdown.TRAIN_FILE), processing_class=tokenizer,
                            callbacks=callbacks)  # fmt: skip


def check_prompts(trainer: GRPOTrainer, rows: list[dict]) -> None:
    """Refuse to train if TRL's prompt ids (its own chat-template call) differ from countdown's."""
    messages = [row["messages"] for row in rows[:16]]
    theirs = [[int(t) for t in ids] for ids in trainer._tokenize_prompts(messages)[0]]
    if theirs != countdown.batch_prompt_token_ids(trainer.processing_class, messages):
        raise RuntimeError("TRL's prompt token ids differ from countdown.prompt_token_ids'")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class TimedGRPOTrainer(GRPOTrainer):
    """GRPOTrainer recording the seconds of each rollout: generation, rewards, old log-probs.

    With gradient accumulation (`gradient_accumulation_steps` > 1) it also undoes one division of the loss:
    TRL's `dapo` loss is already a token mean over the accumulation window, and transformers'
    Trainer divides it by the accumulation steps again, which would shrink the gradient by that
    factor (huggingface/trl issue 5619)."""

    def __init__(self, *args, **kwargs):
        self.rollout_seconds: list[float] = []
        super().__init__(*args, **kwargs)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if self.loss_type == "dapo" and model.training:
            return loss * self.current_gradient_accumulation_steps
        return loss

    def _generate_and_score_completions(self, inputs):
        sync(self.accelerator.device)
        start = time.perf_counter()
        output = super()._generate_and_score_completions(inputs)
        sync(self.accelerator.device)
        self.rollout_seconds.append(time.perf_counter() - start)
        return output


def left_padded(prompts: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, prompts))
    ids = [[pad_id] * (width - len(p)) + p for p in prompts]
    mask = [[0] * (width - len(p)) + [1] * len(p) for p in prompts]
    return torch.tensor(ids, device=device), torch.tensor(mask, device=device)


def held_out_report(model, tokenizer, rows: list[dict], prompts: list[list[int]], max_new_tokens: int,
                    batch_size: int, autocast: bool) -> dict:
    """evaluate.py's summary (overall and by number count) of greedy model.generate completions.

    Stops at the pad or end token, as evaluate.py asks its server to; a completion without
    one counts as cut at max_new_tokens.
    """
    stop_ids = sorted({t for t in (tokenizer.pad_token_id, tokenizer.eos_token_id) if t is not None})
    samples = []
    training = model.training
    model.eval()
    with torch.no_grad(), torch.autocast(model.device.type, dtype=torch.bfloat16, enabled=autocast):
        for first in range(0, len(prompts), batch_size):
            ids, mask = left_padded(prompts[first : first + batch_size], stop_ids[0], model.device)
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                                 eos_token_id=stop_ids, pad_token_id=stop_ids[0])  # fmt: skip
            for i, tokens in enumerate(out[:, ids.shape[1] :].tolist(), start=first):
                ends = [k for k, t in enumerate(tokens) if t in stop_ids]
                n = ends[0] + 1 if ends else len(tokens)
                completion = tokenizer.decode(tokens[:n], skip_special_tokens=True)
                samples.append(evaluate.score(rows[i], i, 0, completion, n, "stop" if ends else "length"))
    model.train(training)
    return evaluate.summarize(samples, [1])


class HeldOutClock(TrainerCallback):
    """Held-out pass@1 before training, every `eval_seconds` of training and at the end; stops
    training after `seconds`. Checks fall at the end of a batch (`steps_per_batch` optimizer
    steps), as AReaL's fall at the end of its step; a point is dated when its evaluation begins."""

    def __init__(self, evaluate_model, seconds: float, eval_seconds: float, steps_per_batch: int):
        self.evaluate_model = evaluate_model  # model -> evaluate.py-style report
        self.seconds, self.eval_seconds, self.steps_per_batch = seconds, eval_seconds, steps_per_batch
        self.start: float | None = None
        self.end: float | None = None
        self.next_eval = eval_seconds
        self.batch_ends: list[float] = []
        self.eval_durations: list[float] = []
        self.before: dict = {}
        self.points: list[dict] = []
        self.final: dict = {}

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def timed_report(self, model) -> dict:
        start = time.perf_counter()
        report = self.evaluate_model(model)
        self.eval_durations.append(time.perf_counter() - start)
        return report

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.before = self.evaluate_model(model)

    def on_step_begin(self, args, state, control, **kwargs):
        if self.start is None:
            self.start = time.perf_counter()

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.steps_per_batch:
            return
        now = self.elapsed()
        self.batch_ends.append(now)
        if now >= self.seconds:
            control.should_training_stop = True
        elif now >= self.next_eval:
            report = self.timed_report(model)
            self.points.append(point(now, len(self.batch_ends), report))
            self.next_eval = now + self.eval_seconds

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self.end = self.elapsed()
        self.final = self.timed_report(model)


def point(seconds: float, step: int, report: dict) -> dict:
    return {"seconds": round(seconds, 1), "step": step, "pass@1": report["overall"]["pass@1"]}


def step_split(trainer: TimedGRPOTrainer, clock: HeldOutClock) -> dict:
    """Seconds per batch (first to last batch end) and its parts: rollout, evaluation (amortised), the rest."""
    ends = clock.batch_ends
    if len(ends) < 2:
        return {}
    step = (ends[-1] - ends[0]) / (len(ends) - 1)
    rollout = statistics.mean(trainer.rollout_seconds)
    evaluation = sum(clock.eval_durations[:-1]) / len(ends)  # the last one, after training, is on no step
    return {"step": step, "rollout": rollout, "eval": evaluation, "update": step - rollout - evaluation}


def run(lr_args: argparse.Namespace, seconds: float, eval_seconds: float, eval_batch: int,
        micro_batches: int = 1) -> dict:
    """Train row C for `seconds` from the first rollout; its part of the row's record."""
    if lr_args.device == "cpu":  # as the dev server: a small model on shared cores runs far faster on one thread
        torch.set_num_threads(1)
    model = learning_run.warm_start_model(lr_args)
    data = lr_args.work / "data"
    knobs = areal_knobs(lr_args, model)
    config = trl_config(lr_args, knobs, lr_args.work / "trl", micro_batches)
    tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
    test = countdown.load_puzzles(data / countdown.TEST_FILE)
    prompts = countdown.batch_prompt_token_ids(tokenizer, [row["messages"] for row in test])
    max_new_tokens = int(knobs["eval_gconfig.max_new_tokens"])

    def evaluate_model(trained) -> dict:
        return held_out_report(trained, tokenizer, test, prompts, max_new_tokens, eval_batch, config.bf16)

    clock = HeldOutClock(evaluate_model, seconds, eval_seconds, optimizer_steps_per_batch(config))
    trainer = make_trainer(model, config, data, tokenizer, [clock])
    check_prompts(trainer, test)
    trainer.train()
    steps = len(clock.batch_ends)
    return {
        "framework": f"TRL {trl.__version__}",
        "steps": steps,
        "optimizer_steps": trainer.state.global_step,
        "training_seconds": round(clock.end, 1),
        "seconds_per_step": step_split(trainer, clock),
        "eval_seconds_on_clock": round(sum(clock.eval_durations[:-1]), 1),
        "points": [point(0.0, 0, clock.before), *clock.points],
        "pass@1_before": learning_run.pass_at_1(clock.before),
        "final": {**point(clock.end, steps, clock.final), "pass@1": learning_run.pass_at_1(clock.final)},
        "settings": {"learning_run": learning_run.settings(lr_args), "areal_knobs": knobs, "trl": config.to_dict()},
        "differences": differences(knobs, config),
        "log_history": trainer.state.log_history,
    }
