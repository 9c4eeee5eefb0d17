"""The dev server, started with SGLang's command-line flags (see devkit/dev_server/sglang_seam).

AReaL builds an SGLang server command from `SGLangConfig` (`--model-path`, `--host`, `--port`,
`--random-seed`, `--dtype`, `--base-gpu-id` and many tuning flags). This module reads the
flags that say what to serve and where, ignores the tuning ones (they have no meaning for a
single-process server), and runs the dev server (what `python3 -m devkit.dev_server` runs) in this
process, on the same host and port. The server exits with the process that started it
(AReaL's rollout worker or server wrapper), so a killed run leaves no server behind.
`DEV_SERVER_ARGS` adds dev-server flags, e.g. `DEV_SERVER_ARGS="--decoder hf"`.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

# SGLang's --dtype values, as the dev server names them ("auto" is decided by the device).
DTYPES = {"half": "float16", "float16": "float16", "bfloat16": "bfloat16", "float": "float32", "float32": "float32"}


def sglang_flags() -> argparse.ArgumentParser:
    """The SGLang flags that carry over; every other flag is accepted and ignored."""
    parser = argparse.ArgumentParser(prog="sglang launch_server (dev server stand-in)")
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--random-seed", type=int, default=0)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--base-gpu-id", type=int, default=0)
    return parser


def dev_server_argv(argv: list[str], cuda: bool, parent_pid: int, extra: str = "") -> list[str]:
    """The dev server's arguments for an SGLang command line."""
    args, _ = sglang_flags().parse_known_args(argv)
    dtype = DTYPES.get(args.dtype, "bfloat16" if cuda else "float32")
    device = f"cuda:{args.base_gpu_id}" if cuda else "cpu"
    return [
        "--model", args.model_path, "--host", args.host, "--port", str(args.port),
        "--seed", str(args.random_seed), "--dtype", dtype, "--device", device,
        "--parent-pid", str(parent_pid), *shlex.split(extra),
    ]  # fmt: skip


def main() -> int:
    import torch

    from devkit.dev_server.__main__ import main as dev_server_main

    argv = dev_server_argv(
        sys.argv[1:], torch.cuda.is_available(), os.getppid(), os.environ.get("DEV_SERVER_ARGS", "")
    )
    print(f"dev server in place of SGLang: {' '.join(argv)}", flush=True)
    return dev_server_main(argv)


if __name__ == "__main__":
    sys.exit(main())
