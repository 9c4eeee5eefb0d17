"""experiments/deepen_model.py: the deepened model computes exactly what its source does, and can train."""

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from experiments import deepen_model as dm  # noqa: E402


def test_layer_plan_follows_each_layer_by_its_copies():
    assert dm.layer_plan(2, 6) == [(0, False), (0, True), (0, True), (1, False), (1, True), (1, True)]
    # the remainder goes to the first layers; no copies at all when the depth is kept
    assert [i for i, _ in dm.layer_plan(3, 8)] == [0, 0, 0, 1, 1, 1, 2, 2]
    assert dm.layer_plan(3, 3) == [(0, False), (1, False), (2, False)]
    with pytest.raises(ValueError, match="fewer than"):
        dm.layer_plan(8, 4)


@pytest.fixture(scope="module")
def deepened(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("deep") / "model"
    dm.deepen_model(tiny_model_dir, out, layers=5)
    return out


def test_deepened_model_gives_the_same_logits_and_greedy_completion(tiny_model_dir, deepened):
    tok = AutoTokenizer.from_pretrained(deepened)
    src = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    deep = AutoModelForCausalLM.from_pretrained(deepened).eval()
    assert src.config.num_hidden_layers == 2
    assert deep.config.num_hidden_layers == 5 and len(deep.config.layer_types) == 5
    assert deep.num_parameters() > 2 * src.num_parameters()

    ids = torch.tensor([tok.encode("Using the numbers [19, 36, 55, 7], create an equation that equals 65.")])
    with torch.no_grad():
        assert torch.equal(src(ids).logits, deep(ids).logits)
        a = src.generate(ids, max_new_tokens=12, do_sample=False)
        b = deep.generate(ids, max_new_tokens=12, do_sample=False)
    assert torch.equal(a, b)
    assert (deepened / "tokenizer.json").read_bytes() == (tiny_model_dir / "tokenizer.json").read_bytes()


def test_copies_are_zero_only_where_they_must_be_and_receive_gradient(deepened):
    deep = AutoModelForCausalLM.from_pretrained(deepened)
    layers = deep.model.layers  # plan for 2 -> 5: 0, copy, copy, 1, copy
    assert layers[1].self_attn.o_proj.weight.abs().sum() == 0
    assert layers[1].mlp.down_proj.weight.abs().sum() == 0
    assert torch.equal(layers[1].self_attn.q_proj.weight, layers[0].self_attn.q_proj.weight)
    assert layers[0].self_attn.o_proj.weight.abs().sum() > 0
    assert layers[3].mlp.down_proj.weight.abs().sum() > 0

    ids = torch.arange(1, 20).unsqueeze(0)
    deep(ids, labels=ids).loss.backward()
    assert layers[1].self_attn.o_proj.weight.grad.abs().sum() > 0
    assert layers[4].mlp.down_proj.weight.grad.abs().sum() > 0


def test_bad_source_is_refused_with_the_folder_named(tmp_path):
    r = subprocess.run([sys.executable, "-m", "experiments.deepen_model", "--src", str(tmp_path / "nope"),
                        "--out", str(tmp_path / "out"), "--layers", "4"], capture_output=True, text=True)
    assert r.returncode == 2
    assert "nope: no config.json and model.safetensors there" in r.stderr
    assert not (tmp_path / "out").exists()
