"""evaluate.py: metric functions, the CLI against the tiny model and the dev server, a
flaky server, an unreachable one, and bad data files."""

import asyncio
import contextlib
import itertools
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from aiohttp import web

import countdown
import evaluate
from devkit import ROOT
from devkit.dev_server.client import serve
from devkit.processes import find_free_port
from evaluate import FAILED_REQUEST, Sample, group_metrics, pass_at_k, summarize, worked_steps

OUTPUT_KEYS = {"puzzles", "samples", "pass@1", "format_rate", "mean_completion_tokens",
               "truncation_rate", "exact_step_rate", "failures"}


# -----------------------------------------------------------------------------
# metrics


def test_pass_at_k_matches_brute_force():
    """The estimator equals the fraction of k-subsets of the n samples holding a correct one."""
    for n in range(1, 7):
        for c in range(n + 1):
            outcomes = [True] * c + [False] * (n - c)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(outcomes, k))
                expected = sum(any(s) for s in subsets) / len(subsets)
                assert pass_at_k(n, c, k) == pytest.approx(expected), (n, c, k)


def test_pass_at_k_rejects_impossible_arguments():
    for n, c, k in [(4, 5, 1), (4, 1, 5), (4, 1, 0), (4, -1, 1)]:
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


def _sample(puzzle, nums, verdict, tokens=10, reason="stop", format_ok=True, sample=0, steps=(0, 0)):
    if verdict == FAILED_REQUEST:
        return Sample(puzzle=puzzle, sample=sample, nums=nums, target=10, verdict=verdict, error="HTTP 500",
                      steps_right=5, steps_written=5)  # never counted: no completion
    return Sample(puzzle=puzzle, sample=sample, nums=nums, target=10, verdict=verdict, completion="...",
                  completion_tokens=tokens, finish_reason=reason, format_ok=format_ok,
                  steps_right=steps[0], steps_written=steps[1])


def test_summarize_groups_by_number_count():
    three, four = [1, 2, 3], [1, 2, 3, 4]
    samples = [
        # puzzle 0 (3 numbers): 1 of 2 correct
        _sample(0, three, "correct", tokens=10, steps=(2, 2)),
        _sample(0, three, "wrong_value", tokens=30, reason="length", format_ok=False, steps=(1, 4)),
        # puzzle 1 (3 numbers): none correct, one request failed
        _sample(1, three, "no_answer", tokens=20, format_ok=False),
        _sample(1, three, FAILED_REQUEST),
        # puzzle 2 (4 numbers): both correct
        _sample(2, four, "correct", tokens=40),
        _sample(2, four, "correct", tokens=40),
    ]
    summary = summarize(samples, [1, 2])
    assert set(summary["by_num_count"]) == {"3", "4"}
    g3, g4, overall = summary["by_num_count"]["3"], summary["by_num_count"]["4"], summary["overall"]
    assert set(overall) == OUTPUT_KEYS | {"pass@2"}
    assert (g3["puzzles"], g3["samples"], g4["puzzles"], g4["samples"]) == (2, 4, 1, 2)
    assert g3["pass@1"] == pytest.approx(0.25)  # the failed request counts as unsolved
    assert g3["pass@2"] == pytest.approx(0.5)
    assert g4["pass@1"] == g4["pass@2"] == 1.0
    assert overall["pass@1"] == pytest.approx(0.5)
    assert overall["pass@2"] == pytest.approx(2 / 3)
    # rates and lengths cover the 3 answered samples of group 3 only
    assert g3["format_rate"] == pytest.approx(1 / 3)
    assert g3["truncation_rate"] == pytest.approx(1 / 3)
    assert g3["mean_completion_tokens"] == pytest.approx(20.0)
    assert g3["exact_step_rate"] == pytest.approx(3 / 6)  # pooled over steps, not per sample
    assert g4["exact_step_rate"] is None  # no step lines at all
    assert g3["failures"] == {"no_answer": 1, "invalid_expression": 0, "wrong_numbers": 0,
                              "wrong_value": 1, "failed_request": 1}
    assert overall["failures"]["failed_request"] == 1


def test_group_with_only_failed_requests_has_no_rates():
    m = group_metrics([_sample(0, [1, 2, 3], FAILED_REQUEST)], [1])
    assert m["pass@1"] == 0.0
    assert m["format_rate"] is m["mean_completion_tokens"] is m["truncation_rate"] is m["exact_step_rate"] is None
    assert "n/a" in evaluate.markdown_table({"overall": m, "by_num_count": {}}, [1])


def test_worked_steps_checks_the_arithmetic_of_each_step_line():
    reasoning = "<think>\nI need to make 24 from 8, 3, 3.\n91 - 25 = 65\n3 - 8/3 = 1/3\n8 / 1/3 = 24\n9 / 0 = 1\n7 * 6 = 42\n</think>\n"
    assert worked_steps(reasoning + "<answer>1 + 2 = 3</answer>") == (3, 5)  # the answer's text is not a step
    assert worked_steps("12 + 7 = 19") == (1, 1)  # no </think>: the whole completion is reasoning
    for text in ["", "<think></think>", "1 + 2 = 3 = 3", " 1 + 2 = 3", "-1 + 2 = 1", "1 ** 2 = 1", "x + 2 = 3"]:
        assert worked_steps(text) == (0, 0), text


@pytest.mark.parametrize("text", ["9" * 200_000, ("12345 * 67890 = 838102050\n" * 20_000), "1/" * 50_000 + "1 + 1 = 2",
                                  "99999999999 * 99999999999 = 1\n" * 1000, "\x00\n" * 100_000])
def test_worked_steps_is_bounded_on_hostile_text(text):
    right, written = worked_steps(text)
    assert 0 <= right <= written <= text.count("\n") + 1


def test_select_puzzles_depends_only_on_seed():
    rows = [{}] * 50
    a = evaluate.select_puzzles(rows, 10, seed=1)
    assert a == evaluate.select_puzzles(rows, 10, seed=1) == sorted(set(a))
    assert a != evaluate.select_puzzles(rows, 10, seed=2)
    assert evaluate.select_puzzles(rows, None, seed=1) == list(range(50))


def test_failure_examples_keep_a_few_of_each_kind_from_many_puzzles():
    samples = [_sample(p, [1, 2, 3], v, sample=j)
               for p, verdicts in enumerate([["no_answer"] * 3, ["no_answer", "correct", "wrong_value"]])
               for j, v in enumerate(verdicts)]
    kept = evaluate.failure_examples(samples, per_kind=2)
    assert [(f["puzzle"], f["sample"], f["verdict"]) for f in kept] == [
        (0, 0, "no_answer"), (1, 0, "no_answer"), (1, 2, "wrong_value")]


def test_report_says_when_requests_failed():
    config = dict(model="m", server="s", data="d", puzzles=1, puzzles_in_file=1, n=2, k=[1],
                  temperature=1.0, top_p=1.0, max_new_tokens=8, seed=0)
    text = evaluate.markdown_report(summarize([_sample(0, [1, 2, 3], FAILED_REQUEST),
                                               _sample(0, [1, 2, 3], "correct")], [1]), config)
    assert "1 request(s) failed" in text and "lower bounds" in text


# -----------------------------------------------------------------------------
# command line against real and fake servers


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "test.jsonl"
    countdown.write_jsonl([(path, countdown.generate_puzzles(20, seed=3))])
    return path


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return evaluate.load_tokenizer(str(tiny_model_dir))


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    with serve(tiny_model_dir) as addr:
        yield addr


def run_main(capsys, *argv) -> tuple[int, str, str]:
    code = evaluate.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_model_end_to_end(tiny_model_dir, data_file, tmp_path, capsys):
    """--model starts the dev server itself; 8 puzzles x 2 samples with pass@2."""
    code, out, err = run_main(capsys, "--model", tiny_model_dir, "--data", data_file, "--limit", 8,
                              "--n", 2, "--k", 2, "--temperature", 1.0, "--max-new-tokens", 12,
                              "--out-dir", tmp_path)
    assert code == 0, err
    report = json.loads((tmp_path / "eval.json").read_text())
    assert set(report["overall"]) == OUTPUT_KEYS | {"pass@2"}
    assert report["overall"]["puzzles"] == 8 and report["overall"]["samples"] == 16
    assert sum(g["samples"] for g in report["by_num_count"].values()) == 16
    assert set(report["by_num_count"]) <= {"3", "4"}
    assert sum(report["overall"]["failures"].values()) <= 16
    assert report["overall"]["failures"]["failed_request"] == 0
    assert 0 < report["overall"]["mean_completion_tokens"] <= 12
    assert report["config"]["k"] == [1, 2] and report["config"]["puzzles_in_file"] == 20
    assert (tmp_path / "eval.md").read_text() in out + "\n"
    assert "| all | 8 | 16 |" in out
    failures = [json.loads(line) for line in (tmp_path / "failures.jsonl").read_text().splitlines()]
    assert failures and all(f["completion"] is not None and f["nums"] and f["target"] for f in failures)
    assert "16/16 samples" in err


def test_server_mode_greedy_is_deterministic(server, tiny_model_dir, data_file, tmp_path, capsys):
    """--server against a dev server started with the helper: two greedy runs agree."""
    runs = []
    for name in ("a", "b"):
        code, out, err = run_main(capsys, "--server", server, "--tokenizer", tiny_model_dir,
                                  "--data", data_file, "--limit", 8, "--max-new-tokens", 16,
                                  "--out-dir", tmp_path / name)
        assert code == 0, err
        runs.append(json.loads((tmp_path / name / "eval.json").read_text()))
        runs[-1]["failures.jsonl"] = (tmp_path / name / "failures.jsonl").read_text()
        runs[-1].pop("elapsed_s")
    assert runs[0] == runs[1]
    assert runs[0]["config"]["model"] == str(tiny_model_dir)  # from the server's /get_model_info
    assert runs[0]["overall"]["samples"] == 8


@contextlib.contextmanager
def fake_server(generate):
    """Serve a /generate handler (a mock of SGLang's) and /health on a free port, from a
    background thread."""

    async def health(request: web.Request) -> web.Response:
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/generate", generate)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
    host, port = runner.addresses[0][:2]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"{host}:{port}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.run_until_complete(runner.cleanup())
        loop.close()


def sglang_reply(ids: list[int]) -> web.Response:
    """A finished completion of `ids` in SGLang's /generate response format."""
    meta = {"finish_reason": {"type": "stop", "matched": 2}, "completion_tokens": len(ids),
            "output_token_logprobs": [[-0.1, t, None] for t in ids]}
    return web.json_response({"text": "", "meta_info": meta})


def test_flaky_server_is_retried_then_counted(tokenizer, tiny_model_dir, data_file, tmp_path,
                                              capsys, monkeypatch):
    """A fake, flaky server (mocks SGLang's /generate): every prompt's first try gets HTTP 500,
    the second try a correct answer in SGLang's response format, and one prompt always
    gets 500. The run retries, solves the others and counts one failed request."""
    monkeypatch.setattr(evaluate, "BACKOFF_S", 0.01)
    rows = countdown.load_puzzles(str(data_file))
    answers = {tuple(countdown.prompt_token_ids(tokenizer, r["messages"])): r["solution"] for r in rows}
    broken = next(iter(answers))  # the first puzzle's prompt
    tries: dict[tuple, int] = {}

    async def generate(request: web.Request) -> web.Response:
        prompt = tuple((await request.json())["input_ids"])
        tries[prompt] = tries.get(prompt, 0) + 1
        if prompt == broken or tries[prompt] == 1:
            return web.json_response({"error": "boom"}, status=500)
        return sglang_reply(tokenizer.encode(f"<think>easy</think>\n<answer>{answers[prompt]}</answer>"))

    with fake_server(generate) as addr:
        code, out, err = run_main(capsys, "--server", addr, "--tokenizer", tiny_model_dir,
                                  "--data", data_file, "--retries", 3, "--out-dir", tmp_path)
    assert code == 0, err
    assert tries[broken] == 3 and all(n == 2 for p, n in tries.items() if p != broken)
    report = json.loads((tmp_path / "eval.json").read_text())
    assert report["overall"]["failures"]["failed_request"] == 1
    assert report["overall"]["pass@1"] == pytest.approx(19 / 20)
    assert report["overall"]["format_rate"] == 1.0
    assert list(report["request_errors"]) == ['HTTP 500: {"error": "boom"}']
    assert "1 request(s) failed after retries" in out
    assert "1 request(s) failed (up to 3 tries each)" in err


def test_solved_out_keeps_each_solved_puzzle_with_its_distinct_correct_completions(
        tokenizer, tiny_model_dir, data_file, tmp_path, capsys):
    """A fake server (mocks SGLang's /generate) answers the first 10 puzzles right, in one of two
    ways by turns, and the others wrong. --solved-out keeps the 10, each with both ways once,
    in a file that sft.py loads (rejection-sampling fine-tuning)."""
    rows = countdown.load_puzzles(str(data_file))
    prompts = [tuple(countdown.prompt_token_ids(tokenizer, r["messages"])) for r in rows]
    solvable = {prompt: row["solution"] for prompt, row in zip(prompts[:10], rows[:10])}
    tries: dict[tuple, int] = {}

    async def generate(request: web.Request) -> web.Response:
        prompt = tuple((await request.json())["input_ids"])
        tries[prompt] = tries.get(prompt, 0) + 1
        answer = solvable.get(prompt, "1 + 1")
        return sglang_reply(tokenizer.encode(f"<think>way {tries[prompt] % 2}</think>\n<answer>{answer}</answer>"))

    out = tmp_path / "solved.jsonl"
    with fake_server(generate) as addr:
        code, _, err = run_main(capsys, "--server", addr, "--tokenizer", tiny_model_dir, "--data", data_file,
                                "--n", 4, "--temperature", 1.0, "--solved-out", out)
    assert code == 0, err
    solved = countdown.load_puzzles(str(out))  # as sft.py loads it, `completions` checked
    assert [{k: v for k, v in row.items() if k != "completions"} for row in solved] == rows[:10]
    for row in solved:
        answer = f"<answer>{row['solution']}</answer>"
        assert sorted(row["completions"]) == [f"<think>way 0</think>\n{answer}", f"<think>way 1</think>\n{answer}"]
    assert "wrote 10 solved puzzles" in err


def test_solved_rows_skip_wrong_and_repeated_completions():
    rows = [{"nums": [1, 2, 3], "target": 10, "id": i} for i in range(3)]
    samples = [_sample(0, [1, 2, 3], "correct", sample=2), _sample(0, [1, 2, 3], "correct", sample=0),
               _sample(1, [1, 2, 3], "wrong_value"), _sample(2, [1, 2, 3], "correct", sample=1),
               _sample(2, [1, 2, 3], "no_answer", sample=0)]
    samples[0].completion = "second"
    assert evaluate.solved_rows(rows, samples) == [
        {**rows[0], "completions": ["...", "second"]}, {**rows[2], "completions": ["..."]}]


def test_concurrency_above_100_is_honoured(tokenizer, tiny_model_dir, data_file, tmp_path, capsys):
    """A fake server (mocks SGLang's /generate) holds each request until 120 are in flight, as
    --concurrency 120 asks (aiohttp's default connection pool stops at 100), or for 5 s."""
    in_flight, most = 0, 0
    all_arrived = asyncio.Event()

    async def generate(request: web.Request) -> web.Response:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        if in_flight == 120:
            all_arrived.set()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(all_arrived.wait(), timeout=5)
        in_flight -= 1
        return sglang_reply([])

    with fake_server(generate) as addr:
        code, out, err = run_main(capsys, "--server", addr, "--tokenizer", tiny_model_dir, "--data", data_file,
                                  "--n", 6, "--concurrency", 120, "--out-dir", tmp_path)
    assert code == 0, err
    assert most == 120


def test_unreachable_server_is_one_clear_error(tiny_model_dir, data_file, capsys):
    addr = f"127.0.0.1:{find_free_port()}"
    code, out, err = run_main(capsys, "--server", addr, "--tokenizer", tiny_model_dir, "--data", data_file)
    assert code == 1
    assert err.count("\n") == 1 and f"cannot reach a server at http://{addr}" in err


@pytest.mark.parametrize("content, where", [
    ('{"nums": [1, 2], "target": 3, "solution": "1 + 2", "messages": [{"role": "user", "content": "x"}]}\n'
     '{"nums": [1, 2], "target": 4, "solution": "1 + 2", "messages": []}\n', "bad.jsonl:2:"),
    ("not json\n", "bad.jsonl:1:"),
    (None, "bad.jsonl: no such file"),
])
def test_bad_data_file_exits_2_with_file_and_line(tmp_path, content, where):
    path = tmp_path / "bad.jsonl"
    if content is not None:
        path.write_text(content)
    proc = subprocess.run([sys.executable, "evaluate.py", "--model", str(tmp_path), "--data", str(path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and where in proc.stderr and "Traceback" not in proc.stderr
