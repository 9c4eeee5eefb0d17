"""Measure a model on the held-out Countdown puzzles.

    python3 evaluate.py --model PATH                       # starts a local server for PATH
    python3 evaluate.py --server HOST:PORT --tokenizer PATH  # any SGLang-protocol server

Each puzzle's prompt is built by `countdown.prompt_token_ids`, the function training
uses, and each completion is decoded and scored exactly as in train.py (reward_score).
The report gives, overall and by number count: pass@1 (mean success over all samples),
pass@k (the unbiased estimator of Chen et al. 2021 over `--n` samples per puzzle),
format rate, mean completion length, truncation rate, exact steps (the share of the
reasoning's `a op b = v` lines whose arithmetic is right) and failures by kind. It is
printed as a Markdown table and, with `--out-dir`, written to eval.json, eval.md and
failures.jsonl (a few failed completions of each kind, for a person to read). With
`--solved-out`, the puzzles solved are written with their distinct correct completions,
which sft.py trains on in place of the reference solutions (rejection-sampling fine-tuning).

The defaults (one greedy sample per puzzle, 1024 new tokens) match the trainer's
evaluation, so `pass@1` here is comparable with `eval-rollout/success` in a run's logs.

With `--model`, the server is the project's dev server (devkit/dev_server/) on CPU,
or on CUDA when a GPU is present. When SGLang is installed and a GPU is present,
SGLang is started instead; that branch is not exercised by this repository's tests
(they run on CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import math
import random
import re
import sys
import time
import zlib
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path

if __name__ == "__main__":  # the wrong Python costs one line, not a traceback
    from devkit.launch import preflight

    preflight.require_modules("evaluate.py", ("aiohttp", "transformers"))

import aiohttp

import countdown
from devkit.dev_server.client import DevServer
from reward_score import Verdict, apply_operator, has_think_answer_format, judge

DEFAULT_DATA = f"{countdown.DEFAULT_OUT_DIR}/{countdown.TEST_FILE}"
FAILED_REQUEST = "failed_request"  # the verdict of a sample whose request never succeeded
FAILURE_KINDS = [v.value for v in Verdict if v is not Verdict.CORRECT] + [FAILED_REQUEST]
BACKOFF_S = 1.0  # wait before the first retry; doubled before each further one
# a number as sft_formats.completions.solution_steps writes it; bounded, so exact math stays cheap
_NUMBER = r"\d{1,9}(?:/\d{1,9})?"
STEP_LINE = re.compile(rf"^({_NUMBER}) ([-+*/]) ({_NUMBER}) = ({_NUMBER})$", re.MULTILINE)


class EvalError(Exception):
    """A problem the user can fix (bad address, tokenizer folder, option); printed as one line."""


# -----------------------------------------------------------------------------
# puzzles and samples


@dataclass
class Sample:
    """One completion of one puzzle, scored."""

    puzzle: int  # line index of the puzzle in the data file (0-based, blank lines skipped)
    sample: int  # which of the puzzle's --n samples
    nums: list[int]
    target: int
    verdict: str  # a reward_score.Verdict value, or FAILED_REQUEST
    completion: str | None = None  # None when the request failed
    completion_tokens: int = 0
    finish_reason: str | None = None  # "stop" or "length"
    format_ok: bool = False
    steps_written: int = 0  # `a op b = v` lines in the reasoning
    steps_right: int = 0  # ... whose arithmetic is right
    error: str | None = None  # why the request failed


def select_puzzles(rows: list[dict], limit: int | None, seed: int) -> list[int]:
    """Indices of the puzzles to evaluate: all of them, or `limit` drawn with `seed`
    (the same seed always draws the same puzzles), in file order."""
    if limit is None or limit >= len(rows):
        return list(range(len(rows)))
    return sorted(random.Random(seed).sample(range(len(rows)), limit))


def sampling_seed(seed: int, puzzle: int, sample: int) -> int:
    """A distinct, reproducible seed per request: with one shared seed a deterministic
    server would return the same completion `--n` times. SGLang honours it when started
    with --enable-deterministic-inference; the dev server ignores it (its sampler is
    seeded once, by its own --seed)."""
    return zlib.crc32(f"{seed}:{puzzle}:{sample}".encode())


def score(row: dict, puzzle: int, sample: int, completion: str, completion_tokens: int,
          finish_reason: str) -> Sample:
    right, written = worked_steps(completion)
    return Sample(
        puzzle=puzzle,
        sample=sample,
        nums=row["nums"],
        target=row["target"],
        verdict=judge(completion, row).value,
        completion=completion,
        completion_tokens=completion_tokens,
        finish_reason=finish_reason,
        format_ok=has_think_answer_format(completion),
        steps_written=written,
        steps_right=right,
    )


def worked_steps(completion: str) -> tuple[int, int]:
    """(right, written): the reasoning's step lines (`12 + 7 = 19`, as in the reference
    completions) and how many of them compute correctly.

    Why: a small model can learn to write steps that land on the target with sums that
    are wrong; pass@1 does not tell whether its reasoning computes or only looks as if it
    did (docs/results/goal-65.md, the retry format).
    """
    right = written = 0
    for a, op, b, value in STEP_LINE.findall(completion.split("</think>", 1)[0]):
        written += 1
        right += apply_operator(Fraction(a), op, Fraction(b)) == Fraction(value)
    return right, written


def failed(row: dict, puzzle: int, sample: int, error: str) -> Sample:
    return Sample(puzzle=puzzle, sample=sample, nums=row["nums"], target=row["target"],
                  verdict=FAILED_REQUEST, error=error)


# -----------------------------------------------------------------------------
# metrics (pure functions of the scored samples)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn without replacement from n,
    of which c are correct, is correct: 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def group_metrics(samples: list[Sample], ks: list[int]) -> dict:
    """Metrics of one group of samples. pass@k counts a failed request as an unsolved
    sample (so it is a lower bound when requests failed); format, length and truncation
    are over the samples that got a completion (None when none did)."""
    correct_by_puzzle: dict[int, list[bool]] = defaultdict(list)
    for s in samples:
        correct_by_puzzle[s.puzzle].append(s.verdict == Verdict.CORRECT)
    answered = [s for s in samples if s.verdict != FAILED_REQUEST]
    kinds = Counter(s.verdict for s in samples)
    metrics = {"puzzles": len(correct_by_puzzle), "samples": len(samples)}
    for k in ks:
        metrics[f"pass@{k}"] = _mean([pass_at_k(len(c), sum(c), k) for c in correct_by_puzzle.values()])
    metrics["format_rate"] = _mean([float(s.format_ok) for s in answered])
    metrics["mean_completion_tokens"] = _mean([float(s.completion_tokens) for s in answered])
    metrics["truncation_rate"] = _mean([float(s.finish_reason == "length") for s in answered])
    written = sum(s.steps_written for s in answered)
    metrics["exact_step_rate"] = sum(s.steps_right for s in answered) / written if written else None
    metrics["failures"] = {kind: kinds[kind] for kind in FAILURE_KINDS}
    return metrics


def summarize(samples: list[Sample], ks: list[int]) -> dict:
    """Metrics overall and by how many numbers the puzzle has."""
    by_count: dict[int, list[Sample]] = defaultdict(list)
    for s in samples:
        by_count[len(s.nums)].append(s)
    return {
        "overall": group_metrics(samples, ks),
        "by_num_count": {str(n): group_metrics(by_count[n], ks) for n in sorted(by_count)},
    }


def solved_rows(rows: list[dict], samples: list[Sample]) -> list[dict]:
    """Each puzzle with a correct sample: its row from --data plus `completions`, its distinct
    correct completions in sample order. Why distinct: a completion sampled again and again
    would otherwise outweigh the other ways the model found to solve the same puzzle."""
    found: dict[int, list[str]] = defaultdict(list)
    for s in sorted(samples, key=lambda s: (s.puzzle, s.sample)):
        if s.verdict == Verdict.CORRECT and s.completion not in found[s.puzzle]:
            found[s.puzzle].append(s.completion)
    return [{**rows[puzzle], "completions": completions} for puzzle, completions in sorted(found.items())]


def failure_examples(samples: list[Sample], per_kind: int) -> list[dict]:
    """Up to `per_kind` failures of each kind: first samples of puzzles in file order,
    then second samples, ..., so that the examples come from as many puzzles as possible."""
    taken: Counter = Counter()
    examples = []
    for s in sorted(samples, key=lambda s: (s.sample, s.puzzle)):
        if s.verdict != Verdict.CORRECT and taken[s.verdict] < per_kind:
            taken[s.verdict] += 1
            examples.append(asdict(s))
    return examples


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def markdown_table(summary: dict, ks: list[int]) -> str:
    header = ["numbers", "puzzles", "samples", *(f"pass@{k}" for k in ks), "format", "mean tokens",
              "truncated", "exact steps", *(kind.replace("_", " ") for kind in FAILURE_KINDS)]
    groups = [*summary["by_num_count"].items(), ("all", summary["overall"])]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, m in groups:
        tokens = "n/a" if m["mean_completion_tokens"] is None else f"{m['mean_completion_tokens']:.1f}"
        cells = [name, m["puzzles"], m["samples"], *(_pct(m[f"pass@{k}"]) for k in ks),
                 _pct(m["format_rate"]), tokens, _pct(m["truncation_rate"]), _pct(m["exact_step_rate"]),
                 *(m["failures"][kind] for kind in FAILURE_KINDS)]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines)


def markdown_report(summary: dict, config: dict) -> str:
    ks = config["k"]
    lines = [
        "# Countdown evaluation",
        "",
        f"- model: `{config['model']}` (server `{config['server']}`)",
        f"- data: `{config['data']}`: {config['puzzles']} of {config['puzzles_in_file']} puzzles "
        f"(seed {config['seed']}), {config['n']} sample(s) each",
        f"- sampling: temperature {config['temperature']}, top_p {config['top_p']}, "
        f"max_new_tokens {config['max_new_tokens']}",
        "",
        markdown_table(summary, ks),
        "",
        "pass@k: unbiased estimator over the samples of each puzzle, averaged over puzzles "
        "(pass@1 is the mean success over all samples). format: `<think>...</think>` then "
        "`<answer>...</answer>`. exact steps: the reasoning's `a op b = v` lines whose arithmetic "
        "is right, out of all such lines. format, mean tokens, truncated (hit max_new_tokens) and "
        "exact steps are over answered samples.",
    ]
    n_failed = summary["overall"]["failures"][FAILED_REQUEST]
    if n_failed:
        lines += ["", f"**{n_failed} request(s) failed after retries and count as unsolved**: "
                      "the pass@k values above are lower bounds."]
    return "\n".join(lines) + "\n"


# -----------------------------------------------------------------------------
# talking to the server


class RequestFailed(Exception):
    pass


def base_url(server: str) -> str:
    return server.rstrip("/") if "://" in server else f"http://{server}"


async def check_server(session: aiohttp.ClientSession, url: str) -> str | None:
    """Fail early, with one clear message, when nothing usable answers at `url`.
    Returns the served model's path when the server tells (SGLang and the dev server do)."""
    timeout = aiohttp.ClientTimeout(total=10)
    try:
        async with session.get(f"{url}/health", timeout=timeout) as resp:
            if resp.status != 200:
                raise EvalError(f"server at {url} answered /health with HTTP {resp.status}: "
                                "is it still loading the model?")
        async with session.get(f"{url}/get_model_info", timeout=timeout) as resp:
            info = await resp.json(content_type=None) if resp.status == 200 else {}
    except (aiohttp.ClientError, asyncio.TimeoutError) as e:
        raise EvalError(f"cannot reach a server at {url} ({type(e).__name__}: {e}); check that "
                        "it is running and that --server HOST:PORT is its address") from None
    except ValueError:  # /get_model_info is optional: not JSON is fine
        info = {}
    return info.get("model_path") if isinstance(info, dict) else None


async def generate(session: aiohttp.ClientSession, url: str, payload: dict, retries: int,
                   timeout: float) -> tuple[list[int], str]:
    """POST /generate; returns (completion token ids, finish reason).

    Retries connection errors, timeouts, 5xx, 408 and 429 answers and aborted
    generations (a server being paused) with exponential backoff; other 4xx answers
    reject the request itself and are not retried. Raises RequestFailed with the last
    error. Token ids are read from the log-prob list, as AReaL's client does: SGLang
    returns it with or without --skip-tokenizer-init.
    """
    error = "no attempt made"
    for attempt in range(retries):
        if attempt:
            await asyncio.sleep(BACKOFF_S * 2 ** (attempt - 1))
        try:
            async with session.post(f"{url}/generate", json=payload,
                                    timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                if resp.status != 200:
                    error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                    if resp.status < 500 and resp.status not in (408, 429):
                        break  # the request itself is wrong: trying again cannot help
                    continue
                meta = (await resp.json(content_type=None))["meta_info"]
            reason = meta["finish_reason"]["type"]
            if reason == "abort":
                error = f"generation aborted: {meta['finish_reason'].get('message', '')}"
                continue
            return [int(t[1]) for t in meta["output_token_logprobs"]], reason
        except (aiohttp.ClientError, asyncio.TimeoutError) as e:
            error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        except (ValueError, KeyError, TypeError, IndexError) as e:
            error = f"malformed response: {type(e).__name__}: {e}"
    raise RequestFailed(error)


class Progress:
    """done/total and pass@1 so far on stderr: one updating line on a terminal,
    otherwise a line about every 10%."""

    def __init__(self, total: int):
        self.total, self.done, self.correct, self.failed = total, 0, 0, 0
        self.start = time.perf_counter()
        self.tty = sys.stderr.isatty()

    def update(self, sample: Sample) -> None:
        self.done += 1
        self.correct += sample.verdict == Verdict.CORRECT
        self.failed += sample.verdict == FAILED_REQUEST
        if self.tty or self.done == self.total or self.done % max(1, self.total // 10) == 0:
            line = (f"{self.done}/{self.total} samples, pass@1 so far {100 * self.correct / self.done:.1f}%, "
                    f"{self.failed} failed requests, {time.perf_counter() - self.start:.0f} s")
            end = "\n" if not self.tty or self.done == self.total else ""
            print(("\r" if self.tty else "") + line, end=end, file=sys.stderr, flush=True)


async def run_samples(url: str, rows: list[dict], puzzles: list[int], prompts: list[list[int]],
                      tokenizer, args: argparse.Namespace) -> tuple[str | None, list[Sample]]:
    """The served model's path (if the server tells) and `args.n` samples of every
    puzzle, with at most `args.concurrency` requests in flight."""
    stop_ids = sorted({t for t in (tokenizer.pad_token_id, tokenizer.eos_token_id) if t is not None})
    semaphore = asyncio.Semaphore(args.concurrency)
    progress = Progress(len(puzzles) * args.n)

    async def one(session: aiohttp.ClientSession, puzzle: int, prompt: list[int], j: int) -> Sample:
        params = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
                  "top_p": args.top_p, "stop_token_ids": stop_ids}
        if args.temperature > 0:
            params["sampling_seed"] = sampling_seed(args.seed, puzzle, j)
        payload = {"input_ids": prompt, "sampling_params": params, "return_logprob": True, "stream": False}
        async with semaphore:
            try:
                ids, reason = await generate(session, url, payload, args.retries, args.request_timeout)
                completion = tokenizer.decode(ids, skip_special_tokens=True)  # as train.py does
                sample = score(rows[puzzle], puzzle, j, completion, len(ids), reason)
            except RequestFailed as e:
                sample = failed(rows[puzzle], puzzle, j, str(e))
        progress.update(sample)
        return sample

    # aiohttp opens at most 100 connections by default, which would cap --concurrency there
    connector = aiohttp.TCPConnector(limit=args.concurrency)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None), connector=connector) as session:
        served_model = await check_server(session, url)
        jobs = [one(session, p, prompt, j) for p, prompt in zip(puzzles, prompts) for j in range(args.n)]
        return served_model, list(await asyncio.gather(*jobs))


class SGLangServer(DevServer):
    """SGLang under the dev server's process handling (own process group, /health wait,
    kill on exit). Not exercised by this repository's tests: no GPU here."""

    def command(self) -> list[str]:
        return [self.python, "-m", "sglang.launch_server", "--model-path", self.model_path,
                "--host", self.host, "--port", str(self.port), "--random-seed", str(self.seed),
                "--skip-tokenizer-init"]


@contextlib.contextmanager
def inference_server(args: argparse.Namespace):
    """Yield the address to evaluate against: `--server`, or a server started for `--model`."""
    if args.server:
        yield args.server
        return
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and importlib.util.find_spec("sglang"):
        server = SGLangServer(args.model, seed=args.seed, timeout=1800)
        print(f"starting SGLang for {args.model} on {device}", file=sys.stderr)
    else:
        dtype = "float32" if device == "cpu" else "bfloat16"
        server = DevServer(args.model, device=device, dtype=dtype, seed=args.seed,
                                      max_batch=args.concurrency, timeout=600)
        print(f"starting the dev server for {args.model} on {device}/{dtype}", file=sys.stderr)
    try:
        server.start()
    except (RuntimeError, TimeoutError) as e:
        raise EvalError(str(e).splitlines()[0]) from None
    with server:
        yield server.addr


def load_tokenizer(path: str):
    if not Path(path).is_dir():
        raise EvalError(f"{path}: not a local folder (nothing is downloaded from the Hugging Face hub)")
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as e:
        raise EvalError(f"cannot load a tokenizer from {path}: {e}") from None


# -----------------------------------------------------------------------------
# command line


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="evaluate.py", description=__doc__.split("\n\n")[0])
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--model", help="local Hugging Face model folder: a server is started for it")
    where.add_argument("--server", help="HOST:PORT of a running SGLang-protocol server")
    p.add_argument("--tokenizer", help="tokenizer folder (default: --model; required with --server)")
    p.add_argument("--device", help="for --model: cpu, cuda, cuda:1 ... (default: cuda if available)")
    p.add_argument("--data", default=DEFAULT_DATA, help="test puzzles, JSONL from countdown.py (%(default)s)")
    p.add_argument("--limit", type=int, help="evaluate this many puzzles, drawn with --seed (default: all)")
    p.add_argument("--n", type=int, default=1, help="samples per puzzle (%(default)s)")
    p.add_argument("--k", type=int, nargs="+", default=[], help="pass@k to report besides pass@1, k <= n")
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (%(default)s)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling (%(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=1024, help="completion budget (%(default)s)")
    p.add_argument("--seed", type=int, default=0,
                   help="picks the --limit puzzles; seeds the server started for --model and is sent "
                        "as sampling_seed (one per request) when sampling (%(default)s)")
    p.add_argument("--concurrency", type=int, default=64, help="most requests in flight (%(default)s)")
    p.add_argument("--retries", type=int, default=3,
                   help="tries per request before counting it failed (%(default)s)")
    p.add_argument("--request-timeout", type=float, default=900.0, help="seconds per try (%(default)s)")
    p.add_argument("--out-dir", type=Path, help="write eval.json, eval.md and failures.jsonl here")
    p.add_argument("--failures-per-kind", type=int, default=5,
                   help="failures of each kind kept in failures.jsonl (%(default)s)")
    p.add_argument("--solved-out", type=Path,
                   help="write the puzzles solved, each with its distinct correct completions, as JSONL "
                        "(sft.py trains on them: rejection-sampling fine-tuning)")
    args = p.parse_args(argv)
    if args.server and not args.tokenizer:
        p.error("--tokenizer is required with --server")
    for name in ("n", "concurrency", "retries", "max_new_tokens"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.limit is not None and args.limit < 1:
        p.error("--limit must be >= 1")
    if any(not 1 <= k <= args.n for k in args.k):
        p.error(f"every --k must be between 1 and --n ({args.n}), got {args.k}")
    args.k = sorted({1, *args.k})
    return args


def write_outputs(out_dir: Path, report: dict, markdown: str, failures: list[dict]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "eval.json").write_text(json.dumps(report, indent=2) + "\n")
    (out_dir / "eval.md").write_text(markdown)
    (out_dir / "failures.jsonl").write_text("".join(json.dumps(f) + "\n" for f in failures))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        rows = countdown.load_puzzles(args.data)  # first: a bad file fails before any slow import
    except countdown.DataError as e:
        print(f"evaluate.py: {e}", file=sys.stderr)
        return 2
    if args.n > 1 and args.temperature == 0:
        print("evaluate.py: warning: --n > 1 with greedy decoding repeats the same completion",
              file=sys.stderr)
    puzzles = select_puzzles(rows, args.limit, args.seed)
    start = time.perf_counter()
    try:
        tokenizer = load_tokenizer(args.tokenizer or args.model)
        prompts = [countdown.prompt_token_ids(tokenizer, rows[i]["messages"]) for i in puzzles]
        with inference_server(args) as addr:
            url = base_url(addr)
            served_model, samples = asyncio.run(run_samples(url, rows, puzzles, prompts, tokenizer, args))
    except EvalError as e:
        print(f"evaluate.py: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nevaluate.py: interrupted", file=sys.stderr)
        return 130

    summary = summarize(samples, args.k)
    config = {
        "model": args.model or served_model or "unknown", "tokenizer": args.tokenizer or args.model,
        "server": args.server or "started for --model",
        "data": args.data, "puzzles": len(puzzles), "puzzles_in_file": len(rows), "n": args.n,
        "k": args.k, "temperature": args.temperature, "top_p": args.top_p,
        "max_new_tokens": args.max_new_tokens, "seed": args.seed, "limit": args.limit,
    }
    errors = Counter(s.error for s in samples if s.error)
    report = {"config": config, **summary, "request_errors": dict(errors.most_common(5)),
              "elapsed_s": round(time.perf_counter() - start, 1)}
    markdown = markdown_report(summary, config)
    print(markdown)
    if errors:
        print(f"evaluate.py: {sum(errors.values())} request(s) failed (up to {args.retries} tries each); "
              f"most common error: {errors.most_common(1)[0][0]}", file=sys.stderr)
    if args.out_dir:
        write_outputs(args.out_dir, report, markdown, failure_examples(samples, args.failures_per_kind))
        print(f"wrote {args.out_dir}/eval.json, eval.md and failures.jsonl", file=sys.stderr)
    if args.solved_out:
        solved = solved_rows(rows, samples)
        countdown.write_jsonl([(args.solved_out, solved)])
        print(f"wrote {len(solved)} solved puzzles to {args.solved_out}", file=sys.stderr)
    return 1 if sum(errors.values()) == len(samples) else 0  # nothing was evaluated


if __name__ == "__main__":
    sys.exit(main())
