"""devkit/make_tiny_model.py: a loadable HF folder, a round-tripping tokenizer, determinism."""

import json
import os

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from safetensors.torch import load_file  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig  # noqa: E402

import countdown  # noqa: E402
from sft_formats.completions import reference_completion  # noqa: E402
from devkit import make_tiny_model as mtm  # noqa: E402


@pytest.fixture(scope="module")
def built(tiny_model_dir):
    """The session's tiny model (tests/conftest.py builds it with make_tiny_model)."""
    return tiny_model_dir


@pytest.fixture(scope="module")
def tok(built):
    return AutoTokenizer.from_pretrained(built)


def test_folder_loads_with_auto_classes(built, tok):
    names = set(os.listdir(built))
    for f in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
              "generation_config.json"):
        assert f in names
    # atomic write: no temporary siblings left behind
    assert [p.name for p in built.parent.iterdir()] == [built.name]

    model = AutoModelForCausalLM.from_pretrained(built)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    cfg = model.config
    assert cfg.tie_word_embeddings
    assert cfg.vocab_size == len(tok)
    assert cfg.max_position_embeddings >= 2048
    assert model.dtype == torch.float32
    assert 800 <= len(tok) <= 2048
    n = mtm.count_params(model)
    assert 1_000_000 <= n <= 3_000_000
    tok_cfg = json.loads((built / "tokenizer_config.json").read_text())
    assert tok_cfg["chat_template"] == mtm.CHAT_TEMPLATE
    assert tok_cfg["tokenizer_class"] == "PreTrainedTokenizerFast"

    # and it runs
    ids = torch.tensor([tok.encode("Using the numbers [1, 2]")])
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tok))
    assert torch.isfinite(logits).all()


TEXTS = [
    "Using the numbers [55, 36, 7, 19], create an equation that equals 65.",
    "<think>\n55 + 36 = 91\n91 - 7 = 84\n84 - 19 = 65\n</think>\n<answer>55 + 36 - 7 - 19</answer>",
    "<answer> (1 + 2) / 3 </answer>",
    "  leading and trailing spaces  \n\n\ttabs\r\nCRLF",
    "unicode: héllo wörld, ½ × 3 ≠ 7, 日本語, emoji 🚀🧮, combining e\u0301 (NFD kept)",
    "zero width\u200bspace and nbsp\u00a0here",
    "",
    "12345678901234567890",
    "<|im_start|>user\nhi<|im_end|>\n",
]


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_round_trips(tok, text):
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert tok.unk_token_id is None


def test_round_trips_real_prompts_and_completions(tok):
    for row in countdown.generate_puzzles(20, seed=7):
        ids = countdown.prompt_token_ids(tok, row["messages"])
        text = tok.apply_chat_template(row["messages"], tokenize=False, add_generation_prompt=True)
        assert tok.decode(ids) == text
        completion = reference_completion(row)
        assert tok.decode(tok.encode(completion, add_special_tokens=False)) == completion


def test_digits_are_single_tokens(tok):
    toks = tok.convert_ids_to_tokens(tok.encode("2024 + 987", add_special_tokens=False))
    digits = [t for t in toks if any(c.isdigit() for c in t)]
    assert digits == list("2024987")


def test_chat_template(tok):
    user = [{"role": "user", "content": "hi"}]
    text = tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    assert text == (f"<|im_start|>system\n{mtm.DEFAULT_SYSTEM_MESSAGE}<|im_end|>\n"
                    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    msgs = countdown.make_messages([1, 2, 3], 6)
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\n" + msgs[0]["content"] + "<|im_end|>\n")
    assert text.count("<|im_start|>system") == 1
    assert text.endswith("<|im_end|>\n<|im_start|>assistant\n")
    no_gen = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False)
    assert no_gen.endswith("<|im_end|>\n") and not no_gen.endswith("assistant\n")
    ids = countdown.prompt_token_ids(tok, msgs)
    assert ids[-3:] == tok.encode("<|im_start|>assistant\n", add_special_tokens=False)
    assert ids == tok.encode(text, add_special_tokens=False)
    other = countdown.make_messages([10, 25, 7, 3], 99)
    assert countdown.batch_prompt_token_ids(tok, [msgs, other]) == [ids, countdown.prompt_token_ids(tok, other)]


def test_special_token_ids_consistent(built, tok):
    cfg = transformers.AutoConfig.from_pretrained(built)
    gen = GenerationConfig.from_pretrained(built)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    pad = tok.convert_tokens_to_ids("<|endoftext|>")
    assert (pad, tok.convert_tokens_to_ids("<|im_start|>"), im_end) == (0, 1, 2)
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == im_end
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == pad
    assert cfg.eos_token_id == gen.eos_token_id == im_end
    assert cfg.pad_token_id == gen.pad_token_id == pad
    assert cfg.bos_token_id == gen.bos_token_id == pad
    for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        assert len(tok.encode(t, add_special_tokens=False)) == 1
        assert t in tok.all_special_tokens
    # encode() adds nothing (no BOS), decode can drop the specials
    assert tok.encode("a", add_special_tokens=True) == tok.encode("a", add_special_tokens=False)
    assert tok.decode(tok.encode("<|im_start|>user\nhi<|im_end|>"), skip_special_tokens=True) == "user\nhi"


def test_same_seed_same_weights_other_seed_differs(built, tok, tmp_path):
    again = mtm.make_tiny_model(tmp_path / "again", seed=0, verbose=False)
    a, b = (load_file(p / "model.safetensors") for p in (built, again))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert (built / "tokenizer.json").read_bytes() == (again / "tokenizer.json").read_bytes()
    assert (built / "config.json").read_bytes() == (again / "config.json").read_bytes()
    other = mtm.build_model(tok, preset="tiny", seed=1).state_dict()
    assert any(not torch.equal(a[k], other[k]) for k in a)


def test_cli_replaces_existing_folder(tmp_path, capsys):
    out = tmp_path / "cli"
    out.mkdir()
    (out / "stale.txt").write_text("old model")
    assert mtm.main(["--out", str(out), "--seed", "3"]) == 0
    assert "params=" in capsys.readouterr().out
    assert not (out / "stale.txt").exists()
    assert (out / "model.safetensors").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cli"]  # no temp dirs left


def test_an_unwritable_out_is_one_line_and_builds_nothing(tmp_path, capsys, monkeypatch):
    def not_to_be_built():
        raise AssertionError("the tokenizer was built although its folder cannot be written")

    monkeypatch.setattr(mtm, "build_corpus", not_to_be_built)
    (tmp_path / "a_file").write_text("not a folder")  # a folder below a file: unwritable even as root
    assert mtm.main(["--out", str(tmp_path / "a_file" / "m")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("devkit/make_tiny_model.py: cannot write") and "--out" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_interrupted_build_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(mtm, "build_corpus", lambda: ["a tiny corpus 123 <answer>", "x y z"] * 5)

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(transformers.PreTrainedTokenizerFast, "save_pretrained", interrupted)
    with pytest.raises(KeyboardInterrupt):
        mtm.make_tiny_model(tmp_path / "half", seed=0, verbose=False)
    assert list(tmp_path.iterdir()) == []  # no half folder, no temp dir


def test_small_preset_size(tok):
    model = mtm.build_model(tok, preset="small", seed=0)
    assert 20_000_000 <= mtm.count_params(model) <= 30_000_000
    assert model.config.num_key_value_heads < model.config.num_attention_heads


def test_medium_preset_is_three_times_small(tok):
    small = mtm.count_params(mtm.build_model(tok, preset="small", seed=0))
    medium = mtm.build_model(tok, preset="medium", seed=0)
    assert 2.5 * small <= mtm.count_params(medium) <= 3.5 * small
    assert medium.config.hidden_size // medium.config.num_attention_heads == 64


@pytest.mark.parametrize("preset, billions, without_embedding", [("qwen2.5-1.5b", 1.54, 1.31),
                                                                  ("qwen2.5-3b", 3.09, 2.77)])
def test_qwen_presets_have_the_released_models_shapes(tok, preset, billions, without_embedding):
    """The Qwen2.5 model cards' parameter counts, in all and without the embedding (on the meta
    device: no random weights built in a test)."""
    config = mtm.model_config(tok, preset)
    with torch.device("meta"):
        model = transformers.Qwen2ForCausalLM(config)
    total = mtm.count_params(model)
    embedding = config.vocab_size * config.hidden_size
    assert config.vocab_size == 151936 > len(tok)
    assert (round(total / 1e9, 2), round((total - embedding) / 1e9, 2)) == (billions, without_embedding)


def test_a_bfloat16_preset_is_written_in_bfloat16(tmp_path, monkeypatch):
    """The qwen2.5 presets' folder format, on tiny's sizes (those models are built on the GPU
    machine), with a vocabulary larger than the tokenizer: it loads, and ids past the
    tokenizer's end decode to nothing."""
    monkeypatch.setitem(mtm.PRESETS, "qwen2.5-3b", {**mtm.TINY, "vocab_size": 4096})
    out = mtm.make_tiny_model(tmp_path / "m", preset="qwen2.5-3b", verbose=False)
    assert {t.dtype for t in load_file(out / "model.safetensors").values()} == {torch.bfloat16}
    model = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert model.config.vocab_size == 4096
    past_the_end = len(tokenizer) + 100
    assert tokenizer.decode([past_the_end]) == ""
    assert tokenizer.decode(tokenizer.encode("12 + 3") + [past_the_end]) == "12 + 3"
