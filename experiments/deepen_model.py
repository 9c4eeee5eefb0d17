"""Deepen a Qwen2 checkpoint with identity blocks: the same model, at a deeper model's cost.

    python3 -m experiments.deepen_model --src runs/learn/plain/warm_start --out runs/learn/deep24 --layers 24

Why: which stack reaches an accuracy sooner (experiments/time_to_accuracy.py) depends on how
much of a step is generation. The project's warm start has 8 layers, where decoding is cheap;
a deeper model cannot be trained from scratch within one time-to-accuracy row, nor its weights
be carried from one GPU session to the next. This tool turns a checkpoint into one of ``--layers`` layers that
computes exactly the same function, so every row starts from the same held-out pass@1 while
each decoding step costs ``--layers`` layers. Each source layer is followed by copies of
itself whose attention output projection (``o_proj``) and MLP down projection
(``down_proj``) are zero: a copy adds nothing to the residual stream (block expansion, as in
LLaMA Pro, Wu et al. 2024). Training moves the zero projections at once (their gradient is
not zero), and the rest of each copy once they have moved.

The tokenizer, chat template and generation config are copied unchanged; the folder is
written atomically, like devkit/make_tiny_model.py's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from devkit.make_tiny_model import write_folder_atomically

# In a copy these are zero, so that attention and MLP each add nothing to the residual stream.
ZEROED_IN_COPIES = ("self_attn.o_proj.weight", "mlp.down_proj.weight")
LAYER_PREFIX = "model.layers."


def layer_plan(n_src: int, n_out: int) -> list[tuple[int, bool]]:
    """For each output layer, (the source layer it copies, whether it is an identity copy).

    Source layers keep their order; each is followed by its copies, spread as evenly as
    ``n_out`` allows (the first ``n_out % n_src`` layers get one more).
    """
    if n_out < n_src:
        raise ValueError(f"--layers {n_out} is fewer than the checkpoint's {n_src} layers")
    plan = []
    for i in range(n_src):
        copies = n_out // n_src - 1 + (1 if i < n_out % n_src else 0)
        plan += [(i, False)] + [(i, True)] * copies
    return plan


def deepened_state_dict(state: dict, plan: list[tuple[int, bool]]) -> dict:
    """The source tensors rearranged by ``plan``: layers copied, the projections of copies zeroed."""
    import torch

    out = {k: v for k, v in state.items() if not k.startswith(LAYER_PREFIX)}
    for j, (i, is_copy) in enumerate(plan):
        src = f"{LAYER_PREFIX}{i}."
        for key, value in state.items():
            if key.startswith(src):
                name = key[len(src):]
                zero = is_copy and name in ZEROED_IN_COPIES
                out[f"{LAYER_PREFIX}{j}.{name}"] = torch.zeros_like(value) if zero else value.clone()
    return out


def deepen_model(src: str | Path, out: str | Path, layers: int) -> Path:
    """Write ``out``: the checkpoint at ``src`` deepened to ``layers`` layers (see the module doc).

    Works on the files, not on a loaded model, so that the tensors keep their stored dtype
    and every other file (tokenizer, chat template, generation config) is copied unchanged.
    """
    from safetensors.torch import load_file, save_file

    src, out = Path(src), Path(out).absolute()
    if not (src / "config.json").is_file() or not (src / "model.safetensors").is_file():
        raise ValueError(f"{src}: no config.json and model.safetensors there; "
                         "--src must be a Hugging Face model folder saved in one file")
    config = json.loads((src / "config.json").read_text())
    if config.get("model_type") != "qwen2":
        raise ValueError(f"{src}: model_type {config.get('model_type')!r}; this tool knows Qwen2 layers only")
    plan = layer_plan(config["num_hidden_layers"], layers)
    state = load_file(src / "model.safetensors")
    deep = deepened_state_dict(state, plan)
    config["num_hidden_layers"] = layers
    if "layer_types" in config:
        config["layer_types"] = [config["layer_types"][i] for i, _ in plan]

    def fill(tmp: Path) -> None:
        for f in src.iterdir():
            if f.is_file() and f.name not in ("config.json", "model.safetensors"):
                shutil.copy2(f, tmp / f.name)
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_file(deep, tmp / "model.safetensors", metadata={"format": "pt"})

    write_folder_atomically(out, fill)
    print(f"wrote {out}: {layers} layers from {src}'s {len(set(i for i, _ in plan))}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--src", required=True, help="a Qwen2 Hugging Face folder")
    p.add_argument("--out", required=True, help="output folder (replaced if it exists)")
    p.add_argument("--layers", type=int, required=True, help="layers of the output model")
    args = p.parse_args(argv)
    try:
        deepen_model(args.src, args.out, args.layers)
    except ValueError as e:
        p.error(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
