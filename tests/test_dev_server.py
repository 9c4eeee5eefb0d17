"""The dev server (devkit/dev_server/) against an in-process HF model and AReaL's real SGLang client."""

import asyncio
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("aiohttp")

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

import countdown  # noqa: E402
from conftest import alive, heavy_imports  # noqa: E402
from devkit import ROOT  # noqa: E402
from devkit.dev_server import client  # noqa: E402
from devkit.make_tiny_model import make_tiny_model  # noqa: E402

STEP_DELAY_MS = 2  # makes long requests reliably long enough to pause mid-flight


# ----------------------------------------------------------------------------- helpers


def wait_until(pred, timeout=10.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def generate(addr, input_ids, max_new_tokens=16, temperature=0.0, **sp):
    status, body = client.http_request(addr, "/generate", {
        "input_ids": input_ids,
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": temperature, **sp},
        "return_logprob": True,
        "stream": False,
    })
    assert status == 200, body
    return body


def info(addr):
    return client.http_json(addr, "/get_server_info")


def hf_greedy(model, ids, n):
    out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=n, do_sample=False, top_k=None, top_p=None, temperature=None)
    return out[0, len(ids):].tolist()


def hf_logprobs(model, prompt, output, temperature=1.0):
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0].float()
    lp = torch.log_softmax(logits / temperature, -1)
    pos = torch.arange(len(prompt) - 1, len(prompt) + len(output) - 1)
    return lp[pos, torch.tensor(output)].tolist(), logits[pos]


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """In-process reference decoding: tiny matmuls are much slower with threads
    competing for the same cores as the server."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def alt_model_dir(tmp_path_factory):
    """Same architecture and tokenizer, other weights (seed 1)."""
    return make_tiny_model(tmp_path_factory.mktemp("alt") / "model", seed=1, verbose=False)


@pytest.fixture(scope="module")
def hf(tiny_model_dir):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def prompts(tok):
    rows = countdown.generate_puzzles(4, seed=11)
    ps = [countdown.prompt_token_ids(tok, r["messages"]) for r in rows]
    chat = countdown.prompt_token_ids(tok, [{"role": "user", "content": "Hello, what is 2 + 2?"}])
    return ps + [chat, chat[:9], [1, 42]]  # very different lengths: left padding matters


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    with client.DevServer(tiny_model_dir, extra_args=["--step-delay-ms", str(STEP_DELAY_MS), "--log-level", "DEBUG"]) as s:
        yield s


# ----------------------------------------------------------------------------- raw HTTP


def test_health_and_info(server, tiny_model_dir):
    assert client.http_request(server.addr, "/health")[0] == 200
    i = info(server.addr)
    assert i["pid"] == server.pid and i["model_path"] == str(tiny_model_dir)
    assert client.http_request(server.addr, "/get_model_info")[1]["is_generation"] is True
    assert client.http_request(server.addr, "/v1/models")[0] == 200
    assert client.http_request(server.addr, "/flush_cache", {})[0] == 200


def test_debug_log_has_each_request_arriving_and_answered(server, prompts):
    """At --log-level DEBUG a run's server log lines a client's timeline up with the server's."""
    rid = "debug-log-probe"
    out = client.http_json(server.addr, "/generate", {
        "rid": rid, "input_ids": prompts[0], "sampling_params": {"max_new_tokens": 3, "temperature": 0.0}})
    wait_until(lambda: f"request {rid} answered" in server.log_file.read_text(), what="the answered line")
    lines = [line for line in server.log_file.read_text().splitlines() if f"request {rid} " in line]
    assert len(lines) == 2, lines
    assert lines[0].endswith(f"arrived: {len(prompts[0])} prompt tokens, at most 3 new")
    assert re.search(rf"answered after \d+\.\d{{3}}s: {len(out['output_ids'])} tokens, length$", lines[1]), lines[1]


def test_concurrent_greedy_equals_unbatched_hf(server, hf, prompts):
    n = 24
    batches_before = info(server.addr)["num_batches"]
    with ThreadPoolExecutor(len(prompts)) as ex:
        results = list(ex.map(lambda p: generate(server.addr, p, n, ignore_eos=True), prompts))
    # the concurrent requests were served in fewer batches than requests (left-padded together)
    assert info(server.addr)["num_batches"] - batches_before < len(prompts)
    for p, r in zip(prompts, results):
        meta = r["meta_info"]
        assert meta["finish_reason"] == {"type": "length", "length": n}
        assert meta["prompt_tokens"] == len(p) and meta["completion_tokens"] == n
        assert r["output_ids"] == hf_greedy(hf, p, n)
        lps = meta["output_token_logprobs"]
        assert [t for _, t, _ in lps] == r["output_ids"]
        ref, _ = hf_logprobs(hf, p, r["output_ids"])  # greedy: raw log-softmax
        assert max(abs(a - b) for (a, _, _), b in zip(lps, ref)) < 1e-4


def test_prompt_logprobs_for_scoring(server, hf, prompts):
    """The request AReaL's RemoteInfEngine.compute_logp sends (logprob_start_len)."""
    p = prompts[4]
    status, r = client.http_request(server.addr, "/generate", {
        "input_ids": p, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
        "return_logprob": True, "logprob_start_len": 3, "stream": False})
    assert status == 200
    got = r["meta_info"]["input_token_logprobs"]
    assert [t for _, t, _ in got] == p[3:]
    ref, _ = hf_logprobs(hf, p[:1], p[1:])
    assert max(abs(a - b) for (a, _, _), b in zip(got, ref[2:])) < 1e-4


def test_sampled_logprobs_are_temperature_scaled(server, hf, prompts):
    p, t = prompts[0], 0.7
    r = generate(server.addr, p, 20, temperature=t, top_k=50, top_p=0.95, ignore_eos=True)
    out = r["output_ids"]
    ref, logits = hf_logprobs(hf, p, out, temperature=t)
    got = [lp for lp, _, _ in r["meta_info"]["output_token_logprobs"]]
    assert max(abs(a - b) for a, b in zip(got, ref)) < 1e-4
    # every sampled token is inside the top-k of its step
    ranks = (logits > logits.gather(1, torch.tensor(out)[:, None])).sum(1)
    assert int(ranks.max()) < 50


def test_stop_token_ids_and_max_new_tokens(server, hf, prompts):
    p = prompts[1]
    free = generate(server.addr, p, 12, ignore_eos=True)["output_ids"]
    stop = free[5]
    j = free.index(stop)
    r = generate(server.addr, p, 12, stop_token_ids=[stop])
    assert r["output_ids"] == free[: j + 1]  # the stop token is part of the output, as in SGLang
    assert r["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert len(r["meta_info"]["output_token_logprobs"]) == j + 1
    # ignore_eos disables token-id stops (SGLang semantics)
    r = generate(server.addr, p, 12, stop_token_ids=[stop], ignore_eos=True)
    assert r["output_ids"] == free and r["meta_info"]["finish_reason"]["type"] == "length"
    r = generate(server.addr, p, 3, ignore_eos=True)
    assert r["output_ids"] == free[:3] and r["meta_info"]["finish_reason"] == {"type": "length", "length": 3}
    r = generate(server.addr, p, 0)
    assert r["output_ids"] == [] and r["meta_info"]["finish_reason"]["type"] == "length"
    r = generate(server.addr, p, 12, stop_token_ids=[free[0]])
    assert r["output_ids"] == free[:1]
    assert r["meta_info"]["finish_reason"] == {"type": "stop", "matched": free[0]}


def test_bad_requests_do_not_hurt(server):
    assert client.http_request(server.addr, "/generate", {"input_ids": []})[0] == 400
    assert client.http_request(server.addr, "/generate", {"input_ids": [10 ** 6]})[0] == 400
    assert client.http_request(server.addr, "/generate", {"input_ids": [1], "stream": True})[0] == 400
    assert client.http_request(server.addr, "/generate", {"input_ids": [1], "sampling_params": {"top_p": 0}})[0] == 400
    with pytest.raises(client.HTTPStatusError) as e:
        client.http_json(server.addr, "/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": -1}})
    assert e.value.status == 400 and "max_new_tokens" in e.value.body["message"]
    status, body = client.http_request(server.addr, "/update_weights_from_distributed", {})
    assert status == 400 and "not supported" in body["message"]
    assert generate(server.addr, [1, 2, 3], 2)["meta_info"]["completion_tokens"] == 2


def test_pause_holds_requests_until_continue(server, prompts):
    status, body = client.http_request(server.addr, "/pause_generation", {})
    assert status == 200 and body["success"]
    try:
        box = {}
        th = threading.Thread(target=lambda: box.setdefault("r", generate(server.addr, prompts[2], 4)))
        th.start()
        wait_until(lambda: info(server.addr)["queued"] == 1, what="request queued")
        time.sleep(0.5)
        assert th.is_alive() and "r" not in box  # held, not rejected
    finally:
        assert client.http_request(server.addr, "/continue_generation", {})[0] == 200
    th.join(timeout=30)
    assert box["r"]["meta_info"]["finish_reason"]["type"] == "length"
    assert len(box["r"]["output_ids"]) == 4


def test_pause_aborts_the_running_batch_with_partial_output(server, prompts):
    n = 2000
    box = {}
    th = threading.Thread(target=lambda: box.setdefault("r", generate(server.addr, prompts[3], n, ignore_eos=True)))
    th.start()
    wait_until(lambda: info(server.addr)["running"] == 1, what="request running")
    time.sleep(0.1)
    try:
        assert client.http_request(server.addr, "/pause_generation", {})[0] == 200
        assert info(server.addr)["running"] == 0  # pause returned after the batch stopped
        th.join(timeout=30)
        r = box["r"]
        fr = r["meta_info"]["finish_reason"]
        assert fr["type"] == "abort", fr
        k = len(r["output_ids"])
        assert 0 < k < n and len(r["meta_info"]["output_token_logprobs"]) == k
    finally:
        client.http_request(server.addr, "/continue_generation", {})


def test_update_weights_from_disk(server, hf, alt_model_dir, tiny_model_dir, prompts):
    p, n = prompts[4], 16
    before = generate(server.addr, p, n, ignore_eos=True)
    v0 = before["meta_info"]["weight_version"]
    alt = AutoModelForCausalLM.from_pretrained(alt_model_dir, dtype=torch.float32).eval()
    expected = hf_greedy(alt, p, n)
    assert expected != before["output_ids"]
    try:
        status, body = client.http_request(server.addr, "/update_weights_from_disk",
                                    {"model_path": str(alt_model_dir), "abort_all_requests": True})
        assert status == 200 and body["success"] is True
        # fully applied when the call returned
        after = generate(server.addr, p, n, ignore_eos=True)
        assert after["output_ids"] == expected
        assert after["meta_info"]["weight_version"] != v0

        status, body = client.http_request(server.addr, "/update_weights_from_disk",
                                    {"model_path": "/nonexistent/model", "abort_all_requests": True})
        assert status == 400 and body["success"] is False and "/nonexistent/model" in body["message"]
        assert generate(server.addr, p, n, ignore_eos=True)["output_ids"] == expected  # old weights kept
    finally:
        status, _ = client.http_request(server.addr, "/update_weights_from_disk", {"model_path": str(tiny_model_dir)})
        assert status == 200
    assert generate(server.addr, p, n, ignore_eos=True)["output_ids"] == before["output_ids"]


# ----------------------------------------------------------------------------- AReaL client


def remote_engine(server, trial_name: str, **config_overrides):
    """AReaL's SGLang client, initialised against the dev server."""
    areal_engine = pytest.importorskip("areal.engine")
    from areal.api.cli_args import InferenceEngineConfig

    settings = dict(experiment_name="test-dev-server", trial_name=trial_name, backend="sglang:d1",
                    setup_timeout=30, request_timeout=120, pause_grace_period=0.0,
                    max_concurrent_rollouts=8, consumer_batch_size=1)  # fmt: skip
    config = InferenceEngineConfig(**{**settings, **config_overrides})
    engine = areal_engine.RemoteSGLangEngine(config)
    engine.initialize(addr=server.addr)
    return engine


def test_areal_remote_sglang_engine(server, hf, prompts):
    from areal.api import ModelRequest
    from areal.api.cli_args import GenerationHyperparameters

    engine = remote_engine(server, "t0")
    try:
        p = prompts[0]
        g = GenerationHyperparameters(max_new_tokens=12, greedy=True, ignore_eos=True)
        resp = asyncio.run(engine.agenerate(ModelRequest(rid="r1", input_ids=p, gconfig=g)))
        assert resp.output_tokens == hf_greedy(hf, p, 12)
        assert len(resp.output_logprobs) == 12 and resp.stop_reason == "length"
        assert resp.input_tokens == p

        # Pause mid-flight: the server aborts the request with partial output, the client
        # resubmits prompt + partial output after continue, and the result is seamless.
        n = 300
        g = GenerationHyperparameters(max_new_tokens=n, greedy=True, ignore_eos=True)
        aborted_before = info(server.addr)["num_aborted"]
        box = {}

        def run():
            box["r"] = asyncio.run(engine.agenerate(ModelRequest(rid="r2", input_ids=p, gconfig=g)))

        th = threading.Thread(target=run)
        th.start()
        wait_until(lambda: info(server.addr)["running"] == 1, what="request running")
        time.sleep(0.2)
        engine.pause_generation()
        time.sleep(0.3)
        engine.continue_generation()
        th.join(timeout=120)
        resp = box["r"]
        assert info(server.addr)["num_aborted"] == aborted_before + 1
        assert len(resp.output_tokens) == n == len(resp.output_logprobs)
        assert resp.stop_reason == "length"
        ref = hf_greedy(hf, p, n)
        assert resp.output_tokens == ref
        lps, _ = hf_logprobs(hf, p, ref)
        assert max(abs(a - b) for a, b in zip(resp.output_logprobs, lps)) < 1e-4
    finally:
        engine.destroy()


def resend_after_resume(server, prompt) -> list[float]:
    """Run one long rollout through AReaL's RemoteSGLangEngine and interrupt it as a weight push
    does (dispatcher paused, server paused: it aborts the request, then continued, then the
    dispatcher resumed); the sleeps agenerate asked for meanwhile, in seconds."""
    from areal.api import ModelRequest
    from areal.api.cli_args import GenerationHyperparameters

    engine = remote_engine(server, "resume")
    asked, real_sleep, box = [], asyncio.sleep, {}

    async def recorded_sleep(delay, result=None):
        if delay > 0:
            asked.append(delay)
        return await real_sleep(delay, result)

    def run():
        g = GenerationHyperparameters(max_new_tokens=200, greedy=True, ignore_eos=True)
        box["r"] = asyncio.run(engine.agenerate(ModelRequest(rid="resume", input_ids=prompt, gconfig=g)))

    try:
        asyncio.sleep = recorded_sleep
        th = threading.Thread(target=run)
        th.start()
        wait_until(lambda: info(server.addr)["running"] == 1, what="request running")
        engine.pause()  # the trainer's rollout.pause() before a push
        engine.pause_generation()  # the push: the server aborts the running request
        engine.continue_generation()
        time.sleep(0.3)  # the rest of the trainer's step
        engine.resume()
        th.join(timeout=120)
    finally:
        asyncio.sleep = real_sleep
        engine.destroy()
    assert len(box["r"].output_tokens) == 200  # the aborted request was resent and finished
    return asked


@pytest.fixture
def upstream_resends(monkeypatch):
    """AReaL's own resend wait for the test, whatever ran before in this process; restored after."""
    from areal.infra import remote_inf_engine
    from areal.infra.async_task_runner import AsyncTaskRunner
    from areal.infra.workflow_executor import WorkflowExecutor

    monkeypatch.setattr(remote_inf_engine, "asyncio", asyncio)
    for owner, name in [(remote_inf_engine.RemoteInfEngine, "pause"), (remote_inf_engine.RemoteInfEngine, "pause_generation"),
                        (remote_inf_engine.RemoteInfEngine, "set_version"), (WorkflowExecutor, "is_paused"),
                        (AsyncTaskRunner, "__init__")]:  # fmt: skip
        original = getattr(owner, name)
        monkeypatch.setattr(owner, name, getattr(original, "__wrapped__", original))


def test_areal_resends_an_aborted_rollout_on_a_half_second_poll(server, prompts, upstream_resends):
    """The premise of areal_patches/resume_poll (if AReaL changes, drop the module)."""
    asked = resend_after_resume(server, prompts[0])
    assert asked and set(asked) == {0.5}


def test_resume_poll_resends_it_within_20_ms_of_the_resume(server, prompts, upstream_resends):
    from areal.infra import remote_inf_engine

    from areal_patches import resume_poll

    resume_poll.install()
    resume_poll.install()  # idempotent
    assert isinstance(remote_inf_engine.asyncio, resume_poll.CappedSleep)
    asked = resend_after_resume(server, prompts[0])
    assert len(asked) >= 10 and max(asked) == resume_poll.POLL_SECONDS  # polled through the 0.3 s


def timed_workflow():
    """An AReaL rollout workflow that notes when each episode starts (`.started[data["name"]]`),
    then waits `data["seconds"]`: what the tests using it check is when AReaL's dispatcher starts
    an episode, not what it generates."""
    from areal.api import RolloutWorkflow

    class Timed(RolloutWorkflow):
        def __init__(self):
            self.started = {}

        async def arun_episode(self, engine, data):
            self.started[data["name"]] = time.perf_counter()
            await asyncio.sleep(data["seconds"])
            return {"rewards": torch.tensor([1.0])}

    return Timed()


def start_after_resume(server) -> float:
    """Seconds from the trainer's resume of AReaL's dispatcher to the start of a rollout queued
    while it was paused, with another rollout running through the pause (as rollouts do through
    a weight push); the resume comes 0.6 s after the pause."""
    engine = remote_engine(server, "runner", max_head_offpolicyness=8)  # the staleness bound holds nothing
    workflow = timed_workflow()
    try:
        engine.submit({"name": "running", "seconds": 2.0}, workflow=workflow)
        wait_until(lambda: "running" in workflow.started, what="a rollout running")
        engine.pause()
        engine.submit({"name": "queued", "seconds": 0.0}, workflow=workflow)
        time.sleep(0.6)
        resumed = time.perf_counter()
        engine.resume()
        engine.wait(count=2, timeout=30)
    finally:
        engine.destroy()
    return workflow.started["queued"] - resumed


def test_areal_starts_new_rollouts_on_a_half_second_poll_after_a_resume(server, upstream_resends):
    """The premise of resume_poll's runner poll: paused, AReaL's runner sleeps 0.5 s at a time."""
    assert start_after_resume(server) > 0.25


def test_resume_poll_starts_them_within_20_ms_of_the_resume(server, upstream_resends):
    from areal_patches import resume_poll

    resume_poll.install()
    assert start_after_resume(server) < 0.15


def wait_for_the_second_batch(server, offpolicyness: int) -> float:
    """Seconds AReaL's prepare_batch takes to return a trainer's second batch (2 rollouts of
    0.3 s each) after 0.5 s of training and a push (version 1) that followed its first."""

    class Batches(list):  # what prepare_batch reads of a dataloader: its batches and their size
        batch_size = 2

    engine = remote_engine(server, f"ahead{offpolicyness}", consumer_batch_size=2, max_head_offpolicyness=offpolicyness)
    batches = Batches([[{"name": i, "seconds": 0.3} for i in (2 * b, 2 * b + 1)] for b in range(20)])
    workflow = timed_workflow()
    try:
        assert len(engine.prepare_batch(batches, workflow=workflow)) == 2
        time.sleep(0.5)  # the trainer trains
        engine.pause()
        engine.set_version(1)  # and pushes
        engine.resume()
        started = time.perf_counter()
        assert len(engine.prepare_batch(batches, workflow=workflow)) == 2
        return time.perf_counter() - started
    finally:
        engine.destroy()


@pytest.fixture
def upstream_dispatcher(monkeypatch):
    """AReaL's own prepare_batch rounds for the test, whatever ran before in this process."""
    from areal.infra.workflow_executor import BatchTaskDispatcher

    original = BatchTaskDispatcher.active_submit_and_wait
    monkeypatch.setattr(BatchTaskDispatcher, "active_submit_and_wait", getattr(original, "__wrapped__", original))


def test_areal_starts_the_next_batch_only_when_the_trainer_asks_for_it(server, upstream_dispatcher):
    """The premise of areal_patches/submit_ahead: nothing runs while the trainer trains."""
    assert wait_for_the_second_batch(server, offpolicyness=2) > 0.2


def test_submit_ahead_runs_it_while_the_trainer_trains_and_never_beyond_the_bound(server, upstream_dispatcher):
    from areal_patches import submit_ahead

    submit_ahead.install()
    submit_ahead.install()  # idempotent
    assert wait_for_the_second_batch(server, offpolicyness=2) < 0.1
    assert wait_for_the_second_batch(server, offpolicyness=0) > 0.2  # synchronous: the bound holds it


def interrupt_by_a_push(server, prompt, new_version: bool):
    """A long rollout through AReaL's RemoteSGLangEngine, interrupted as a weight push does it:
    the trainer pauses the dispatcher, the push pauses the server (which aborts the request),
    loads and continues it, and the trainer sets the client's new version (`new_version`).
    Returns the engine, with the dispatcher still paused, and the rollout's thread and result."""
    from areal.api import ModelRequest
    from areal.api.cli_args import GenerationHyperparameters

    engine = remote_engine(server, "push")
    box = {}

    def run():
        g = GenerationHyperparameters(max_new_tokens=200, greedy=True, ignore_eos=True)
        box["r"] = asyncio.run(engine.agenerate(ModelRequest(rid="push", input_ids=prompt, gconfig=g)))

    th = threading.Thread(target=run)
    th.start()
    wait_until(lambda: info(server.addr)["running"] == 1, what="request running")
    engine.pause()
    engine.pause_generation()
    engine.continue_generation()
    if new_version:
        engine.set_version(1)
    return engine, th, box


def test_resume_poll_resends_it_once_the_push_is_over_before_the_trainer_resumes(server, prompts, upstream_resends):
    from areal_patches import resume_poll

    resume_poll.install()
    engine, th, box = interrupt_by_a_push(server, prompts[0], new_version=True)
    try:
        th.join(timeout=120)
        assert not th.is_alive() and engine.workflow_executor.runner.paused.is_set()  # done, the dispatcher still paused
        versions = box["r"].output_versions
        assert len(versions) == 200 and versions[0] == 0 and versions[-1] == 1  # old weights, then the new
        assert versions == sorted(versions)
    finally:
        engine.resume()
        engine.destroy()


def test_resume_poll_holds_a_resend_without_a_new_version_until_the_resume(server, prompts, upstream_resends):
    from areal_patches import resume_poll

    resume_poll.install()
    engine, th, box = interrupt_by_a_push(server, prompts[0], new_version=False)
    try:
        th.join(timeout=1.0)
        assert th.is_alive() and info(server.addr)["running"] == 0  # not resent while paused
        engine.resume()
        th.join(timeout=120)
        assert len(box["r"].output_tokens) == 200 and set(box["r"].output_versions) == {0}
    finally:
        engine.resume()
        engine.destroy()


# ----------------------------------------------------------------------------- process hygiene


def test_serve_leaves_no_process_when_body_raises(tiny_model_dir, tmp_path):
    log = tmp_path / "server.log"
    with pytest.raises(RuntimeError, match="boom"):
        with client.serve(tiny_model_dir, log_file=log) as addr:
            pid = info(addr)["pid"]
            assert alive(pid)
            raise RuntimeError("boom")
    assert not alive(pid)
    with pytest.raises(OSError):
        client.http_json(addr, "/health", timeout=2)
    assert log.read_text().rstrip().endswith("stopped")  # SIGTERM shut it down cleanly


def test_the_client_imports_no_torch():
    """Scripts, launchers and evaluate.py start servers through it without paying for torch."""
    assert heavy_imports("devkit.dev_server.client", {"torch", "transformers"}) == []


def test_server_exits_when_its_parent_is_killed(tiny_model_dir):
    code = (
        "import sys, time\n"
        "from devkit.dev_server.client import DevServer\n"
        f"s = DevServer({str(tiny_model_dir)!r}).start()\n"
        "print(s.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        pid = int(parent.stdout.readline())
        assert alive(pid)
    finally:
        parent.kill()  # SIGKILL: no atexit, no cleanup in the parent
        parent.wait()
    wait_until(lambda: not alive(pid), timeout=15, what="orphaned server to exit")


def test_unhealthy_server_error_names_address_and_log(tmp_path):
    log = tmp_path / "server.log"
    with pytest.raises(RuntimeError) as e:
        with client.serve(tmp_path / "no-such-model", log_file=log, timeout=60):
            pass
    msg = str(e.value)
    assert "127.0.0.1:" in msg and str(log) in msg
    assert log.exists() and log.stat().st_size > 0
