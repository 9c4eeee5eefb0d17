"""devkit/dev_server/static_decode.py against transformers' own decoding, through the dev server's Engine.

On CPU the static decoder runs eagerly (CUDA graphs need a GPU), so these tests check its
arithmetic and bookkeeping: KV-cache layout, left padding, bucket padding rows, grouped-
query attention, weight swaps, fallback. The graph replay itself is checked on the GPU
machine by experiments/bench/gpu/decode.py, which compares it with transformers' decoding.
"""

import pytest

torch = pytest.importorskip("torch")

from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaConfig  # noqa: E402

import countdown  # noqa: E402
from devkit.dev_server import static_decode  # noqa: E402
from devkit.dev_server.engine import Engine  # noqa: E402
from devkit.dev_server.protocol import GenRequest, SamplingParams  # noqa: E402
from devkit.make_tiny_model import make_tiny_model  # noqa: E402


@pytest.fixture(scope="module")
def prompts(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = countdown.generate_puzzles(4, seed=5)
    return [countdown.prompt_token_ids(tok, r["messages"]) for r in rows] + [[1, 42], [7] * 30]


@pytest.fixture(scope="module")
def engines(tiny_model_dir):
    hf = Engine(str(tiny_model_dir), "cpu", "float32", seed=0, decoder="hf")
    static = Engine(str(tiny_model_dir), "cpu", "float32", seed=0, decoder="static",
                    max_batch=16, static_max_len=256)
    return hf, static


def requests(prompts, temperature=0.0, max_new_tokens=40, logprob_start_len=-1, **params):
    p = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, **params)
    return [GenRequest(rid=str(i), input_ids=list(ids), params=p, return_logprob=True,
                       logprob_start_len=logprob_start_len, loop=None, future=None)
            for i, ids in enumerate(prompts)]


def generate(engine, reqs, model=None):
    engine.generator.manual_seed(0)
    return engine.generate_batch(model or engine.model, reqs, should_abort=lambda: False)


def assert_same(a, b, tol=1e-4):
    for x, y in zip(a, b, strict=True):
        assert x["output_ids"] == y["output_ids"]
        assert x["finish_reason"] == y["finish_reason"]
        assert x["logprobs"] == pytest.approx(y["logprobs"], abs=tol)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_static_decoding_equals_transformers(engines, prompts, temperature):
    """6 rows of very different lengths (padded to a bucket of 8), greedy and sampled."""
    hf, static = engines
    assert_same(generate(hf, requests(prompts, temperature)), generate(static, requests(prompts, temperature)))


def test_stop_tokens_and_per_row_limits(engines, prompts):
    hf, static = engines
    first = generate(hf, requests(prompts[:1], max_new_tokens=30))[0]["output_ids"]
    stop = first[5]
    reqs = requests(prompts, stop_token_ids=(stop,))
    reqs[-1].params = SamplingParams(max_new_tokens=3, temperature=0.0)
    a, b = generate(hf, reqs), generate(static, reqs)
    assert_same(a, b)
    assert b[0]["finish_reason"] == {"type": "stop", "matched": stop}
    assert b[0]["output_ids"][-1] == stop and len(b[0]["output_ids"]) <= 6
    assert b[-1]["finish_reason"] == {"type": "length", "length": 3}


def test_prompt_logprobs(engines, prompts):
    hf, static = engines
    a = generate(hf, requests(prompts, max_new_tokens=2, logprob_start_len=0))
    b = generate(static, requests(prompts, max_new_tokens=2, logprob_start_len=0))
    for x, y in zip(a, b):
        assert [t for _, t, _ in x["input_logprobs"]] == [t for _, t, _ in y["input_logprobs"]]
        got = [v for v, _, _ in y["input_logprobs"][1:]]
        assert got == pytest.approx([v for v, _, _ in x["input_logprobs"][1:]], abs=1e-4)


def test_follows_swapped_weights(engines, prompts, tmp_path):
    """The decoder keeps its own copy of the weights; a new model object is copied in."""
    hf, static = engines
    other = make_tiny_model(tmp_path / "other", seed=3, verbose=False)
    new_model = static.load_model(str(other))
    static.check_compatible(new_model)
    before = generate(static, requests(prompts))
    after = generate(static, requests(prompts), model=new_model)
    assert after != before
    assert_same(generate(hf, requests(prompts), model=new_model), after)
    assert_same(generate(static, requests(prompts)), before)  # and back


def test_batches_too_long_for_the_cache_fall_back(engines, prompts):
    hf, static = engines
    long_prompts = [p * 8 for p in prompts[:2]]  # > static_max_len with the new tokens
    assert not static.static.fits(2, max(map(len, long_prompts)) + 40)
    assert_same(generate(hf, requests(long_prompts)), generate(static, requests(long_prompts)))


def test_incompatible_weights_are_refused(engines, tmp_path):
    _, static = engines
    bigger = make_tiny_model(tmp_path / "small", preset="small", verbose=False)
    model = AutoModelForCausalLM.from_pretrained(bigger)
    with pytest.raises(ValueError, match="names or shapes"):
        static.check_compatible(model)


def test_only_qwen2_and_llama_full_attention_are_supported(tiny_model_dir):
    assert static_decode.unsupported_reason(LlamaConfig()) is None
    assert "qwen3" in static_decode.unsupported_reason(AutoConfig.for_model("qwen3"))  # q/k norms: not served
    config = AutoModelForCausalLM.from_pretrained(tiny_model_dir).config
    assert static_decode.unsupported_reason(config) is None
    config.use_sliding_window = True
    assert "sliding" in static_decode.unsupported_reason(config)


def test_batch_buckets():
    assert [static_decode.batch_bucket(n, 1024) for n in (1, 2, 3, 64, 65, 1000, 1024)] == [
        1, 2, 4, 64, 128, 1024, 1024]
    assert static_decode.batch_bucket(100, 96) == 96
