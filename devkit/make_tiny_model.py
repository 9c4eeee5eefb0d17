"""Build a small, randomly initialised Qwen2-style model with a project-trained tokenizer.

    python3 -m devkit.make_tiny_model --out models/tiny-qwen2 [--preset tiny|demo|small|medium] [--seed 0]

Nothing is downloaded. The output is an ordinary Hugging Face folder (config.json,
model.safetensors, generation_config.json, tokenizer.json, tokenizer_config.json with
the chat template embedded) that loads with ``AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained``.

Tokenizer: byte-level BPE (every string round-trips, there is no UNK token), digits split
into single-digit pre-tokens, trained on a corpus of Countdown prompts and target-format
completions generated with ``countdown.py`` and ``sft_formats``. Special tokens follow Qwen:
``<|endoftext|>`` (pad), ``<|im_start|>``, ``<|im_end|>`` (eos). The chat template is
ChatML as in Qwen2.5, with a default system message when none is given.

Model: ``Qwen2ForCausalLM`` from a ``Qwen2Config``, random init seeded by ``--seed``
(same seed, same weights, bit for bit), tied embeddings, float32 (the qwen2.5 presets: bfloat16).

Presets:
  tiny   ~1.4 M params: CPU tests and the quick CPU demo.
  demo   tiny in 8 attention heads instead of 4: the CPU demo that learns (`make demo`).
  small  ~25 M params: the GPU learning experiment (docs/results/learning.md); 49 MB in bf16, so
         a warm-started checkpoint fits in one transfer to and from the GPU machine.
  medium ~76 M params: the larger model of the learning experiment.
  qwen2.5-1.5b, qwen2.5-3b  those models' shapes and vocabulary, written in bfloat16: the
         README's one- and two-GPU commands run on a GPU machine (tests/test_launchers.py).

The folder is written atomically: it is built in a temporary sibling directory and
renamed into place, so an interrupted run never leaves a half-written model behind.
An existing folder at ``--out`` is replaced.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END]
DEFAULT_SYSTEM_MESSAGE = "You are a helpful assistant."

# ChatML, as in Qwen2.5 (without the tool-calling branches).
CHAT_TEMPLATE = (
    "{%- if messages and messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- set loop_messages = messages[1:] %}"
    "{%- else %}"
    "{{- '<|im_start|>system\\n" + DEFAULT_SYSTEM_MESSAGE + "<|im_end|>\\n' }}"
    "{%- set loop_messages = messages %}"
    "{%- endif %}"
    "{%- for message in loop_messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)

TINY = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)

PRESETS: dict[str, dict] = {
    "tiny": TINY,
    # tiny's sizes in 8 heads of 32 (4 key/value heads): the CPU demo's model, the one every
    # measured demo run used (docs/results/cpu-demo.md). Same parameter count as tiny.
    "demo": {**TINY, "num_attention_heads": 8, "num_key_value_heads": 4},
    "small": dict(
        hidden_size=512,
        intermediate_size=1536,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=2,
    ),
    # GPT-2 small's depth and width (12 x 768) in head_dim 64: the larger model that the
    # warm start's step-bound SFT and GRPO's plateau asked for (docs/results/goal-65.md).
    "medium": dict(
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=12,
        num_attention_heads=12,
        num_key_value_heads=4,
    ),
    # The shapes of Qwen2.5-1.5B and -3B (the README's one- and two-GPU commands), their
    # 151,936-entry vocabulary included (the logits are a large part of a training step's
    # memory), so that a GPU run costs what those models cost; the weights are random and the
    # tokenizer is this project's (ids past its end decode to nothing).
    "qwen2.5-1.5b": dict(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
    ),
    "qwen2.5-3b": dict(
        hidden_size=2048,
        intermediate_size=11008,
        num_hidden_layers=36,
        num_attention_heads=16,
        num_key_value_heads=2,
        vocab_size=151936,
    ),
}
# Written in bfloat16, as the released checkpoints are: float32 would double their folders.
BFLOAT16_PRESETS = {"qwen2.5-1.5b", "qwen2.5-3b"}

VOCAB_SIZE = 1024  # BPE target; the corpus supports ~900 (899 tokens with the current one)
MAX_POSITION_EMBEDDINGS = 4096
CORPUS_PUZZLES = 1000
CORPUS_SEED = 1234  # fixed: the tokenizer does not depend on --seed

# General text so that words outside the fixed Countdown templates get merges too:
# the phrases a model may use while reasoning, plus a little plain English.
_EXTRA_TEXT = """\
Let me think about this step by step. First, I look at the numbers and the target.
The target is small, so I should probably subtract or divide. The target is large,
so multiplication might help. Let me try adding the two largest numbers first.
That gives a number that is too big. Maybe I can subtract the smallest one.
That is still too small, so this approach does not work. Let me try another way.
Alternatively, I could multiply two numbers and then add or subtract the rest.
If I divide this by that, the result is not an integer, so division is not useful here.
We are close: the difference is only two. I have one number left, and I must use it.
Each number can be used exactly once, and I have to use all of them.
Check: the equation uses every number once and equals the target. The answer is correct.
Wait, I made a mistake in the previous step. Let me recompute the sum carefully.
Hmm, what about parentheses? Grouping the first two numbers changes the order of operations.
Addition and multiplication are commutative; subtraction and division are not.
Working backwards from the target: which number divides the target evenly?
I will list the possible pairs: sum, difference, product and quotient of each pair.
None of these combinations reach the target, so I need to reconsider the operations.
This looks promising. Now I need to combine the result with the remaining numbers.
Therefore the final equation is written below, inside the answer tags.
Question: how many apples are left if you have twelve and eat three? Nine apples remain.
Numbers, equations, expressions, operators, results, solutions, attempts and checks.
Plus, minus, times, divided by, equals, greater than, less than, twice, half, double.
One, two, three, four, five, six, seven, eight, nine, ten, hundred, thousand.
Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday; January to December.
The weather today is sunny with a light breeze, and the forecast says rain tomorrow.
Python, JSON, HTTP, tokens, models, training, rewards, rollouts, gradients, policies.
""".splitlines()


def build_corpus(n_puzzles: int = CORPUS_PUZZLES, seed: int = CORPUS_SEED) -> list[str]:
    """Countdown chat transcripts (prompt + reference completion) rendered with ChatML."""
    import countdown
    from sft_formats.completions import reference_completion

    rows = countdown.generate_puzzles(n_puzzles, seed=seed)
    texts = []
    for row in rows:
        messages = list(row["messages"]) + [
            {"role": "assistant", "content": reference_completion(row)}
        ]
        texts.append(_render_chatml(messages))
    texts.extend(_EXTRA_TEXT)
    return texts


def _render_chatml(messages: list[dict]) -> str:
    parts = []
    if not messages or messages[0]["role"] != "system":
        parts.append(f"{IM_START}system\n{DEFAULT_SYSTEM_MESSAGE}{IM_END}\n")
    for m in messages:
        parts.append(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n")
    return "".join(parts)


def build_tokenizer(corpus: list[str], vocab_size: int = VOCAB_SIZE):
    """Train a byte-level BPE tokenizer; returns a transformers PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = None  # no normalisation: exact round trip of any text
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    for i, t in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t))

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        unk_token=None,
        additional_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
        model_max_length=MAX_POSITION_EMBEDDINGS,
        clean_up_tokenization_spaces=False,
    )


def model_config(tokenizer, preset: str = "tiny"):
    """The Qwen2Config of ``preset``, sized for ``tokenizer`` (or for the preset's own
    vocabulary where it names one)."""
    from transformers import Qwen2Config

    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {sorted(PRESETS)}")
    pad_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    return Qwen2Config(
        max_position_embeddings=MAX_POSITION_EMBEDDINGS,
        rope_theta=10000.0,
        rms_norm_eps=1e-6,
        hidden_act="silu",
        initializer_range=0.02,
        tie_word_embeddings=True,
        use_cache=True,
        bos_token_id=pad_id,  # as in Qwen2: never prepended by the tokenizer
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=pad_id,
        dtype="float32",
        **{"vocab_size": len(tokenizer), **PRESETS[preset]},
    )


def build_model(tokenizer, preset: str = "tiny", seed: int = 0):
    """Randomly initialised Qwen2ForCausalLM (float32) of ``model_config``."""
    import torch
    from transformers import GenerationConfig, Qwen2ForCausalLM

    config = model_config(tokenizer, preset)
    pad_id, eos_id = config.pad_token_id, config.eos_token_id
    # Deterministic init on CPU in float32, without disturbing the caller's global RNG.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        bos_token_id=pad_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        do_sample=False,
        max_new_tokens=256,
    )
    model.eval()
    return model


def portable_tokenizer_config(path: Path) -> None:
    """Use class/key names that transformers 4.x understands as well as 5.x.

    transformers 5 writes ``tokenizer_class: TokenizersBackend`` and a list-valued
    ``extra_special_tokens``; 4.x knows neither. ``PreTrainedTokenizerFast`` and
    ``additional_special_tokens`` load to the same tokenizer in 5.x.
    """
    cfg = json.loads(path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    extra = cfg.pop("extra_special_tokens", None)
    if isinstance(extra, list):
        cfg["additional_special_tokens"] = extra
    elif extra:
        cfg["extra_special_tokens"] = extra
    cfg.pop("backend", None)
    path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")


def _fix_permissions(folder: Path) -> None:
    """mkdtemp makes a 0700 folder (and safetensors may write 0600 files): apply the umask."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(folder, 0o777 & ~umask)
    for f in folder.iterdir():
        os.chmod(f, 0o666 & ~umask)


class OutFolderError(ValueError):
    """The output folder cannot be written; the message names it and what to do."""


def check_out_folder(out: Path) -> None:
    """Make ``out``'s parent and check that a folder can be written there, before the minutes
    of building that would otherwise end in a traceback from ``write_folder_atomically``."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        os.rmdir(tempfile.mkdtemp(prefix=f".{out.name}.check-", dir=out.parent))
    except OSError as e:
        raise OutFolderError(f"cannot write {out}: {e.strerror or e}; give --out a folder you can write") from None


def write_folder_atomically(out: Path, fill) -> None:
    """Have ``fill(tmp)`` write a temporary sibling of ``out``, then rename it into place.

    An interrupted run never leaves a half-written folder at ``out``; an existing one is replaced.
    """
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        fill(tmp)
        _fix_permissions(tmp)
        old = None
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
            os.rename(out, old / "m")
        os.rename(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def count_params(model) -> int:
    # Tied embeddings are counted once.
    return sum(p.numel() for p in model.parameters())


def make_tiny_model(out: str | os.PathLike, preset: str = "tiny", seed: int = 0,
                    verbose: bool = True) -> Path:
    """Build tokenizer + model and write them atomically to ``out`` (replaced if present)."""
    import torch

    t0 = time.perf_counter()
    out = Path(out).absolute()
    check_out_folder(out)
    tokenizer = build_tokenizer(build_corpus())
    model = build_model(tokenizer, preset=preset, seed=seed)
    n_params = count_params(model)

    if preset in BFLOAT16_PRESETS:
        model.to(torch.bfloat16)

    def fill(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp, save_jinja_files=False)
        portable_tokenizer_config(tmp / "tokenizer_config.json")

    write_folder_atomically(out, fill)
    if verbose:
        print(
            f"wrote {out}: preset={preset} seed={seed} params={n_params:,} "
            f"({n_params / 1e6:.2f} M) vocab={len(tokenizer)} "
            f"in {time.perf_counter() - t0:.1f}s"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="output folder (replaced if it exists)")
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    p.add_argument("--seed", type=int, default=0, help="weight init seed")
    args = p.parse_args(argv)
    try:
        make_tiny_model(args.out, preset=args.preset, seed=args.seed)
    except OutFolderError as e:
        print(f"devkit/make_tiny_model.py: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
