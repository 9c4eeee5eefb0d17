"""Continuous batching (devkit/dev_server/continuous.py): requests that join a running batch on
the static decoder decode as they would alone, are answered when they finish, and leave
their rows to the next ones.

On CPU the static decoder runs eagerly (CUDA graphs need a GPU); the graph replay is checked
on the GPU machine by experiments/bench/gpu/decode.py. The references are the transformers
decoder's static batches, which tests/test_static_decode.py and tests/test_dev_server.py
check against `model.generate`.
"""

import json
import threading
import time
from collections import deque

import pytest

torch = pytest.importorskip("torch")

from transformers import AutoTokenizer  # noqa: E402

import countdown  # noqa: E402
from devkit.dev_server import client  # noqa: E402
from devkit.dev_server.continuous import ContinuousBatch, can_serve  # noqa: E402
from devkit.dev_server.engine import Engine  # noqa: E402
from devkit.dev_server.protocol import GenRequest, SamplingParams  # noqa: E402

ROWS = 4  # fewer cache rows than requests, so rows are reused within a run


@pytest.fixture(scope="module")
def prompts(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = countdown.generate_puzzles(5, seed=7)
    return [countdown.prompt_token_ids(tok, r["messages"]) for r in rows] + [[1, 42], [7] * 30, [3, 9, 27]]


@pytest.fixture(scope="module")
def engines(tiny_model_dir):
    hf = Engine(str(tiny_model_dir), "cpu", "float32", seed=0, decoder="hf")
    static = Engine(str(tiny_model_dir), "cpu", "float32", seed=0, decoder="static",
                    max_batch=ROWS, static_max_len=256)
    return hf, static


def requests(prompts, max_new=(20, 45), temperature=0.0, **params):
    """One request per prompt (greedy unless told), the token budgets cycling through `max_new`."""
    return [GenRequest(rid=str(i), input_ids=list(p), return_logprob=True, logprob_start_len=-1, loop=None,
                       future=None, params=SamplingParams(max_new_tokens=max_new[i % len(max_new)],
                                                          temperature=temperature, **params))
            for i, p in enumerate(prompts)]


def reference(hf, reqs):
    """The transformers decoder's answers, one static batch."""
    return hf.generate_batch(hf.model, reqs, should_abort=lambda: False)


class Arrivals:
    """The scheduler's side of a run: requests arrive in the queue at given decode steps,
    answers are kept with the step they came at."""

    def __init__(self, reqs, arrive_at):
        self.pending = sorted(zip(arrive_at, range(len(reqs)), reqs), key=lambda x: x[:2])
        self.queue = deque()
        self.answers, self.answered_at = {}, {}
        self.batch = None

    def take(self, room, fits):
        steps = self.batch.summary.steps
        while self.pending and self.pending[0][0] <= steps:
            self.queue.append(self.pending.pop(0)[2])
        taken = []
        while self.queue and len(taken) < room and fits(self.queue[0]):
            taken.append(self.queue.popleft())
        return taken

    def answer(self, req, res):
        self.answers[req.rid] = res
        self.answered_at[req.rid] = self.batch.summary.steps

    def run(self, engine, first, should_abort=lambda: False):
        self.batch = ContinuousBatch(engine, engine.model, self.take, self.answer, should_abort)
        return self.batch.run(first)


def assert_same(answers, ref, tol=1e-4):
    for i, r in enumerate(ref):
        a = answers[str(i)]
        assert a["output_ids"] == r["output_ids"], i
        assert a["finish_reason"] == r["finish_reason"], i
        assert a["logprobs"] == pytest.approx(r["logprobs"], abs=tol), i


def test_requests_joining_a_running_batch_decode_as_they_would_alone(engines, prompts):
    """8 requests through 4 rows: two start the run, the others arrive at steps 3-30 and take
    rows as earlier ones finish; greedy outputs and log-probs equal the reference's."""
    hf, static = engines
    reqs = requests(prompts)
    arrivals = Arrivals(reqs[2:], arrive_at=[3, 3, 7, 12, 20, 30])
    summary = arrivals.run(static, reqs[:2])
    assert_same(arrivals.answers, reference(hf, requests(prompts)))
    assert summary.requests == len(reqs) and summary.rows_max == ROWS
    assert summary.output_tokens == sum(len(a["output_ids"]) for a in arrivals.answers.values())


def test_a_request_is_answered_when_it_finishes(engines, prompts):
    """A 20-token request is answered at its 20th step, not when the 45-token one beside it ends."""
    _, static = engines
    reqs = requests(prompts[:2])
    arrivals = Arrivals([], [])
    summary = arrivals.run(static, reqs)
    assert arrivals.answered_at == {"0": 19, "1": 44}  # the first token comes from the prefill
    assert summary.steps == 44


def test_stop_tokens_stop_strings_and_penalties(engines, prompts, tiny_model_dir):
    """Greedy with a frequency penalty, a stop token id and a stop string, per-row budgets:
    the same answers as the reference, rows freed at their stop."""
    hf, static = engines
    first = reference(hf, requests(prompts[:1], max_new=(40,)))[0]["output_ids"]
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    text = tok.decode(first[10:14])
    params = dict(stop_token_ids=(first[6],), stop=(text,), frequency_penalty=0.5)
    reqs = requests(prompts, **params)
    arrivals = Arrivals(reqs[3:], arrive_at=[0] * 5)  # queued: they take rows as rows free
    arrivals.run(static, reqs[:3])
    ref = reference(hf, requests(prompts, **params))
    assert_same(arrivals.answers, ref)
    assert any(r["finish_reason"]["type"] == "stop" for r in ref)


def test_only_requests_of_the_runs_settings_that_fit_its_slots_join(engines, prompts):
    """The queue is taken oldest first and stops at a request with other sampling settings,
    or one needing more cache slots than the run attends over; those wait, in order."""
    _, static = engines
    run_reqs = requests(prompts[:1], max_new=(30,))
    greedy = requests(prompts[1:2], max_new=(10,))[0]
    sampled = requests(prompts[2:3], max_new=(10,), temperature=1.0)[0]
    too_long = requests(prompts[3:4], max_new=(250,))[0]
    for blocker in (sampled, too_long):
        arrivals = Arrivals([greedy, blocker, requests(prompts[4:5])[0]], arrive_at=[0, 0, 0])
        summary = arrivals.run(static, run_reqs)
        assert summary.requests == 2 and set(arrivals.answers) == {"0", greedy.rid}
        assert list(arrivals.queue)[0] is blocker and len(arrivals.queue) == 2


def test_an_abort_answers_every_row_with_what_it_has(engines, prompts):
    hf, static = engines
    reqs = requests(prompts[:4], max_new=(60,))
    arrivals = Arrivals([], [])
    summary = arrivals.run(static, reqs, should_abort=lambda: arrivals.batch.summary.steps >= 9)
    ref = reference(hf, requests(prompts[:4], max_new=(60,)))
    for i, r in enumerate(ref):
        a = arrivals.answers[str(i)]
        assert a["finish_reason"]["type"] == "abort"
        assert a["output_ids"] == r["output_ids"][:10]  # the prefill's token and 9 steps'
    assert summary.finish == {"abort": 4}


def test_sampled_rows_keep_their_own_budgets(engines, prompts):
    _, static = engines
    reqs = requests(prompts, max_new=(5, 17, 33), temperature=1.0, top_p=0.9)
    arrivals = Arrivals(reqs[2:], arrive_at=[1, 4, 4, 8, 15, 15])
    arrivals.run(static, reqs[:2])
    for r in reqs:
        a = arrivals.answers[r.rid]
        assert len(a["output_ids"]) == len(a["logprobs"]) <= r.params.max_new_tokens
        assert all(lp <= 0 for lp in a["logprobs"])


def test_a_run_starts_only_when_the_static_decoder_holds_it(engines, prompts):
    hf, static = engines
    assert can_serve(static, requests(prompts[:ROWS]))
    assert not can_serve(static, requests(prompts[: ROWS + 1]))  # more rows than the cache
    assert not can_serve(static, requests(prompts[:1], max_new=(250,)))  # prompt + 250 > 256 slots
    assert not can_serve(hf, requests(prompts[:1]))


def test_the_server_answers_short_requests_while_a_long_one_runs(tiny_model_dir, prompts, engines):
    """Through HTTP: a long request runs; three short ones sent meanwhile join it and are
    answered before it ends, with the reference's tokens; the server logs one batch that held
    four rows. Then a pause aborts the rows in flight."""
    hf, _ = engines
    args = ["--decoder", "static", "--max-batch", "8", "--static-max-len", "256", "--step-delay-ms", "20"]
    with client.DevServer(tiny_model_dir, extra_args=args) as server:
        done = {}

        def send(i, n):
            body = client.http_request(server.addr, "/generate", {
                "input_ids": prompts[i], "sampling_params": {"max_new_tokens": n, "temperature": 0.0}})[1]
            done[i] = (time.monotonic(), body["output_ids"])

        long = threading.Thread(target=send, args=(0, 120))
        long.start()
        time.sleep(0.5)
        short = [threading.Thread(target=send, args=(i, 8)) for i in (1, 2, 3)]
        for t in short:
            t.start()
        for t in (long, *short):
            t.join(timeout=60)
        assert all(done[i][0] < done[0][0] for i in (1, 2, 3))
        ref = reference(hf, [requests([prompts[i]], max_new=(n,))[0] for i, n in ((0, 120), (1, 8), (2, 8), (3, 8))])
        assert [done[i][1] for i in range(4)] == [r["output_ids"] for r in ref]
        assert "rows_max=4 " in server.log_file.read_text()

        box = {}
        t = threading.Thread(target=lambda: box.setdefault("r", client.http_request(server.addr, "/generate", {
            "input_ids": prompts[4], "sampling_params": {"max_new_tokens": 200, "temperature": 0.0}})[1]))
        t.start()
        time.sleep(0.5)
        assert client.http_request(server.addr, "/pause_generation", {})[0] == 200
        t.join(timeout=30)
        assert box["r"]["meta_info"]["finish_reason"]["type"] == "abort"
        assert 0 < len(box["r"]["output_ids"]) < 200
        assert client.http_request(server.addr, "/continue_generation", {})[0] == 200


def test_the_batching_bench_serves_one_workload_both_ways(tiny_model_dir, tmp_path, capsys):
    from experiments.bench import batching

    out = tmp_path / "rows.json"
    batching.main(["--model", str(tiny_model_dir), "--groups", "3", "--group-size", "2", "--gap-ms", "30",
                   "--max-new", "12", "--max-batch", "8", "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [r["batching"] for r in rows] == ["static", "continuous"]
    for r in rows:
        assert r["requests"] == 6 and 6 <= r["output_tokens"] <= 6 * 12 and r["batches"] >= 1
        assert 0 < r["group_wait_mean_s"] <= r["seconds"]
    assert capsys.readouterr().out.count("| static | 6 |") == 1
