"""train.py on CPU: the workflow through AReaL's real RemoteSGLangEngine and the dev server,
GRPO grouping, a two-step training run with disk weight pushes, recovery, and bad input.

Nothing is mocked but the trainer of one test and the engine of another, each saying why: the dev server
(devkit/dev_server/) stands in for SGLang, which cannot run here, and speaks the same HTTP
protocol to the same client code.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import countdown
import plot
from devkit import ROOT
from devkit.dev_server.client import http_json, serve
from devkit.launch import training
from reward_score import compute_score

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("data")
    countdown.main(["--out-dir", str(out), "--train-size", "400", "--test-size", "16", "--seed", "3"])
    return out


@pytest.fixture(scope="module")
def engine(tiny_model_dir, tmp_path_factory):
    from areal.api.cli_args import InferenceEngineConfig
    from areal.engine import RemoteSGLangEngine

    log = tmp_path_factory.mktemp("server") / "server.log"
    with serve(str(tiny_model_dir), log_file=log) as addr:
        rollout = RemoteSGLangEngine(
            InferenceEngineConfig(
                backend="sglang:d1", max_concurrent_rollouts=16, consumer_batch_size=4,
                max_head_offpolicyness=10**6,  # no trainer here: never hold rollouts back
            )
        )
        rollout.initialize(addr=addr)
        yield rollout
        rollout.destroy()


def rollout_groups(engine, model_dir: Path, rows: list[dict], n: int, temperature: float = 1.0):
    """One group per row, in the order of `rows` (AReaL returns them in completion order)."""
    from areal.api.cli_args import GenerationHyperparameters

    gconfig = GenerationHyperparameters(n_samples=n, max_new_tokens=24, temperature=temperature)
    groups = engine.rollout_batch(
        rows,
        workflow="train.CountDownWorkflow",
        workflow_kwargs=dict(gconfig=gconfig, tokenizer=str(model_dir)),
        group_size=n,
    )
    tokenizer = engine_tokenizer(model_dir)
    prompts = [countdown.prompt_token_ids(tokenizer, row["messages"]) for row in rows]

    def row_index(group) -> int:
        ids = group["input_ids"][0].tolist()
        return next(i for i, p in enumerate(prompts) if ids[: len(p)] == p)

    return sorted(groups, key=row_index)


def test_workflow_trajectories_match_prompt_model_and_reward(engine, tiny_model_dir, data_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rows = countdown.load_puzzles(str(data_dir / "test_e.jsonl"))[:3]
    n, temperature = 4, 0.8
    groups = rollout_groups(engine, tiny_model_dir, rows, n, temperature)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()

    assert len(groups) == len(rows)
    for row, group in zip(rows, groups):
        assert group["input_ids"].shape[0] == n and group["rewards"].shape == (n,)
        prompt = countdown.prompt_token_ids(tokenizer, row["messages"])
        p = len(prompt)
        for i in range(n):
            length = int(group["attention_mask"][i].sum())
            ids = group["input_ids"][i, :length]
            assert ids[:p].tolist() == prompt
            assert length > p
            mask = group["loss_mask"][i]
            assert mask[:p].eq(0).all() and mask[p:length].eq(1).all() and mask[length:].eq(0).all()
            assert group["versions"][i, :p].eq(-1).all() and group["versions"][i, p:length].ge(0).all()
            assert group["logprobs"][i, :p].eq(0).all()

            completion = tokenizer.decode(ids[p:].tolist(), skip_special_tokens=True)
            assert group["rewards"][i].item() == compute_score(completion, row)

            with torch.no_grad():
                logits = model(ids[None]).logits[0, p - 1 : length - 1].float()
            expected = torch.log_softmax(logits / temperature, -1).gather(-1, ids[p:, None])[:, 0]
            torch.testing.assert_close(group["logprobs"][i, p:length], expected, atol=1e-4, rtol=0)


def test_grpo_normalises_rewards_within_each_prompts_group(engine, tiny_model_dir, data_dir):
    """Every prompt gets exactly n_samples trajectories, consecutive in the batch, and the
    shipped reward_norm (group_size = gconfig.n_samples) centres and scales each group alone.
    The rewards are replaced by known values: what is tested is the grouping, not the model."""
    from areal.api.cli_args import parse_cli_args, to_structured_cfg
    from areal.utils.data import Normalization, concat_padded_tensors
    from omegaconf import OmegaConf

    from train import CountDownConfig

    cfg, _ = parse_cli_args(["--config", str(ROOT / "train_config.yaml"), "gconfig.n_samples=4"])
    config = OmegaConf.to_object(to_structured_cfg(cfg, CountDownConfig))
    n = config.gconfig.n_samples
    assert config.actor.reward_norm.group_size == n

    rows = countdown.load_puzzles(str(data_dir / "test_e.jsonl"))[3:6]
    batch = concat_padded_tensors(rollout_groups(engine, tiny_model_dir, rows, n))
    assert batch["input_ids"].shape[0] == n * len(rows)

    rewards = torch.tensor([0.0, 1.0, 0.1, 1.0, 0.0, 0.0, 0.1, 0.0, 1.0, 1.0, 1.0, 0.1])
    normalised = Normalization(config.actor.reward_norm)(rewards)
    tokenizer = engine_tokenizer(tiny_model_dir)
    for g, row in enumerate(rows):
        block = slice(g * n, (g + 1) * n)
        prompt = countdown.prompt_token_ids(tokenizer, row["messages"])
        assert (batch["input_ids"][block, : len(prompt)] == torch.tensor(prompt)).all()
        r = rewards[block]
        expected = (r - r.mean()) / (r.std() + config.actor.reward_norm.eps)
        torch.testing.assert_close(normalised[block].float(), expected, atol=1e-5, rtol=0)


def engine_tokenizer(model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


def probe(addr: str, prompts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
    """Greedy completions and their log-probs straight from the server."""
    results = []
    for ids in prompts:
        out = http_json(addr, "/generate", {
            "input_ids": ids, "return_logprob": True,
            "sampling_params": {"max_new_tokens": 8, "temperature": 0.0, "ignore_eos": True},
        })  # fmt: skip
        pairs = out["meta_info"]["output_token_logprobs"]
        results.append(([p[1] for p in pairs], [p[0] for p in pairs]))
    return results


def greedy_logprobs_of(model_dir: Path, prompt: list[int], completion: list[int]) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None])[:, 0]


# actor.kl_ctl > 0 (train_config.yaml ships 0): AReaL loads the `ref` model beside the actor
# and takes a KL penalty off the rewards.
KL_PENALTY = ["actor.kl_ctl=0.1"]


def train_overrides(run_dir: Path, model: Path, data_dir: Path, steps: int) -> list[str]:
    return training.cpu_overrides(run_dir, model, data_dir, steps) + [
        # Constant negative reward, no normalisation: the random model earns no reward, and
        # this still gives every sampled token a non-zero advantage, so weights must move.
        "actor.reward_norm=null", "actor.adv_norm=null", "actor.reward_bias=-0.5",
        "actor.optimizer.lr=1e-3", "saver.freq_steps=1", "valid_dataset.batch_size=8", *KL_PENALTY,
    ]  # fmt: skip


def train(run_dir: Path, model: Path, data_dir: Path, addr: str, steps: int) -> str:
    log = run_dir / f"train-{steps}.log"
    training.launch_trainer(run_dir, train_overrides(run_dir, model, data_dir, steps), addr, log)
    return log.read_text()


@pytest.mark.e2e
def test_two_steps_of_training_with_a_kl_penalty_then_recovery_after_a_kill(tiny_model_dir, data_dir, tmp_path):
    """With a KL penalty (KL_PENALTY): the ref model starts from the actor's weights, so the
    penalty is zero at the first step and appears once the actor has moved (by the last step;
    the second step's rollouts may still come from the first weights); a ref that loaded other
    weights, or computed log-probs differently from the actor, fails the first check."""
    rows = countdown.load_puzzles(str(data_dir / "test_e.jsonl"))[:2]
    tokenizer = engine_tokenizer(tiny_model_dir)
    prompts = [countdown.prompt_token_ids(tokenizer, r["messages"]) for r in rows]
    run_dir = tmp_path / "run"
    with serve(str(tiny_model_dir), log_file=tmp_path / "server.log") as addr:
        before = probe(addr, prompts)
        log = train(run_dir, tiny_model_dir, data_dir, addr, steps=2)
        after = probe(addr, prompts)
        assert http_json(addr, "/get_weight_version")["weight_version"] in (2, "2")

        # The disk pushes changed what the server computes ...
        change = max(
            max(abs(a - b) for a, b in zip(lp_a, lp_b)) if ids_a == ids_b else float("inf")
            for (ids_a, lp_a), (ids_b, lp_b) in zip(after, before)
        )
        assert change > 1e-3
        # ... into exactly the weights the trainer saved after its last step.
        saved = sorted(run_dir.glob("checkpoints/*/*/*/default/epoch*globalstep1"))
        assert saved, "no HF checkpoint saved after step 2"
        for prompt, (ids, logprobs) in zip(prompts, after):
            expected = greedy_logprobs_of(saved[-1], prompt, ids)
            torch.testing.assert_close(torch.tensor(logprobs), expected, atol=1e-4, rtol=0)

        assert "Train step 1/" in log and "Train step 2/" in log
        scalars = plot.load_run(run_dir / "logs" / "tensorboard")
        assert sorted(scalars["rollout/reward"]) == [0, 1]
        assert sorted(scalars["eval-rollout/success"]) == [0, 1]
        assert sorted(scalars["timeperf/ref_logp"]) == [0, 1]
        assert abs(scalars["ppo_actor/kl_rewards/avg"][0]) < 1e-6

        # A run killed mid-way resumes from its last recover checkpoint. (This launch itself
        # resumes the finished 2-step run at step 3; it is killed once step 3 is logged.)
        killed_log = run_dir / "train-killed.log"
        cmd, env = training.trainer_launch(run_dir, train_overrides(run_dir, tiny_model_dir, data_dir, 5), addr)
        with killed_log.open("w") as out:
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # fmt: skip
            try:
                wait_for(lambda: "Train step 3/" in killed_log.read_text(), proc, timeout=600)
            finally:
                kill_tree(proc)
        last_logged = max(logged_steps(killed_log.read_text()))
        assert 3 <= last_logged < 5
        resumed = logged_steps(train(run_dir, tiny_model_dir, data_dir, addr, steps=5))
        # The step after the last logged one, or one more if the kill fell between that
        # step's recover checkpoint and its log line.
        assert resumed[0] in (last_logged + 1, last_logged + 2) and resumed[-1] == 5
        # A hard kill may lose the killed step's unflushed metrics, never the resumed ones.
        scalars = plot.load_run(run_dir / "logs" / "tensorboard")
        assert {0, 1} | {n - 1 for n in resumed} <= set(scalars["rollout/reward"])
        assert abs(scalars["ppo_actor/kl_rewards/avg"][4]) > 1e-4  # the actor has moved


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL torchrun and its workers at once, like a machine failing (torchrun gets no
    chance to stop the workers, which run in process groups of their own)."""
    import psutil

    for child in psutil.Process(proc.pid).children(recursive=True):
        child.kill()
    proc.kill()
    proc.wait()


def logged_steps(log: str) -> list[int]:
    return [int(n) for n in re.findall(r"Train step (\d+)/", log)]


def wait_for(condition, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.time() + timeout
    while not condition():
        assert proc.poll() is None, "trainer exited before the awaited step"
        assert time.time() < deadline, "trainer too slow"
        time.sleep(0.5)


def run_train_py(args: list[str]) -> subprocess.CompletedProcess:
    """train.py as a plain process: these errors come before any distributed set-up."""
    return subprocess.run(
        [sys.executable, "train.py", "--config", "train_config.yaml", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.e2e
def test_bad_inputs_give_actionable_errors(tiny_model_dir, data_dir, tmp_path):
    base = [f"cluster.fileroot={tmp_path}", f"cluster.name_resolve.nfs_record_root={tmp_path}/nr",
            f"actor.path={tiny_model_dir}", f"valid_dataset.path={data_dir}/test_e.jsonl"]  # fmt: skip
    missing = tmp_path / "missing.jsonl"
    proc = run_train_py([*base, f"train_dataset.path={missing}"])
    assert proc.returncode == 2  # the project's status for bad input
    assert f"{missing}: no such file; run `python3 countdown.py`" in proc.stderr

    broken = tmp_path / "broken.jsonl"
    good = (data_dir / "test_e.jsonl").read_text().splitlines()
    broken.write_text("\n".join([good[0], '{"nums": [1, 2], "target": ', *good[1:3]]) + "\n")
    proc = run_train_py([*base, f"train_dataset.path={broken}"])
    assert proc.returncode == 2 and f"{broken}:2:" in proc.stderr

    proc = run_train_py([*base, f"train_dataset.path={data_dir}/train_e.jsonl", "actor.path=/no/such/model"])
    assert proc.returncode == 2 and "'/no/such/model' does not exist" in proc.stderr


@pytest.mark.e2e
def test_unreachable_server_is_named_and_nothing_is_left_behind(tiny_model_dir, data_dir, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"  # closed again before anyone connects
    overrides = training.cpu_overrides(tmp_path, tiny_model_dir, data_dir, steps=1) + ["+rollout.setup_timeout=3"]
    env = training.trainer_env(dead)
    proc = subprocess.Popen(
        training.trainer_command(overrides), cwd=ROOT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode != 0
    assert re.search(rf"inference server\(s\) at {re.escape(dead)} did not answer", output)
    assert not list(tmp_path.glob("checkpoints/**/*.safetensors"))
    leftovers = subprocess.run(["pgrep", "-s", str(proc.pid)], capture_output=True, text=True)
    assert leftovers.stdout.strip() == ""


@pytest.mark.e2e
def test_skip_uniform_groups_reaches_the_trainer(tiny_model_dir, data_dir, tmp_path, monkeypatch):
    """skip_uniform_groups=true gives PPOTrainer.train train.has_reward_spread, by the name AReaL
    resolves, as its dynamic filter; the default gives none. The trainer is mocked by a recorder:
    the tiny model solves no puzzle, so a real run would drop every group and never fill a batch."""
    from areal.infra.remote_inf_engine import RemoteInfEngine

    import train

    calls = []

    class Recorder:
        rollout = SimpleNamespace(server_infos=[])  # what the server watchdog reads

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def train(self, **kwargs):
            calls.append(kwargs)

    monkeypatch.setattr(train, "start_trainer", lambda *args: Recorder())
    argv = ["--config", str(ROOT / "train_config.yaml"), f"cluster.fileroot={tmp_path}",
            f"cluster.name_resolve.nfs_record_root={tmp_path}/nr", f"actor.path={tiny_model_dir}",
            f"train_dataset.path={data_dir}/train_e.jsonl", f"valid_dataset.path={data_dir}/test_e.jsonl"]  # fmt: skip
    train.main([*argv, "skip_uniform_groups=true"])
    train.main(argv)
    assert [c["dynamic_filter_fn"] for c in calls] == ["train.has_reward_spread", None]

    keep = RemoteInfEngine._resolve_should_accept_fn(None, calls[0]["dynamic_filter_fn"])
    assert keep({"rewards": torch.tensor([0.0, 0.1, 0.0, 0.0])})
    assert keep({"rewards": torch.tensor([1.0, 0.0, 1.0, 1.0])})
    assert not keep({"rewards": torch.zeros(4)})
    assert not keep({"rewards": torch.ones(4)})


ROW = {"nums": [19, 36, 55, 7], "target": 65, "messages": countdown.make_messages([19, 36, 55, 7], 65)}
ANSWERS = {  # completion -> compute_score
    "<think>55 + 36 = 91</think>\n<answer>55 + 36 - 7 - 19</answer>": 1.0,
    "<think>36 / 12 = 3</think>\n<answer>55 + 36 / (19 - 7)</answer>": 0.1,  # 58: 7 off
    "<think>55 + 36 = 91</think>\n<answer>55 + 36 + 7 + 19</answer>": 0.1,  # 117: 52 off
    "<think>55 + 36 = 91</think>\n<answer>55 + 36 - 26</answer>": 0.1,  # wrong numbers
    "<think>55 + 36 = 91": 0.0,  # no answer
}


class ScriptedEngine:
    """Stands in for AReaL's engine so that the workflow sees chosen completions: the tiny
    model cannot be made to write a near miss. Everything after generation is train.py's own."""

    def __init__(self, tokenizer, completions):
        self.tokenizer, self.completions = tokenizer, list(completions)

    async def agenerate(self, request):
        from areal.api import ModelResponse

        out = self.tokenizer.encode(self.completions.pop(0), add_special_tokens=False)
        return ModelResponse(input_tokens=list(request.input_ids), output_tokens=out,
                             output_logprobs=[-1.0] * len(out), output_versions=[0] * len(out))


def test_the_workflow_rewards_each_completion_with_compute_score(tiny_model_dir):
    import asyncio

    from areal.api.cli_args import GenerationHyperparameters

    import train

    workflow = train.CountDownWorkflow(GenerationHyperparameters(max_new_tokens=24), str(tiny_model_dir))
    engine = ScriptedEngine(workflow.tokenizer, ANSWERS)
    rewards = [asyncio.run(workflow.arun_episode(engine, ROW))["rewards"].item() for _ in ANSWERS]
    assert [compute_score(completion, ROW) for completion in ANSWERS] == list(ANSWERS.values())
    assert rewards == pytest.approx(list(ANSWERS.values()))  # the trajectory's float32 reward


def test_a_groups_episodes_render_their_puzzles_prompt_once(tiny_model_dir, monkeypatch):
    import asyncio

    from areal.api.cli_args import GenerationHyperparameters

    import train

    workflow = train.CountDownWorkflow(GenerationHyperparameters(max_new_tokens=24), str(tiny_model_dir))
    rendered = []
    render = workflow.tokenizer.apply_chat_template
    monkeypatch.setattr(workflow.tokenizer, "apply_chat_template", lambda *a, **k: rendered.append(1) or render(*a, **k))
    other = {**ROW, "messages": [{"role": "user", "content": ROW["messages"][-1]["content"] + " "}]}
    puzzles = [ROW] * 4 + [other] * 2
    engine = ScriptedEngine(workflow.tokenizer, list(ANSWERS)[:1] * len(puzzles))
    sent = []
    generate = engine.agenerate

    async def agenerate(request):
        sent.append(request.input_ids)
        request.input_ids.append(0)  # a request's ids are its own: changing them changes no other's
        return await generate(request)

    engine.agenerate = agenerate
    for puzzle in puzzles:
        asyncio.run(workflow.arun_episode(engine, puzzle))
    assert len(rendered) == 2
    assert [ids[:-1] for ids in sent[:4]] == [countdown.prompt_token_ids(workflow.tokenizer, ROW["messages"])] * 4
    assert sent[4][:-1] == countdown.prompt_token_ids(workflow.tokenizer, other["messages"]) != sent[0][:-1]


def test_a_trajectory_masks_the_prompt_and_keeps_the_completions_logprobs_and_versions():
    import train

    response = SimpleNamespace(input_len=3, output_len=2, input_tokens=[5, 6, 7], output_tokens=[8, 9],
                               output_logprobs=[-0.25, -1.5], output_versions=[4, 5])
    traj = train.trajectory(response, 1.0)
    assert {key: (value.dtype, tuple(value.shape)) for key, value in traj.items()} == {
        "input_ids": (torch.int64, (1, 5)), "attention_mask": (torch.bool, (1, 5)), "loss_mask": (torch.int32, (1, 5)),
        "logprobs": (torch.float32, (1, 5)), "versions": (torch.int64, (1, 5)), "rewards": (torch.float32, (1,))}
    assert traj["input_ids"].tolist() == [[5, 6, 7, 8, 9]] and traj["attention_mask"].all()
    assert traj["loss_mask"].tolist() == [[0, 0, 0, 1, 1]]
    assert traj["logprobs"].tolist() == [[0.0, 0.0, 0.0, -0.25, -1.5]]
    assert traj["versions"].tolist() == [[-1, -1, -1, 4, 5]] and traj["rewards"].tolist() == [1.0]
